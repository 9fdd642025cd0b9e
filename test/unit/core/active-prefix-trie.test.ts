import { describe, expect, it } from "vitest";
import { ManualClock } from "../../../src/core/time.js";
import { seededRandom, type Random } from "../../../src/core/random.js";
import { LoadLedger } from "../../../src/core/load-ledger.js";
import { ActivePrefixTrie } from "../../../src/core/active-prefix-trie.js";
import type { RankBlockTotals } from "../../../src/core/active-block-index.js";
import { ReferenceLedgerBlocks } from "./reference-ledger-blocks.js";

/**
 * Oracle: the ledger on the prefix tree against the per-hash index it replaced, driven as the
 * ledger drove it (reference-ledger-blocks.ts, beside this file), with the same randomised bookings,
 * frees, output blocks (decayed or not), rank removals and counts. Every count, every set of
 * ranks touched, every rank's active blocks (to the bit) and the distinct hash count must agree.
 */

/** A chained sequence hash: each names its whole prefix, as the real ones (XXH3 over the parent's). */
function chain(blocks: readonly number[]): Uint32Array {
  const out = new Uint32Array(2 * blocks.length);
  let hi = 0x1234567;
  let lo = 0x89abcdef;
  for (let i = 0; i < blocks.length; i++) {
    const b = blocks[i] as number;
    const nhi = Math.imul(hi ^ Math.imul(b + 1, 0x9e3779b1) ^ (lo >>> 7), 0x85ebca6b) ^ (lo >>> 13);
    const nlo = Math.imul(lo ^ nhi ^ Math.imul(b, 0x27d4eb2d), 0xc2b2ae35) ^ (nhi >>> 16);
    hi = nhi ^ (nlo >>> 11);
    lo = nlo;
    out[2 * i] = hi >>> 0;
    out[2 * i + 1] = lo >>> 0;
  }
  return out;
}

/** A list that breaks the chain rule: hashes of live lists out of order, repeated, or mixed. */
function brokenList(rng: Random, lists: Uint32Array[]): Uint32Array {
  const int = (n: number): number => Math.floor(rng.next() * n);
  const src = lists[int(lists.length)] as Uint32Array;
  const n = src.length >>> 1;
  const pairs: number[] = [];
  const kind = int(4);
  const len = 1 + int(Math.max(1, n));
  for (let i = 0; i < len; i++) {
    let j: number;
    if (kind === 0) j = int(n); // anywhere
    else if (kind === 1) j = Math.min(n - 1, 1 + i); // starts one in
    else if (kind === 2) j = i % Math.max(1, int(3) + 1); // repeats
    else j = n - 1 - (i % n); // reversed
    pairs.push(src[2 * j] as number, src[2 * j + 1] as number);
  }
  if (kind === 3 && lists.length > 1) {
    const other = lists[int(lists.length)] as Uint32Array;
    pairs.push(...other.subarray(0, 2 * Math.min(3, other.length >>> 1)));
  }
  return Uint32Array.from(pairs);
}

interface Scenario {
  seed: number;
  ranks: number;
  ops: number;
  /** Share of bookings whose list breaks the chain rule. */
  broken: number;
  /** Distinct block values: few means more shared prefixes and branches. */
  alphabet: number;
  maxBlocks: number;
}

function runOracle(sc: Scenario): { fellBack: boolean } {
  const rng = seededRandom(sc.seed);
  const int = (n: number): number => Math.floor(rng.next() * n);
  const clock = new ManualClock();
  const ledger = new LoadLedger({ clock, random: seededRandom(sc.seed + 1) });
  const ref = new ReferenceLedgerBlocks(seededRandom(sc.seed + 1));
  const live = new Map<string, { rank: number; list: Uint32Array }>();
  const sequences: number[][] = [];
  const groups = Array.from({ length: 4 }, () => Array.from({ length: 1 + int(sc.maxBlocks) }, () => int(sc.alphabet)));
  let nextId = 0;
  let sawBroken = false;

  const newSequence = (): number[] => {
    const r = rng.next();
    let base: number[];
    if (r < 0.35 && sequences.length > 0) base = (sequences[int(sequences.length)] as number[]).slice(); // a session's next turn
    else if (r < 0.6 && sequences.length > 0) {
      const s = sequences[int(sequences.length)] as number[];
      base = s.slice(0, int(s.length + 1)); // branches (or ends) inside an earlier prompt
    } else base = (groups[int(groups.length)] as number[]).slice(0, 1 + int(sc.maxBlocks)); // a system prompt
    const extra = rng.next() < 0.2 ? 0 : int(sc.maxBlocks);
    for (let i = 0; i < extra; i++) base.push(int(sc.alphabet));
    if (base.length === 0) base.push(int(sc.alphabet));
    sequences.push(base);
    if (sequences.length > 200) sequences.splice(int(sequences.length), 1);
    return base;
  };

  const out = new Int32Array(sc.ranks);
  const refOut = new Int32Array(sc.ranks);
  const touched: number[] = [];
  const refTouched: number[] = [];
  const check = (query: Uint32Array, label: string): void => {
    ledger.newBlocksFor(query, out, touched);
    ref.newBlocksFor(query, refOut, refTouched);
    expect(Array.from(out), label).toEqual(Array.from(refOut));
    expect([...touched].sort((a, b) => a - b), label).toEqual([...refTouched].sort((a, b) => a - b));
    for (const r of touched) out[r] = 0;
    for (const r of refTouched) refOut[r] = 0;
    touched.length = 0;
    refTouched.length = 0;
  };
  const compareTotals = (label: string): void => {
    expect(ledger.distinctActiveHashes, label).toBe(ref.distinctActiveHashes);
    for (let r = 0; r < sc.ranks; r++) expect(Object.is(ledger.activeBlocks(r), ref.activeBlocks(r)), `${label} rank ${r}: ${ledger.activeBlocks(r)} vs ${ref.activeBlocks(r)}`).toBe(true);
  };

  for (let op = 0; op < sc.ops; op++) {
    const r = rng.next();
    const liveIds = [...live.keys()];
    let label: string;
    if (r < 0.45 || liveIds.length === 0) {
      const id = `q${nextId++}`;
      const rank = int(sc.ranks);
      let list: Uint32Array;
      if (rng.next() < sc.broken && live.size > 0) {
        list = brokenList(rng, [...live.values()].map((l) => l.list));
        sawBroken = true;
      } else {
        list = chain(newSequence());
      }
      ledger.add(id, rank, list, { prefillTokens: 1, trackPrefill: true });
      ref.add(id, rank, list);
      live.set(id, { rank, list });
      label = `op ${op} add ${id} on ${rank}, ${list.length >>> 1} blocks`;
    } else if (r < 0.8) {
      const id = liveIds[int(liveIds.length)] as string;
      ledger.free(id);
      ref.free(id);
      live.delete(id);
      label = `op ${op} free ${id}`;
    } else if (r < 0.97) {
      const id = liveIds[int(liveIds.length)] as string;
      const decay = rng.next() < 0.3 ? undefined : [0, 0.25, 0.5, 0.8, 1][int(5)];
      ledger.addOutputBlock(id, decay);
      ref.addOutputBlock(id, decay);
      label = `op ${op} output ${id} decay ${String(decay)}`;
    } else {
      const rank = int(sc.ranks);
      for (const id of ledger.removeRank(rank)) live.delete(id);
      ref.removeRank(rank);
      label = `op ${op} remove rank ${rank}`;
    }
    compareTotals(label);
    check(chain(sequences[int(sequences.length)] ?? [1]), `${label}: count of an earlier prompt`);
    check(chain(newSequence()), `${label}: count of a new prompt`);
    if (live.size > 0) check(brokenList(rng, [...live.values()].map((l) => l.list)), `${label}: count of a broken list`);
    // Now and then everything leaves (the per-hash index hands back to the tree when empty).
    if (op % 250 === 249) {
      for (const id of [...live.keys()]) {
        ledger.free(id);
        ref.free(id);
        live.delete(id);
      }
      compareTotals(`${label}: all freed`);
      expect(ledger.distinctActiveHashes).toBe(0);
    }
  }
  return { fellBack: sawBroken };
}

describe("ActivePrefixTrie (the ledger's active blocks) against the per-hash index", () => {
  it("agrees on every count and total for chained prompts: sessions, shared system prompts, branches", () => {
    for (const seed of [1, 2]) runOracle({ seed, ranks: 5, ops: 800, broken: 0, alphabet: 3, maxBlocks: 12 });
  });

  it("agrees with many ranks and long prompts", () => {
    runOracle({ seed: 11, ranks: 40, ops: 400, broken: 0, alphabet: 2, maxBlocks: 60 });
  });

  it("agrees when some booking lists break the chain rule (handed to the per-hash index and back)", () => {
    for (const seed of [5, 6]) expect(runOracle({ seed, ranks: 4, ops: 700, broken: 0.05, alphabet: 3, maxBlocks: 10 }).fellBack).toBe(true);
  });
});

describe("ActivePrefixTrie", () => {
  const totals = (): RankBlockTotals => ({ uniqueBlocks: 0, fractionalCount: 0, fractionalDeficit: 0 });
  const count = (trie: ActivePrefixTrie, list: Uint32Array, ranks = 4): number[] => {
    const out = new Int32Array(ranks);
    trie.countHolders(list, out, []);
    return Array.from(out);
  };

  it("splits a node where a booking ends or branches inside it, in either half, and counts each half's holders", () => {
    const trie = new ActivePrefixTrie();
    const st = [totals(), totals()];
    const long = chain([1, 2, 3, 4, 5, 6, 7, 8]);
    trie.touchAll(long, 0, st[0] as RankBlockTotals);
    // Ends after 6 of 8: the shorter tail becomes the new node.
    trie.touchAll(long.slice(0, 12), 1, st[1] as RankBlockTotals);
    // Branches after 2: the shorter head becomes the new node.
    const branch = chain([1, 2, 9, 9]);
    trie.touchAll(branch, 1, st[1] as RankBlockTotals);
    expect(trie.size).toBe(10);
    expect(st.map((s) => s.uniqueBlocks)).toEqual([8, 8]);
    // Rank 1's two lists share their first 2 hashes: it holds 6 of `long` and all of `branch`.
    expect(count(trie, long)).toEqual([8, 6, 0, 0]);
    expect(count(trie, branch)).toEqual([2, 4, 0, 0]);
    trie.untouchAll(long, 0, st[0] as RankBlockTotals);
    expect(count(trie, long)).toEqual([0, 6, 0, 0]);
    expect(trie.size).toBe(8);
    trie.untouchAll(long.slice(0, 12), 1, st[1] as RankBlockTotals);
    trie.untouchAll(branch, 1, st[1] as RankBlockTotals);
    expect(trie.size).toBe(0);
    expect(st.map((s) => s.uniqueBlocks)).toEqual([0, 0]);
  });

  it("keys words of 2^31 and more as the words they are (the table and filter take them as int32)", () => {
    const trie = new ActivePrefixTrie();
    const st = [totals(), totals()];
    // Every word has its top bit set; a second list differs from the first only there.
    const high = Uint32Array.from(chain([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]), (w) => (w | 0x8000_0000) >>> 0);
    const low = Uint32Array.from(high, (w) => w & 0x7fff_ffff);
    trie.touchAll(high, 0, st[0] as RankBlockTotals);
    expect(count(trie, high)).toEqual([12, 0, 0, 0]);
    expect(count(trie, low)).toEqual([0, 0, 0, 0]);
    trie.touchAll(low, 1, st[1] as RankBlockTotals);
    // Past the child scan: a branch of high after 2 hashes found through the table.
    const branches = Array.from({ length: 12 }, (_, b) => {
      const l = high.slice();
      for (let i = 2; i < 12; i++) l[2 * i] = (0x8000_0000 + b * 7_919 + i) >>> 0;
      return l;
    });
    for (const l of branches) trie.touchAll(l, 2, st[0] as RankBlockTotals);
    expect(count(trie, branches[11] as Uint32Array)).toEqual([2, 0, 12, 0]);
    expect(count(trie, low)).toEqual([0, 12, 0, 0]);
    expect(trie.size).toBe(12 + 12 + 12 * 10);
    trie.untouchAll(high, 0, st[0] as RankBlockTotals);
    for (const l of branches) trie.untouchAll(l, 2, st[0] as RankBlockTotals);
    expect(count(trie, high)).toEqual([0, 0, 0, 0]);
    trie.untouchAll(low, 1, st[1] as RankBlockTotals);
    expect(trie.size).toBe(0);
    expect(trie.perHash).toBe(false);
  });

  it("hands a list that repeats a hash, or starts inside the tree, to the per-hash index until nothing is in flight", () => {
    const trie = new ActivePrefixTrie();
    const st = totals();
    const a = chain([1, 2, 3]);
    trie.touchAll(a, 0, st);
    expect(trie.perHash).toBe(false);
    const inside = a.slice(2); // starts at the second hash
    trie.touchAll(inside, 1, totals());
    expect(trie.perHash).toBe(true);
    expect(trie.fallbacks).toBe(1);
    expect(count(trie, a)).toEqual([3, 2, 0, 0]);
    trie.untouchAll(inside, 1, totals());
    expect(trie.perHash).toBe(true);
    trie.untouchAll(a, 0, st);
    expect(trie.perHash).toBe(false);
    expect(trie.size).toBe(0);
    const repeated = Uint32Array.from([...a.subarray(0, 2), ...a.subarray(0, 2)]);
    const st2 = totals();
    trie.touchAll(repeated, 2, st2);
    expect(trie.perHash).toBe(true);
    expect(st2.uniqueBlocks).toBe(1);
    expect(count(trie, repeated)).toEqual([0, 0, 2, 0]);
    // Rejected keys are not left behind: the per-hash index holds exactly one hash.
    expect(trie.size).toBe(1);
  });
});
