/**
 * Request-body validation: parsed JSON -> the typed shapes of src/core/types.ts.
 *
 * Hand-written, table-driven checks (TypeBox/ajv are not installed, and these cost little per
 * field next to parsing). Each table is typed against its wire interface (`Shape<T>` has one entry per key of T,
 * whose check returns that key's type), so a field added to types.ts without a validator fails
 * to compile. Wrong shapes are 422 KVMESH_INVALID_FIELD naming the field path
 * ("token_ids[3]: must be an integer in [0, 4294967295]"); unknown fields are rejected rather than
 * ignored, because a misspelt optional field silently dropped routes differently without a trace.
 * Semantic checks (ranges that depend on config, id lengths, prompt consistency) stay in the
 * service, which answers 400 for them.
 */
import { badRequest, invalidField } from "../core/index.js";
import { MAX_ID_BYTES } from "../core/index.js";
import type {
  BlockExtraInfo,
  BlockMmObjectInfo,
  MmRoutingInfo,
  PromptFields,
  ReservationRequest,
  RouterConfigOverrideWire,
  SelectAndReserveRequest,
  SelectRequest,
  SessionContext,
  WorkerPatchRequest,
  WorkerRankRef,
  WorkerRequest,
} from "../core/index.js";

/** Validates `v` found at `path` and returns it typed (possibly converted: numbers -> bigint). */
export type Check<T> = (v: unknown, path: string) => T;

interface Field<T> {
  readonly check: Check<T>;
  readonly required: boolean;
  /** What the field must be, for "x: required <what>". */
  readonly what: string;
}

/** One entry per key of T; optional keys take `opt`, required ones `req`. */
export type Shape<T> = { readonly [K in keyof T]-?: Field<Exclude<T[K], undefined>> };

const U32_MAX = 0xffff_ffff;
const U64_LIMIT = 1n << 64n;
const I64_MIN = -(1n << 63n);

const fail = (path: string, problem: string): never => {
  throw invalidField(path, problem);
};

// ---------------------------------------------------------------- scalar checks

/**
 * A lone UTF-16 surrogate: `"\ud800"` is valid JSON, but the code unit has no UTF-8 form. Every
 * encoder on the way out (msgpack on the mesh, JSON replies, logs) writes it as U+FFFD, so peers
 * would hold the session or booking under another id ("a\ud800" and "a\udc00" both become
 * "a\ufffd" there and collide), and the id cannot be percent-encoded into a URL path to free it.
 * With the `u` flag a well-formed pair is one code point, so only lone halves match.
 */
const LONE_SURROGATE = /\p{Cs}/u;

/** Strings must be well-formed Unicode (400 naming the field otherwise, like any invalid value). */
function wellFormed(v: string, path: string): string {
  if (LONE_SURROGATE.test(v)) throw badRequest(`${path} must be well-formed Unicode (a lone surrogate has no UTF-8 form)`, path);
  return v;
}

const str =
  (what = "string"): Check<string> =>
  (v, path) =>
    typeof v === "string" ? wellFormed(v, path) : fail(path, `must be a ${what}`);

/** Selection and session ids: a string (422 otherwise) of at most MAX_ID_BYTES (400, as the service). */
const id: Check<string> = (v, path) => {
  if (typeof v !== "string") return fail(path, "must be a string");
  if (v.length > MAX_ID_BYTES / 3 && Buffer.byteLength(v, "utf8") > MAX_ID_BYTES) throw badRequest(`${path} is longer than ${MAX_ID_BYTES} bytes`, path);
  return wellFormed(v, path);
};

const bool: Check<boolean> = (v, path) => (typeof v === "boolean" ? v : fail(path, "must be a boolean"));

/** A finite JSON number (a bigint literal is converted: it is finite, only imprecise). */
const num: Check<number> = (v, path) => {
  if (typeof v === "number" && Number.isFinite(v)) return v;
  if (typeof v === "bigint") return Number(v);
  return fail(path, "must be a finite number");
};

const nonNegative: Check<number> = (v, path) => {
  const n = num(v, path);
  return n >= 0 ? n : fail(path, "must be a non-negative number");
};

const intIn = (min: number, max: number): Check<number> => {
  const problem = `must be an integer in [${min}, ${max}]`;
  return (v, path) => (typeof v === "number" && Number.isInteger(v) && v >= min && v <= max ? v : fail(path, problem));
};
const u32 = intIn(0, U32_MAX);
const uSafe = intIn(0, Number.MAX_SAFE_INTEGER);

/** A 64-bit integer as bigint: numbers must be exact (safe) integers, bigints are exact already. */
const big64 = (min: bigint, limit: bigint, problem: string): Check<bigint> => {
  return (v, path) => {
    const b = typeof v === "bigint" ? v : typeof v === "number" && Number.isSafeInteger(v) ? BigInt(v) : fail(path, problem);
    return b >= min && b < limit ? b : fail(path, problem);
  };
};
/** Worker ids: unsigned 64-bit. */
export const u64: Check<bigint> = big64(0n, U64_LIMIT, "must be an integer in [0, 18446744073709551615]");
/** Hashes: signed or unsigned 64-bit (the reference sends i64; the service reinterprets as u64). */
export const hash64: Check<bigint> = big64(I64_MIN, U64_LIMIT, "must be an integer in [-9223372036854775808, 18446744073709551615]");

const oneOf = <T extends string>(...values: T[]): Check<T> => {
  const problem = `must be one of ${values.map((x) => JSON.stringify(x)).join(", ")}`;
  return (v, path) => (values.includes(v as T) ? (v as T) : fail(path, problem));
};

/** lora_name and cache_salt accept an explicit null (the reference's Option<String>). */
const nullableStr: Check<string | null> = (v, path) => (v === null ? null : str()(v, path));

// ---------------------------------------------------------------- composite checks

const arrayOf = <T>(item: Check<T>, what: string): Check<T[]> => {
  return (v, path) => {
    if (!Array.isArray(v)) return fail(path, `must be an array of ${what}`);
    const out = new Array<T>(v.length);
    for (let i = 0; i < v.length; i++) out[i] = item(v[i], `${path}[${i}]`);
    return out;
  };
};

/**
 * Token ids are checked in place (no copy): a 14,000-token prompt costs one tight loop. A
 * Uint32Array (the server's fast body path, token-ids.ts) holds only valid ids by construction.
 */
const tokenIds: Check<readonly number[] | Uint32Array> = (v, path) => {
  if (v instanceof Uint32Array) return v;
  if (!Array.isArray(v)) return fail(path, "must be an array of integers");
  const a = v as unknown[];
  for (let i = 0; i < a.length; i++) {
    const t = a[i];
    if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t > U32_MAX) fail(`${path}[${i}]`, `must be an integer in [0, ${U32_MAX}]`);
  }
  return a as number[];
};

const recordOf = <T>(item: Check<T>, what: string): Check<Record<string, T>> => {
  return (v, path) => {
    if (!isPlainObject(v)) return fail(path, `must be an object of ${what}`);
    const out: Record<string, T> = {};
    for (const k of Object.keys(v)) {
      const checked = item(v[k], `${path}.${k}`);
      // defineProperty so a "__proto__" key stays data, never the prototype.
      Object.defineProperty(out, k, { value: checked, enumerable: true, writable: true, configurable: true });
    }
    return out;
  };
};

const isPlainObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

const req = <T>(check: Check<T>, what: string): Field<T> => ({ check, required: true, what });
const opt = <T>(check: Check<T>, what = ""): Field<T> => ({ check, required: false, what });

/**
 * An object with exactly the fields of `shape`: unknown keys are rejected, a missing or null
 * required field is "required <what>", a null optional field counts as absent (serde's Option).
 */
export function objectOf<T>(shape: Shape<T>): Check<T> {
  const fields = shape as Readonly<Record<string, Field<unknown>>>;
  const required = Object.keys(fields).filter((k) => fields[k]?.required === true);
  return (v, path) => {
    if (!isPlainObject(v)) return fail(path === "" ? "body" : path, "must be a JSON object");
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v)) {
      const f = Object.hasOwn(fields, k) ? fields[k] : undefined;
      const at = path === "" ? k : `${path}.${k}`;
      if (f === undefined) fail(at, "unknown field");
      else {
        const value = v[k];
        if (value === null) {
          if (f.required) fail(at, `required ${f.what}`);
          continue;
        }
        out[k] = f.check(value, at);
      }
    }
    for (const k of required) {
      if (out[k] === undefined) fail(path === "" ? k : `${path}.${k}`, `required ${fields[k]?.what ?? "field"}`);
    }
    return out as T;
  };
}

// ---------------------------------------------------------------- request tables

const workerFields: Shape<Omit<WorkerRequest, "worker_id">> = {
  model_name: opt(str()),
  routing_group: opt(str()),
  endpoint: opt(str()),
  kv_events_endpoint: opt(str()),
  kv_events_endpoints: opt(recordOf(str(), "strings")),
  replay_endpoint: opt(str()),
  // kvmesh addition: one replay endpoint per dp rank (docs/compatibility.md).
  replay_endpoints: opt(recordOf(str(), "strings")),
  block_size: opt(u32),
  data_parallel_start_rank: opt(u32),
  data_parallel_size: opt(u32),
  max_num_batched_tokens: opt(u32),
  total_kv_blocks: opt(uSafe),
  is_eagle: opt(bool),
  taints: opt(arrayOf(str(), "strings")),
  // The rest of the reference's WorkerRequest (types.rs): stored and echoed (docs/http-api.md, Worker fields).
  stable_routing_id: opt(str()),
  topology_domains: opt(recordOf(str(), "strings")),
  kv_transfer_domain: opt(str()),
  kv_transfer_enforcement: opt(oneOf("required", "preferred")),
  kv_transfer_preferred_weight: opt(num),
  router_hint_worker_type: opt(str()),
  router_hint_source_control_endpoints: opt(recordOf(str(), "strings")),
  kv_event_source_mode: opt(str()),
};

/** An array whose items may be null (the reference's `Vec<Option<T>>`). */
const arrayOfNullable = <T>(item: Check<T>, what: string): Check<(T | null)[]> => {
  return (v, path) => {
    if (!Array.isArray(v)) return fail(path, `must be an array of ${what}`);
    const out = new Array<T | null>(v.length);
    for (let i = 0; i < v.length; i++) out[i] = v[i] === null ? null : item(v[i], `${path}[${i}]`);
    return out;
  };
};

/** A `(start, end)` offset pair: a JSON array of exactly two non-negative integers. */
const offsetPair: Check<readonly [number, number]> = (v, path) => {
  if (!Array.isArray(v) || v.length !== 2) return fail(path, "must be an array of two non-negative integers");
  return [uSafe(v[0], `${path}[0]`), uSafe(v[1], `${path}[1]`)] as const;
};

/** The reference's `BlockExtraInfo { mm_objects: [BlockMmObjectInfo { mm_hash: u64, offsets }] }` (protocols.rs). */
const blockExtraInfo = objectOf<BlockExtraInfo>({
  mm_objects: req(
    arrayOf(
      objectOf<BlockMmObjectInfo>({
        mm_hash: req(u64, "unsigned 64-bit integer"),
        offsets: req(arrayOf(offsetPair, "[start, end] pairs"), "array of [start, end] pairs"),
      }),
      "objects",
    ),
    "array of objects",
  ),
});
const blockMmInfos = arrayOfNullable(blockExtraInfo, "objects or nulls");

const promptFields: Shape<PromptFields> = {
  token_ids: opt(tokenIds),
  // The reference's `MmRoutingInfoRequest` (services/selection/input.rs).
  mm_routing_info: opt(
    objectOf<MmRoutingInfo>({
      routing_token_ids: req(tokenIds, "array of integers"),
      block_mm_infos: opt(blockMmInfos),
    }),
  ),
  block_mm_infos: opt(blockMmInfos),
  block_hashes: opt(arrayOf(hash64, "64-bit integers")),
  sequence_hashes: opt(arrayOf(hash64, "64-bit integers")),
  isl_tokens: opt(u32),
  lora_name: opt(nullableStr),
  cache_salt: opt(nullableStr),
  is_eagle: opt(bool),
};

const overrideFields: Shape<RouterConfigOverrideWire> = {
  overlap_score_credit: opt(num),
  overlap_score_weight: opt(num),
  prefill_load_scale: opt(num),
  router_temperature: opt(num),
  assume_kv_reuse: opt(bool),
  track_prefill_tokens: opt(bool),
  shared_cache_multiplier: opt(num),
};

const sessionContext = objectOf<SessionContext>({
  session_id: req(id, "string"),
  parent_session_id: opt(id),
  session_final: opt(bool),
  input_trigger: opt(oneOf("user_message", "tool_result", "other")),
});

const rankRef = objectOf<WorkerRankRef>({
  worker_id: req(u64, "unsigned 64-bit integer"),
  dp_rank: opt(u32),
});

const partitionFields = {
  model_name: opt(str()),
  routing_group: opt(str()),
  router_config_override: opt(objectOf(overrideFields)),
} as const;

const filterFields: Shape<Pick<SelectRequest, "allowed_worker_ids" | "pinned_worker" | "routing_constraints">> = {
  allowed_worker_ids: opt(arrayOf(u64, "unsigned 64-bit integers")),
  pinned_worker: opt(
    objectOf<{ worker_id: bigint; dp_rank: number }>({
      worker_id: req(u64, "unsigned 64-bit integer"),
      dp_rank: req(u32, "integer"),
    }),
  ),
  routing_constraints: opt(
    objectOf<{ required_taints?: string[]; preferred_taints?: Record<string, number> }>({
      required_taints: opt(arrayOf(str(), "strings")),
      preferred_taints: opt(recordOf(num, "numbers")),
    }),
  ),
};

const selectFields: Shape<SelectAndReserveRequest> = {
  ...promptFields,
  ...partitionFields,
  ...filterFields,
  selection_id: opt(id),
  expected_output_tokens: opt(u32),
  // The reference's queue priority (types.rs: `Option<f64>`, `Option<u32>`); kvmesh has no queue.
  priority_jump: opt(num),
  strict_priority: opt(u32),
  session_id: opt(id),
  session_context: opt(sessionContext),
  affinity_target: opt(rankRef),
  expected_prefill_duration_ms: opt(nonNegative),
};

/** POST /potential_loads and /overlap_scores: a prompt scored against a partition, no booking. */
export type ScoreRequest = Pick<
  SelectRequest,
  keyof PromptFields | "model_name" | "routing_group" | "router_config_override" | "allowed_worker_ids" | "pinned_worker" | "routing_constraints"
>;

export const parseWorkerRequest: Check<WorkerRequest> = objectOf<WorkerRequest>({ ...workerFields, worker_id: req(u64, "unsigned 64-bit integer") });
export const parseWorkerPatch: Check<WorkerPatchRequest> = objectOf<WorkerPatchRequest>({
  ...workerFields,
  lifecycle: opt(oneOf("schedulable", "draining")),
});
export const parseSelectRequest: Check<SelectRequest> = objectOf<SelectRequest>({ ...selectFields, advisory: opt(bool) });
export const parseSelectAndReserveRequest: Check<SelectAndReserveRequest> = objectOf<SelectAndReserveRequest>(selectFields);
export const parseScoreRequest: Check<ScoreRequest> = objectOf<ScoreRequest>({ ...promptFields, ...partitionFields, ...filterFields });
export const parseReservationRequest: Check<ReservationRequest> = objectOf<ReservationRequest>({
  ...promptFields,
  ...partitionFields,
  selection_id: req(id, "string"),
  worker_id: opt(u64),
  dp_rank: opt(u32),
  expected_output_tokens: opt(u32),
  effective_prefill_tokens: opt(u32),
  track_prefill_tokens: opt(bool),
  session_id: opt(id),
  session_context: opt(sessionContext),
});
export const parseOutputBlockRequest: Check<{ decay_fraction?: number }> = objectOf<{ decay_fraction?: number }>({ decay_fraction: opt(num) });
export const parseEmptyRequest: Check<Record<string, never>> = objectOf<Record<string, never>>({});
export const parsePeerRequest: Check<{ endpoint: string }> = objectOf<{ endpoint: string }>({ endpoint: req(str(), "string") });

/** A worker id from a URL path: canonical unsigned decimal, at most 2^64 - 1 (400 otherwise). */
export function parseWorkerIdParam(raw: string): bigint {
  if (!/^(0|[1-9]\d{0,19})$/.test(raw)) throw badRequest("worker_id: must be an unsigned 64-bit decimal integer", "worker_id");
  const v = BigInt(raw);
  if (v >= U64_LIMIT) throw badRequest("worker_id: must be an unsigned 64-bit decimal integer", "worker_id");
  return v;
}

/** A selection id from a URL path: non-empty, at most MAX_ID_BYTES (400 otherwise). */
export function parseSelectionIdParam(raw: string): string {
  if (raw.length === 0) throw badRequest("selection_id must be a non-empty string", "selection_id");
  if (Buffer.byteLength(raw, "utf8") > MAX_ID_BYTES) throw badRequest(`selection_id is longer than ${MAX_ID_BYTES} bytes`, "selection_id");
  return raw;
}
