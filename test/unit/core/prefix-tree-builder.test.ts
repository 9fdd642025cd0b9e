import { describe, expect, it } from "vitest";

import { PrefixIndex, STORAGE_TIERS, withRankLookup, type RankEntries, type StorageTier } from "../../../src/core/prefix-index.js";
import { PrefixTreeBuilder } from "../../../src/core/prefix-tree-builder.js";
import { IndexTreeMerger, type IndexPartitionTree, type IndexRankTarget } from "../../../src/core/index-tree-merge.js";
import type { IndexRankSnapshot } from "../../../src/core/index-snapshot.js";
import { hashListFromBigInts } from "../../../src/core/hash64.js";
import { isKvmeshError } from "../../../src/core/errors.js";
import { seededRandom } from "../../../src/core/random.js";
import { locals, match, seqOf, seqs } from "../../helpers/index-paths.js";

/** Stores path[from..] for the rank, chained below path[from-1]. */
function store(idx: PrefixIndex, rank: number, tier: StorageTier, path: readonly number[], from = 0): boolean {
  const parent = from === 0 ? null : seqOf(path.slice(0, from));
  return idx.applyStored(rank, tier, parent, seqs(path).subarray(2 * from), locals(path).subarray(2 * from));
}

function remove(idx: PrefixIndex, rank: number, tier: StorageTier, path: readonly number[], depth: number): number {
  return idx.applyRemoved(rank, tier, hashListFromBigInts([seqOf(path.slice(0, depth))]));
}

/**
 * A random source index over `ranks` ranks: chains in every tier from a few shared prefixes
 * (ids 1..4 at the first blocks, so most nodes are held by several ranks), some evicted (gaps:
 * detached device holders and blocks cut off from the root).
 */
function randomIndex(seed: number, ranks: number, ops = 800): PrefixIndex {
  const rnd = seededRandom(seed);
  const idx = new PrefixIndex();
  const path = (len: number): number[] => Array.from({ length: len }, (_, d) => 1 + Math.floor(rnd.next() * (d < 2 ? 2 : 5)));
  for (let op = 0; op < ops; op++) {
    const rank = Math.floor(rnd.next() * ranks);
    const tier = STORAGE_TIERS[rnd.next() < 0.7 ? 0 : rnd.next() < 0.5 ? 1 : 2] as StorageTier;
    const p = path(1 + Math.floor(rnd.next() * 7));
    if (rnd.next() < 0.85) store(idx, rank, tier, p);
    else remove(idx, rank, tier, p, 1 + Math.floor(rnd.next() * p.length));
  }
  return idx;
}

/** What an index answers: sizes, each rank's size and dump, matches over many paths, shed pairs, parked blocks. */
function observe(idx: PrefixIndex, ranks: number, seed: number): unknown {
  const rnd = seededRandom(seed);
  const queries = Array.from({ length: 300 }, () => Array.from({ length: 1 + Math.floor(rnd.next() * 8) }, (_, d) => 1 + Math.floor(rnd.next() * (d < 2 ? 2 : 5))));
  return {
    size: idx.size,
    nodes: idx.nodeCount,
    shed: idx.shedPairs,
    parked: idx.detached.blocks,
    ranks: Array.from({ length: ranks }, (_, r) => [idx.rankSize(r), idx.dumpRank(r)]),
    matches: queries.map((q) => match(idx, q)),
  };
}

/** Rank r of the image is installed as rank key `keyOf(r)`: keys out of the exporter's order, so the builder's sort matters. */
const keyOf = (r: number, ranks: number): number => (r * 7) % ranks;

describe("PrefixTreeBuilder + PrefixIndex.adoptTree (the warm join's whole-tree install)", () => {
  it.each([1, 2, 3, 4, 5, 6])("gives the same index as importRankEntries rank by rank, on random multi-tier, multi-rank data (seed %i)", (seed) => {
    const RANKS = 16;
    const src = randomIndex(seed, RANKS);
    const perRank = new PrefixIndex();
    const builder = new PrefixTreeBuilder();
    for (let r = 0; r < RANKS; r++) {
      const e = src.exportRankEntries(r);
      // Half with the lookup built ahead (the decoding thread's), half without. Each import
      // adopts the table it is given (its slots rewritten in place): one each.
      const given = (): RankEntries => (r % 2 === 0 ? withRankLookup(e) : e);
      perRank.importRankEntries(keyOf(r, RANKS), given());
      builder.add(keyOf(r, RANKS), given());
    }
    const adopted = new PrefixIndex();
    adopted.adoptTree(builder.build());
    expect(adopted.size).toBeGreaterThan(0);
    expect(observe(adopted, RANKS, seed)).toEqual(observe(perRank, RANKS, seed));
    // The adopted index keeps working: evict, store, clear on top of it (device sets that were views).
    for (const c of [perRank, adopted]) {
      remove(c, 1, "device", [1, 1], 1);
      store(c, 1, "device", [1, 1, 3, 4]);
      store(c, 2, "host", [2, 1, 5]);
      for (let r = 0; r < RANKS; r += 3) store(c, r, "device", [1, 2, 3, 4, 5, 1]);
      c.applyCleared(5);
    }
    expect(observe(adopted, RANKS, seed + 100)).toEqual(observe(perRank, RANKS, seed + 100));
  });

  it.each([1, 2, 3])("applies each rank's bound as importRankEntries does, counting the shed (seed %i)", (seed) => {
    const RANKS = 8;
    const src = randomIndex(seed, RANKS);
    const perRank = new PrefixIndex();
    const builder = new PrefixTreeBuilder();
    let shed = 0;
    for (let r = 0; r < RANKS; r++) {
      const e = src.exportRankEntries(r);
      const bound = 1 + (r % 4) * 3;
      shed += Math.max(0, e.entryNode.length - bound);
      perRank.importRankEntries(r, withRankLookup(e), bound);
      builder.add(r, withRankLookup(e), bound);
    }
    expect(shed).toBeGreaterThan(0);
    const adopted = new PrefixIndex();
    adopted.adoptTree(builder.build());
    expect(adopted.shedPairs).toBe(shed);
    expect(observe(adopted, RANKS, seed)).toEqual(observe(perRank, RANKS, seed));
  });

  it("replaces the image's ranks over live state, keeps the others' and a keepOwn rank's blocks and parked chains", () => {
    const RANKS = 10;
    const src = randomIndex(9, RANKS);
    const live = (idx: PrefixIndex): void => {
      // Live blocks (no gaps, so a carry-over keeps every one): ranks 0..3 in the image, 20 and 21 not.
      for (const r of [0, 1, 2, 3, 20, 21]) {
        store(idx, r, "device", [1, 2, 3, 4]);
        store(idx, r, "host", [2, 2, 9]);
      }
      // Parked chains: rank 1's goes with its replaced blocks, rank 21's and rank 3's stay.
      for (const r of [1, 3, 21]) expect(idx.applyStoredOrPark(r, "device", seqOf([7, 7]), seqs([7, 7, 8]).subarray(4), locals([7, 7, 8]).subarray(4))).toBe("parked");
    };
    const keepOwn = (r: number): boolean => r === 3;
    const perRank = new PrefixIndex();
    live(perRank);
    const builder = new PrefixTreeBuilder();
    for (let r = 0; r < RANKS; r++) {
      const e = src.exportRankEntries(r);
      builder.add(r, withRankLookup(e));
      if (!keepOwn(r)) perRank.importRankEntries(r, withRankLookup(e));
    }
    const adopted = new PrefixIndex();
    live(adopted);
    adopted.adoptTree(builder.build(), keepOwn);
    expect(adopted.detached.blocks).toBe(2);
    expect(observe(adopted, 22, 9)).toEqual(observe(perRank, 22, 9));
    // The kept chains still attach once their parent is stored.
    for (const c of [perRank, adopted]) {
      expect(c.applyStoredOrPark(21, "device", null, seqs([7, 7]), locals([7, 7]))).toBe("stored");
      expect(c.applyStoredOrPark(3, "device", null, seqs([7, 7]), locals([7, 7]))).toBe("stored");
    }
    expect(adopted.detached.blocks).toBe(0);
    expect(observe(adopted, 22, 10)).toEqual(observe(perRank, 22, 10));
  });

  it("skips a repeated (tier, hash) of a rank without a lookup, as importRankEntries does", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2]);
    const e = idx.exportRankEntries(0);
    const dup: RankEntries = { ...e, entryHashes: Uint32Array.from([...e.entryHashes.subarray(0, 2), ...e.entryHashes.subarray(0, 2)]) };
    const perRank = new PrefixIndex();
    perRank.importRankEntries(0, dup);
    const builder = new PrefixTreeBuilder();
    builder.add(0, dup);
    const adopted = new PrefixIndex();
    adopted.adoptTree(builder.build());
    expect(adopted.size).toBe(1);
    expect(observe(adopted, 1, 3)).toEqual(observe(perRank, 1, 3));
  });

  it("refuses a rank added twice (a malformed snapshot names each rank once)", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2]);
    const builder = new PrefixTreeBuilder();
    builder.add(4, idx.exportRankEntries(0));
    let err: unknown;
    try {
      builder.add(4, idx.exportRankEntries(0));
    } catch (e) {
      err = e;
    }
    expect(isKvmeshError(err)).toBe(true);
    expect(String(err)).toMatch(/rank 4 is in the index snapshot twice/);
  });

  it("an empty image leaves an index's blocks as they were", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2, 3]);
    store(idx, 1, "disk", [1, 4]);
    const before = observe(idx, 2, 1);
    idx.adoptTree(new PrefixTreeBuilder().build());
    expect(observe(idx, 2, 1)).toEqual(before);
  });
});

describe("IndexTreeMerger (the decoding thread's side of the whole-tree install)", () => {
  const snapshot = (workerId: bigint, blockSize: number, entries: RankEntries): IndexRankSnapshot => ({ modelName: "m", routingGroup: "g", blockSize, workerId, dpRank: 0, position: { seq: 3n, digest: null }, entries });
  const target = (workerId: bigint, rank: number, bound = Infinity): IndexRankTarget => ({ modelName: "m", routingGroup: "g", blockSize: 16, workerId, dpRank: 0, rank, bound });

  it("merges the ranks it has a target for (at their rank key and bound), hands the others back whole, and builds one tree per partition", () => {
    const src = new PrefixIndex();
    store(src, 0, "device", [1, 2, 3]);
    store(src, 1, "device", [1, 2, 4, 5]);
    const m = new IndexTreeMerger([target(1n, 7), target(2n, 3, 2)]);
    const { merged, rest } = m.take([snapshot(1n, 16, src.exportRankEntries(0)), snapshot(2n, 16, src.exportRankEntries(1)), snapshot(3n, 16, src.exportRankEntries(1)), snapshot(1n, 32, src.exportRankEntries(0))]);
    expect(merged.map((x) => [x.workerId, x.rank, x.blocks, x.position?.seq])).toEqual([
      [1n, 7, 3, 3n],
      [2n, 3, 2, 3n],
    ]);
    // No target (worker 3) or another block size: installed rank by rank instead.
    expect(rest.map((x) => [x.workerId, x.blockSize])).toEqual([
      [3n, 16],
      [1n, 32],
    ]);
    const trees = m.build();
    expect(trees.map((t) => [t.modelName, t.routingGroup])).toEqual([["m", "g"]]);
    const idx = new PrefixIndex();
    idx.adoptTree((trees[0] as IndexPartitionTree).image);
    expect(match(idx, [1, 2, 4, 5])).toEqual({ 3: [2, 0, 0], 7: [2, 0, 0] });
    expect(idx.shedPairs).toBe(2);
  });

  it("refuses a snapshot naming a rank twice (the pull fails and the joiner tries another peer)", () => {
    const src = new PrefixIndex();
    store(src, 0, "device", [1, 2]);
    const m = new IndexTreeMerger([target(1n, 0)]);
    expect(() => m.take([snapshot(1n, 16, src.exportRankEntries(0)), snapshot(1n, 16, src.exportRankEntries(0))])).toThrow(/twice/);
  });
});
