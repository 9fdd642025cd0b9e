import { describe, expect, it } from "vitest";

import { decodeIndexSyncReply, decodeIndexSyncRequest, encodeIndexSyncRequest, IndexSyncServer, isIndexSyncRequest } from "../../../mesh/index-sync.js";
import { MeshRemoteError, MeshWireError } from "../../../mesh/errors.js";
import { decodeIndexChunk } from "../../../src/core/index.js";
import { makeService, storedBatch, tokens, worker } from "../../helpers/core-fixtures.js";

function server() {
  const { svc } = makeService();
  for (let w = 1; w <= 3; w++) {
    svc.upsertWorker(worker(w));
    svc.applyKvEvents(BigInt(w), 0, storedBatch(tokens(300, w)));
  }
  return new IndexSyncServer({ source: svc.indexSnapshotSource, positionOf: () => ({ seq: 7n, digest: 9n }), chunkBytes: 1024 });
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
});
