import { describe, it, expect } from "vitest";
import { seededRandom } from "../../../src/core/random.js";
import { hashListFromBigInts } from "../../../src/core/hash64.js";
import { computeBlockHashes, computeSequenceHashes } from "../../../src/core/hashing.js";
import { MAX_PROMPT_TOKENS, normalizePrompt } from "../../../src/core/prompt.js";
import { PromptHashCache } from "../../../src/core/prompt-hash-cache.js";
import type { PromptFields } from "../../../src/core/types.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";

const rnd = seededRandom(3);
const tokens = (n: number, from = 0): number[] => Array.from({ length: n }, (_, i) => (from + i * 7) % 1000);

function codeOf(fn: () => unknown): string {
  const e = kvmeshErrorOf(fn);
  return `${e.code}: ${e.message}`;
}

describe("normalizePrompt", () => {
  it("hashes token_ids as computeBlockHashes + computeSequenceHashes, with or without a cache", () => {
    const cache = new PromptHashCache({ blockSize: 16 });
    const p: PromptFields = { token_ids: tokens(16 * 5 + 3), lora_name: "lora", cache_salt: "salt" };
    const local = computeBlockHashes(p.token_ids ?? [], 16, { loraName: "lora", cacheSalt: "salt" });
    const want = { localHashes: local, seqHashes: computeSequenceHashes(local), islTokens: 83 };
    expect(normalizePrompt(p, 16, false, true, rnd)).toEqual(want);
    expect(normalizePrompt(p, 16, false, true, rnd, cache)).toEqual(want);
    expect(normalizePrompt(p, 16, false, true, rnd, cache)).toEqual(want);
  });

  it("bypasses a cache of another block size or Eagle mode (including a per-request is_eagle)", () => {
    const cache = new PromptHashCache({ blockSize: 16 });
    const t = tokens(16 * 4 + 1);
    const eagleLocal = computeBlockHashes(t, 16, { isEagle: true });
    expect(normalizePrompt({ token_ids: t, is_eagle: true }, 16, false, true, rnd, cache).localHashes).toEqual(eagleLocal);
    expect(normalizePrompt({ token_ids: t }, 16, true, true, rnd, cache).localHashes).toEqual(eagleLocal);
    expect(normalizePrompt({ token_ids: t }, 8, false, true, rnd, cache).localHashes).toEqual(computeBlockHashes(t, 8));
    // An Eagle cache serves a plain partition's request that asks for Eagle.
    const eagleCache = new PromptHashCache({ blockSize: 16, isEagle: true });
    expect(normalizePrompt({ token_ids: t, is_eagle: true }, 16, false, true, rnd, eagleCache).localHashes).toEqual(eagleLocal);
  });

  it("reports invalid token_ids identically with and without a cache", () => {
    const cache = new PromptHashCache({ blockSize: 4 });
    for (const bad of [[1, 2, -3, 4], [1, 2, 3, 4, 5.5], [Number.NaN]]) {
      expect(codeOf(() => normalizePrompt({ token_ids: bad }, 4, false, true, rnd, cache))).toBe(codeOf(() => normalizePrompt({ token_ids: bad }, 4, false, true, rnd)));
    }
    expect(codeOf(() => normalizePrompt({ token_ids: [] }, 4, false, true, rnd, cache))).toContain("must not be empty");
    expect(codeOf(() => normalizePrompt({ token_ids: "1,2" as unknown as number[] }, 4, false, true, rnd, cache))).toContain("must be an array");
    const long = new Array<number>(MAX_PROMPT_TOKENS + 1);
    expect(codeOf(() => normalizePrompt({ token_ids: long }, 4, false, true, rnd, cache))).toContain("longer than");
  });

  it("takes precomputed hashes as given, and requires them together", () => {
    const block = [1n, (1n << 64n) - 1n];
    const seq = [1n, -2n];
    const got = normalizePrompt({ block_hashes: block, sequence_hashes: seq, isl_tokens: 100 }, 16, false, true, rnd);
    expect(got).toEqual({ localHashes: hashListFromBigInts(block), seqHashes: hashListFromBigInts(seq), islTokens: 100 });
    expect(codeOf(() => normalizePrompt({ block_hashes: block, isl_tokens: 100 }, 16, false, true, rnd))).toContain("given together");
    expect(codeOf(() => normalizePrompt({ block_hashes: block, sequence_hashes: [1n], isl_tokens: 100 }, 16, false, true, rnd))).toContain("same length");
    expect(codeOf(() => normalizePrompt({ block_hashes: block, sequence_hashes: seq, isl_tokens: 0 }, 16, false, true, rnd))).toContain("isl_tokens");
    expect(codeOf(() => normalizePrompt({ block_hashes: [1n << 64n], sequence_hashes: [1n], isl_tokens: 1 }, 16, false, true, rnd))).toContain("block_hashes");
    expect(codeOf(() => normalizePrompt({}, 16, false, true, rnd))).toContain("a prompt needs");
  });

  it("replaces tracking hashes with random ones when KV reuse is not assumed, leaving the cache exact", () => {
    const cache = new PromptHashCache({ blockSize: 4 });
    const t = tokens(12);
    const a = normalizePrompt({ token_ids: t }, 4, false, false, seededRandom(1), cache);
    const b = normalizePrompt({ token_ids: t }, 4, false, false, seededRandom(2), cache);
    expect(a.localHashes).toEqual(computeBlockHashes(t, 4));
    expect(a.seqHashes).toHaveLength(6);
    expect(a.seqHashes).not.toEqual(b.seqHashes);
    expect(normalizePrompt({ token_ids: t }, 4, false, true, rnd, cache).seqHashes).toEqual(computeSequenceHashes(computeBlockHashes(t, 4)));
  });
});
