/**
 * The prefix index's apply paths were made cheaper (issue 26, docs/ingest-thread.md): the index
 * after any sequence of events must be what the code before made. Random sequences of stored
 * (chained, parked, replaced, cycling, bounded), removed (in any order, root first, deepest
 * first, unknown hashes), cleared and imported events are applied to the live PrefixIndex and to
 * a frozen copy of the old one (oracle/prefix-index-before.ts); after every step both must give
 * the same answers, the same dump, the same export, the same matches and the same counters.
 */
import { describe, expect, it } from "vitest";
import { PrefixIndex, type StorageTier } from "../../../src/core/prefix-index.js";
import { pairToBigInt, type HashList } from "../../../src/core/hash64.js";
import { seededRandom } from "../../../src/core/random.js";
import { PrefixIndex as OldPrefixIndex } from "./oracle/prefix-index-before.js";

type AnyIndex = PrefixIndex | OldPrefixIndex;

const RANKS = 6;
/** Content ids per depth: small, so ranks share nodes and chains branch. */
const ALPHABET = 3;
const MAX_DEPTH = 9;

const pick = <T>(rnd: () => number, a: readonly T[]): T => a[Math.floor(rnd() * a.length)] as T;
const int = (rnd: () => number, n: number): number => Math.floor(rnd() * n);

/** A block's content (local) hash: its path's last id and depth, so equal content recurs across chains. */
const localWords = (depth: number, id: number): [number, number] => [0x1000 + depth, (id * 0x9e37_79b1) >>> 0];

/** One rank's engine hashes: a chained function of the path, with the rank's own salt sometimes (distinct seq hashes). */
function seqWords(path: readonly number[], salt: number): [number, number] {
  let h = 0x811c_9dc5 ^ salt;
  for (const id of path) h = Math.imul(h ^ (id + 1), 0x0100_0193) >>> 0;
  return [path.length, h >>> 0];
}

interface Held {
  path: number[];
  hash: [number, number];
}

function list(words: readonly (readonly [number, number])[]): HashList {
  const out = new Uint32Array(words.length * 2);
  words.forEach(([hi, lo], i) => {
    out[2 * i] = hi;
    out[2 * i + 1] = lo;
  });
  return out;
}

const big = (w: readonly [number, number]): bigint => pairToBigInt(w[0], w[1]);

/** Everything observable of an index, as plain data. */
function fingerprint(idx: AnyIndex, queries: readonly HashList[]): unknown {
  const ranks = [];
  for (let r = 0; r < RANKS; r++) {
    const e = idx.exportRankEntries(r);
    ranks.push({
      size: idx.rankSize(r),
      dump: JSON.stringify(idx.dumpRank(r), (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v)),
      export: [Array.from(e.nodeParent), Array.from(e.nodeKeys), Array.from(e.entryTier), Array.from(e.entryNode), Array.from(e.entryHashes)],
    });
  }
  const matches = queries.map((q) => {
    const m = idx.findMatches(q);
    const rows: number[][] = [];
    for (let j = 0; j < m.count; j++) rows.push([m.ranks[j] as number, m.device[j] as number, m.host[j] as number, m.disk[j] as number]);
    return rows;
  });
  return { size: idx.size, nodes: idx.nodeCount, shed: idx.shedPairs, cycles: idx.cyclesRejected, detached: idx.detached, ranks, matches };
}

function runSequence(seed: number, steps: number): void {
  const random = seededRandom(seed);
  const rnd = (): number => random.next();
  const live = new PrefixIndex(64);
  const old = new OldPrefixIndex(64);
  const both = <T>(f: (idx: AnyIndex) => T): T => {
    const a = f(live);
    const b = f(old);
    expect(a).toEqual(b);
    return a;
  };
  // What each rank was told it stores (per tier), to pick parents and removals from; stale entries are fine.
  const held: Held[][] = Array.from({ length: RANKS }, () => []);
  const bound = Array.from({ length: RANKS }, (_, r) => (r === 1 ? 12 : r === 2 ? 30 : Infinity));
  const queries: HashList[] = [];
  const tiers: StorageTier[] = ["device", "device", "device", "host", "disk"];
  for (let step = 0; step < steps; step++) {
    const rank = int(rnd, RANKS);
    const roll = rnd();
    if (roll < 0.5) {
      // Stored: below the root, below a block the rank holds, or below an unknown parent (parked).
      const tier = pick(rnd, tiers);
      const mine = held[rank] as Held[];
      const p = rnd();
      const parent: Held | null = p < 0.3 || mine.length === 0 ? null : p < 0.92 ? pick(rnd, mine) : { path: [9, 9], hash: [0xdead, int(rnd, 4)] };
      const salt = rnd() < 0.1 ? int(rnd, 3) + 1 : 0;
      const path = parent === null ? [] : [...parent.path];
      const n = 1 + int(rnd, 6);
      const engine: [number, number][] = [];
      const local: [number, number][] = [];
      for (let i = 0; i < n && path.length < MAX_DEPTH; i++) {
        path.push(int(rnd, ALPHABET));
        local.push(localWords(path.length, path[path.length - 1] as number));
        // Now and then an engine hash the rank already uses elsewhere: a replaced claim, or a cycle.
        const h: [number, number] = rnd() < 0.06 && mine.length > 0 ? pick(rnd, mine).hash : seqWords(path, salt);
        engine.push(h);
        mine.push({ path: [...path], hash: h });
      }
      const parentHash = parent === null ? null : big(parent.hash);
      if (rnd() < 0.2) both((idx) => idx.applyStored(rank, tier, parentHash, list(engine), list(local), bound[rank]));
      else both((idx) => idx.applyStoredOrPark(rank, tier, parentHash, list(engine), list(local), bound[rank]));
      if (queries.length < 24 && local.length > 0) queries.push(list([...(parent === null ? [] : parent.path.map((id, d) => localWords(d + 1, id))), ...local]));
    } else if (roll < 0.9) {
      // Removed: some of the rank's hashes in one of several orders, and now and then an unknown one.
      const mine = held[rank] as Held[];
      if (mine.length === 0) continue;
      const tier = pick(rnd, tiers);
      const chosen = mine.filter(() => rnd() < 0.4);
      const order = rnd();
      if (order < 0.3) chosen.sort((a, b) => a.path.length - b.path.length);
      else if (order < 0.6) chosen.sort((a, b) => b.path.length - a.path.length);
      else if (order < 0.8) chosen.sort(() => rnd() - 0.5);
      const words = chosen.map((h) => h.hash);
      if (rnd() < 0.2) words.splice(int(rnd, words.length + 1), 0, [0xbeef, int(rnd, 1000)]);
      if (rnd() < 0.1 && words.length > 0) words.push(words[0] as [number, number]); // a repeat
      both((idx) => idx.applyRemoved(rank, tier, list(words)));
      if (rnd() < 0.5) held[rank] = mine.filter((h) => !chosen.includes(h));
    } else if (roll < 0.94) {
      both((idx) => { idx.applyCleared(rank); });
      held[rank] = [];
    } else if (roll < 0.97) {
      both((idx) => idx.attachWaiting(rank, bound[rank]));
    } else {
      // A warm join's rank import: another rank's export replaces this rank's blocks, in both.
      const from = int(rnd, RANKS);
      const e = live.exportRankEntries(from);
      expect(e).toEqual(old.exportRankEntries(from));
      both((idx) => idx.importRankEntries(rank, e, bound[rank]));
      held[rank] = [...(held[from] as Held[])];
    }
    expect(fingerprint(live, queries)).toEqual(fingerprint(old, queries));
  }
}

describe("PrefixIndex apply paths against the code before (oracle)", () => {
  for (let seed = 1; seed <= 24; seed++) {
    it(`random sequence ${seed}: the same index after every event`, () => {
      runSequence(seed, 250);
    });
  }

  it("a bench-shaped stream (32-block chains stored from the root, removed root first) ends in the same index", () => {
    const live = new PrefixIndex();
    const old = new OldPrefixIndex();
    const chain = (rank: number, c: number): { engine: HashList; local: HashList } => {
      const engine: [number, number][] = [];
      const local: [number, number][] = [];
      for (let b = 0; b < 32; b++) {
        engine.push([rank * 1000 + c, b]);
        local.push([c, b === 0 ? c : b]);
      }
      return { engine: list(engine), local: list(local) };
    };
    for (let k = 0; k < 64; k++) {
      for (let rank = 0; rank < 4; rank++) {
        const s = chain(rank, k % 16);
        const r = chain(rank, (k + 8) % 16);
        expect(live.applyStoredOrPark(rank, "device", null, s.engine, s.local)).toBe(old.applyStoredOrPark(rank, "device", null, s.engine, s.local));
        expect(live.applyRemoved(rank, "device", r.engine)).toBe(old.applyRemoved(rank, "device", r.engine));
      }
    }
    expect(fingerprint(live, [chain(0, 3).local, chain(1, 5).local])).toEqual(fingerprint(old, [chain(0, 3).local, chain(1, 5).local]));
  });
});
