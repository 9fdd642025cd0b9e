import { describe, expect, it } from "vitest";

import { DEFAULT_VOCAB_SIZE, TRACE_BLOCK_TOKENS, clearTokenBlockCache, promptTokensFor, tokenBlockCacheStats, tokensForHashId } from "../../../src/mock/token-blocks.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";

describe("token blocks", () => {
  it("maps a hash id to the same 512 tokens every time, below the vocabulary size", () => {
    const a = tokensForHashId(42);
    expect(a).toHaveLength(TRACE_BLOCK_TOKENS);
    expect(tokensForHashId(42)).toEqual(a);
    expect(Math.max(...a)).toBeLessThan(DEFAULT_VOCAB_SIZE);
    // Not a constant or a ramp: many distinct values spread over the vocabulary.
    expect(new Set(a).size).toBeGreaterThan(500);
    expect(Math.max(...a)).toBeGreaterThan(DEFAULT_VOCAB_SIZE / 2);
    // Neighbouring and far-apart ids (beyond 2^32) give unrelated blocks.
    const b = tokensForHashId(43);
    expect(a.filter((t, i) => t === b[i]).length).toBeLessThan(5);
    expect(tokensForHashId(2 ** 40 + 42)).not.toEqual(a);
    // Shorter blocks are a prefix of the same stream.
    expect(tokensForHashId(42, 16)).toEqual(a.subarray(0, 16));
  });

  it("builds a prompt from its hash ids, cut to input_length, with a cache that gives equal content", () => {
    clearTokenBlockCache();
    const p = promptTokensFor([7, 8, 9], 1_100);
    expect(p).toHaveLength(1_100);
    expect(p.subarray(0, 512)).toEqual(tokensForHashId(7));
    expect(p.subarray(512, 1_024)).toEqual(tokensForHashId(8));
    expect(p.subarray(1_024)).toEqual(tokensForHashId(9).subarray(0, 76));
    // Hot ids come from the cache, and the returned prompt is the caller's to modify.
    p.fill(0);
    const again = promptTokensFor([7, 8, 9], 1_100);
    expect(again.subarray(0, 512)).toEqual(tokensForHashId(7));
    expect(tokenBlockCacheStats()).toEqual({ hits: 3, misses: 3 });
    // Only the blocks input_length reaches are used.
    expect(promptTokensFor([7, 8, 9], 512)).toEqual(tokensForHashId(7));
  });

  it("rejects ids that cannot cover the prompt and invalid ids", () => {
    expect(kvmeshErrorOf(() => promptTokensFor([1, 2], 1_025)).message).toMatch(/input_length 1025 exceeds 2 hash ids x 512 tokens/);
    expect(kvmeshErrorOf(() => promptTokensFor([1, -2], 1_000)).details).toEqual({ field: "hash_ids" });
    expect(kvmeshErrorOf(() => tokensForHashId(1.5)).code).toBe("KVMESH_BAD_REQUEST");
    expect(kvmeshErrorOf(() => tokensForHashId(1, 0)).details).toEqual({ field: "block_tokens" });
  });
});
