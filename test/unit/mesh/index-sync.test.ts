import { describe, expect, it } from "vitest";

import { decodeIndexSyncReply, decodeIndexSyncRequest, encodeIndexSyncRequest, IndexSyncClient, IndexSyncServer, isIndexSyncRequest } from "../../../mesh/index-sync.js";
import { MeshRemoteError, MeshWireError } from "../../../mesh/errors.js";
import { decodeIndexChunk, type IndexPartitionTree, type IndexRankSnapshot, type MergedRank } from "../../../src/core/index.js";
import { makeService, storedBatch, tokens, worker } from "../../helpers/core-fixtures.js";

function server() {
  const { svc } = makeService();
  for (let w = 1; w <= 3; w++) {
    svc.upsertWorker(worker(w));
    svc.applyKvEvents(BigInt(w), 0, storedBatch(tokens(300, w)));
  }
  // The main thread's slicer (the export thread: index-export-worker.test.ts).
  return new IndexSyncServer({ source: svc.indexSnapshotSource, positionOf: () => ({ seq: 7n, digest: 9n }), chunkBytes: 1024, exportThread: false });
}

const allow = () => Promise.resolve(null);

describe("index sync over the control channel", () => {
  it("round-trips a request and tells it apart from the control channel's msgpack", () => {
    const req = { from: 42n, publishEndpoint: "tcp://10.0.0.1:5555", cursor: "m\u0000g\u00001" };
    const raw = encodeIndexSyncRequest(req);
    expect(isIndexSyncRequest(raw)).toBe(true);
    expect(decodeIndexSyncRequest(raw)).toEqual(req);
    expect(decodeIndexSyncRequest(encodeIndexSyncRequest({ from: 1n, publishEndpoint: undefined, cursor: null }))).toEqual({ from: 1n, publishEndpoint: undefined, cursor: null });
    expect(isIndexSyncRequest(Buffer.of(0x84, 1, 2, 3))).toBe(false);
    expect(() => decodeIndexSyncRequest(raw.subarray(0, raw.length - 1))).toThrow(MeshWireError);
  });

  it("serves the index in bounded chunks a cursor walks, each rank whole with its position", async () => {
    const s = server();
    expect(s.handle(Buffer.of(0x80), allow)).toBeNull();
    let cursor: string | null = null;
    const workers: bigint[] = [];
    for (let i = 0; i < 10; i++) {
      const reply = decodeIndexSyncReply("peer", (await s.handle(encodeIndexSyncRequest({ from: 1n, publishEndpoint: undefined, cursor }), allow)) as Buffer);
      for (const r of decodeIndexChunk(reply.chunk)) {
        workers.push(r.workerId);
        expect(r.position).toEqual({ seq: 7n, digest: 9n });
      }
      if (reply.next === null) break;
      cursor = reply.next;
    }
    expect(workers).toEqual([1n, 2n, 3n]);
    expect(s.stats).toMatchObject({ chunksServed: 3, ranksServed: 3, blocksServed: 900 });
  });

  it("refuses a request the snapshot check refuses, and a malformed one, with error replies (counted)", async () => {
    const s = server();
    const refused = (await s.handle(encodeIndexSyncRequest({ from: 1n, publishEndpoint: undefined, cursor: null }), () => Promise.resolve("not a peer"))) as Buffer;
    expect(() => decodeIndexSyncReply("peer", refused)).toThrow(MeshRemoteError);
    const bad = (await s.handle(Buffer.from("KVIQ"), allow)) as Buffer;
    expect(() => decodeIndexSyncReply("peer", bad)).toThrow(/overruns/);
    expect(s.stats).toMatchObject({ refused: 1, malformed: 1, chunksServed: 0 });
  });

  it("a client pulls every chunk through its decoding thread, each rank with its lookup built ahead; a failed request rejects the pull", async () => {
    const s = server();
    let asked = 0;
    const link = (failAt: number) => ({
      request: async (_endpoint: string, payload: Buffer): Promise<Buffer> => {
        if (++asked === failAt) throw new MeshRemoteError("peer", "gone");
        return (await s.handle(payload, allow)) as Buffer;
      },
    });
    const got: IndexRankSnapshot[] = [];
    const client = new IndexSyncClient({ link: link(0), from: 1n, advertise: undefined });
    client.prepare();
    const r = await client.pull("peer", (ranks) => {
      got.push(...ranks);
    });
    expect(r).toMatchObject({ peer: "peer", chunks: 3, ranks: 3 });
    expect(Object.keys(r.phasesMs).sort()).toEqual(["adopt", "build", "decode", "install", "wait"]);
    expect(got.map((x) => x.workerId)).toEqual([1n, 2n, 3n]);
    for (const x of got) expect(x.entries.lookup?.size).toBe(x.entries.entryNode.length);
    // The same ranks install into a fresh service as the peer holds them.
    const { svc } = makeService();
    for (let w = 1; w <= 3; w++) svc.upsertWorker(worker(w));
    for (const x of got) expect(svc.importIndexRank(x)).toEqual({ installed: 300 });
    expect(svc.sizes().indexedBlocks).toBe(900);

    asked = 0;
    const failing = new IndexSyncClient({ link: link(2), from: 1n, advertise: undefined });
    const installed: bigint[] = [];
    await expect(
      failing.pull("peer", (ranks) => {
        installed.push(...ranks.map((x) => x.workerId));
      }),
    ).rejects.toThrow(/gone/);
    expect(installed).toEqual([1n]);
  });

  it("with targets, the thread merges those ranks into partition trees handed over at the end; the others install at once; a malformed chunk rejects the pull", async () => {
    const s = server();
    const link = { request: async (_endpoint: string, payload: Buffer): Promise<Buffer> => (await s.handle(payload, allow)) as Buffer };
    const { svc } = makeService();
    for (let w = 1; w <= 3; w++) svc.upsertWorker(worker(w));
    // Worker 3 is left out of the targets (as one registered after the pull started): installed rank by rank.
    const targets = svc.indexRankTargets().filter((t) => t.workerId !== 3n);
    expect(targets).toHaveLength(2);
    const installed: bigint[] = [];
    const merged: MergedRank[] = [];
    let trees: IndexPartitionTree[] = [];
    const client = new IndexSyncClient({ link, from: 1n, advertise: undefined });
    const r = await client.pull(
      "peer",
      (ranks) => {
        for (const x of ranks) {
          installed.push(x.workerId);
          expect(svc.importIndexRank(x)).toEqual({ installed: 300 });
        }
      },
      {
        targets,
        merged: (m) => merged.push(...m),
        adopt: (t) => {
          // Nothing of the merged ranks is installed before the trees come.
          expect(svc.sizes().indexedBlocks).toBe(300);
          trees = t;
        },
      },
    );
    expect(r).toMatchObject({ chunks: 3, ranks: 3 });
    expect(installed).toEqual([3n]);
    expect(merged.map((m) => [m.workerId, m.blocks, m.position?.seq])).toEqual([
      [1n, 300, 7n],
      [2n, 300, 7n],
    ]);
    expect(trees).toHaveLength(1);
    for (const m of merged) expect(svc.mergedRankHolds(m)).toBe(true);
    expect(svc.adoptIndexTree(trees[0] as IndexPartitionTree, () => false)).toBe(true);
    // The tree's ranks and the one installed alone (carried over) are all there.
    expect(svc.sizes().indexedBlocks).toBe(900);

    const garbled = new IndexSyncClient({ link: { request: () => Promise.resolve(Buffer.concat([Buffer.of(0, 0, 0, 0), Buffer.from("KVIX garbage")])) }, from: 1n, advertise: undefined });
    await expect(garbled.pull("peer", () => undefined, { targets, merged: () => undefined, adopt: () => undefined })).rejects.toThrow(MeshWireError);
  });
});
