/**
 * The worker catalog: one record per worker id (service-wide), each in one partition
 * `(model_name, routing_group)`. It owns validation and the lifecycle
 * `incomplete -> schedulable -> draining -> unschedulable (removed)`, with the reasons a worker
 * cannot be scheduled spelled out in `not_schedulable_reasons`.
 */
import { badRequest, KvmeshError } from "./errors.js";
import {
  DEFAULT_MODEL_NAME,
  DEFAULT_ROUTING_GROUP,
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

export const partitionKey = (model: string, group: string): string => `${model}:${group}`;

export interface CatalogPolicy {
  /** With KV events on, a rank with no event endpoint cannot be scheduled (the index would stay empty). */
  readonly requireKvEventsEndpoint: boolean;
  /** The partition's fixed block size, if the partition exists. */
  readonly partitionBlockSize: (key: string) => number | undefined;
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
    validateWorkerId(req.worker_id, "worker_id");
    const draft: WorkerCatalogRecord = {
      worker_id: req.worker_id,
      model_name: name(req.model_name, "model_name") ?? DEFAULT_MODEL_NAME,
      routing_group: name(req.routing_group, "routing_group") ?? DEFAULT_ROUTING_GROUP,
      endpoint: endpoint(req.endpoint, "endpoint"),
      kv_events_endpoint: endpoint(req.kv_events_endpoint, "kv_events_endpoint"),
      kv_events_endpoints: endpointMap(req.kv_events_endpoints),
      replay_endpoint: endpoint(req.replay_endpoint, "replay_endpoint"),
      block_size: optInt(req.block_size, "block_size", 0, U32_MAX),
      data_parallel_start_rank: optInt(req.data_parallel_start_rank, "data_parallel_start_rank", 0, U32_MAX) ?? 0,
      data_parallel_size: optInt(req.data_parallel_size, "data_parallel_size", 0, MAX_DATA_PARALLEL_SIZE) ?? 1,
      max_num_batched_tokens: optInt(req.max_num_batched_tokens, "max_num_batched_tokens", 1, U32_MAX),
      total_kv_blocks: optInt(req.total_kv_blocks, "total_kv_blocks", 0, Number.MAX_SAFE_INTEGER),
      is_eagle: optBool(req.is_eagle, "is_eagle") ?? false,
      taints: taints(req.taints),
      lifecycle: "incomplete",
      not_schedulable_reasons: [],
    };
    if (draft.data_parallel_start_rank + draft.data_parallel_size - 1 > U32_MAX) {
      throw badRequest("data_parallel_start_rank + data_parallel_size exceeds the u32 rank range", "data_parallel_size");
    }
    return this.#evaluate(draft, this.#records.get(req.worker_id)?.lifecycle === "draining" ? "draining" : undefined);
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
    const lifecycle: Lifecycle = reasons.length > 0 ? "incomplete" : (forced ?? "schedulable");
    return { ...draft, lifecycle, not_schedulable_reasons: reasons };
  }
}

export function ranksOf(r: Pick<WorkerCatalogRecord, "data_parallel_start_rank" | "data_parallel_size">): number[] {
  const out: number[] = [];
  for (let i = 0; i < r.data_parallel_size; i++) out.push(r.data_parallel_start_rank + i);
  return out;
}

/** The ZeroMQ endpoint publishing KV events for one rank, if any. */
export function kvEventsEndpointFor(r: WorkerCatalogRecord, dpRank: number): string | null {
  const specific = r.kv_events_endpoints[String(dpRank)];
  if (specific !== undefined) return specific;
  return r.data_parallel_size === 1 ? r.kv_events_endpoint : null;
}

function recordToRequest(r: WorkerCatalogRecord): WorkerRequest {
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
    is_eagle: r.is_eagle,
    taints: r.taints,
  };
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

function endpointMap(v: unknown): Record<string, string> {
  if (v === undefined || v === null) return {};
  if (typeof v !== "object" || Array.isArray(v)) throw badRequest("kv_events_endpoints must be an object of rank -> endpoint", "kv_events_endpoints");
  const out: Record<string, string> = {};
  for (const [k, e] of Object.entries(v as Record<string, unknown>)) {
    if (!/^(0|[1-9]\d{0,9})$/.test(k) || Number(k) > U32_MAX) {
      throw badRequest(`kv_events_endpoints key "${k}" is not a dp rank`, "kv_events_endpoints");
    }
    const ep = endpoint(e, `kv_events_endpoints.${k}`);
    if (ep !== null) out[k] = ep;
  }
  return out;
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
