import { describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/errors.js";
import { chunkBytes, decodeIndexChunk, encodeIndexChunk, nextIndexChunk, type IndexRankSnapshot } from "../../../src/core/index-snapshot.js";
import { IndexJoinJournal } from "../../../src/core/index-join-journal.js";
import type { KvEventBatch } from "../../../src/core/kv-events.js";
import { BLOCK, makeService, storedBatch, tokens, worker } from "../../helpers/core-fixtures.js";

/** A service with `workers` workers of one rank each, each holding `blocks` blocks (rank i's prompt seeded i). */
function fleet(workers: number, blocks: number) {
  const { svc } = makeService();
  for (let w = 1; w <= workers; w++) {
    svc.upsertWorker(worker(w));
    svc.applyKvEvents(BigInt(w), 0, storedBatch(tokens(blocks, w)));
  }
  return svc;
}

const positionOf = (workerId: bigint, dpRank: number) => ({ seq: workerId * 10n + BigInt(dpRank), digest: workerId === 2n ? null : 0xabcdn + workerId });

/** Every chunk of the service's index, following cursors. */
function pullAll(svc: ReturnType<typeof fleet>, maxBytes: number): { chunks: number; ranks: IndexRankSnapshot[] } {
  let cursor: string | null = null;
  const ranks: IndexRankSnapshot[] = [];
  let chunks = 0;
  for (;;) {
    const c = nextIndexChunk(svc.indexSnapshotSource, cursor, maxBytes, positionOf);
    chunks++;
    ranks.push(...decodeIndexChunk(chunkBytes(c)));
    if (c.next === null) return { chunks, ranks };
    cursor = c.next;
  }
}

describe("index snapshot codec", () => {
  it("round-trips every rank with its position, in chunks bounded by bytes (at least one rank each)", () => {
    const svc = fleet(5, 6);
    const { chunks, ranks } = pullAll(svc, 300); // one rank of 6 blocks is ~260 bytes: one per chunk
    expect(chunks).toBe(5);
    expect(ranks.map((r) => r.workerId)).toEqual([1n, 2n, 3n, 4n, 5n]);
    expect(ranks[0]?.position).toEqual({ seq: 10n, digest: 0xabcdn + 1n });
    expect(ranks[1]?.position).toEqual({ seq: 20n, digest: null });
    expect(pullAll(svc, 1 << 20).chunks).toBe(1);

    // Installed into a service that knows the workers, the index is the same.
    const { svc: joiner } = makeService();
    for (let w = 1; w <= 5; w++) joiner.upsertWorker(worker(w));
    for (const r of ranks) expect(joiner.importIndexRank(r)).toEqual({ installed: 6 });
    expect(joiner.dump()).toEqual(svc.dump());
  });

  it("stops a chunk before exporting a rank the last one's size says will not fit, and still never passes the bound", () => {
    const svc = fleet(6, 6);
    let exported = 0;
    const src = svc.indexSnapshotSource;
    const counting = { rankKeys: (after?: string | null) => src.rankKeys(after), exportRank: (k: Parameters<typeof src.exportRank>[0]) => (exported++, src.exportRank(k)), exportViews: (k: Parameters<typeof src.exportViews>[0]) => src.exportViews(k) };
    const CHUNK_HEADER = 9;
    const perRank = (nextIndexChunk(src, null, 1 << 20, positionOf).bytes - CHUNK_HEADER) / 6;
    // Two ranks a chunk (ranks of one size): 6 ranks in 3 chunks, each exported once (none dropped).
    const maxBytes = CHUNK_HEADER + 2 * perRank + 10;
    let cursor: string | null = null;
    let chunks = 0;
    const got: bigint[] = [];
    for (;;) {
      const c = nextIndexChunk(counting, cursor, maxBytes, positionOf);
      chunks++;
      expect(c.bytes).toBeLessThanOrEqual(maxBytes);
      expect(chunkBytes(c).length).toBe(c.bytes);
      got.push(...decodeIndexChunk(chunkBytes(c)).map((r) => r.workerId));
      if (c.next === null) break;
      cursor = c.next;
    }
    expect(got).toEqual([1n, 2n, 3n, 4n, 5n, 6n]);
    expect(chunks).toBe(3);
    expect(exported).toBe(6);
  });

  it("refuses ranks this replica does not know, or knows with another block size", () => {
    const svc = fleet(1, 3);
    const [r] = pullAll(svc, 1 << 20).ranks;
    const { svc: joiner } = makeService();
    expect(joiner.importIndexRank(r as IndexRankSnapshot)).toEqual({ refused: "unknown_rank" });
    joiner.upsertWorker(worker(1, { block_size: BLOCK * 2 }));
    expect(joiner.importIndexRank(r as IndexRankSnapshot)).toEqual({ refused: "block_size" });
  });

  it("refuses malformed chunks with a registry error naming the field", () => {
    const [rank] = pullAll(fleet(1, 2), 1 << 20).ranks as [IndexRankSnapshot];
    const good = encodeIndexChunk([rank]);
    const withEntries = (patch: Partial<IndexRankSnapshot["entries"]>): Buffer => encodeIndexChunk([{ ...rank, entries: { ...rank.entries, ...patch } }]);
    const cases: [Buffer, string][] = [
      [Buffer.from("nope"), "index_chunk.magic"],
      [good.subarray(0, good.length - 3), "ranks[0].entries"],
      [Buffer.concat([good, Buffer.of(0)]), "index_chunk"],
      [withEntries({ nodeParent: Int32Array.of(-1, 1) }), "ranks[0].node_parents"],
      [withEntries({ nodeParent: Int32Array.of(-2, 0) }), "ranks[0].node_parents"],
      [withEntries({ entryNode: Int32Array.of(1, 0) }), "ranks[0].entry_nodes"],
      [withEntries({ entryNode: Int32Array.of(0, 2) }), "ranks[0].entry_nodes"],
      [withEntries({ entryTier: Uint8Array.of(0, 3) }), "ranks[0].entry_tiers"],
    ];
    const badVersion = Buffer.from(good);
    badVersion[4] = 9;
    cases.push([badVersion, "index_chunk.version"]);
    const hugeCount = Buffer.from(good);
    hugeCount.writeUInt32LE(0xffffffff, 5);
    cases.push([hugeCount, "index_chunk"]);
    for (const [buf, field] of cases) {
      let err: unknown;
      try {
        decodeIndexChunk(buf);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(KvmeshError);
      expect((err as KvmeshError).code).toBe("KVMESH_BAD_REQUEST");
      expect(JSON.stringify((err as KvmeshError).details)).toContain(field);
    }
  });
});

const batch = (n: number): KvEventBatch => ({ ts: n, dpRank: null, events: [] });

describe("warm join continuity (index-join-journal)", () => {
  it("re-applies the journaled batches past the snapshot's position, in order", () => {
    const j = new IndexJoinJournal();
    for (let s = 5n; s <= 9n; s++) j.record("w:0", s, s * 100n, batch(Number(s)));
    const plan = j.plan("w:0", { seq: 7n, digest: 700n });
    expect(plan).toMatchObject({ kind: "install", gap: null, floor: null });
    expect(plan.kind === "install" && plan.apply.map((e) => e.seq)).toEqual([8n, 9n]);
  });

  it("asks for a replay of the seqs between the position and the first journaled batch", () => {
    const j = new IndexJoinJournal();
    for (let s = 20n; s <= 22n; s++) j.record("w:0", s, null, batch(Number(s)));
    expect(j.plan("w:0", { seq: 11n, digest: null })).toMatchObject({ kind: "install", gap: { from: 12n, to: 20n } });
  });

  it("sheds its oldest batches at the bound, counted, and the shed range becomes a gap to replay", () => {
    const j = new IndexJoinJournal(3);
    for (let s = 1n; s <= 5n; s++) j.record("w:0", s, null, batch(Number(s)));
    expect(j.stats).toEqual({ batches: 3, shed: 2 });
    expect(j.plan("w:0", { seq: 0n, digest: null })).toMatchObject({ kind: "install", gap: { from: 1n, to: 3n } });
  });

  it("a listener behind the snapshot gets a floor: its batches up to the position are covered", () => {
    const j = new IndexJoinJournal();
    j.record("w:0", 3n, null, batch(3));
    expect(j.plan("w:0", { seq: 8n, digest: 1n })).toMatchObject({ kind: "install", apply: [], gap: null, floor: { seq: 8n, digest: 1n } });
    expect(j.plan("other:0", { seq: 8n, digest: 1n })).toMatchObject({ kind: "install", floor: { seq: 8n } });
  });

  it("refuses a snapshot of another publisher incarnation (the batch at its seq differs, or a restart came between)", () => {
    const j = new IndexJoinJournal();
    j.record("w:0", 4n, 40n, batch(4));
    expect(j.plan("w:0", { seq: 4n, digest: 41n })).toMatchObject({ kind: "stale" });
    expect(j.plan("w:0", { seq: 4n, digest: 40n })).toMatchObject({ kind: "install" });
    j.reset("w:0");
    j.record("w:0", 0n, 1n, batch(0));
    expect(j.plan("w:0", { seq: 4n, digest: 40n })).toMatchObject({ kind: "stale" });
  });

  it("stops journaling a rank once finished, and everything once closed", () => {
    const j = new IndexJoinJournal();
    j.record("w:0", 1n, null, batch(1));
    j.finish("w:0");
    j.record("w:0", 2n, null, batch(2));
    expect(j.recording("w:0")).toBe(false);
    expect(j.stats.batches).toBe(0);
    j.close();
    j.record("w:1", 1n, null, batch(1));
    expect(j.stats.batches).toBe(0);
  });
});
