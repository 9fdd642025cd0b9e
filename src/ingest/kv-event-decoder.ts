/**
 * Decoder for the KV-cache events inference engines publish (vLLM's `KvEventBatch`, also emitted
 * by SGLang). Two encodings are in use today and both are accepted:
 *  - maps: `{ts, events, data_parallel_rank}` with events tagged by a `type` key (current vLLM);
 *  - arrays: `[ts, events, dp_rank]` with events whose first element is the tag (msgspec
 *    `array_like=True, tag=True`: older vLLM, SGLang).
 * Block hashes are integers (signed or unsigned 64-bit) or bytes (vLLM with
 * VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), the latter reduced to 64 bits as vLLM's integer mode does.
 * Every field is type-checked; a violation throws KVMESH_BAD_REQUEST naming the field path.
 * Unknown map keys and unknown trailing array elements are ignored, so engines can add fields.
 */
import { Unpackr } from "msgpackr";

import { badRequest, KvmeshError } from "../core/index.js";
import { toU64 } from "../core/index.js";
import type { KvEvent, KvEventBatch, StorageTier } from "../core/index.js";

export type { KvEvent, KvEventBatch, StorageTier } from "../core/index.js";

/** Attention kinds whose blocks are prefix-indexed; any other declared kind is dropped (Dynamo's default registry). */
const MAIN_KV_CACHE_SPEC_KINDS: ReadonlySet<string> = new Set(["full_attention", "mla_attention", "sink_full_attention"]);

/**
 * Per-message caps (#17 F8: one message of 500,000 hashes stalled every /select for up to 726 ms).
 * A message is taken in order up to the first event that would pass a cap; that event and all
 * after it are refused and counted (decodeKvEventBatchCapped). Cutting at an event boundary keeps
 * what is applied exactly what the engine sent; the events after a cut would mostly chain below
 * refused blocks and be dropped anyway.
 *
 * Events per message: as the mesh's MAX_EVENTS_PER_BATCH (mesh/wire.ts). An engine publishes its
 * events once per scheduler step, a few hundred at most.
 */
export const MAX_KV_EVENTS_PER_MESSAGE = 16_384;
/**
 * Block hashes per message, all events together: as the mesh's MAX_HASHES_PER_EVENT, a 2M-token
 * prompt at block size 16. A step stores at most max_num_batched_tokens / block_size blocks
 * (8,192 tokens a step is common), so even SGLang's page size 1 stays far below it.
 */
export const MAX_KV_HASHES_PER_MESSAGE = 131_072;
/**
 * token_ids per message, all events together: 2,097,152, the largest prompt kvmesh routes
 * (MAX_PROMPT_TOKENS, 2,000,000) stored in one step. Bounds the content hashing a message costs.
 */
export const MAX_KV_TOKENS_PER_MESSAGE = 2_097_152;

const U32_MAX = 0xffff_ffff;
const U64_MAX = (1n << 64n) - 1n;

const isU32 = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v) && v >= 0 && v <= U32_MAX;

// int64AsType "bigint": uint64/int64 hashes stay exact (the default "number" would round above 2^53).
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: "bigint" });

type Fields = Readonly<Record<string, unknown>>;

const fail = (path: string, problem: string): KvmeshError => badRequest(`${path}: ${problem}`, path);

/**
 * A field's location is (event index, suffix) and only becomes a string on failure: building
 * paths eagerly for every hash and token id made validation several times slower per event
 * (`npm run bench:core` decodes and applies KV event batches).
 */
const BATCH = -1;
const loc = (ev: number, at: string): string => (ev === BATCH ? at : `events[${ev}]${at}`);

function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (value instanceof Uint8Array) return "binary";
  return typeof value;
}

const isMap = (value: unknown): value is Fields =>
  typeof value === "object" && value !== null && !Array.isArray(value) && !(value instanceof Uint8Array) && Object.getPrototypeOf(value) === Object.prototype;

/** A decoded batch and what the per-message caps refused of it. */
export interface CappedKvEventBatch {
  readonly batch: KvEventBatch;
  /** Events refused at a per-message cap (0: the whole message was taken). */
  readonly shedEvents: number;
  /** Block hashes of those events. */
  readonly shedHashes: number;
}

/** Decodes one msgpack payload (the third frame of a live message) into a normalised batch, per-message caps applied. */
export function decodeKvEventBatch(payload: Uint8Array): KvEventBatch {
  return decodeKvEventBatchCapped(payload).batch;
}

/** As decodeKvEventBatch, saying what the per-message caps refused. */
export function decodeKvEventBatchCapped(payload: Uint8Array): CappedKvEventBatch {
  if (payload.length === 0) throw fail("payload", "empty");
  let raw: unknown;
  try {
    raw = unpackr.unpack(payload);
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    throw new KvmeshError("KVMESH_BAD_REQUEST", `payload: invalid msgpack (${reason})`, { cause: err, details: { field: "payload" } });
  }
  let ts: unknown;
  let events: unknown;
  let dpRank: unknown;
  if (Array.isArray(raw)) {
    if (raw.length < 2) throw fail("batch", `expected [ts, events, dp_rank], got an array of ${raw.length}`);
    [ts, events, dpRank] = raw as unknown[];
  } else if (isMap(raw)) {
    if (!("ts" in raw)) throw fail("ts", "missing");
    if (!("events" in raw)) throw fail("events", "missing");
    ({ ts, events } = raw);
    dpRank = raw["data_parallel_rank"];
  } else {
    throw fail("batch", `expected a map or an array, got ${describe(raw)}`);
  }
  const out: KvEventBatch = {
    ts: toTimestamp(ts),
    events: [],
    dpRank: dpRank === undefined || dpRank === null ? null : toU32(dpRank, BATCH, "data_parallel_rank"),
  };
  if (!Array.isArray(events)) throw fail("events", `expected an array, got ${describe(events)}`);
  const list = events as unknown[];
  let hashes = 0;
  let tokens = 0;
  for (let i = 0; i < list.length; i++) {
    const raw = list[i];
    const h = rawLength(raw, "block_hashes", 1);
    const t = rawLength(raw, "token_ids", 3);
    if (i >= MAX_KV_EVENTS_PER_MESSAGE || hashes + h > MAX_KV_HASHES_PER_MESSAGE || tokens + t > MAX_KV_TOKENS_PER_MESSAGE) {
      let shedHashes = 0;
      for (let j = i; j < list.length; j++) shedHashes += rawLength(list[j], "block_hashes", 1);
      return { batch: out, shedEvents: list.length - i, shedHashes };
    }
    hashes += h;
    tokens += t;
    const event = decodeEvent(raw, i);
    if (event !== null) out.events.push(event);
  }
  return { batch: out, shedEvents: 0, shedHashes: 0 };
}

/** Length of an undecoded event's array field (map key, or array slot), 0 when it is not an array. */
function rawLength(raw: unknown, key: string, slot: number): number {
  const v = Array.isArray(raw) ? (raw as unknown[])[slot] : isMap(raw) ? raw[key] : undefined;
  return Array.isArray(v) ? v.length : 0;
}

function decodeEvent(raw: unknown, ev: number): KvEvent | null {
  if (Array.isArray(raw)) return decodeArrayEvent(raw as unknown[], ev);
  if (isMap(raw)) return decodeMapEvent(raw, ev);
  throw fail(loc(ev, ""), `expected a map or an array, got ${describe(raw)}`);
}

function decodeMapEvent(fields: Fields, ev: number): KvEvent | null {
  const tag = fields["type"];
  if (tag === undefined) throw fail(loc(ev, ".type"), "missing");
  if (typeof tag !== "string") throw fail(loc(ev, ".type"), `expected a string, got ${describe(tag)}`);
  switch (tag) {
    case "BlockStored": {
      const blockHashes = toHashes(requiredField(fields, "block_hashes", ev), ev, ".block_hashes");
      const parent = fields["parent_block_hash"];
      const parentHash = parent === undefined || parent === null ? null : toHash(parent, ev, ".parent_block_hash");
      const { tokenIds, eagle } = toTokenIds(requiredField(fields, "token_ids", ev), ev, ".token_ids");
      const blockSize = optionalU32(requiredField(fields, "block_size", ev), ev, ".block_size");
      optionalU32(fields["lora_id"], ev, ".lora_id");
      const tier = toTier(fields["medium"], ev, ".medium");
      const loraName = optionalString(fields["lora_name"], ev, ".lora_name");
      if (!isMainGroup(fields["group_idx"], fields["kv_cache_spec_kind"], ev)) return null;
      const extras = storedExtras(fields["extra_keys"], fields["block_mm_infos"], optionalString(fields["cache_salt"], ev, ".cache_salt"), loraName, ev, ".extra_keys");
      return { type: "stored", blockHashes, parentHash, tokenIds, blockSize, loraName, tier, eagle, ...extras };
    }
    case "BlockRemoved": {
      const blockHashes = toHashes(requiredField(fields, "block_hashes", ev), ev, ".block_hashes");
      const tier = toTier(fields["medium"], ev, ".medium");
      if (!isMainGroup(fields["group_idx"], fields["kv_cache_spec_kind"], ev)) return null;
      return { type: "removed", blockHashes, tier };
    }
    case "AllBlocksCleared":
      return { type: "cleared" };
    default:
      throw fail(loc(ev, ".type"), `unknown event type ${JSON.stringify(tag)}`);
  }
}

/**
 * Positional layouts (msgspec array_like structs, trailing defaults omitted):
 *   BlockStored  [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
 *                 lora_name, extra_keys, group_idx, kv_cache_spec_kind, ...]
 *   BlockRemoved [tag, block_hashes, medium, group_idx, ...]
 * Slot 5 is the legacy lora_id: validated, then discarded (lora_name identifies the adapter).
 */
function decodeArrayEvent(items: unknown[], ev: number): KvEvent | null {
  const tag = items[0];
  if (tag === undefined) throw fail(loc(ev, "[0]"), "missing event tag");
  if (typeof tag !== "string") throw fail(loc(ev, "[0]"), `expected the event tag string, got ${describe(tag)}`);
  switch (tag) {
    case "BlockStored": {
      const blockHashes = toHashes(requiredItem(items, 1, ev, "[1] (block_hashes)"), ev, "[1] (block_hashes)");
      const parent = requiredItem(items, 2, ev, "[2] (parent_block_hash)");
      const parentHash = parent === null ? null : toHash(parent, ev, "[2] (parent_block_hash)");
      const { tokenIds, eagle } = toTokenIds(requiredItem(items, 3, ev, "[3] (token_ids)"), ev, "[3] (token_ids)");
      const blockSize = optionalU32(requiredItem(items, 4, ev, "[4] (block_size)"), ev, "[4] (block_size)");
      optionalU32(items[5], ev, "[5] (lora_id)");
      const tier = toTier(items[6], ev, "[6] (medium)");
      const loraName = optionalString(items[7], ev, "[7] (lora_name)");
      // Trailing metadata is only honoured when it has the expected type: anything else is an
      // unknown future field and is ignored.
      const groupIdx = typeof items[9] === "number" || typeof items[9] === "bigint" ? items[9] : undefined;
      const kind = typeof items[10] === "string" ? items[10] : undefined;
      if (!isMainGroup(groupIdx, kind, ev)) return null;
      const extras = storedExtras(items[8], undefined, null, loraName, ev, "[8] (extra_keys)");
      return { type: "stored", blockHashes, parentHash, tokenIds, blockSize, loraName, tier, eagle, ...extras };
    }
    case "BlockRemoved": {
      const blockHashes = toHashes(requiredItem(items, 1, ev, "[1] (block_hashes)"), ev, "[1] (block_hashes)");
      const tier = toTier(items[2], ev, "[2] (medium)");
      const groupIdx = typeof items[3] === "number" || typeof items[3] === "bigint" ? items[3] : undefined;
      if (!isMainGroup(groupIdx, undefined, ev)) return null;
      return { type: "removed", blockHashes, tier };
    }
    case "AllBlocksCleared":
      return { type: "cleared" };
    default:
      throw fail(loc(ev, "[0]"), `unknown event tag ${JSON.stringify(tag)}`);
  }
}

/** A vLLM multimodal identifier in extra_keys: a 64-hex-digit digest (Dynamo takes its first 16 digits as the u64 mm_hash). */
const MM_DIGEST = /^[0-9a-fA-F]{64}$/;

/**
 * What a BlockStored's optional metadata adds to its content hashes, as the reference's vLLM wire
 * types read it (Dynamo lib/kv-router zmq wire types: `extra_keys_to_block_mm_infos`,
 * `extract_cache_namespace_from_extra_keys`):
 * - `cache_salt` given on the event (TRT-LLM style), else the salt vLLM stamps in the first
 *   block's `extra_keys` (vllm/v1/core/kv_cache_utils.py `_gen_*_extra_hash_keys`: lora name,
 *   mm identifiers, cache salt, prompt-embedding bytes): its first string that is neither an mm
 *   digest nor the lora name;
 * - per block, the multimodal objects' hashes: `block_mm_infos` when given, else each block's
 *   `extra_keys` mm digests (a bare digest, or `[digest, start offset]` in vLLM 0.19+).
 * Items of other kinds (bytes, numbers) are ignored, as new ones an engine may add.
 */
function storedExtras(
  extraKeys: unknown,
  mmInfos: unknown,
  cacheSalt: string | null,
  loraName: string | null,
  ev: number,
  at: string,
): { cacheSalt?: string; blockMmHashes?: (bigint[] | undefined)[] } {
  const out: { cacheSalt?: string; blockMmHashes?: (bigint[] | undefined)[] } = {};
  let keys: unknown[] | null = null;
  if (extraKeys !== undefined && extraKeys !== null) {
    if (!Array.isArray(extraKeys)) throw fail(loc(ev, at), `expected an array or null, got ${describe(extraKeys)}`);
    keys = extraKeys as unknown[];
  }
  if (cacheSalt !== null && cacheSalt !== "") out.cacheSalt = cacheSalt;
  else if (keys !== null && Array.isArray(keys[0])) {
    for (const item of keys[0] as unknown[]) {
      if (typeof item === "string" && !MM_DIGEST.test(item) && item !== loraName && item !== "") {
        out.cacheSalt = item;
        break;
      }
    }
  }
  let mm: (bigint[] | undefined)[] | undefined;
  if (mmInfos !== undefined && mmInfos !== null) {
    if (!Array.isArray(mmInfos)) throw fail(loc(ev, ".block_mm_infos"), `expected an array or null, got ${describe(mmInfos)}`);
    mm = (mmInfos as unknown[]).map((info, b) => {
      if (info === null || info === undefined) return undefined;
      const objects = isMap(info) ? info["mm_objects"] : undefined;
      if (!Array.isArray(objects)) throw fail(loc(ev, `.block_mm_infos[${b}].mm_objects`), "expected an array");
      const hashes = (objects as unknown[]).map((o, k) => toHash(isMap(o) ? o["mm_hash"] : undefined, ev, `.block_mm_infos[${b}].mm_objects[${k}].mm_hash`));
      return hashes.length > 0 ? hashes : undefined;
    });
  } else if (keys !== null) {
    mm = keys.map((blockKeys) => {
      if (!Array.isArray(blockKeys)) return undefined;
      const hashes: bigint[] = [];
      for (const item of blockKeys as unknown[]) {
        const digest = typeof item === "string" ? item : Array.isArray(item) && typeof item[0] === "string" ? item[0] : undefined;
        if (digest !== undefined && MM_DIGEST.test(digest)) hashes.push(BigInt(`0x${digest.slice(0, 16)}`));
      }
      return hashes.length > 0 ? hashes : undefined;
    });
  }
  if (mm !== undefined && mm.some((h) => h !== undefined)) out.blockMmHashes = mm;
  return out;
}

function requiredField(fields: Fields, name: string, ev: number): unknown {
  if (!(name in fields)) throw fail(loc(ev, `.${name}`), "missing");
  return fields[name];
}

function requiredItem(items: readonly unknown[], i: number, ev: number, at: string): unknown {
  if (i >= items.length) throw fail(loc(ev, at), "missing");
  return items[i];
}

/** Hybrid models publish one event stream per KV-cache group; only group 0 (main attention) is indexed. */
function isMainGroup(groupIdx: unknown, kind: unknown, ev: number): boolean {
  if (groupIdx !== undefined && groupIdx !== null && toU32(groupIdx, ev, ".group_idx") !== 0) return false;
  if (kind === undefined || kind === null) return true;
  if (typeof kind !== "string") throw fail(loc(ev, ".kv_cache_spec_kind"), `expected a string or null, got ${describe(kind)}`);
  return MAIN_KV_CACHE_SPEC_KINDS.has(kind);
}

/**
 * A hash sent as bytes (msgpack bin): what vLLM publishes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0
 * (`ExternalBlockHash = bytes | int`, vllm/v1/core/kv_cache_utils.py). Reduced to the u64 vLLM
 * itself sends in integer mode (`maybe_convert_block_hash`: `int.from_bytes(b, "big") & (2^64 - 1)`,
 * the last 8 bytes big-endian), so an engine keeps the same block identities in either mode.
 */
function bytesHash(b: Uint8Array): bigint {
  let v = 0n;
  for (let i = Math.max(0, b.length - 8); i < b.length; i++) v = (v << 8n) | BigInt(b[i] as number);
  return v;
}

function toHash(value: unknown, ev: number, at: string): bigint {
  let v: bigint;
  if (typeof value === "bigint") v = value;
  else if (value instanceof Uint8Array) return bytesHash(value);
  else if (typeof value === "number") {
    // Above 2^53 msgpackr hands back a float: the hash would already be rounded, so refuse it.
    if (!Number.isSafeInteger(value)) throw fail(loc(ev, at), Number.isInteger(value) ? "integer is not exact (float above 2^53)" : "not an integer");
    v = BigInt(value);
  } else throw fail(loc(ev, at), `not an integer (got ${describe(value)})`);
  try {
    return toU64(v);
  } catch {
    throw fail(loc(ev, at), `${v} is outside the 64-bit range`);
  }
}

function toHashes(value: unknown, ev: number, at: string): bigint[] {
  if (!Array.isArray(value)) throw fail(loc(ev, at), `expected an array, got ${describe(value)}`);
  const list = value as unknown[];
  const out = new Array<bigint>(list.length);
  for (let i = 0; i < list.length; i++) {
    const v = list[i];
    out[i] = typeof v === "bigint" && v >= 0n && v <= U64_MAX ? v : toHash(v, ev, `${at}[${i}]`);
  }
  return out;
}

function toU32(value: unknown, ev: number, at: string): number {
  if (isU32(value)) return value;
  const n = typeof value === "bigint" && value >= 0n && value <= BigInt(U32_MAX) ? Number(value) : value;
  if (typeof n !== "number" || !Number.isInteger(n)) throw fail(loc(ev, at), `not an integer (got ${describe(value)})`);
  if (n < 0 || n > U32_MAX) throw fail(loc(ev, at), `${n} is outside [0, 2^32)`);
  return n;
}

const optionalU32 = (value: unknown, ev: number, at: string): number | null => (value === undefined || value === null ? null : toU32(value, ev, at));

function optionalString(value: unknown, ev: number, at: string): string | null {
  if (value === undefined || value === null) return null;
  if (typeof value !== "string") throw fail(loc(ev, at), `expected a string or null, got ${describe(value)}`);
  return value;
}

function toTimestamp(value: unknown): number {
  if (value === undefined) throw fail("ts", "missing");
  const n = typeof value === "bigint" ? Number(value) : value;
  if (typeof n !== "number" || !Number.isFinite(n)) throw fail("ts", `expected a finite number, got ${describe(value)}`);
  return n;
}

/** Flat `[t0, t1, ...]`, or Eagle pairs `[[t0, t1], [t1, t2], ...]` flattened to firsts plus the last second (as Dynamo does). */
function toTokenIds(value: unknown, ev: number, at: string): { tokenIds: number[]; eagle: boolean } {
  if (!Array.isArray(value)) throw fail(loc(ev, at), `expected an array, got ${describe(value)}`);
  const list = value as unknown[];
  if (list.length === 0) return { tokenIds: [], eagle: false };
  if (!Array.isArray(list[0])) {
    const tokenIds = new Array<number>(list.length);
    for (let i = 0; i < list.length; i++) {
      const v = list[i];
      tokenIds[i] = isU32(v) ? v : toU32(v, ev, `${at}[${i}]`);
    }
    return { tokenIds, eagle: false };
  }
  const tokenIds = new Array<number>(list.length + 1);
  for (let i = 0; i < list.length; i++) {
    const pair = list[i];
    if (!Array.isArray(pair) || pair.length !== 2) throw fail(loc(ev, `${at}[${i}]`), "expected a (first, second) token pair like the other entries");
    const [first, second] = pair as [unknown, unknown];
    tokenIds[i] = isU32(first) ? first : toU32(first, ev, `${at}[${i}][0]`);
    const last = isU32(second) ? second : toU32(second, ev, `${at}[${i}][1]`);
    if (i === list.length - 1) tokenIds[i + 1] = last;
  }
  return { tokenIds, eagle: true };
}

export function toTier(value: unknown, ev: number, at: string): StorageTier {
  if (value === undefined || value === null) return "device";
  if (typeof value !== "string") throw fail(loc(ev, at), `expected a string or null, got ${describe(value)}`);
  // Engines send upper case; the case-folding fallback only runs for anything else.
  const medium = value === "GPU" || value === "CPU" || value === "CPU_PINNED" ? value : value.toUpperCase();
  switch (medium) {
    case "GPU":
      return "device";
    case "CPU":
    case "CPU_PINNED":
      return "host";
    default:
      // "DISK" and every external/offload medium (e.g. LMCache, NIXL remote stores) rank as disk.
      return "disk";
  }
}
