/**
 * What one engine's KV events can make a rank's prefix index hold (#17 F8: a worker registered
 * with total_kv_blocks 100 grew its index to 512,004 blocks) and parent-hash cycles (#17 F11:
 * blocks the metrics counted but no prompt could match).
 */
import { describe, expect, it } from "vitest";

import { hashListFromBigInts } from "../../../src/core/hash64.js";
import { computeBlockHashes } from "../../../src/core/hashing.js";
import type { KvEventBatch } from "../../../src/core/kv-events.js";
import { PrefixIndex } from "../../../src/core/prefix-index.js";
import { DEFAULT_MAX_RANK_INDEX_BLOCKS, MIN_MAX_RANK_INDEX_BLOCKS, RANK_INDEX_BLOCKS_PER_KV_BLOCK, rankIndexBound } from "../../../src/core/rank-index-bound.js";
import { BLOCK, makeService, removedBatch, storedBatch, tokens, worker } from "../../helpers/core-fixtures.js";

/** One BlockStored of `toks` under `parent` with the engine hashes given (any u64 will do). */
function stored(hashes: bigint[], toks: number[], parent: bigint | null): KvEventBatch {
  return { ts: 0, dpRank: null, events: [{ type: "stored", blockHashes: hashes, parentHash: parent, tokenIds: toks, blockSize: BLOCK, loraName: null, tier: "device", eagle: false }] };
}

const block = (seed: number): number[] => tokens(1, seed);

describe("per-rank index bound (#17 F8)", () => {
  it("is a multiple of total_kv_blocks with a floor, and a documented default without it", () => {
    expect(rankIndexBound(null)).toBe(DEFAULT_MAX_RANK_INDEX_BLOCKS);
    expect(rankIndexBound(undefined)).toBe(DEFAULT_MAX_RANK_INDEX_BLOCKS);
    expect(rankIndexBound(100)).toBe(MIN_MAX_RANK_INDEX_BLOCKS);
    expect(rankIndexBound(0)).toBe(MIN_MAX_RANK_INDEX_BLOCKS);
    expect(rankIndexBound(50_000)).toBe(50_000 * RANK_INDEX_BLOCKS_PER_KV_BLOCK);
  });

  it("a worker with total_kv_blocks 100 storing 5,000 blocks keeps the bound, sheds and counts the rest, and still routes by what it holds", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1, { total_kv_blocks: 100 }));
    svc.upsertWorker(worker(2));
    const bound = rankIndexBound(100);
    const r = svc.applyKvEvents(1n, 0, storedBatch(tokens(5_000)));
    expect(svc.sizes().indexedBlocks).toBe(bound);
    expect(svc.stats.kvIndexBlocksShed).toBe(5_000 - bound);
    // The event applied (partly): it is not a dropped event.
    expect(r).toMatchObject({ applied: 1, dropped: 0 });
    // The full rank keeps the prefix it holds and wins a prompt starting with it.
    expect(svc.select({ token_ids: tokens(10) }).worker_id).toBe(1n);
    expect(svc.stats.selectionOverlapBlocks).toBe(10);
    // Removals make room again.
    svc.applyKvEvents(1n, 0, removedBatch(tokens(5_000), bound - 10));
    expect(svc.sizes().indexedBlocks).toBe(bound - 10);
    svc.applyKvEvents(1n, 0, storedBatch(tokens(20, 3)));
    expect(svc.sizes().indexedBlocks).toBe(bound);
    expect(svc.stats.kvIndexBlocksShed).toBe(5_000 - bound + 10);
  });

  it("the bound follows a PATCH of total_kv_blocks, and another rank is not affected", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1, { total_kv_blocks: 100 }));
    svc.upsertWorker(worker(2, { total_kv_blocks: 1_000 }));
    svc.applyKvEvents(2n, 0, storedBatch(tokens(3_000, 2)));
    expect(svc.sizes().indexedBlocks).toBe(3_000);
    svc.patchWorker(1n, { total_kv_blocks: 1_000 });
    svc.applyKvEvents(1n, 0, storedBatch(tokens(3_000)));
    expect(svc.sizes().indexedBlocks).toBe(6_000);
    expect(svc.stats.kvIndexBlocksShed).toBe(0);
  });

  it("PrefixIndex.applyStored stops at maxRankPairs: blocks it already holds never count against it", () => {
    const idx = new PrefixIndex();
    const l = computeBlockHashes(tokens(6), BLOCK);
    const s = hashListFromBigInts([1n, 2n, 3n, 4n, 5n, 6n]);
    expect(idx.applyStored(0, "device", null, s.subarray(0, 8), l.subarray(0, 8), 4)).toBe(true);
    expect(idx.rankSize(0)).toBe(4);
    // Re-storing the held four and two more: only the new two are shed.
    expect(idx.applyStored(0, "device", null, s, l, 4)).toBe(true);
    expect(idx.rankSize(0)).toBe(4);
    expect(idx.shedPairs).toBe(2);
    expect(idx.findMatches(l).device[0]).toBe(4);
  });
});

describe("parent-hash cycles (#17 F11)", () => {
  it("a block stored below its own descendant is refused and counted; the chain still matches", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.applyKvEvents(1n, 0, stored([0xan], block(1), null));
    svc.applyKvEvents(1n, 0, stored([0xbn], block(2), 0xan));
    // A below B: A -> B -> A.
    const r = svc.applyKvEvents(1n, 0, stored([0xan], block(1), 0xbn));
    expect(r).toMatchObject({ applied: 0, dropped: 1 });
    expect(svc.stats.kvParentCycles).toBe(1);
    expect(svc.sizes().indexedBlocks).toBe(2);
    svc.select({ token_ids: [...block(1), ...block(2)] });
    expect(svc.stats.selectionOverlapBlocks).toBe(2);
  });

  it("a block that is its own parent, and a repeat inside one event, are refused", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.applyKvEvents(1n, 0, stored([0xan], block(1), null));
    expect(svc.applyKvEvents(1n, 0, stored([0xan], block(5), 0xan))).toMatchObject({ applied: 0, dropped: 1 });
    // C, D, C in one event: the first two stay, the repeat is refused.
    expect(svc.applyKvEvents(1n, 0, stored([0xcn, 0xdn, 0xcn], [...block(3), ...block(4), ...block(6)], 0xan))).toMatchObject({ applied: 0, dropped: 1 });
    expect(svc.stats.kvParentCycles).toBe(2);
    expect(svc.sizes().indexedBlocks).toBe(3);
    svc.select({ token_ids: [...block(1), ...block(3), ...block(4)] });
    expect(svc.stats.selectionOverlapBlocks).toBe(3);
  });

  it("a hash moving to another parent that is no cycle is still taken (the old claim goes)", () => {
    const idx = new PrefixIndex();
    const l = computeBlockHashes([...block(1), ...block(2), ...block(3)], BLOCK);
    idx.applyStored(0, "device", null, hashListFromBigInts([1n, 2n]), l.subarray(0, 4));
    idx.applyStored(0, "device", null, hashListFromBigInts([3n]), l.subarray(4, 6));
    // Hash 2 now under 3: no cycle.
    expect(idx.applyStored(0, "device", 3n, hashListFromBigInts([2n]), l.subarray(2, 4))).toBe(true);
    expect(idx.cyclesRejected).toBe(0);
    expect(idx.rankSize(0)).toBe(3);
  });
});
