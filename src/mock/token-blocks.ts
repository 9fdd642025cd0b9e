/**
 * Token ids for trace hash ids. A Mooncake-format trace names each 512-token prompt block by a
 * hash id (equal ids at the same position mean a reusable prefix); a replay turns every id into
 * the same block of token ids each time, so the router hashing the prompt and the engine
 * publishing KV events for it agree on every block hash.
 *
 * Token ids come from a per-id PRNG (mulberry32 seeded by a 32-bit mix of the id), uniform below
 * DEFAULT_VOCAB_SIZE like a Llama-3-sized vocabulary. A block costs ~2 us to generate at 512
 * tokens; hot ids (system prompts, long conversations) repeat thousands of times in a trace, so
 * promptTokensFor keeps recently used blocks in a bounded LRU.
 */
import { badRequest } from "../core/index.js";

/** Tokens per hash id in Mooncake traces. */
export const TRACE_BLOCK_TOKENS = 512;
/** Token ids are drawn from [0, DEFAULT_VOCAB_SIZE): Llama 3 has 128,256 entries. */
export const DEFAULT_VOCAB_SIZE = 128_000;
/** Blocks kept by the LRU per block length: 4,096 x 512 tokens x 4 bytes = 8 MiB. */
export const DEFAULT_TOKEN_BLOCK_CACHE_ENTRIES = 4_096;

const TWO_POW_32 = 4_294_967_296;

/** murmur3's 32-bit finalizer: neighbouring ids get unrelated seeds. */
function fmix32(x: number): number {
  let h = x | 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

function checkHashId(id: number): void {
  if (!Number.isSafeInteger(id) || id < 0) throw badRequest(`hash id must be a non-negative safe integer, got ${String(id)}`, "hash_ids");
}

function checkBlockTokens(blockTokens: number): void {
  if (!Number.isInteger(blockTokens) || blockTokens < 1) throw badRequest(`block tokens must be a positive integer, got ${String(blockTokens)}`, "block_tokens");
}

/** Fills `out` with the tokens of hash id `id` (no validation: callers check). */
function fillTokens(id: number, out: Uint32Array): void {
  const lo = id % TWO_POW_32;
  const hi = Math.floor(id / TWO_POW_32);
  let a = fmix32(lo ^ fmix32(hi + 0x9e3779b9));
  for (let i = 0; i < out.length; i++) {
    // mulberry32, inlined: a function call per token would double the cost.
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    out[i] = Math.floor((((t ^ (t >>> 14)) >>> 0) / TWO_POW_32) * DEFAULT_VOCAB_SIZE);
  }
}

/** The `blockTokens` token ids of hash id `id`: the same ids for the same id, every time, everywhere. */
export function tokensForHashId(id: number, blockTokens: number = TRACE_BLOCK_TOKENS): Uint32Array {
  checkHashId(id);
  checkBlockTokens(blockTokens);
  const out = new Uint32Array(blockTokens);
  fillTokens(id, out);
  return out;
}

/** Bounded LRU of generated blocks (Map iteration order is insertion order: the first key is the oldest). */
class TokenBlockCache {
  readonly #maxEntries: number;
  readonly #byLength = new Map<number, Map<number, Uint32Array>>();
  hits = 0;
  misses = 0;

  constructor(maxEntries: number) {
    this.#maxEntries = maxEntries;
  }

  get(id: number, blockTokens: number): Uint32Array {
    let blocks = this.#byLength.get(blockTokens);
    if (blocks === undefined) {
      blocks = new Map();
      this.#byLength.set(blockTokens, blocks);
    }
    const cached = blocks.get(id);
    if (cached !== undefined) {
      this.hits++;
      blocks.delete(id);
      blocks.set(id, cached);
      return cached;
    }
    this.misses++;
    const fresh = new Uint32Array(blockTokens);
    fillTokens(id, fresh);
    blocks.set(id, fresh);
    if (blocks.size > this.#maxEntries) {
      const oldest = blocks.keys().next();
      if (oldest.done !== true) blocks.delete(oldest.value);
    }
    return fresh;
  }

  clear(): void {
    this.#byLength.clear();
    this.hits = 0;
    this.misses = 0;
  }
}

const cache = new TokenBlockCache(DEFAULT_TOKEN_BLOCK_CACHE_ENTRIES);

/**
 * The prompt of a trace record: the blocks of `hashIds` concatenated and cut to `inputLength`
 * tokens (Mooncake's last block is usually partial). Throws KVMESH_BAD_REQUEST when the ids cannot
 * cover `inputLength`. The result is a fresh array the caller may keep or modify.
 */
export function promptTokensFor(hashIds: readonly number[], inputLength: number, blockTokens: number = TRACE_BLOCK_TOKENS): Uint32Array {
  checkBlockTokens(blockTokens);
  if (!Number.isInteger(inputLength) || inputLength < 0) throw badRequest(`input_length must be a non-negative integer, got ${String(inputLength)}`, "input_length");
  if (inputLength > hashIds.length * blockTokens) {
    throw badRequest(`input_length ${inputLength} exceeds ${hashIds.length} hash ids x ${blockTokens} tokens`, "input_length");
  }
  const out = new Uint32Array(inputLength);
  const blocks = Math.ceil(inputLength / blockTokens);
  for (let b = 0; b < blocks; b++) {
    const id = hashIds[b] as number;
    checkHashId(id);
    const tokens = cache.get(id, blockTokens);
    const start = b * blockTokens;
    const take = Math.min(blockTokens, inputLength - start);
    out.set(take === blockTokens ? tokens : tokens.subarray(0, take), start);
  }
  return out;
}

/** Hit and miss counts of promptTokensFor's block cache (for benchmarks). */
export function tokenBlockCacheStats(): { hits: number; misses: number } {
  return { hits: cache.hits, misses: cache.misses };
}

/** Empties promptTokensFor's block cache. */
export function clearTokenBlockCache(): void {
  cache.clear();
}
