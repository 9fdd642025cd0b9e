import { describe, expect, it } from "vitest";
import { ManualClock } from "../../../src/core/time.js";
import { seededRandom } from "../../../src/core/random.js";
import { hashListFromBigInts, type HashList } from "../../../src/core/hash64.js";
import { DEFAULT_ACTIVE_REQUEST_EXPIRY_MS, LoadLedger } from "../../../src/core/load-ledger.js";
import { codeOf } from "../../helpers/errors.js";

/** Hashes with the high word set, so (hi, lo) pairs are exercised beyond 2^53. */
const H = (n: number): bigint => (0xdead0000n << 32n) | BigInt(n);
const hl = (...ns: number[]): HashList => hashListFromBigInts(ns.map(H));

const newLedger = (clock = new ManualClock(), expiryMs?: number): LoadLedger =>
  new LoadLedger(expiryMs === undefined ? { clock, random: seededRandom(1) } : { clock, random: seededRandom(1), expiryMs });

const decodeOnly = { prefillTokens: 0, trackPrefill: false };

describe("LoadLedger blocks", () => {
  it("counts a prefix shared by in-flight requests on one rank once, and restores on free", () => {
    const ledger = newLedger();
    ledger.add("a", 0, hl(1, 2, 3, 4), decodeOnly);
    ledger.add("b", 0, hl(1, 2, 3, 5), decodeOnly);
    expect(ledger.activeBlocks(0)).toBe(5);
    expect(ledger.activeRequests(0)).toBe(2);
    expect(ledger.free("a")).toBe(true);
    expect(ledger.activeBlocks(0)).toBe(4);
    expect(ledger.free("b")).toBe(true);
    expect(ledger.activeBlocks(0)).toBe(0);
    expect(ledger.loads()).toEqual([]);
    expect(ledger.distinctActiveHashes).toBe(0);
  });

  it("does not deduplicate across ranks", () => {
    const ledger = newLedger();
    ledger.add("a", 0, hl(1, 2, 3), decodeOnly);
    ledger.add("b", 3, hl(1, 2, 3), decodeOnly);
    expect(ledger.activeBlocks(0)).toBe(3);
    expect(ledger.activeBlocks(3)).toBe(3);
    expect(ledger.activeBlocks(1)).toBe(0);
    expect(ledger.rankBound).toBe(4);
  });

  it("copies the hash list so a reused caller buffer cannot corrupt the ledger", () => {
    const ledger = newLedger();
    const buf = hl(1, 2);
    ledger.add("a", 0, buf, decodeOnly);
    buf.fill(7);
    ledger.free("a");
    expect(ledger.activeBlocks(0)).toBe(0);
    expect(ledger.distinctActiveHashes).toBe(0);
  });

  it("rejects invalid rank keys, odd hash lists and bad token counts", () => {
    const ledger = newLedger();
    expect(codeOf(() => { ledger.add("a", -1, hl(1), decodeOnly); })).toBe("KVMESH_BAD_REQUEST");
    expect(codeOf(() => { ledger.add("a", 1.5, hl(1), decodeOnly); })).toBe("KVMESH_BAD_REQUEST");
    expect(codeOf(() => { ledger.add("a", 1 << 20, hl(1), decodeOnly); })).toBe("KVMESH_BAD_REQUEST");
    expect(codeOf(() => { ledger.add("a", 0, new Uint32Array(3), decodeOnly); })).toBe("KVMESH_BAD_REQUEST");
    expect(codeOf(() => { ledger.add("a", 0, hl(1), { prefillTokens: -1, trackPrefill: true }); })).toBe("KVMESH_BAD_REQUEST");
    expect(() => { ledger.add("a", 0, hl(1), { prefillTokens: 1, trackPrefill: true, expectedPrefillDurationMs: Number.NaN }); }).toThrow(
      /expected_prefill_duration_ms/,
    );
    expect(ledger.has("a")).toBe(false);
  });
});

describe("LoadLedger request lifecycle", () => {
  it("rejects a duplicate live id with KVMESH_DUPLICATE_ID and accepts it again after free", () => {
    const ledger = newLedger();
    ledger.add("a", 0, hl(1), decodeOnly);
    expect(codeOf(() => { ledger.add("a", 1, hl(2), decodeOnly); })).toBe("KVMESH_DUPLICATE_ID");
    expect(ledger.activeRequests(1)).toBe(0);
    ledger.free("a");
    ledger.add("a", 1, hl(2), decodeOnly);
    expect(ledger.get("a")?.rank).toBe(1);
  });

  it("answers false / undefined for unknown ids", () => {
    const ledger = newLedger();
    expect(ledger.free("nope")).toBe(false);
    expect(ledger.markPrefillComplete("nope")).toBe(false);
    expect(ledger.addOutputBlock("nope")).toBe(false);
    expect(ledger.has("nope")).toBe(false);
    expect(ledger.get("nope")).toBeUndefined();
    ledger.add("a", 0, hl(1), decodeOnly);
    expect(ledger.free("a")).toBe(true);
    expect(ledger.free("a")).toBe(false);
  });

  it("reports request details", () => {
    const clock = new ManualClock(1234);
    const ledger = newLedger(clock);
    ledger.add("a", 2, hl(1, 2, 3), { prefillTokens: 48, trackPrefill: true });
    expect(ledger.get("a")).toEqual({ rank: 2, startedAtMs: 1234, prefillDone: false, prefillTokens: 48, blockCount: 3 });
    ledger.markPrefillComplete("a");
    expect(ledger.get("a")?.prefillDone).toBe(true);
  });

  it("removeRank drops only that rank's requests and returns their ids", () => {
    const ledger = newLedger();
    ledger.add("a", 0, hl(1, 2), { prefillTokens: 10, trackPrefill: true });
    ledger.add("b", 1, hl(1, 2), { prefillTokens: 20, trackPrefill: true });
    ledger.add("c", 0, hl(3), decodeOnly);
    expect(ledger.removeRank(0).sort()).toEqual(["a", "c"]);
    expect(ledger.has("a")).toBe(false);
    expect(ledger.has("b")).toBe(true);
    expect(ledger.activeBlocks(0)).toBe(0);
    expect(ledger.activePrefillTokens(0)).toBe(0);
    expect(ledger.loads()).toEqual([{ rank: 1, activePrefillTokens: 20, activeBlocks: 2, activeRequests: 1 }]);
    const out = new Int32Array(ledger.rankBound);
    const touched: number[] = [];
    ledger.newBlocksFor(hl(1, 2, 3), out, touched);
    expect(touched).toEqual([1]);
    expect(ledger.removeRank(9)).toEqual([]);
  });
});

describe("LoadLedger prefill load", () => {
  it("sums prefill tokens of requests still in prefill until each is marked complete", () => {
    const ledger = newLedger();
    ledger.add("a", 0, hl(1), { prefillTokens: 100, trackPrefill: true });
    ledger.add("b", 0, hl(2), { prefillTokens: 50, trackPrefill: true });
    ledger.add("c", 0, hl(3), { prefillTokens: 999, trackPrefill: false });
    expect(ledger.activePrefillTokens(0)).toBe(150);
    expect(ledger.markPrefillComplete("b")).toBe(true);
    expect(ledger.activePrefillTokens(0)).toBe(100);
    expect(ledger.markPrefillComplete("b")).toBe(true);
    expect(ledger.activePrefillTokens(0)).toBe(100);
    ledger.free("a");
    expect(ledger.activePrefillTokens(0)).toBe(0);
    expect(ledger.activeBlocks(0)).toBe(2);
  });

  it("decays the oldest request linearly over its duration hint, anchored when it became oldest", () => {
    const clock = new ManualClock(0);
    const ledger = newLedger(clock);
    ledger.add("a", 0, hl(1), { prefillTokens: 100, trackPrefill: true, expectedPrefillDurationMs: 1000 });
    ledger.add("b", 0, hl(2), { prefillTokens: 40, trackPrefill: true, expectedPrefillDurationMs: 400 });
    expect(ledger.activePrefillTokens(0)).toBe(140);
    clock.advance(250);
    expect(ledger.activePrefillTokens(0)).toBe(75 + 40);
    clock.advance(750);
    expect(ledger.activePrefillTokens(0)).toBe(40);
    clock.advance(5000);
    expect(ledger.activePrefillTokens(0)).toBe(40);
    // b becomes the oldest at t = 6000 and only starts decaying then (not from its admission).
    ledger.markPrefillComplete("a");
    expect(ledger.activePrefillTokens(0)).toBe(40);
    clock.advance(100);
    expect(ledger.activePrefillTokens(0)).toBeCloseTo(30, 10);
  });

  it("does not decay without a hint, even when later requests have one", () => {
    const clock = new ManualClock(0);
    const ledger = newLedger(clock);
    ledger.add("a", 0, hl(1), { prefillTokens: 100, trackPrefill: true });
    ledger.add("b", 0, hl(2), { prefillTokens: 40, trackPrefill: true, expectedPrefillDurationMs: 100 });
    clock.advance(10_000);
    expect(ledger.activePrefillTokens(0)).toBe(140);
    ledger.free("a");
    expect(ledger.activePrefillTokens(0)).toBe(40);
    clock.advance(50);
    expect(ledger.activePrefillTokens(0)).toBe(20);
  });

  it("keeps FIFO order through many completions out of order (queue compaction)", () => {
    const clock = new ManualClock(0);
    const ledger = newLedger(clock);
    for (let i = 0; i < 300; i++) ledger.add(`r${i}`, 0, hl(i), { prefillTokens: 1, trackPrefill: true });
    for (let i = 0; i < 300; i += 2) ledger.markPrefillComplete(`r${i}`);
    expect(ledger.activePrefillTokens(0)).toBe(150);
    for (let i = 1; i < 250; i += 2) ledger.free(`r${i}`);
    expect(ledger.activePrefillTokens(0)).toBe(25);
    ledger.add("late", 0, hl(9999), { prefillTokens: 5, trackPrefill: true });
    expect(ledger.activePrefillTokens(0)).toBe(30);
  });
});

describe("LoadLedger output blocks", () => {
  it("adds placeholder blocks and down-weights only blocks no other request holds", () => {
    const ledger = newLedger();
    ledger.add("a", 0, hl(1, 2, 3), decodeOnly);
    ledger.add("b", 0, hl(1, 2), decodeOnly);
    expect(ledger.addOutputBlock("a")).toBe(true);
    expect(ledger.get("a")?.blockCount).toBe(4);
    expect(ledger.activeBlocks(0)).toBe(4);
    // Exclusive to a: 3 and two output blocks -> 3 x 0.5; shared 1, 2 stay whole.
    expect(ledger.addOutputBlock("a", 0.5)).toBe(true);
    expect(ledger.activeBlocks(0)).toBeCloseTo(2 + 1.5, 12);
    ledger.free("b");
    expect(ledger.activeBlocks(0)).toBeCloseTo(3.5, 12);
    // Another request touching a weighted block makes it count fully again.
    ledger.add("c", 0, hl(1, 2, 3), decodeOnly);
    expect(ledger.activeBlocks(0)).toBeCloseTo(4, 12);
    ledger.free("c");
    ledger.free("a");
    expect(ledger.activeBlocks(0)).toBe(0);
    expect(ledger.distinctActiveHashes).toBe(0);
  });

  it("rejects a decay fraction outside [0, 1] naming decay_fraction", () => {
    const ledger = newLedger();
    ledger.add("a", 0, hl(1), decodeOnly);
    for (const bad of [-0.1, 1.5, Number.NaN, Infinity]) {
      expect(() => ledger.addOutputBlock("a", bad)).toThrow(/decay_fraction/);
    }
    expect(ledger.get("a")?.blockCount).toBe(1);
    expect(ledger.addOutputBlock("a", 0)).toBe(true);
    expect(ledger.activeBlocks(0)).toBe(0);
    expect(ledger.addOutputBlock("a", 1)).toBe(true);
    expect(ledger.activeBlocks(0)).toBe(3);
  });
});

describe("LoadLedger expiry", () => {
  it("force-frees requests at 300 s of age, not before, oldest first", () => {
    const clock = new ManualClock(0);
    const ledger = newLedger(clock);
    ledger.add("a", 0, hl(1), { prefillTokens: 10, trackPrefill: true });
    clock.advance(100_000);
    ledger.add("b", 1, hl(2), decodeOnly);
    clock.set(DEFAULT_ACTIVE_REQUEST_EXPIRY_MS - 1);
    expect(ledger.expire()).toEqual([]);
    expect(ledger.has("a")).toBe(true);
    clock.set(DEFAULT_ACTIVE_REQUEST_EXPIRY_MS);
    expect(ledger.expire()).toEqual(["a"]);
    expect(ledger.has("a")).toBe(false);
    expect(ledger.activePrefillTokens(0)).toBe(0);
    expect(ledger.activeBlocks(0)).toBe(0);
    clock.set(DEFAULT_ACTIVE_REQUEST_EXPIRY_MS + 100_000);
    expect(ledger.expire()).toEqual(["b"]);
    expect(ledger.size).toBe(0);
  });

  it("honours a custom expiry and rejects a non-positive one", () => {
    const clock = new ManualClock(0);
    const ledger = newLedger(clock, 1000);
    ledger.add("a", 0, hl(1), decodeOnly);
    clock.advance(999);
    expect(ledger.expire()).toEqual([]);
    clock.advance(1);
    expect(ledger.expire()).toEqual(["a"]);
    expect(() => newLedger(clock, 0)).toThrow(/expiryMs/);
  });
});

describe("LoadLedger.newBlocksFor", () => {
  it("matches a naive per-rank set computation under random adds, frees and rank removals", () => {
    const rng = seededRandom(42);
    const int = (n: number): number => Math.floor(rng.next() * n);
    const clock = new ManualClock(0);
    const ledger = new LoadLedger({ clock, random: seededRandom(3) });
    const RANKS = 24;
    // Prefix chains over a small alphabet so requests share prefixes heavily. Three families
    // share the same low words and differ only in the high word (the key compare must use both);
    // small consecutive integers stress probing, growth and backward-shift deletes.
    const HIGH_WORDS = [0n, 0xdead0000n << 32n, 0xbeef0001n << 32n];
    const hashOf = (root: number, i: number): bigint => (HIGH_WORDS[Math.floor(root / 4)] as bigint) | BigInt((root % 4) * 1000 + i);
    const chain = (root: number, len: number): bigint[] => Array.from({ length: len }, (_, i) => hashOf(root, i));
    // Scattered queries put unrelated hashes side by side, whose holder runs often have the same
    // length but different ranks (exercises the equal-run shortcut's compare).
    const scattered = (len: number): bigint[] => Array.from({ length: len }, () => hashOf(int(12), int(120)));
    const live = new Map<string, { rank: number; hashes: bigint[] }>();
    let nextId = 0;

    const naiveHolds = (rank: number): Map<bigint, number> => {
      const m = new Map<bigint, number>();
      for (const r of live.values()) if (r.rank === rank) for (const h of r.hashes) m.set(h, (m.get(h) ?? 0) + 1);
      return m;
    };

    const out = new Int32Array(RANKS);
    const touched: number[] = [];
    for (let step = 0; step < 1500; step++) {
      const op = rng.next();
      if (op < 0.55 || live.size === 0) {
        let hashes = chain(int(12), 1 + int(120));
        const rank = int(RANKS);
        const id = `r${nextId++}`;
        const list = hashFrom(hashes);
        if (rng.next() < 0.6) {
          // A selection counts the list first (select_and_reserve): the booking reuses its slots,
          // also after frees shifted slots, adds grew the table, or the list's words changed.
          ledger.newBlocksFor(list, out, touched);
          for (const r of touched) out[r] = 0;
          touched.length = 0;
          const between = rng.next();
          if (between < 0.2 && live.size > 0) {
            const victim = [...live.keys()][int(live.size)] as string;
            ledger.free(victim);
            live.delete(victim);
          } else if (between < 0.4) {
            const other = chain(int(12), 1 + int(120));
            const otherId = `r${nextId++}`;
            const otherRank = int(RANKS);
            ledger.add(otherId, otherRank, hashFrom(other), decodeOnly);
            live.set(otherId, { rank: otherRank, hashes: other });
          } else if (between < 0.5) {
            hashes = chain(int(12), list.length / 2);
            list.set(hashFrom(hashes));
          }
        }
        ledger.add(id, rank, list, decodeOnly);
        live.set(id, { rank, hashes });
      } else if (op < 0.97) {
        const ids = [...live.keys()];
        const id = ids[int(ids.length)] as string;
        expect(ledger.free(id)).toBe(true);
        live.delete(id);
      } else {
        const rank = int(RANKS);
        const removed = ledger.removeRank(rank).sort();
        const expected = [...live].filter(([, r]) => r.rank === rank).map(([id]) => id).sort();
        expect(removed).toEqual(expected);
        for (const id of expected) live.delete(id);
      }
      if (step % 10 !== 0) continue;

      const query = step % 20 === 0 ? scattered(1 + int(150)) : chain(int(12), 1 + int(150));
      ledger.newBlocksFor(hashFrom(query), out, touched);
      const expectTouched: number[] = [];
      for (let rank = 0; rank < RANKS; rank++) {
        const held = naiveHolds(rank);
        const hits = query.filter((h) => held.has(h)).length;
        expect(out[rank]).toBe(hits);
        if (hits > 0) expectTouched.push(rank);
        expect(ledger.activeBlocks(rank)).toBe(held.size);
      }
      expect([...touched].sort((a, b) => a - b)).toEqual(expectTouched);
      for (const r of touched) out[r] = 0;
      touched.length = 0;
    }
    for (const id of [...live.keys()]) ledger.free(id);
    expect(ledger.distinctActiveHashes).toBe(0);
  });

  it("tells apart hashes that share the low word (tag collisions included)", () => {
    const ledger = newLedger();
    const pairs = (from: number): HashList => {
      const list = new Uint32Array(4000);
      for (let i = 0; i < 2000; i++) {
        list[2 * i] = from + i;
        list[2 * i + 1] = 7;
      }
      return list;
    };
    ledger.add("a", 0, pairs(0), decodeOnly);
    const out = new Int32Array(1);
    const touched: number[] = [];
    ledger.newBlocksFor(pairs(5000), out, touched);
    expect(touched).toEqual([]);
    ledger.newBlocksFor(pairs(0), out, touched);
    expect(out[0]).toBe(2000);
    ledger.add("b", 0, pairs(5000), decodeOnly);
    expect(ledger.activeBlocks(0)).toBe(4000);
    ledger.free("a");
    expect(ledger.activeBlocks(0)).toBe(2000);
  });

  it("writes nothing for a prompt no rank holds", () => {
    const ledger = newLedger();
    ledger.add("a", 0, hl(1, 2), decodeOnly);
    const out = new Int32Array(4);
    const touched: number[] = [];
    ledger.newBlocksFor(hl(7, 8, 9), out, touched);
    expect(touched).toEqual([]);
    expect([...out]).toEqual([0, 0, 0, 0]);
  });
});

describe("LoadLedger against a naive model", () => {
  /**
   * Per rank, a map (hash -> refcount, weight) rebuilt the obvious way. The ledger draws output
   * block hashes from its injected Random, so the model replays the same seed to know them.
   */
  interface ModelRequest {
    rank: number;
    hashes: bigint[];
    output: bigint[];
    prefillTokens: number;
    inPrefill: boolean;
  }
  class Model {
    readonly requests = new Map<string, ModelRequest>();
    readonly pairs = new Map<number, Map<bigint, { refs: number; weight: number }>>();
    constructor(readonly random: ReturnType<typeof seededRandom>) {}
    #held(rank: number): Map<bigint, { refs: number; weight: number }> {
      let m = this.pairs.get(rank);
      if (m === undefined) {
        m = new Map();
        this.pairs.set(rank, m);
      }
      return m;
    }
    #touch(rank: number, h: bigint): void {
      const p = this.#held(rank).get(h);
      if (p === undefined) this.#held(rank).set(h, { refs: 1, weight: 1 });
      else {
        p.refs++;
        p.weight = 1;
      }
    }
    add(id: string, rank: number, hashes: bigint[], prefillTokens: number, track: boolean): void {
      this.requests.set(id, { rank, hashes, output: [], prefillTokens, inPrefill: track });
      for (const h of hashes) this.#touch(rank, h);
    }
    addOutput(id: string, decay: number | undefined): void {
      const r = this.requests.get(id);
      if (r === undefined) return;
      const hi = BigInt(Math.floor(this.random.next() * 4294967296) >>> 0);
      const lo = BigInt(Math.floor(this.random.next() * 4294967296) >>> 0);
      const h = (hi << 32n) | lo;
      r.output.push(h);
      this.#touch(r.rank, h);
      if (decay === undefined) return;
      for (const x of [...r.hashes, ...r.output]) {
        const p = this.#held(r.rank).get(x);
        if (p !== undefined && p.refs === 1) p.weight = decay;
      }
    }
    free(id: string): void {
      const r = this.requests.get(id);
      if (r === undefined) return;
      this.requests.delete(id);
      const held = this.#held(r.rank);
      for (const h of [...r.hashes, ...r.output]) {
        const p = held.get(h) as { refs: number; weight: number };
        if (--p.refs === 0) held.delete(h);
      }
    }
    activeBlocks(rank: number): number {
      let sum = 0;
      for (const p of this.pairs.get(rank)?.values() ?? []) sum += p.weight;
      return sum;
    }
    distinct(): number {
      const all = new Set<bigint>();
      for (const m of this.pairs.values()) for (const h of m.keys()) all.add(h);
      return all.size;
    }
  }

  it("agrees on blocks, weights, prefill and request counts across interleaved operations", () => {
    const rng = seededRandom(2024);
    const int = (n: number): number => Math.floor(rng.next() * n);
    const clock = new ManualClock(0);
    const ledger = new LoadLedger({ clock, random: seededRandom(99) });
    const model = new Model(seededRandom(99));
    const RANKS = 12;
    // Chains that share prefixes (same root), differ only in the high word across families, and
    // sometimes repeat a hash inside one request.
    const HIGH = [0n, 0xdead0000n << 32n, 0xffffffffn << 32n];
    const hashOf = (root: number, i: number): bigint => (HIGH[root % 3] as bigint) | BigInt(Math.floor(root / 3) * 1000 + i);
    const request = (): bigint[] => {
      const root = int(9);
      const hashes = Array.from({ length: 1 + int(60) }, (_, i) => hashOf(root, i));
      if (rng.next() < 0.1) hashes.push(hashes[int(hashes.length)] as bigint);
      return hashes;
    };
    const DECAYS = [undefined, 0, 0.25, 0.5, 1];
    const out = new Int32Array(RANKS);
    const touched: number[] = [];
    let nextId = 0;
    const liveIds = (): string[] => [...model.requests.keys()];

    // Every value is compared at every step as before, with plain comparisons that record the
    // first mismatch (an expect() per value was most of this test's time: ~250,000 of them).
    const failures: string[] = [];
    const same = (what: string, got: unknown, want: unknown): void => {
      if (got !== want) failures.push(`${what}: got ${String(got)}, model ${String(want)}`);
    };
    // toBeCloseTo(want, 9): |got - want| < 10^-9 / 2.
    const close = (what: string, got: number, want: number): void => {
      if (!(Math.abs(got - want) < 5e-10)) failures.push(`${what}: got ${got}, model ${want}`);
    };
    const requests = new Int32Array(RANKS);
    const prefillTokens = new Float64Array(RANKS);
    for (let step = 0; step < 3000 && failures.length === 0; step++) {
      const op = rng.next();
      const ids = liveIds();
      if (op < 0.4 || ids.length === 0) {
        const id = `q${nextId++}`;
        const rank = int(RANKS);
        const hashes = request();
        const track = rng.next() < 0.7;
        const tokens = int(500);
        ledger.add(id, rank, hashFrom(hashes), { prefillTokens: tokens, trackPrefill: track });
        model.add(id, rank, hashes, tokens, track);
      } else if (op < 0.65) {
        const id = ids[int(ids.length)] as string;
        const decay = DECAYS[int(DECAYS.length)];
        same(`step ${step} addOutputBlock(${id})`, ledger.addOutputBlock(id, decay), true);
        model.addOutput(id, decay);
      } else if (op < 0.78) {
        const id = ids[int(ids.length)] as string;
        same(`step ${step} markPrefillComplete(${id})`, ledger.markPrefillComplete(id), true);
        (model.requests.get(id) as ModelRequest).inPrefill = false;
      } else if (op < 0.98) {
        const id = ids[int(ids.length)] as string;
        same(`step ${step} free(${id})`, ledger.free(id), true);
        model.free(id);
      } else {
        const rank = int(RANKS);
        const expected = ids.filter((id) => model.requests.get(id)?.rank === rank).sort();
        same(`step ${step} removeRank(${rank})`, JSON.stringify(ledger.removeRank(rank).sort()), JSON.stringify(expected));
        for (const id of expected) model.free(id);
      }

      same(`step ${step} size`, ledger.size, model.requests.size);
      requests.fill(0);
      prefillTokens.fill(0);
      for (const r of model.requests.values()) {
        requests[r.rank] = (requests[r.rank] as number) + 1;
        if (r.inPrefill) prefillTokens[r.rank] = (prefillTokens[r.rank] as number) + r.prefillTokens;
      }
      for (let rank = 0; rank < RANKS; rank++) {
        same(`step ${step} activeRequests(${rank})`, ledger.activeRequests(rank), requests[rank]);
        close(`step ${step} activeBlocks(${rank})`, ledger.activeBlocks(rank), model.activeBlocks(rank));
        same(`step ${step} activePrefillTokens(${rank})`, ledger.activePrefillTokens(rank), prefillTokens[rank]);
      }
      // The bulk read selection uses agrees with the accessors, for ranks never seen too.
      const candidates = Int32Array.from({ length: RANKS + 3 }, (_, i) => (i * 5) % (RANKS + 3));
      const held = Int32Array.from({ length: RANKS + 3 }, () => int(4));
      const [prefill, decode, count] = [0, 1, 2].map(() => new Float64Array(candidates.length)) as [Float64Array, Float64Array, Float64Array];
      ledger.fillCandidateLoads(candidates, candidates.length, 7, held, prefill, decode, count);
      for (let i = 0; i < candidates.length; i++) {
        const rank = candidates[i] as number;
        same(`step ${step} candidate ${rank} prefill`, prefill[i], ledger.activePrefillTokens(rank));
        same(`step ${step} candidate ${rank} decode`, decode[i], ledger.activeBlocks(rank) + 7 - (held[rank] as number));
        same(`step ${step} candidate ${rank} count`, count[i], ledger.activeRequests(rank));
      }
      if (step % 25 !== 0) continue;

      same(`step ${step} distinctActiveHashes`, ledger.distinctActiveHashes, model.distinct());
      for (const [id, r] of model.requests) same(`step ${step} blockCount(${id})`, ledger.get(id)?.blockCount, r.hashes.length + r.output.length);
      const query = request();
      ledger.newBlocksFor(hashFrom(query), out, touched);
      for (let rank = 0; rank < RANKS; rank++) {
        const heldPairs = model.pairs.get(rank);
        same(`step ${step} newBlocksFor rank ${rank}`, out[rank], query.filter((h) => heldPairs?.has(h) === true).length);
      }
      for (const r of touched) out[r] = 0;
      touched.length = 0;
    }
    expect(failures).toEqual([]);
    for (const id of liveIds()) ledger.free(id);
    expect(ledger.distinctActiveHashes).toBe(0);
    expect(ledger.loads()).toEqual([]);
  });

  it("counts a block fully again once a down-weighted request is freed and its storage reused", () => {
    const ledger = newLedger();
    ledger.add("a", 0, hl(1, 2, 3), decodeOnly);
    ledger.addOutputBlock("a", 0.25);
    expect(ledger.activeBlocks(0)).toBeCloseTo(1, 12);
    ledger.free("a");
    // New pairs on the same and other ranks land on the freed holder entries.
    ledger.add("b", 0, hl(4, 5, 6, 7), decodeOnly);
    ledger.add("c", 1, hl(4, 5), decodeOnly);
    expect(ledger.activeBlocks(0)).toBe(4);
    expect(ledger.activeBlocks(1)).toBe(2);
    ledger.free("b");
    expect(ledger.activeBlocks(0)).toBe(0);
    expect(ledger.activeBlocks(1)).toBe(2);
  });
});

function hashFrom(values: bigint[]): HashList {
  return hashListFromBigInts(values);
}

describe("LoadLedger flat per-rank loads", () => {
  it("equal the accessors after any sequence of changes, the prefill floor never above the prefill, the busy set the ranks with requests", () => {
    const clock = new ManualClock(1_000);
    const ledger = newLedger(clock);
    const g = seededRandom(3);
    const live: string[] = [];
    const RANKS = 12;
    for (let step = 0; step < 2_000; step++) {
      const u = g.next();
      const rank = Math.floor(g.next() * RANKS);
      if (u < 0.4 || live.length === 0) {
        const id = `q${step}`;
        const start = Math.floor(g.next() * 6);
        ledger.add(id, rank, hl(...Array.from({ length: 1 + Math.floor(g.next() * 5) }, (_, i) => start + i)), {
          prefillTokens: Math.floor(g.next() * 50),
          trackPrefill: g.next() < 0.8,
          expectedPrefillDurationMs: g.next() < 0.4 ? Math.floor(g.next() * 200) : null,
        });
        live.push(id);
      } else {
        const id = live[Math.floor(g.next() * live.length)] as string;
        if (u < 0.6) ledger.markPrefillComplete(id);
        else if (u < 0.7) ledger.addOutputBlock(id, g.next() < 0.5 ? 0.25 : undefined);
        else if (u < 0.72) ledger.removeRank(rank);
        else {
          ledger.free(id);
          live.splice(live.indexOf(id), 1);
        }
      }
      clock.advance(Math.floor(g.next() * 20));
      const ranks = Int32Array.from({ length: RANKS }, (_, i) => i);
      const prefill = new Float64Array(RANKS);
      const decode = new Float64Array(RANKS);
      const requests = new Float64Array(RANKS);
      ledger.fillCandidateLoads(ranks, RANKS, 3, new Int32Array(RANKS), prefill, decode, requests);
      const want = Array.from({ length: RANKS }, (_, r) => [ledger.activePrefillTokens(r), ledger.activeBlocks(r), ledger.activeRequests(r)]);
      const got = Array.from({ length: RANKS }, (_, r) => [prefill[r], (decode[r] as number) - 3, requests[r]]);
      const flat = Array.from({ length: RANKS }, (_, r) => [ledger.flatBlocks[r] ?? 0, ledger.flatRequests[r] ?? 0]);
      const floorAbove = want.filter((w, r) => (ledger.flatPrefillFloor[r] ?? 0) > (w[0] as number));
      // The busy set (the candidate scan's sparse pass) is exactly the ranks with live requests.
      const busy = Array.from(ledger.busyRanks.subarray(0, ledger.busyCount)).sort((a, b) => a - b);
      const withRequests = want.flatMap((w, r) => ((w[2] as number) > 0 ? [r] : []));
      expect({ step, got, flat, floorAbove, busy }).toEqual({ step, got: want, flat: want.map((w) => [w[1], w[2]]), floorAbove: [], busy: withRequests });
    }
  });
});
