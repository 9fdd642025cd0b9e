/**
 * Turns the prompt fields of a request (token ids, or precomputed hashes) into the block hashes
 * the prefix index walks and the tracking (sequence) hashes the load ledger deduplicates.
 */
import { badRequest } from "./errors.js";
import { hashListFromBigInts, type HashList } from "./hash64.js";
import { computeBlockHashes, computeSequenceHashes } from "./hashing.js";
import type { PromptHashCache } from "./prompt-hash-cache.js";
import type { Random } from "./clock.js";
import type { PromptFields } from "./types.js";

export interface NormalizedPrompt {
  readonly localHashes: HashList;
  readonly seqHashes: HashList;
  readonly islTokens: number;
}

/** Longest prompt accepted, tokens: bounds hashing work and memory per request. */
export const MAX_PROMPT_TOKENS = 2_000_000;

/**
 * `cache`, when given, memoises token hashing (bit-identical results); it is used only when its
 * block size and Eagle mode match this prompt's, otherwise the prompt is hashed directly.
 */
export function normalizePrompt(
  p: PromptFields,
  blockSize: number,
  isEagle: boolean,
  assumeKvReuse: boolean,
  random: Random,
  cache?: PromptHashCache,
): NormalizedPrompt {
  let localHashes: HashList;
  let seqHashes: HashList;
  let islTokens: number;
  if (p.token_ids !== undefined) {
    if (!Array.isArray(p.token_ids) && !(p.token_ids instanceof Uint32Array)) throw badRequest("token_ids must be an array of integers", "token_ids");
    if (p.token_ids.length === 0) throw badRequest("token_ids must not be empty", "token_ids");
    if (p.token_ids.length > MAX_PROMPT_TOKENS) throw badRequest(`token_ids is longer than ${MAX_PROMPT_TOKENS} tokens`, "token_ids");
    const eagle = p.is_eagle ?? isEagle;
    const salts = { loraName: p.lora_name ?? null, cacheSalt: p.cache_salt ?? null };
    if (cache?.accepts(blockSize, eagle) === true) {
      ({ localHashes, seqHashes } = cache.hash(p.token_ids, salts));
    } else {
      localHashes = computeBlockHashes(p.token_ids, blockSize, { ...salts, isEagle: eagle });
      seqHashes = computeSequenceHashes(localHashes);
    }
    islTokens = p.token_ids.length;
  } else if (p.block_hashes !== undefined || p.sequence_hashes !== undefined || p.isl_tokens !== undefined) {
    if (p.block_hashes === undefined || p.sequence_hashes === undefined || p.isl_tokens === undefined) {
      throw badRequest("block_hashes, sequence_hashes and isl_tokens must be given together", "block_hashes");
    }
    if (p.block_hashes.length !== p.sequence_hashes.length) {
      throw badRequest(
        `block_hashes (${p.block_hashes.length}) and sequence_hashes (${p.sequence_hashes.length}) must have the same length`,
        "sequence_hashes",
      );
    }
    if (!Number.isInteger(p.isl_tokens) || p.isl_tokens <= 0) throw badRequest("isl_tokens must be a positive integer", "isl_tokens");
    localHashes = toHashList(p.block_hashes, "block_hashes");
    seqHashes = toHashList(p.sequence_hashes, "sequence_hashes");
    islTokens = p.isl_tokens;
  } else {
    throw badRequest("a prompt needs token_ids, or block_hashes + sequence_hashes + isl_tokens", "token_ids");
  }
  if (!assumeKvReuse) {
    // Without KV reuse, in-flight requests never share active blocks: random tracking hashes.
    seqHashes = new Uint32Array(seqHashes.length);
    for (let i = 0; i < seqHashes.length; i++) seqHashes[i] = Math.floor(random.next() * 0x1_0000_0000);
  }
  return { localHashes, seqHashes, islTokens };
}

function toHashList(values: readonly bigint[], field: string): HashList {
  try {
    return hashListFromBigInts(values);
  } catch (e) {
    throw badRequest(`${field}: ${e instanceof Error ? e.message : String(e)}`, field);
  }
}
