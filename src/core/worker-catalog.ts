/**
 * The worker catalog: one record per worker id (service-wide), each in one partition
 * `(model_name, routing_group)`. It owns validation and the lifecycle
 * `incomplete -> schedulable -> draining -> unschedulable (removed)`, with the reasons a worker
 * cannot be scheduled spelled out in `not_schedulable_reasons`.
 */
import { badRequest, KvmeshError } from "./errors.js";
import { MAX_WORKER_FIELD_ENTRIES } from "./limits.js";
import {
  DEFAULT_MODEL_NAME,
  DEFAULT_ROUTING_GROUP,
  type KvTransferEnforcement,
  type Lifecycle,
  type WorkerCatalogRecord,
  type WorkerId,
  type WorkerPatchRequest,
  type WorkerRequest,
} from "./types.js";

/** Longest model name, routing group, endpoint or taint accepted, bytes. */
export const MAX_NAME_BYTES = 256;
export const MAX_ENDPOINT_BYTES = 1024;
/** More ranks than any real deployment; bounds memory per worker. */
export const MAX_DATA_PARALLEL_SIZE = 1024;
const U64_MAX = (1n << 64n) - 1n;
const U32_MAX = 0xffff_ffff;

/** Every list or map of a worker within MAX_WORKER_FIELD_ENTRIES: what the mesh decoder accepts of it (limits.ts). */
function boundFieldEntries(req: object): void {
  for (const [field, v] of Object.entries(req) as [string, unknown][]) {
    const n = Array.isArray(v) ? v.length : v !== null && typeof v === "object" ? Object.keys(v).length : 0;
    if (n > MAX_WORKER_FIELD_ENTRIES) throw badRequest(`${field} has ${String(n)} entries, more than ${String(MAX_WORKER_FIELD_ENTRIES)}`, field);
  }
}

export const partitionKey = (model: string, group: string): string => `${model}:${group}`;

export interface CatalogPolicy {
  /** With KV events on, a rank with no event endpoint cannot be scheduled (the index would stay empty). */
  readonly requireKvEventsEndpoint: boolean;
  /** The partition's fixed block size, if the partition exists. */
  readonly partitionBlockSize: (key: string) => number | undefined;
  /** The partition's fixed Eagle mode, if the partition exists. */
  readonly partitionIsEagle?: (key: string) => boolean | undefined;
}

/**
 * Prefixes of the reasons a worker's KV-event or replay endpoint cannot be used, whether the
 * catalog found its form invalid or the ingest's ZeroMQ socket refused it. The reference words
 * them the same way (ingress.rs `reconcile`: "invalid kv_events endpoint for worker {id} dp_rank
 * {rank}: …", behind core/workers.rs's "reconciliation failed: ").
 */
export const KV_EVENTS_ENDPOINT_REASON = "reconciliation failed: invalid kv_events endpoint";
export const REPLAY_ENDPOINT_REASON = "reconciliation failed: invalid replay endpoint";

/** Whether `r` is incomplete because one of its KV-event or replay endpoints cannot be used. */
export function hasUnusableKvEndpoint(r: WorkerCatalogRecord): boolean {
  return r.lifecycle === "incomplete" && r.not_schedulable_reasons.some((x) => x.startsWith(KV_EVENTS_ENDPOINT_REASON) || x.startsWith(REPLAY_ENDPOINT_REASON));
}

/** The reason the ingest reports when ZeroMQ refuses a rank's KV-event endpoint. */
export function kvEventsEndpointRefused(workerId: WorkerId, dpRank: number, endpoint: string, error: string): string {
  return `${KV_EVENTS_ENDPOINT_REASON} for worker ${workerId} dp_rank ${dpRank}: ZeroMQ refused \`${endpoint}\`: ${error}`;
}

export class WorkerCatalog {
  readonly #records = new Map<WorkerId, WorkerCatalogRecord>();
  readonly #policy: CatalogPolicy;

  constructor(policy: CatalogPolicy) {
    this.#policy = policy;
  }

  get size(): number {
    return this.#records.size;
  }

  get(workerId: WorkerId): WorkerCatalogRecord | undefined {
    return this.#records.get(workerId);
  }

  require(workerId: WorkerId): WorkerCatalogRecord {
    const r = this.#records.get(workerId);
    if (r === undefined) throw new KvmeshError("KVMESH_WORKER_NOT_FOUND", `worker ${workerId} not found`);
    return r;
  }

  list(model?: string, group?: string): WorkerCatalogRecord[] {
    const out: WorkerCatalogRecord[] = [];
    for (const r of this.#records.values()) {
      if (model !== undefined && r.model_name !== model) continue;
      if (group !== undefined && r.routing_group !== group) continue;
      out.push(r);
    }
    return out.sort((a, b) => (a.worker_id < b.worker_id ? -1 : a.worker_id > b.worker_id ? 1 : 0));
  }

  /** Validates and builds the record that an upsert would store, without storing it. */
  prepareUpsert(req: WorkerRequest): WorkerCatalogRecord {
    return this.#evaluate(workerDraft(req), this.#records.get(req.worker_id)?.lifecycle === "draining" ? "draining" : undefined);
  }

  /**
   * The record a peer's registration makes here (src/core/catalog-replication.ts): its fields as
   * the peer resolved them, draining exactly when the peer's was; the reasons are this replica's.
   */
  prepareReplicated(req: WorkerRequest, draining: boolean): WorkerCatalogRecord {
    return this.#evaluate(workerDraft(req), draining ? "draining" : undefined);
  }

  /** Validates a PATCH against the current record and returns the merged record (not stored). */
  preparePatch(workerId: WorkerId, patch: WorkerPatchRequest): WorkerCatalogRecord {
    const current = this.require(workerId);
    if ("worker_id" in patch) throw badRequest("worker_id cannot be patched", "worker_id");
    const merged: WorkerRequest = { ...recordToRequest(current) };
    for (const [k, v] of Object.entries(patch)) {
      if (k === "lifecycle" || v === undefined) continue;
      (merged as unknown as Record<string, unknown>)[k] = v;
    }
    const lifecycle = patch.lifecycle;
    if (lifecycle !== undefined && lifecycle !== "schedulable" && lifecycle !== "draining") {
      throw badRequest(`lifecycle must be "schedulable" or "draining"`, "lifecycle");
    }
    const record = this.prepareUpsert(merged);
    const drain = lifecycle === "draining" || (lifecycle === undefined && current.lifecycle === "draining");
    return this.#evaluate(record, drain ? "draining" : undefined);
  }

  store(record: WorkerCatalogRecord): void {
    this.#records.set(record.worker_id, record);
  }

  remove(workerId: WorkerId): WorkerCatalogRecord {
    const r = this.require(workerId);
    this.#records.delete(workerId);
    return { ...r, lifecycle: "unschedulable" };
  }

  #evaluate(draft: WorkerCatalogRecord, forced: Lifecycle | undefined): WorkerCatalogRecord {
    const reasons: string[] = [];
    if (draft.endpoint === null || draft.endpoint === "") reasons.push("missing endpoint");
    if (draft.block_size === null || draft.block_size === 0) reasons.push("missing block_size");
    else if (draft.block_size < 2) reasons.push("block_size must be > 1");
    if (draft.data_parallel_size === 0) reasons.push("data_parallel_size is 0");
    if (draft.data_parallel_size > 1 && draft.replay_endpoint !== null) {
      reasons.push("replay_endpoint is only supported for data_parallel_size 1");
    }
    if (this.#policy.requireKvEventsEndpoint) {
      for (const rank of ranksOf(draft)) {
        if (kvEventsEndpointFor(draft, rank) === null) reasons.push(`no kv_events_endpoint for dp rank ${rank}`);
      }
    }
    const key = partitionKey(draft.model_name, draft.routing_group);
    const fixed = this.#policy.partitionBlockSize(key);
    if (fixed !== undefined && draft.block_size !== null && draft.block_size !== fixed) {
      reasons.push(`reconciliation failed: block_size ${draft.block_size} does not match partition ${key} block_size ${fixed}`);
    }
    // The reference fixes a partition's Eagle mode with its block size (core/workers.rs
    // ensure_entry_for: "is_eagle mismatch for {key}: existing=… requested=…").
    const fixedEagle = this.#policy.partitionIsEagle?.(key);
    const eagle = draft.is_eagle ?? false;
    if (fixedEagle !== undefined && eagle !== fixedEagle) {
      reasons.push(`reconciliation failed: is_eagle mismatch for ${key}: existing=${fixedEagle} requested=${eagle}`);
    }
    // With KV events on, endpoints the listener could not use keep the worker incomplete; the
    // reference checks their form only once nothing else is missing (ingress.rs reconcile runs
    // for a record with no reasons yet), with common/zmq.rs validate_endpoint.
    if (this.#policy.requireKvEventsEndpoint && reasons.length === 0) {
      for (const rank of ranksOf(draft)) {
        const ep = kvEventsEndpointFor(draft, rank);
        const problem = ep === null ? null : zmqEndpointProblem(ep);
        if (problem !== null) reasons.push(`${KV_EVENTS_ENDPOINT_REASON} for worker ${draft.worker_id} dp_rank ${rank}: ${problem}`);
      }
      const problem = draft.replay_endpoint === null ? null : zmqEndpointProblem(draft.replay_endpoint);
      if (problem !== null) reasons.push(`${REPLAY_ENDPOINT_REASON} for worker ${draft.worker_id}: ${problem}`);
      for (const [rank, ep] of Object.entries(draft.replay_endpoints ?? {})) {
        const p = zmqEndpointProblem(ep);
        if (p !== null) reasons.push(`${REPLAY_ENDPOINT_REASON} for worker ${draft.worker_id} dp_rank ${rank}: ${p}`);
      }
    }
    const lifecycle: Lifecycle = reasons.length > 0 ? "incomplete" : (forced ?? "schedulable");
    return { ...draft, lifecycle, not_schedulable_reasons: reasons };
  }
}

/**
 * Validates a registration and resolves its fields (defaults, sorted taints), lifecycle not yet
 * evaluated: what the catalogue stores, and what the mesh's decoder checks a peer's against.
 * Throws a 400/422 KvmeshError naming the field.
 */
export function workerDraft(req: WorkerRequest): WorkerCatalogRecord {
  validateWorkerId(req.worker_id, "worker_id");
  boundFieldEntries(req);
  const draft: WorkerCatalogRecord = {
    worker_id: req.worker_id,
    model_name: name(req.model_name, "model_name") ?? DEFAULT_MODEL_NAME,
    routing_group: name(req.routing_group, "routing_group") ?? DEFAULT_ROUTING_GROUP,
    endpoint: endpoint(req.endpoint, "endpoint"),
    kv_events_endpoint: endpoint(req.kv_events_endpoint, "kv_events_endpoint"),
    kv_events_endpoints: endpointMap(req.kv_events_endpoints, "kv_events_endpoints"),
    replay_endpoint: endpoint(req.replay_endpoint, "replay_endpoint"),
    block_size: optInt(req.block_size, "block_size", 0, U32_MAX),
    data_parallel_start_rank: optInt(req.data_parallel_start_rank, "data_parallel_start_rank", 0, U32_MAX) ?? 0,
    data_parallel_size: optInt(req.data_parallel_size, "data_parallel_size", 0, MAX_DATA_PARALLEL_SIZE) ?? 1,
    max_num_batched_tokens: optInt(req.max_num_batched_tokens, "max_num_batched_tokens", 1, U32_MAX),
    total_kv_blocks: optInt(req.total_kv_blocks, "total_kv_blocks", 0, Number.MAX_SAFE_INTEGER),
    is_eagle: optBool(req.is_eagle, "is_eagle") ?? null,
    taints: taints(req.taints),
    stable_routing_id: text(req.stable_routing_id, "stable_routing_id"),
    topology_domains: stringMap(req.topology_domains, "topology_domains"),
    kv_transfer_domain: text(req.kv_transfer_domain, "kv_transfer_domain"),
    kv_transfer_enforcement: enforcement(req.kv_transfer_enforcement),
    kv_transfer_preferred_weight: finite(req.kv_transfer_preferred_weight, "kv_transfer_preferred_weight"),
    lifecycle: "incomplete",
    not_schedulable_reasons: [],
  };
  // Echoed only when set, like the reference (skip_serializing_if).
  const hintType = text(req.router_hint_worker_type, "router_hint_worker_type");
  if (hintType !== null) draft.router_hint_worker_type = hintType;
  const hintEndpoints = endpointMap(req.router_hint_source_control_endpoints, "router_hint_source_control_endpoints");
  if (Object.keys(hintEndpoints).length > 0) draft.router_hint_source_control_endpoints = hintEndpoints;
  const sourceMode = text(req.kv_event_source_mode, "kv_event_source_mode");
  if (sourceMode !== null) draft.kv_event_source_mode = sourceMode;
  const replays = endpointMap(req.replay_endpoints, "replay_endpoints");
  if (Object.keys(replays).length > 0) draft.replay_endpoints = replays;
  if (draft.data_parallel_start_rank + draft.data_parallel_size - 1 > U32_MAX) {
    throw badRequest("data_parallel_start_rank + data_parallel_size exceeds the u32 rank range", "data_parallel_size");
  }
  return draft;
}

export function ranksOf(r: Pick<WorkerCatalogRecord, "data_parallel_start_rank" | "data_parallel_size">): number[] {
  const out: number[] = [];
  for (let i = 0; i < r.data_parallel_size; i++) out.push(r.data_parallel_start_rank + i);
  return out;
}

/**
 * The replay endpoint of one rank, if any: its entry in `replay_endpoints` (kvmesh addition),
 * else `replay_endpoint` for a single-rank worker (a multi-rank worker with one is incomplete).
 */
export function replayEndpointFor(r: WorkerCatalogRecord, dpRank: number): string | null {
  const specific = r.replay_endpoints?.[String(dpRank)];
  if (specific !== undefined) return specific;
  return r.data_parallel_size === 1 ? r.replay_endpoint : null;
}

/** The ZeroMQ endpoint publishing KV events for one rank, if any. */
export function kvEventsEndpointFor(r: WorkerCatalogRecord, dpRank: number): string | null {
  const specific = r.kv_events_endpoints[String(dpRank)];
  if (specific !== undefined) return specific;
  return r.data_parallel_size === 1 ? r.kv_events_endpoint : null;
}

/** A record back in the `POST /workers` shape: re-registering it stores the same fields. */
export function recordToRequest(r: WorkerCatalogRecord): WorkerRequest {
  return {
    worker_id: r.worker_id,
    model_name: r.model_name,
    routing_group: r.routing_group,
    endpoint: r.endpoint ?? undefined,
    kv_events_endpoint: r.kv_events_endpoint ?? undefined,
    kv_events_endpoints: r.kv_events_endpoints,
    replay_endpoint: r.replay_endpoint ?? undefined,
    block_size: r.block_size ?? undefined,
    data_parallel_start_rank: r.data_parallel_start_rank,
    data_parallel_size: r.data_parallel_size,
    max_num_batched_tokens: r.max_num_batched_tokens ?? undefined,
    total_kv_blocks: r.total_kv_blocks ?? undefined,
    is_eagle: r.is_eagle ?? undefined,
    taints: r.taints,
    stable_routing_id: r.stable_routing_id ?? undefined,
    topology_domains: r.topology_domains,
    kv_transfer_domain: r.kv_transfer_domain ?? undefined,
    kv_transfer_enforcement: r.kv_transfer_enforcement ?? undefined,
    kv_transfer_preferred_weight: r.kv_transfer_preferred_weight ?? undefined,
    router_hint_worker_type: r.router_hint_worker_type,
    router_hint_source_control_endpoints: r.router_hint_source_control_endpoints,
    kv_event_source_mode: r.kv_event_source_mode,
    replay_endpoints: r.replay_endpoints,
  };
}

/**
 * Why `endpoint` is not a ZeroMQ endpoint a SUB can connect to, or null if its form is fine. The
 * reference's rules (common/zmq.rs validate_endpoint): `scheme://address` with a non-empty
 * address; `tcp` needs `host:port`, a non-empty host, an IPv6 host in brackets and a u16 port;
 * `ipc` and `inproc` take any address; every other scheme is refused. Its messages, word for word.
 */
export function zmqEndpointProblem(endpoint: string): string | null {
  const bad = (why: string): string => `invalid ZMQ endpoint \`${endpoint}\`: ${why}`;
  const sep = endpoint.indexOf("://");
  if (sep < 0) return bad("missing scheme");
  const scheme = endpoint.slice(0, sep);
  const address = endpoint.slice(sep + 3);
  if (address === "") return bad("missing address");
  if (scheme === "ipc" || scheme === "inproc") return null;
  if (scheme !== "tcp") return bad(`unsupported scheme \`${scheme}\``);
  const colon = address.lastIndexOf(":");
  if (colon < 0) return bad("missing TCP port");
  const host = address.slice(0, colon);
  const port = address.slice(colon + 1);
  if (host === "") return bad("missing TCP host");
  if (host.startsWith("[")) {
    if (!host.endsWith("]")) return bad("missing closing `]`");
  } else if (host.includes(":")) return bad("missing TCP port");
  // Rust's `u16` parse and its ParseIntError messages: an optional '+', then decimal digits.
  const digits = port.startsWith("+") ? port.slice(1) : port;
  if (port === "") return bad("invalid TCP port: cannot parse integer from empty string");
  if (!/^\d+$/.test(digits)) return bad("invalid TCP port: invalid digit found in string");
  if (Number(digits) > 0xffff) return bad("invalid TCP port: number too large to fit in target type");
  return null;
}

export function validateWorkerId(v: unknown, field: string): asserts v is bigint {
  if (typeof v !== "bigint" || v < 0n || v > U64_MAX) throw badRequest(`${field} must be an unsigned 64-bit integer`, field);
}

const utf8Bytes = (s: string): number => Buffer.byteLength(s, "utf8");

function name(v: unknown, field: string): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string" || v.length === 0) throw badRequest(`${field} must be a non-empty string`, field);
  if (utf8Bytes(v) > MAX_NAME_BYTES) throw badRequest(`${field} is longer than ${MAX_NAME_BYTES} bytes`, field);
  return v;
}

function endpoint(v: unknown, field: string): string | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== "string") throw badRequest(`${field} must be a string`, field);
  if (utf8Bytes(v) > MAX_ENDPOINT_BYTES) throw badRequest(`${field} is longer than ${MAX_ENDPOINT_BYTES} bytes`, field);
  return v;
}

function endpointMap(v: unknown, field: string): Record<string, string> {
  if (v === undefined || v === null) return {};
  if (typeof v !== "object" || Array.isArray(v)) throw badRequest(`${field} must be an object of rank -> endpoint`, field);
  const out: Record<string, string> = {};
  for (const [k, e] of Object.entries(v as Record<string, unknown>)) {
    if (!/^(0|[1-9]\d{0,9})$/.test(k) || Number(k) > U32_MAX) {
      throw badRequest(`${field} key "${k}" is not a dp rank`, field);
    }
    const ep = endpoint(e, `${field}.${k}`);
    if (ep !== null) out[k] = ep;
  }
  return out;
}

/** An optional free-form string (may be empty, as the reference's Option<String>), bounded. */
function text(v: unknown, field: string): string | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== "string") throw badRequest(`${field} must be a string`, field);
  if (utf8Bytes(v) > MAX_NAME_BYTES) throw badRequest(`${field} is longer than ${MAX_NAME_BYTES} bytes`, field);
  return v;
}

/** Most topology labels a worker may carry (real ones have a handful: zone, rack, host). */
export const MAX_TOPOLOGY_DOMAINS = 64;

function stringMap(v: unknown, field: string): Record<string, string> {
  if (v === undefined || v === null) return {};
  if (typeof v !== "object" || Array.isArray(v)) throw badRequest(`${field} must be an object of string -> string`, field);
  const entries = Object.entries(v as Record<string, unknown>);
  if (entries.length > MAX_TOPOLOGY_DOMAINS) throw badRequest(`${field} has more than ${MAX_TOPOLOGY_DOMAINS} entries`, field);
  const out: Record<string, string> = {};
  for (const [k, e] of entries) {
    text(k, `${field} key`);
    const value = text(e, `${field}.${k}`);
    // defineProperty so a "__proto__" key stays data, never the prototype.
    if (value !== null) Object.defineProperty(out, k, { value, enumerable: true, writable: true, configurable: true });
  }
  return out;
}

function enforcement(v: unknown): KvTransferEnforcement | null {
  if (v === undefined || v === null) return null;
  if (v !== "required" && v !== "preferred") throw badRequest(`kv_transfer_enforcement must be "required" or "preferred"`, "kv_transfer_enforcement");
  return v;
}

function finite(v: unknown, field: string): number | null {
  if (v === undefined || v === null) return null;
  const n = typeof v === "bigint" ? Number(v) : v;
  if (typeof n !== "number" || !Number.isFinite(n)) throw badRequest(`${field} must be a finite number`, field);
  return n;
}

function optInt(v: unknown, field: string, min: number, max: number): number | null {
  if (v === undefined || v === null) return null;
  const n = typeof v === "bigint" ? Number(v) : v;
  if (typeof n !== "number" || !Number.isInteger(n) || n < min || n > max) {
    throw badRequest(`${field} must be an integer in [${min}, ${max}]`, field);
  }
  return n;
}

function optBool(v: unknown, field: string): boolean | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean") throw badRequest(`${field} must be a boolean`, field);
  return v;
}

function taints(v: unknown): string[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw badRequest("taints must be an array of strings", "taints");
  const set = new Set<string>();
  v.forEach((t: unknown, i) => {
    const s = name(t, `taints[${i}]`);
    if (s !== undefined) set.add(s);
  });
  return [...set].sort();
}
