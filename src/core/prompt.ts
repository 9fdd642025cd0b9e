/**
 * Turns the prompt fields of a request (token ids, or precomputed hashes) into the block hashes
 * the prefix index walks and the tracking (sequence) hashes the load ledger deduplicates.
 */
import { badRequest } from "./errors.js";
import { hashCount, hashListFromBigInts, type HashList } from "./hash64.js";
import { MAX_HASHES_PER_BOOKING } from "./limits.js";
import { computePromptHashes } from "./hashing.js";
import type { PromptHashCache } from "./prompt-hash-cache.js";
import type { Random } from "./random.js";
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
  const routing = routingTokens(p);
  if (routing !== undefined) {
    const { tokens, field } = routing;
    if (!Array.isArray(tokens) && !(tokens instanceof Uint32Array)) throw badRequest(`${field} must be an array of integers`, field);
    if (tokens.length === 0) throw badRequest(`${field} must not be empty`, field);
    if (tokens.length > MAX_PROMPT_TOKENS) throw badRequest(`${field} is longer than ${MAX_PROMPT_TOKENS} tokens`, field);
    const eagle = p.is_eagle ?? isEagle;
    const salts = { loraName: p.lora_name ?? null, cacheSalt: p.cache_salt ?? null };
    const blockMmHashes = mmHashesPerBlock(routing.mmInfos);
    if (blockMmHashes === undefined && cache?.accepts(blockSize, eagle) === true) {
      ({ localHashes, seqHashes } = cache.hash(tokens, salts));
    } else {
      // Multimodal prompts bypass the memo: its key has no room for the objects' hashes.
      ({ localHashes, seqHashes } = computePromptHashes(tokens, blockSize, { ...salts, isEagle: eagle, ...(blockMmHashes === undefined ? {} : { blockMmHashes }) }));
    }
    islTokens = tokens.length;
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
  boundHashes(seqHashes, routing === undefined ? "sequence_hashes" : routing.field, blockSize);
  if (!assumeKvReuse) {
    // Without KV reuse, in-flight requests never share active blocks: random tracking hashes.
    seqHashes = new Uint32Array(seqHashes.length);
    for (let i = 0; i < seqHashes.length; i++) seqHashes[i] = Math.floor(random.next() * 0x1_0000_0000);
  }
  return { localHashes, seqHashes, islTokens };
}

/**
 * The prompt of an explicit reservation (POST /reservations with `worker_id`), as the reference's
 * `normalize_for_reservation` (services/selection/input.rs): tokens are hashed as for a
 * selection, but precomputed input needs only `sequence_hashes` + `isl_tokens`, since a booking
 * loads the ledger by sequence hash and block hashes only look the cache up. This is how a
 * client replays a booking on another replica from the `sequence_hashes` select_and_reserve
 * returned. Without block hashes nothing is matched against the cache (no overlap).
 */
export function normalizeReservationPrompt(p: PromptFields, normalize: (p: PromptFields) => NormalizedPrompt): NormalizedPrompt {
  if (routingTokens(p) !== undefined || p.block_hashes !== undefined || p.sequence_hashes === undefined) return normalize(p);
  if (p.isl_tokens === undefined) throw badRequest("isl_tokens is required with sequence_hashes and no token_ids", "isl_tokens");
  if (!Number.isInteger(p.isl_tokens) || p.isl_tokens <= 0) throw badRequest("isl_tokens must be a positive integer", "isl_tokens");
  const seqHashes = toHashList(p.sequence_hashes, "sequence_hashes");
  boundHashes(seqHashes, "sequence_hashes", null);
  return { localHashes: new Uint32Array(0), seqHashes, islTokens: p.isl_tokens };
}

/** A booking of more blocks than a mesh event carries would cut this replica off from its peers (limits.ts, #29 G2). */
function boundHashes(seqHashes: HashList, field: string, blockSize: number | null): void {
  const n = hashCount(seqHashes);
  if (n <= MAX_HASHES_PER_BOOKING) return;
  const why = blockSize === null || field === "sequence_hashes" ? `${String(n)} hashes` : `${String(n)} blocks of ${String(blockSize)} tokens`;
  throw badRequest(`${field}: ${why}, more than the ${String(MAX_HASHES_PER_BOOKING)} one booking may hold`, field);
}

/**
 * The tokens a prompt is hashed from, as the reference's `routing_tokens_and_mm_infos`
 * (services/selection/input.rs): `mm_routing_info.routing_token_ids` when non-empty, with its own
 * `block_mm_infos`; otherwise `token_ids` with the top-level `block_mm_infos`. Undefined: the
 * prompt is precomputed hashes (and any `block_mm_infos` is unused).
 */
function routingTokens(
  p: PromptFields,
): { readonly tokens: readonly number[] | Uint32Array; readonly field: string; readonly mmInfos: PromptFields["block_mm_infos"] } | undefined {
  const mm = p.mm_routing_info;
  if (mm !== undefined && mm.routing_token_ids.length > 0) {
    return { tokens: mm.routing_token_ids, field: "mm_routing_info.routing_token_ids", mmInfos: mm.block_mm_infos ?? [] };
  }
  if (p.token_ids === undefined) return undefined;
  return { tokens: p.token_ids, field: "token_ids", mmInfos: p.block_mm_infos };
}

/** Per block index, its multimodal objects' hashes; undefined when no block has any. */
function mmHashesPerBlock(infos: PromptFields["block_mm_infos"]): (bigint[] | undefined)[] | undefined {
  if (infos === undefined) return undefined;
  let out: (bigint[] | undefined)[] | undefined;
  for (let i = 0; i < infos.length; i++) {
    const objects = infos[i]?.mm_objects;
    if (objects === undefined || objects.length === 0) continue;
    out ??= new Array<bigint[] | undefined>(infos.length);
    out[i] = objects.map((o) => o.mm_hash);
  }
  return out;
}

function toHashList(values: readonly bigint[], field: string): HashList {
  try {
    return hashListFromBigInts(values);
  } catch (e) {
    throw badRequest(`${field}: ${e instanceof Error ? e.message : String(e)}`, field);
  }
}
