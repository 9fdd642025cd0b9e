import { describe, it, expect } from "vitest";
import { PrefixIndex, STORAGE_TIERS, withRankLookup, type RankEntries, type StorageTier } from "../../../src/core/prefix-index.js";
import { hashListFromBigInts } from "../../../src/core/hash64.js";
import { localOf, locals, match, scores, seqOf, seqs, type Scores } from "../../helpers/index-paths.js";
import { seededRandom, type Random } from "../../../src/core/random.js";

/** Stores path[from..] for the rank, chained below path[from-1]. */
function store(idx: PrefixIndex, rank: number, tier: StorageTier, path: readonly number[], from = 0): boolean {
  const s = seqs(path);
  const l = locals(path);
  const parent = from === 0 ? null : seqOf(path.slice(0, from));
  return idx.applyStored(rank, tier, parent, s.subarray(2 * from), l.subarray(2 * from));
}

/** Removes the blocks path[0..k] for each k in `depths` (1-based prefix lengths). */
function remove(idx: PrefixIndex, rank: number, tier: StorageTier, path: readonly number[], depths: readonly number[]): number {
  return idx.applyRemoved(rank, tier, hashListFromBigInts(depths.map((d) => seqOf(path.slice(0, d)))));
}

describe("PrefixIndex: stored / removed / cleared", () => {
  it("scores a rank by the consecutive leading blocks it holds", () => {
    const idx = new PrefixIndex();
    expect(store(idx, 0, "device", [1, 2, 3])).toBe(true);
    expect(idx.size).toBe(3);
    expect(idx.nodeCount).toBe(3);
    expect(match(idx, [1, 2, 3, 4])).toEqual({ 0: [3, 0, 0] });
    expect(match(idx, [1, 2])).toEqual({ 0: [2, 0, 0] });
    expect(match(idx, [1, 9, 3])).toEqual({ 0: [1, 0, 0] });
    // Overlap is a prefix property: holding block 2 does not help a request starting with it.
    expect(match(idx, [2, 3])).toEqual({});
    expect(match(idx, [])).toEqual({});
  });

  it("chains a stored event below its parent hash", () => {
    const idx = new PrefixIndex();
    expect(store(idx, 4, "device", [1, 2])).toBe(true);
    expect(store(idx, 4, "device", [1, 2, 3, 4], 2)).toBe(true);
    expect(match(idx, [1, 2, 3, 4])).toEqual({ 4: [4, 0, 0] });
    expect(idx.nodeCount).toBe(4);
  });

  it("drops an event whose parent this rank does not hold, changing nothing", () => {
    const idx = new PrefixIndex();
    expect(store(idx, 0, "device", [1, 2, 3], 1)).toBe(false);
    expect(idx.size).toBe(0);
    expect(idx.nodeCount).toBe(0);
    // Another rank holding the parent does not make it known to this rank.
    expect(store(idx, 1, "device", [1])).toBe(true);
    expect(store(idx, 0, "device", [1, 2], 1)).toBe(false);
    expect(match(idx, [1, 2])).toEqual({ 1: [1, 0, 0] });
    expect(idx.size).toBe(1);
  });

  it("removing a middle block stops the match there; storing it again restores the full match", () => {
    const idx = new PrefixIndex();
    const path = [1, 2, 3, 4, 5];
    store(idx, 0, "device", path);
    store(idx, 1, "device", path);
    expect(remove(idx, 0, "device", path, [3])).toBe(1);
    expect(match(idx, path)).toEqual({ 0: [2, 0, 0], 1: [5, 0, 0] });
    expect(idx.size).toBe(9);
    expect(store(idx, 0, "device", path.slice(0, 3), 2)).toBe(true);
    expect(match(idx, path)).toEqual({ 0: [5, 0, 0], 1: [5, 0, 0] });
    // Two gaps, filled in the opposite order.
    remove(idx, 0, "device", path, [2, 4]);
    expect(match(idx, path)).toEqual({ 0: [1, 0, 0], 1: [5, 0, 0] });
    store(idx, 0, "device", path.slice(0, 4), 3);
    expect(match(idx, path)).toEqual({ 0: [1, 0, 0], 1: [5, 0, 0] });
    store(idx, 0, "device", path.slice(0, 2), 1);
    expect(match(idx, path)).toEqual({ 0: [5, 0, 0], 1: [5, 0, 0] });
  });

  it("ignores unknown hashes on removal and counts only real removals", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2]);
    expect(remove(idx, 0, "device", [1, 2], [2, 2])).toBe(1);
    expect(remove(idx, 0, "host", [1, 2], [1])).toBe(0); // held in device, not host
    expect(remove(idx, 7, "device", [1], [1])).toBe(0); // unknown rank
    expect(idx.size).toBe(1);
    expect(idx.nodeCount).toBe(1);
  });

  it("cleared drops every tier of the rank and prunes its nodes", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2]);
    store(idx, 0, "host", [1, 2, 3], 2);
    store(idx, 1, "device", [1]);
    idx.applyCleared(0);
    expect(match(idx, [1, 2, 3])).toEqual({ 1: [1, 0, 0] });
    expect(idx.size).toBe(1);
    expect(idx.rankSize(0)).toBe(0);
    expect(idx.nodeCount).toBe(1);
    // The rank can store again from scratch.
    expect(store(idx, 0, "device", [1, 2], 1)).toBe(false);
    expect(store(idx, 0, "device", [1, 2])).toBe(true);
    expect(match(idx, [1, 2])).toEqual({ 0: [2, 0, 0], 1: [1, 0, 0] });
  });

  it("removeRank removes everything of that rank and prunes nodes only it held", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2, 3, 4]);
    store(idx, 1, "device", [1, 2, 7]);
    store(idx, 0, "disk", [9, 9]);
    expect(idx.nodeCount).toBe(7);
    idx.removeRank(0);
    expect(idx.size).toBe(3);
    expect(idx.nodeCount).toBe(3);
    expect(match(idx, [1, 2, 3, 4])).toEqual({ 1: [2, 0, 0] });
    expect(match(idx, [9, 9])).toEqual({});
    idx.removeRank(1);
    expect(idx.size).toBe(0);
    expect(idx.nodeCount).toBe(0);
    expect(idx.approxBytes).toBeGreaterThan(0);
  });

  it("re-storing a held hash is idempotent", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2]);
    store(idx, 0, "device", [1, 2]);
    expect(idx.size).toBe(2);
    expect(match(idx, [1, 2])).toEqual({ 0: [2, 0, 0] });
  });

  it("rejects rank keys outside [0, 2^20) and mismatched hash lists", () => {
    const idx = new PrefixIndex();
    expect(() => store(idx, -1, "device", [1])).toThrow(RangeError);
    expect(() => store(idx, 2 ** 20, "device", [1])).toThrow(RangeError);
    expect(() => idx.applyStored(0, "device", null, seqs([1, 2]), locals([1]))).toThrow(RangeError);
    expect(() => { idx.applyCleared(1.5); }).toThrow(RangeError);
    expect(idx.size).toBe(0);
  });
});

describe("PrefixIndex: storage tiers", () => {
  it("reports host and disk as extensions beyond the device prefix", () => {
    const idx = new PrefixIndex();
    const path = [1, 2, 3, 4, 5, 6];
    store(idx, 0, "device", path.slice(0, 2));
    store(idx, 0, "host", path.slice(0, 4), 2);
    store(idx, 0, "disk", path.slice(0, 5), 4);
    expect(match(idx, path)).toEqual({ 0: [2, 2, 1] });
    expect(match(idx, path.slice(0, 3))).toEqual({ 0: [2, 1, 0] });
    expect(STORAGE_TIERS).toEqual(["device", "host", "disk"]);
  });

  it("lists a rank holding only lower tiers, with device 0", () => {
    const idx = new PrefixIndex();
    store(idx, 3, "host", [1, 2]);
    store(idx, 5, "disk", [1, 2, 3]);
    expect(match(idx, [1, 2, 3])).toEqual({ 3: [0, 2, 0], 5: [0, 0, 3] });
  });

  it("host extension stops at a block held only on disk; disk extension counts host and device blocks", () => {
    const idx = new PrefixIndex();
    const path = [1, 2, 3, 4];
    store(idx, 0, "device", path.slice(0, 1));
    store(idx, 0, "disk", path.slice(0, 2), 1);
    store(idx, 0, "host", path.slice(0, 3), 2);
    store(idx, 0, "device", path, 3); // device block whose device chain is broken (detached)
    expect(match(idx, path)).toEqual({ 0: [1, 0, 3] });
  });

  it("a device block past a device gap counts as host-or-device when the gap is in host", () => {
    const idx = new PrefixIndex();
    const path = [1, 2, 3];
    store(idx, 0, "device", path);
    remove(idx, 0, "device", path, [2]);
    expect(match(idx, path)).toEqual({ 0: [1, 0, 0] });
    store(idx, 0, "host", path.slice(0, 2), 1);
    expect(match(idx, path)).toEqual({ 0: [1, 2, 0] });
    remove(idx, 0, "host", path, [2]);
    expect(match(idx, path)).toEqual({ 0: [1, 0, 0] });
  });

  it("the same block held in device and host counts once, in device", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2]);
    store(idx, 0, "host", [1, 2]);
    expect(idx.size).toBe(4);
    expect(match(idx, [1, 2])).toEqual({ 0: [2, 0, 0] });
    remove(idx, 0, "device", [1, 2], [1, 2]);
    expect(match(idx, [1, 2])).toEqual({ 0: [0, 2, 0] });
  });
});

describe("PrefixIndex: many ranks", () => {
  it("scores many ranks sharing prefixes of different lengths", () => {
    const idx = new PrefixIndex();
    const prefix = Array.from({ length: 20 }, (_, i) => 100 + i);
    const expected: Scores = {};
    for (let r = 0; r < 300; r++) {
      const held = (r % 20) + 1;
      const path = [...prefix.slice(0, held), 1000 + r]; // plus one block of its own
      store(idx, r, "device", path);
      expected[r] = [held, 0, 0];
    }
    expect(match(idx, prefix)).toEqual(expected);
    expect(idx.nodeCount).toBe(20 + 300);
    // A request that diverges after block 5.
    const diverging = [...prefix.slice(0, 5), 7];
    const exp5: Scores = {};
    for (let r = 0; r < 300; r++) exp5[r] = [Math.min((r % 20) + 1, 5), 0, 0];
    expect(match(idx, diverging)).toEqual(exp5);
    // Few dropouts among many members (the binary-search path): evict block 10 from ranks 7 and 250.
    remove(idx, 7, "device", prefix, [10]); // rank 7 held 8 blocks: unaffected
    remove(idx, 259, "device", prefix, [10]); // rank 259 held 20
    expect(match(idx, prefix)[259]).toEqual([9, 0, 0]);
    expect(match(idx, prefix)[7]).toEqual([8, 0, 0]);
    expect(match(idx, prefix)[279]).toEqual([20, 0, 0]);
  });

  it("returns a reused buffer: the caller copies before the next call", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1]);
    store(idx, 1, "device", [2]);
    const a = idx.findMatches(locals([1]));
    const b = idx.findMatches(locals([2]));
    expect(a).toBe(b);
    expect(scores(b)).toEqual({ 1: [1, 0, 0] });
  });
});

describe("PrefixIndex: dumpRank", () => {
  it("round-trips through applyStored into an empty index", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2, 3, 4]);
    store(idx, 0, "device", [1, 2, 5, 6], 2); // branch
    store(idx, 0, "host", [1, 2, 3, 4, 7], 4);
    store(idx, 0, "disk", [8, 9]);
    store(idx, 1, "device", [1, 2]);
    remove(idx, 0, "device", [1, 2, 3, 4], [3]);
    store(idx, 0, "host", [1, 2, 3], 2); // the device gap is now filled by host
    const copy = new PrefixIndex();
    for (const rank of [0, 1]) {
      for (const ev of idx.dumpRank(rank)) {
        expect(
          copy.applyStored(rank, ev.tier, ev.parentHash, hashListFromBigInts(ev.blockHashes), hashListFromBigInts(ev.localHashes)),
        ).toBe(true);
      }
    }
    expect(copy.size).toBe(idx.size);
    expect(copy.nodeCount).toBe(idx.nodeCount);
    expect(copy.rankSize(0)).toBe(idx.rankSize(0));
    for (const q of [[1, 2, 3, 4, 7], [1, 2, 5, 6], [8, 9], [1, 2, 3]]) expect(match(copy, q)).toEqual(match(idx, q));
    expect(match(copy, [1, 2, 3, 4, 7])).toEqual({ 0: [2, 3, 0], 1: [2, 0, 0] });
    expect(idx.dumpRank(0).every((e) => e.blockHashes.length === e.localHashes.length)).toBe(true);
    expect(idx.dumpRank(42)).toEqual([]);
  });

  it("leaves out blocks cut off by a gap the rank holds in no tier", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2, 3]);
    remove(idx, 0, "device", [1, 2, 3], [2]);
    const events = idx.dumpRank(0);
    expect(events).toEqual([{ tier: "device", parentHash: null, blockHashes: [seqOf([1])], localHashes: [localOf(1)] }]);
  });
});

describe("PrefixIndex: exportRankEntries / importRankEntries (the warm join's bulk copy)", () => {
  function fixture(): PrefixIndex {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2, 3, 4]);
    store(idx, 0, "device", [1, 2, 5, 6], 2);
    store(idx, 0, "host", [1, 2, 3, 4, 7], 4);
    store(idx, 0, "disk", [8, 9]);
    store(idx, 1, "device", [1, 2]);
    remove(idx, 0, "device", [1, 2, 3, 4], [3]);
    store(idx, 0, "host", [1, 2, 3], 2);
    return idx;
  }

  it("copies ranks into another index: nodes parents first, entries in node order, matches equal", () => {
    const idx = fixture();
    const e = idx.exportRankEntries(0);
    for (let i = 0; i < e.nodeParent.length; i++) expect(e.nodeParent[i]).toBeLessThan(i);
    for (let i = 1; i < e.entryNode.length; i++) expect(e.entryNode[i]).toBeGreaterThanOrEqual(e.entryNode[i - 1] as number);
    expect(e.entryNode.length).toBe(idx.rankSize(0));
    const copy = new PrefixIndex();
    expect(copy.importRankEntries(0, e)).toBe(idx.rankSize(0));
    expect(copy.importRankEntries(1, idx.exportRankEntries(1))).toBe(2);
    expect(copy.size).toBe(idx.size);
    expect(copy.nodeCount).toBe(idx.nodeCount);
    for (const q of [[1, 2, 3, 4, 7], [1, 2, 5, 6], [8, 9], [1, 2, 3]]) expect(match(copy, q)).toEqual(match(idx, q));
    expect(match(copy, [1, 2, 3, 4, 7])).toEqual({ 0: [2, 3, 0], 1: [2, 0, 0] });
    expect(idx.exportRankEntries(42).entryNode.length).toBe(0);
  });

  it("replaces what the rank held, and a later stored event chains below an imported block", () => {
    const idx = fixture();
    const copy = new PrefixIndex();
    store(copy, 0, "device", [5, 5, 5]);
    copy.importRankEntries(0, idx.exportRankEntries(0));
    expect(match(copy, [5, 5, 5])).toEqual({});
    expect(store(copy, 0, "device", [1, 2, 5, 6, 9], 4)).toBe(true);
    expect(match(copy, [1, 2, 5, 6, 9])).toEqual({ 0: [5, 0, 0] });
  });

  it("leaves out blocks cut off by a gap the rank holds in no tier", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2, 3]);
    remove(idx, 0, "device", [1, 2, 3], [2]);
    const e = idx.exportRankEntries(0);
    expect(Array.from(e.nodeParent)).toEqual([-1]);
    expect(e.entryNode.length).toBe(1);
  });

  it("keeps a device block whose parent the rank holds only in host detached, as applyStored does", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "host", [1]);
    store(idx, 0, "device", [1, 2], 1);
    const copy = new PrefixIndex();
    copy.importRankEntries(0, idx.exportRankEntries(0));
    expect(match(copy, [1, 2])).toEqual(match(idx, [1, 2]));
    // Storing the parent in device attaches it.
    store(copy, 0, "device", [1]);
    store(idx, 0, "device", [1]);
    expect(match(copy, [1, 2])).toEqual({ 0: [2, 0, 0] });
    expect(match(idx, [1, 2])).toEqual(match(copy, [1, 2]));
  });

  it("stops at maxRankPairs, counting the rest as shed, and leaves no holderless node behind", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2, 3, 4, 5]);
    const copy = new PrefixIndex();
    expect(copy.importRankEntries(0, idx.exportRankEntries(0), 3)).toBe(3);
    expect(copy.shedPairs).toBe(2);
    expect(copy.nodeCount).toBe(3);
    expect(match(copy, [1, 2, 3, 4, 5])).toEqual({ 0: [3, 0, 0] });
  });

  it("skips an entry whose (tier, hash) is taken already, pruning a node left with no holder", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2]);
    const e = idx.exportRankEntries(0);
    // Both entries name the first hash: the second (on node 1) is a repeat.
    const dup = { ...e, entryHashes: Uint32Array.from([...e.entryHashes.subarray(0, 2), ...e.entryHashes.subarray(0, 2)]) };
    const copy = new PrefixIndex();
    expect(copy.importRankEntries(0, dup)).toBe(1);
    expect(copy.nodeCount).toBe(1);
    expect(copy.size).toBe(1);
  });
});

describe("PrefixIndex: importRankEntries adopting a lookup built ahead (withRankLookup, the decoding thread's)", () => {
  /** A random index over `ranks` ranks: chains in every tier sharing prefixes, some evicted. */
  function randomIndex(seed: number, ranks: number): PrefixIndex {
    const rnd = seededRandom(seed);
    const idx = new PrefixIndex();
    const path = (len: number): number[] => Array.from({ length: len }, () => 1 + Math.floor(rnd.next() * 4));
    for (let op = 0; op < 600; op++) {
      const rank = Math.floor(rnd.next() * ranks);
      const tier = STORAGE_TIERS[rnd.next() < 0.7 ? 0 : rnd.next() < 0.5 ? 1 : 2] as StorageTier;
      const p = path(1 + Math.floor(rnd.next() * 6));
      if (rnd.next() < 0.8) store(idx, rank, tier, p);
      else remove(idx, rank, tier, p, [1 + Math.floor(rnd.next() * p.length)]);
    }
    return idx;
  }

  /** What a copy answers: sizes, each rank's dump, and matches over many paths. */
  function observe(idx: PrefixIndex, ranks: number, seed: number): unknown {
    const rnd = seededRandom(seed);
    const queries = Array.from({ length: 200 }, () => Array.from({ length: 1 + Math.floor(rnd.next() * 7) }, () => 1 + Math.floor(rnd.next() * 4)));
    return {
      size: idx.size,
      nodes: idx.nodeCount,
      ranks: Array.from({ length: ranks }, (_, r) => [idx.rankSize(r), idx.dumpRank(r)]),
      matches: queries.map((q) => match(idx, q)),
    };
  }

  it.each([1, 2, 3, 4])("gives the same index as entry-by-entry inserts on random data (seed %i)", (seed) => {
    const RANKS = 12;
    const src = randomIndex(seed, RANKS);
    const perEntry = new PrefixIndex();
    const adopted = new PrefixIndex();
    // Both start with state of their own that the import replaces (and a rank it keeps).
    for (const c of [perEntry, adopted]) {
      store(c, 0, "device", [4, 4, 4]);
      store(c, RANKS, "host", [1, 2, 3]);
    }
    for (let r = 0; r < RANKS; r++) {
      const e = src.exportRankEntries(r);
      const ahead = withRankLookup(e);
      expect(ahead.lookup?.size).toBe(e.entryNode.length);
      // The export leaves out blocks cut off from the root by a gap: every exported entry goes in.
      expect(perEntry.importRankEntries(r, e)).toBe(e.entryNode.length);
      expect(adopted.importRankEntries(r, ahead)).toBe(e.entryNode.length);
    }
    expect(observe(adopted, RANKS + 1, seed)).toEqual(observe(perEntry, RANKS + 1, seed));
    // And the copy keeps working as an index: evict and store on top of an adopted table.
    for (const c of [perEntry, adopted]) {
      remove(c, 1, "device", [1, 2, 3], [2]);
      store(c, 1, "device", [1, 2, 3, 4]);
    }
    expect(observe(adopted, RANKS + 1, seed + 100)).toEqual(observe(perEntry, RANKS + 1, seed + 100));
  });

  it("drops a repeated (tier, hash) ahead, as the per-entry import skips it", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2]);
    const e = idx.exportRankEntries(0);
    const dup: RankEntries = { ...e, entryHashes: Uint32Array.from([...e.entryHashes.subarray(0, 2), ...e.entryHashes.subarray(0, 2)]) };
    const ahead = withRankLookup(dup);
    expect(ahead.entryNode.length).toBe(1);
    expect(ahead.lookup?.size).toBe(1);
    const a = new PrefixIndex();
    const b = new PrefixIndex();
    expect(a.importRankEntries(0, dup)).toBe(1);
    expect(b.importRankEntries(0, ahead)).toBe(1);
    expect(observe(b, 1, 7)).toEqual(observe(a, 1, 7));
  });

  it("falls back to entry-by-entry inserts when the rank does not fit its bound, counting the shed", () => {
    const idx = new PrefixIndex();
    store(idx, 0, "device", [1, 2, 3, 4, 5]);
    const copy = new PrefixIndex();
    expect(copy.importRankEntries(0, withRankLookup(idx.exportRankEntries(0)), 3)).toBe(3);
    expect(copy.shedPairs).toBe(2);
    expect(copy.nodeCount).toBe(3);
    expect(match(copy, [1, 2, 3, 4, 5])).toEqual({ 0: [3, 0, 0] });
  });
});

// ---------------------------------------------------------------- randomized model check

/** Naive model: per rank and tier, the set of held paths (as "1,2,3" keys). */
class NaiveIndex {
  /** rank -> tier -> held path key ("1,2,3") -> the path. */
  readonly held = new Map<number, Map<StorageTier, Map<string, number[]>>>();
  // Kept as the sets change, so that checking size and node count after every operation costs
  // what the change costs, not a walk of everything held (same values as recounting).
  #size = 0;
  /** Prefix key -> how many held (rank, tier, path) entries have it as a prefix. */
  readonly #prefixRefs = new Map<string, number>();

  #tiers(rank: number): Map<StorageTier, Map<string, number[]>> {
    let m = this.held.get(rank);
    if (m === undefined) {
      m = new Map(STORAGE_TIERS.map((t) => [t, new Map<string, number[]>()]));
      this.held.set(rank, m);
    }
    return m;
  }

  #ref(path: readonly number[], by: 1 | -1): void {
    for (let d = 1; d <= path.length; d++) {
      const k = path.slice(0, d).join(",");
      const n = (this.#prefixRefs.get(k) ?? 0) + by;
      if (n === 0) this.#prefixRefs.delete(k);
      else this.#prefixRefs.set(k, n);
    }
  }

  holds(rank: number, tiers: readonly StorageTier[], key: string): boolean {
    const m = this.held.get(rank);
    return m !== undefined && tiers.some((t) => m.get(t)?.has(key) ?? false);
  }

  stored(rank: number, tier: StorageTier, path: readonly number[], from: number): boolean {
    if (from > 0 && !this.holds(rank, STORAGE_TIERS, path.slice(0, from).join(","))) return false;
    const set = this.#tiers(rank).get(tier) as Map<string, number[]>;
    for (let d = from + 1; d <= path.length; d++) {
      const key = path.slice(0, d).join(",");
      if (set.has(key)) continue;
      const prefix = path.slice(0, d);
      set.set(key, prefix);
      this.#size++;
      this.#ref(prefix, 1);
    }
    return true;
  }

  removed(rank: number, tier: StorageTier, keys: readonly string[]): number {
    const set = this.held.get(rank)?.get(tier);
    let n = 0;
    for (const k of keys) {
      const path = set?.get(k);
      if (path === undefined) continue;
      (set as Map<string, number[]>).delete(k);
      this.#size--;
      this.#ref(path, -1);
      n++;
    }
    return n;
  }

  cleared(rank: number): void {
    for (const set of this.held.get(rank)?.values() ?? []) {
      for (const path of set.values()) this.#ref(path, -1);
      this.#size -= set.size;
    }
    this.held.delete(rank);
  }

  size(): number {
    return this.#size;
  }

  /** Distinct held paths closed under prefixes: exactly the nodes a pruned tree keeps. */
  nodeCount(): number {
    return this.#prefixRefs.size;
  }

  match(path: readonly number[]): Scores {
    const out: Scores = {};
    for (const rank of this.held.keys()) {
      const key = (d: number): string => path.slice(0, d + 1).join(",");
      let x = 0;
      while (x < path.length && this.holds(rank, ["device"], key(x))) x++;
      let y = x;
      while (y < path.length && this.holds(rank, ["device", "host"], key(y))) y++;
      let z = y;
      while (z < path.length && this.holds(rank, STORAGE_TIERS, key(z))) z++;
      if (z > 0) out[rank] = [x, y - x, z - y];
    }
    return out;
  }

  heldPaths(rank: number, tier?: StorageTier): number[][] {
    const m = this.held.get(rank);
    if (m === undefined) return [];
    const out: number[][] = [];
    for (const [t, s] of m) if (tier === undefined || t === tier) for (const path of s.values()) out.push(path);
    return out;
  }
}

function pickOne<T>(rnd: Random, items: readonly T[]): T | undefined {
  return items.length === 0 ? undefined : items[Math.floor(rnd.next() * items.length)];
}

describe("PrefixIndex: randomized comparison with a naive model", () => {
  // 40 ranks exercise the binary-search dropout path (few dropouts out of >= 13 members).
  it.each([
    [1, 6],
    [2, 6],
    [3, 40],
  ])("agrees over 2,500 random stored/removed/cleared operations (seed %i, %i ranks)", (seed, RANKS) => {
    const rnd = seededRandom(seed);
    const idx = new PrefixIndex();
    const model = new NaiveIndex();
    const ALPHABET = 3; // tiny alphabet: paths collide, share prefixes and branch
    const randomPath = (len: number): number[] => Array.from({ length: len }, () => 1 + Math.floor(rnd.next() * ALPHABET));
    const tierOf = (): StorageTier => {
      const r = rnd.next();
      return r < 0.6 ? "device" : r < 0.8 ? "host" : "disk";
    };
    const failures: string[] = [];
    const queries: number[][] = [];

    for (let op = 0; op < 2_500 && failures.length === 0; op++) {
      const rank = Math.floor(rnd.next() * RANKS);
      const r = rnd.next();
      let what: string;
      if (r < 0.55) {
        const tier = tierOf();
        let path: number[];
        let from: number;
        const base = rnd.next() < 0.7 ? pickOne(rnd, model.heldPaths(rank)) : undefined;
        if (base !== undefined) {
          from = base.length;
          path = [...base, ...randomPath(1 + Math.floor(rnd.next() * 3))];
        } else if (rnd.next() < 0.15) {
          path = randomPath(2 + Math.floor(rnd.next() * 3)); // parent probably unknown
          from = 1;
        } else {
          path = randomPath(1 + Math.floor(rnd.next() * 4));
          from = 0;
        }
        const want = model.stored(rank, tier, path, from);
        const got = store(idx, rank, tier, path, from);
        what = `stored r${rank} ${tier} [${path.join(",")}] from ${from}`;
        if (got !== want) failures.push(`op ${op} ${what}: returned ${got}, model ${want}`);
        queries.push(path);
      } else if (r < 0.97) {
        const tier = tierOf();
        const held = model.heldPaths(rank, tier);
        const victims: number[][] = [];
        const k = 1 + Math.floor(rnd.next() * 3);
        for (let i = 0; i < k; i++) {
          const v = rnd.next() < 0.85 ? pickOne(rnd, held) : randomPath(1 + Math.floor(rnd.next() * 4));
          if (v !== undefined) victims.push(v);
        }
        const want = model.removed(rank, tier, victims.map((v) => v.join(",")));
        const got = idx.applyRemoved(rank, tier, hashListFromBigInts(victims.map(seqOf)));
        what = `removed r${rank} ${tier} ${victims.map((v) => `[${v.join(",")}]`).join(" ")}`;
        if (got !== want) failures.push(`op ${op} ${what}: returned ${got}, model ${want}`);
      } else {
        model.cleared(rank);
        idx.applyCleared(rank);
        what = `cleared r${rank}`;
      }

      if (idx.size !== model.size()) failures.push(`op ${op} ${what}: size ${idx.size}, model ${model.size()}`);
      if (idx.nodeCount !== model.nodeCount()) {
        failures.push(`op ${op} ${what}: nodeCount ${idx.nodeCount}, model ${model.nodeCount()}`);
      }
      const probes = [randomPath(1 + Math.floor(rnd.next() * 8)), pickOne(rnd, queries) ?? [1]];
      const longest = pickOne(rnd, model.heldPaths(rank));
      if (longest !== undefined) probes.push([...longest, ...randomPath(2)]);
      for (const q of probes) {
        const got = JSON.stringify(match(idx, q));
        const want = JSON.stringify(model.match(q));
        if (got !== want) failures.push(`op ${op} ${what}: match [${q.join(",")}] got ${got}, model ${want}`);
      }
    }
    expect(failures).toEqual([]);

    // The final state also survives a dump round trip (matching-wise: orphans are left out).
    const copy = new PrefixIndex();
    for (let rank = 0; rank < RANKS; rank++) {
      for (const ev of idx.dumpRank(rank)) {
        const ok = copy.applyStored(
          rank,
          ev.tier,
          ev.parentHash,
          hashListFromBigInts(ev.blockHashes),
          hashListFromBigInts(ev.localHashes),
        );
        if (!ok) failures.push(`dump replay of rank ${rank} dropped an event`);
      }
    }
    for (let i = 0; i < 300; i++) {
      const q = i % 2 === 0 ? randomPath(1 + Math.floor(rnd.next() * 8)) : (pickOne(rnd, queries) ?? [1]);
      const got = JSON.stringify(match(copy, q));
      const want = JSON.stringify(model.match(q));
      if (got !== want) failures.push(`dump copy: match [${q.join(",")}] got ${got}, model ${want}`);
    }
    expect(copy.size).toBeLessThanOrEqual(idx.size);
    expect(failures).toEqual([]);

    // And through the warm join's bulk export and import: the same state as the dump's replay.
    const bulk = new PrefixIndex();
    for (let rank = 0; rank < RANKS; rank++) bulk.importRankEntries(rank, idx.exportRankEntries(rank));
    expect(bulk.size).toBe(copy.size);
    expect(bulk.nodeCount).toBe(copy.nodeCount);
    for (let rank = 0; rank < RANKS; rank++) expect(bulk.rankSize(rank)).toBe(copy.rankSize(rank));
    for (let i = 0; i < 300; i++) {
      const q = i % 2 === 0 ? randomPath(1 + Math.floor(rnd.next() * 8)) : (pickOne(rnd, queries) ?? [1]);
      const got = JSON.stringify(match(bulk, q));
      const want = JSON.stringify(model.match(q));
      if (got !== want) failures.push(`bulk copy: match [${q.join(",")}] got ${got}, model ${want}`);
    }
    expect(failures).toEqual([]);
  });
});
