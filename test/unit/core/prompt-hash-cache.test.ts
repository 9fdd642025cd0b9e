import { describe, it, expect } from "vitest";
import { seededRandom, type Random } from "../../../src/core/random.js";
import { KvmeshError } from "../../../src/core/errors.js";
import { computeBlockHashes, computeSequenceHashes } from "../../../src/core/hashing.js";
import { PromptHashCache, type PromptHashOptions } from "../../../src/core/prompt-hash-cache.js";

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

describe("PromptHashCache (a partition's prompt hasher)", () => {
  for (const [blockSize, isEagle] of [
    [64, false],
    [16, false],
    [3, false],
    [1, false],
    [16, true],
    [4, true],
  ] as const) {
    it(`matches computeBlockHashes + computeSequenceHashes bit for bit (block ${blockSize}, eagle ${isEagle})`, () => {
      const rnd = seededRandom(blockSize * 1000 + (isEagle ? 1 : 0));
      const cache = new PromptHashCache({ blockSize, isEagle });
      const prefixes = Array.from({ length: 4 }, () => randomTokens(rnd, Math.floor(rnd.next() * 12 * blockSize), 5));
      for (let r = 0; r < 100; r++) {
        const prefix = prefixes[Math.floor(rnd.next() * prefixes.length)] as number[];
        const tail = randomTokens(rnd, Math.floor(rnd.next() * 6 * blockSize), rnd.next() < 0.5 ? 3 : 150_000);
        const tokens = [...prefix.slice(0, Math.floor(rnd.next() * (prefix.length + 1))), ...tail];
        const salt = SALTS[Math.floor(rnd.next() * SALTS.length)] as PromptHashOptions;
        // Parsed bodies arrive as Uint32Array, others as number[]; also a view at a non-zero byte offset.
        const input = r % 3 === 0 ? tokens : r % 3 === 1 ? Uint32Array.from(tokens) : Uint32Array.from([9, ...tokens]).subarray(1);
        expect(cache.hash(input, salt)).toEqual(reference(tokens, blockSize, isEagle, salt));
      }
    });
  }

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
    // A failed call leaves nothing behind: the good prompt still hashes exactly.
    expect(cache.hash(good)).toEqual(reference(good, 4, false));
  });

  it("returns empty lists for a prompt shorter than one window", () => {
    const cache = new PromptHashCache({ blockSize: 4, isEagle: true });
    expect(cache.hash([1, 2, 3, 4])).toEqual({ localHashes: new Uint32Array(0), seqHashes: new Uint32Array(0) });
  });

  it("reports the layout it serves and validates its options", () => {
    const cache = new PromptHashCache({ blockSize: 16, isEagle: true });
    expect(cache.accepts(16, true)).toBe(true);
    expect(cache.accepts(16, false)).toBe(false);
    expect(cache.accepts(32, true)).toBe(false);
    expect(() => new PromptHashCache({ blockSize: 0 })).toThrow(KvmeshError);
    expect(() => new PromptHashCache({ blockSize: 1.5 })).toThrow(KvmeshError);
  });
});
