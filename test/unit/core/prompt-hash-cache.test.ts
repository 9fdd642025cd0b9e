import { describe, it, expect } from "vitest";
import { seededRandom, type Random } from "../../../src/core/random.js";
import { KvmeshError } from "../../../src/core/errors.js";
import { computeBlockHashes, computeSequenceHashes, saltSeed } from "../../../src/core/hashing.js";
import { DEFAULT_PROMPT_HASH_CACHE_BLOCKS, PromptHashCache, promptBlockKey, type PromptHashOptions } from "../../../src/core/prompt-hash-cache.js";

function reference(tokens: readonly number[], blockSize: number, isEagle: boolean, opts: PromptHashOptions = {}): { localHashes: Uint32Array; seqHashes: Uint32Array } {
  const localHashes = computeBlockHashes(tokens, blockSize, { ...opts, isEagle });
  return { localHashes, seqHashes: computeSequenceHashes(localHashes) };
}

function randomTokens(rnd: Random, n: number, vocab = 150_000): number[] {
  return Array.from({ length: n }, () => Math.floor(rnd.next() * vocab));
}

function thrown(fn: () => unknown): unknown {
  try {
    fn();
  } catch (e) {
    return e;
  }
  throw new Error("expected a throw");
}

const SALTS: PromptHashOptions[] = [{}, { loraName: "adapter-a" }, { cacheSalt: "tenant-7" }, { loraName: "adapter-a", cacheSalt: "tenant-7" }, { loraName: "", cacheSalt: null }];

describe("PromptHashCache", () => {
  for (const [blockSize, isEagle, capacityBlocks] of [
    [64, false, DEFAULT_PROMPT_HASH_CACHE_BLOCKS],
    [16, false, 64],
    [3, false, 8],
    [1, false, 16],
    [16, true, 64],
    [4, true, 8],
  ] as const) {
    it(`matches computeBlockHashes + computeSequenceHashes bit for bit (block ${blockSize}, eagle ${isEagle}, ${capacityBlocks} slots)`, () => {
      const rnd = seededRandom(blockSize * 1000 + capacityBlocks + (isEagle ? 1 : 0));
      const cache = new PromptHashCache({ blockSize, isEagle, capacityBlocks });
      // Few shared prefixes, branching tails, small vocab (repeated windows under other parents).
      const prefixes = Array.from({ length: 4 }, () => randomTokens(rnd, Math.floor(rnd.next() * 12 * blockSize), 5));
      for (let r = 0; r < 300; r++) {
        const prefix = prefixes[Math.floor(rnd.next() * prefixes.length)] as number[];
        const tail = randomTokens(rnd, Math.floor(rnd.next() * 6 * blockSize), rnd.next() < 0.5 ? 3 : 150_000);
        const cut = Math.floor(rnd.next() * (prefix.length + 1));
        const tokens = [...prefix.slice(0, cut), ...tail];
        const salt = SALTS[Math.floor(rnd.next() * SALTS.length)] as PromptHashOptions;
        // Parsed bodies arrive as Uint32Array (compared natively), others as number[]; a view at
        // a non-zero byte offset checks the native compare's offsets.
        const input = r % 3 === 0 ? tokens : r % 3 === 1 ? Uint32Array.from(tokens) : Uint32Array.from([9, ...tokens]).subarray(1);
        const got = cache.hash(input, salt);
        const want = reference(tokens, blockSize, isEagle, salt);
        expect(got.localHashes).toEqual(want.localHashes);
        expect(got.seqHashes).toEqual(want.seqHashes);
      }
      const s = cache.stats;
      expect(s.hits).toBeGreaterThan(0);
      expect(s.misses).toBeGreaterThan(0);
      // Tiny tables recycle their records many times over and must stay exact meanwhile.
      if (capacityBlocks < 100) expect(s.misses).toBeGreaterThan(10 * capacityBlocks);
    });
  }

  it("answers a repeated prompt entirely from the cache and a salted one not at all", () => {
    const rnd = seededRandom(7);
    const tokens = randomTokens(rnd, 64 * 20 + 10);
    const cache = new PromptHashCache({ blockSize: 64 });
    cache.hash(tokens);
    expect(cache.stats).toEqual({ hits: 0, misses: 20, evictions: 0 });
    expect(cache.hash(tokens)).toEqual(reference(tokens, 64, false));
    expect(cache.stats).toEqual({ hits: 20, misses: 20, evictions: 0 });
    // Same tokens under another salt: other local hashes, so nothing may be reused.
    const salted = cache.hash(tokens, { cacheSalt: "s" });
    expect(salted).toEqual(reference(tokens, 64, false, { cacheSalt: "s" }));
    expect(salted.localHashes).not.toEqual(reference(tokens, 64, false).localHashes);
    expect(cache.stats).toEqual({ hits: 20, misses: 40, evictions: 0 });
  });

  it("keeps a window seen under another parent apart (same tokens, different prefix)", () => {
    const cache = new PromptHashCache({ blockSize: 4 });
    const a = [1, 2, 3, 4, 9, 9, 9, 9];
    const b = [5, 6, 7, 8, 9, 9, 9, 9];
    cache.hash(a);
    expect(cache.hash(b)).toEqual(reference(b, 4, false));
    expect(cache.stats.hits).toBe(0);
    // As a root the window [9,9,9,9] has no parent: it must not match the child entries either.
    expect(cache.hash([9, 9, 9, 9])).toEqual(reference([9, 9, 9, 9], 4, false));
    expect(cache.stats.hits).toBe(0);
  });

  it("verifies every token on a key collision (forced: two windows with the same 32-bit key)", () => {
    // Block size 1: find two tokens whose root keys collide (birthday bound: ~2^16 tries).
    const seed = saltSeed(null, null);
    const hi = Number(seed >> 32n);
    const lo = Number(seed & 0xffffffffn);
    const seen = new Map<number, number>();
    let pair: [number, number] | undefined;
    const one = new Uint32Array(1);
    for (let t = 0; t < 4_000_000 && pair === undefined; t++) {
      one[0] = t;
      const key = promptBlockKey(one, 0, 1, true, 0, 0, hi, lo) || 1;
      const prev = seen.get(key);
      if (prev !== undefined) pair = [prev, t];
      else seen.set(key, t);
    }
    expect(pair).toBeDefined();
    const [x, y] = pair as [number, number];
    const cache = new PromptHashCache({ blockSize: 1, capacityBlocks: 8 });
    cache.hash([x]);
    expect(cache.hash([y])).toEqual(reference([y], 1, false));
    expect(cache.stats).toEqual({ hits: 0, misses: 2, evictions: 0 });
    expect(cache.hash([x])).toEqual(reference([x], 1, false));
    expect(cache.stats.hits).toBe(1);
  });

  it("verifies the parent on a key collision (forced: same window under two parents with the same key)", () => {
    // Prompts [p, 7] at block size 1: the child window [7] is keyed with seq(p) as its parent.
    const seed = saltSeed(null, null);
    const hi = Number(seed >> 32n);
    const lo = Number(seed & 0xffffffffn);
    const child = new Uint32Array([7]);
    const seen = new Map<number, number>();
    let pair: [number, number] | undefined;
    for (let p = 0; p < 1_000_000 && pair === undefined; p++) {
      const parent = computeBlockHashes([p], 1);
      const key = promptBlockKey(child, 0, 1, false, parent[0] as number, parent[1] as number, hi, lo) || 1;
      const prev = seen.get(key);
      if (prev !== undefined) pair = [prev, p];
      else seen.set(key, p);
    }
    expect(pair).toBeDefined();
    const [a, b] = pair as [number, number];
    const cache = new PromptHashCache({ blockSize: 1, capacityBlocks: 8 });
    cache.hash([a, 7]);
    expect(cache.hash([b, 7])).toEqual(reference([b, 7], 1, false));
    expect(cache.stats.hits).toBe(0);
  });

  it("verifies the salt seed on a key collision (forced: same root window under two salts with the same key)", () => {
    const one = new Uint32Array([7]);
    const seen = new Map<number, string>();
    let pair: [string, string] | undefined;
    for (let i = 0; i < 1_000_000 && pair === undefined; i++) {
      const salt = `s${i}`;
      const seed = saltSeed(null, salt);
      const key = promptBlockKey(one, 0, 1, true, 0, 0, Number(seed >> 32n), Number(seed & 0xffffffffn)) || 1;
      const prev = seen.get(key);
      if (prev !== undefined) pair = [prev, salt];
      else seen.set(key, salt);
    }
    expect(pair).toBeDefined();
    const [a, b] = pair as [string, string];
    const cache = new PromptHashCache({ blockSize: 1, capacityBlocks: 8 });
    cache.hash([7], { cacheSalt: a });
    expect(cache.hash([7], { cacheSalt: b })).toEqual(reference([7], 1, false, { cacheSalt: b }));
    expect(cache.stats.hits).toBe(0);
  });

  for (const refreshed of [false, true]) {
    it(`never matches a slot whose store was cut short by an invalid token (e ${refreshed ? "recently used" : "the victim"})`, () => {
      // One set of 8 ways, e the least recently used (the victim) unless refreshed. The key
      // samples positions 0, 2, 4, 6 and 7 only, so e's slot with its tokens overwritten up to
      // position 6 would carry q's tag and fields next to q's tokens.
      const cache = new PromptHashCache({ blockSize: 8, capacityBlocks: 8 });
      const e = [1, 2, 3, 4, 5, 6, 7, 8];
      cache.hash(e);
      for (let i = 0; i < 7; i++) cache.hash([100 + i, 0, 0, 0, 0, 0, 0, 0]);
      if (refreshed) cache.hash(e);
      expect(cache.stats).toEqual({ hits: refreshed ? 1 : 0, misses: 8, evictions: 0 });
      expect(() => cache.hash([1, 20, 3, 40, 5, 60, 7, -1])).toThrow(KvmeshError);
      const q = [1, 20, 3, 40, 5, 60, 7, 8];
      expect(cache.hash(q)).toEqual(reference(q, 8, false));
      expect(cache.hash(e)).toEqual(reference(e, 8, false));
    });
  }

  it("stays within its slots: a block dies once capacityBlocks newer blocks were logged", () => {
    const cache = new PromptHashCache({ blockSize: 2, capacityBlocks: 8 });
    const block = (i: number): number[] => [i, i + 1000];
    for (let i = 0; i < 8; i++) cache.hash(block(i));
    expect(cache.hash(block(0))).toEqual(reference(block(0), 2, false));
    expect(cache.stats).toEqual({ hits: 1, misses: 8, evictions: 0 });
    for (let i = 8; i < 16; i++) cache.hash(block(i));
    expect(cache.hash(block(0))).toEqual(reference(block(0), 2, false));
    expect(cache.stats).toEqual({ hits: 1, misses: 17, evictions: 0 });
    expect(cache.tableBytes).toBe(8 * (12 + 4 * (9 + 2)));
  });

  it("counts an eviction when a full set drops a live block, and stays exact", () => {
    // 16 slots = 2 sets of 8; nine single-token prompts whose keys pick set 0 overflow it.
    const seed = saltSeed(null, null);
    const one = new Uint32Array(1);
    const picked: number[] = [];
    for (let t = 0; picked.length < 9; t++) {
      one[0] = t;
      if (((promptBlockKey(one, 0, 1, true, 0, 0, Number(seed >> 32n), Number(seed & 0xffffffffn)) || 1) & 1) === 0) picked.push(t);
    }
    const cache = new PromptHashCache({ blockSize: 1, capacityBlocks: 16 });
    for (const t of picked) cache.hash([t]);
    expect(cache.stats).toEqual({ hits: 0, misses: 9, evictions: 1 });
    // The oldest was dropped from the index: hashed again (exactly), dropping the next oldest.
    expect(cache.hash([picked[0] as number])).toEqual(reference([picked[0] as number], 1, false));
    expect(cache.stats).toEqual({ hits: 0, misses: 10, evictions: 2 });
    expect(cache.hash([picked[8] as number])).toEqual(reference([picked[8] as number], 1, false));
    expect(cache.stats.hits).toBe(1);
  });

  it("follows the log only to a record of the same parent", () => {
    // Log: [b], [a], then [b, t] appends t (child of b) right after a's record. A request
    // [a, t] matches a and must not take that next record, whose parent is b.
    const cache = new PromptHashCache({ blockSize: 2 });
    const [a, b, t] = [[1, 2], [3, 4], [5, 6]];
    cache.hash(b);
    cache.hash(a);
    cache.hash([...b, ...t]);
    expect(cache.stats).toEqual({ hits: 1, misses: 3, evictions: 0 });
    expect(cache.hash([...a, ...t])).toEqual(reference([...a, ...t], 2, false));
    expect(cache.stats).toEqual({ hits: 2, misses: 4, evictions: 0 });
  });

  it("never follows the log into a record whose rewrite an invalid token cut short", () => {
    // 8 records. [x, y] fills slots 0-1 and six roots the rest; clear() kills them all, so
    // [x, bad] logs x again in slot 0 and is cut short rewriting slot 1 (y's old record) with
    // q's first 7 tokens: slot 1 then holds q's tokens next to y's fields.
    const cache = new PromptHashCache({ blockSize: 8, capacityBlocks: 8 });
    const x = [1, 2, 3, 4, 5, 6, 7, 8];
    const y = [11, 12, 13, 14, 15, 16, 17, 18];
    const q = [21, 22, 23, 24, 25, 26, 27, 18];
    cache.hash([...x, ...y]);
    for (let i = 0; i < 6; i++) cache.hash([100 + i, 0, 0, 0, 0, 0, 0, 0]);
    cache.clear();
    expect(() => cache.hash([...x, ...q.slice(0, 7), -1])).toThrow(KvmeshError);
    expect(cache.hash([...x, ...q])).toEqual(reference([...x, ...q], 8, false));
    expect(cache.stats).toEqual({ hits: 1, misses: 8 + 2 + 1, evictions: 0 });
  });

  it("walks an earlier prompt's records and re-probes after a divergence", () => {
    const rnd = seededRandom(5);
    const cache = new PromptHashCache({ blockSize: 8 });
    const a = randomTokens(rnd, 8 * 30);
    const b = [...a.slice(0, 8 * 12), ...randomTokens(rnd, 8 * 10)];
    const c = [...b.slice(0, 8 * 16), ...a.slice(8 * 16)];
    cache.hash(a);
    cache.hash(b);
    expect(cache.stats).toEqual({ hits: 12, misses: 30 + 10, evictions: 0 });
    // c = b's first 16 blocks, then a's tail under b's (different) chain: hits 16, misses 14.
    expect(cache.hash(c)).toEqual(reference(c, 8, false));
    expect(cache.stats).toEqual({ hits: 12 + 16, misses: 40 + 14, evictions: 0 });
    expect(cache.hash(a)).toEqual(reference(a, 8, false));
    expect(cache.stats.hits).toBe(28 + 30);
  });

  it("clear forgets every block", () => {
    const cache = new PromptHashCache({ blockSize: 2 });
    cache.hash([1, 2, 3, 4]);
    cache.clear();
    cache.hash([1, 2, 3, 4]);
    expect(cache.stats).toEqual({ hits: 0, misses: 4, evictions: 0 });
  });

  it("rejects an invalid token with the reference's error, wherever it is", () => {
    const cache = new PromptHashCache({ blockSize: 4 });
    const good = [10, 11, 12, 13, 14, 15, 16, 17, 18];
    cache.hash(good);
    for (const bad of [-1, 1.5, Number.NaN, 2 ** 32, Number.POSITIVE_INFINITY]) {
      for (const at of [0, 3, 5, 8]) {
        const tokens = [...good];
        tokens[at] = bad;
        const ref = thrown(() => computeBlockHashes(tokens, 4));
        const got = thrown(() => cache.hash(tokens));
        expect(got).toBeInstanceOf(KvmeshError);
        expect((got as KvmeshError).message).toBe((ref as KvmeshError).message);
        expect((got as KvmeshError).code).toBe((ref as KvmeshError).code);
      }
    }
    // The first invalid token is reported even when a later one is invalid too.
    expect((thrown(() => cache.hash([1, 2, 3, 4, 5, -2, 7, 8, -9])) as Error).message).toContain("token_ids[5]");
    // A too-short prompt is still validated; -0 is accepted as 0, as by the reference.
    expect((thrown(() => cache.hash([1, -1])) as Error).message).toContain("token_ids[1]");
    expect(cache.hash([-0, 0, 0, 0])).toEqual(reference([0, 0, 0, 0], 4, false));
    // Failed stores left nothing that can match: the good prompt still hashes exactly.
    expect(cache.hash(good)).toEqual(reference(good, 4, false));
  });

  it("returns empty lists for a prompt shorter than one window", () => {
    const cache = new PromptHashCache({ blockSize: 4, isEagle: true });
    expect(cache.hash([1, 2, 3, 4])).toEqual({ localHashes: new Uint32Array(0), seqHashes: new Uint32Array(0) });
    expect(cache.stats).toEqual({ hits: 0, misses: 0, evictions: 0 });
  });

  it("reports the layout it serves and validates its options", () => {
    const cache = new PromptHashCache({ blockSize: 16, isEagle: true, capacityBlocks: 100 });
    expect(cache.capacityBlocks).toBe(64);
    expect(cache.accepts(16, true)).toBe(true);
    expect(cache.accepts(16, false)).toBe(false);
    expect(cache.accepts(32, true)).toBe(false);
    expect(new PromptHashCache({ blockSize: 64 }).tableBytes).toBe(65_536 * 304);
    expect(() => new PromptHashCache({ blockSize: 0 })).toThrow(KvmeshError);
    expect(() => new PromptHashCache({ blockSize: 1.5 })).toThrow(KvmeshError);
    expect(() => new PromptHashCache({ blockSize: 4, capacityBlocks: 7 })).toThrow(KvmeshError);
  });
});
