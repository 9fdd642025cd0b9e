/**
 * Wire shapes of the selection API (the reference's JSON, snake_case), shared by the library
 * facade and the HTTP layer. 64-bit values (worker ids, hashes) are `bigint`; the HTTP layer
 * parses and prints them as exact JSON integers.
 */

export type WorkerId = bigint;

export type Lifecycle = "incomplete" | "schedulable" | "draining" | "unschedulable";

export interface WorkerRequest {
  worker_id: WorkerId;
  model_name?: string | undefined;
  routing_group?: string | undefined;
  endpoint?: string | undefined;
  kv_events_endpoint?: string | undefined;
  kv_events_endpoints?: Readonly<Record<string, string>> | undefined;
  replay_endpoint?: string | undefined;
  /**
   * kvmesh addition: a replay endpoint per dp rank (rank -> endpoint), for a data-parallel engine
   * that runs one publisher and one replay socket per rank (vLLM and SGLang offset both ports by
   * the rank). The reference takes `replay_endpoint` for a single-rank worker only.
   */
  replay_endpoints?: Readonly<Record<string, string>> | undefined;
  block_size?: number | undefined;
  data_parallel_start_rank?: number | undefined;
  data_parallel_size?: number | undefined;
  max_num_batched_tokens?: number | undefined;
  total_kv_blocks?: number | undefined;
  is_eagle?: boolean | undefined;
  taints?: readonly string[] | undefined;
  // The reference's remaining registration fields (types.rs WorkerRequest): stored and echoed.
  // kvmesh honours taints (routing_constraints) and is_eagle (hashing, partition mode); the rest
  // feed reference features kvmesh does not have (HRW routing, disaggregation, router hints).
  stable_routing_id?: string | undefined;
  topology_domains?: Readonly<Record<string, string>> | undefined;
  kv_transfer_domain?: string | undefined;
  kv_transfer_enforcement?: KvTransferEnforcement | undefined;
  kv_transfer_preferred_weight?: number | undefined;
  router_hint_worker_type?: string | undefined;
  router_hint_source_control_endpoints?: Readonly<Record<string, string>> | undefined;
  kv_event_source_mode?: string | undefined;
}

export type KvTransferEnforcement = "required" | "preferred";

/** PATCH replaces only the supplied fields (maps and sets wholesale); `lifecycle` may drain a worker. */
export type WorkerPatchRequest = Partial<Omit<WorkerRequest, "worker_id">> & {
  lifecycle?: "schedulable" | "draining" | undefined;
};

export interface WorkerCatalogRecord {
  worker_id: WorkerId;
  model_name: string;
  routing_group: string;
  endpoint: string | null;
  kv_events_endpoint: string | null;
  kv_events_endpoints: Record<string, string>;
  replay_endpoint: string | null;
  /** kvmesh addition (see WorkerRequest); omitted from the record when empty. */
  replay_endpoints?: Record<string, string>;
  block_size: number | null;
  data_parallel_start_rank: number;
  data_parallel_size: number;
  max_num_batched_tokens: number | null;
  total_kv_blocks: number | null;
  /** null when not given (the reference's Option<bool>); the partition treats null as false. */
  is_eagle: boolean | null;
  taints: string[];
  stable_routing_id: string | null;
  topology_domains: Record<string, string>;
  kv_transfer_domain: string | null;
  kv_transfer_enforcement: KvTransferEnforcement | null;
  kv_transfer_preferred_weight: number | null;
  /** Omitted from the record when absent (the reference's skip_serializing_if). */
  router_hint_worker_type?: string;
  /** Omitted from the record when empty. */
  router_hint_source_control_endpoints?: Record<string, string>;
  /** Omitted from the record when absent. */
  kv_event_source_mode?: string;
  lifecycle: Lifecycle;
  not_schedulable_reasons: string[];
}

export interface WorkerRankRef {
  worker_id: WorkerId;
  dp_rank?: number | null | undefined;
}

export interface RouterConfigOverrideWire {
  overlap_score_credit?: number | undefined;
  overlap_score_weight?: number | undefined;
  prefill_load_scale?: number | undefined;
  router_temperature?: number | undefined;
  assume_kv_reuse?: boolean | undefined;
  track_prefill_tokens?: boolean | undefined;
  shared_cache_multiplier?: number | undefined;
}

/** One multimodal object whose placeholder tokens fall in a block (the reference's `BlockMmObjectInfo`). */
export interface BlockMmObjectInfo {
  /** Hash identifying the object: appended (sorted, little-endian u64) to its block's tokens when hashing. */
  mm_hash: bigint;
  /** Placeholder token ranges `[start, end]` relative to the block; accepted, not used for hashing. */
  offsets: readonly (readonly [number, number])[];
}

/** Multimodal metadata of one block (the reference's `BlockExtraInfo`); null for a text-only block. */
export interface BlockExtraInfo {
  mm_objects: readonly BlockMmObjectInfo[];
}

/** Routing tokens for a multimodal prompt (the reference's `MmRoutingInfoRequest`). */
export interface MmRoutingInfo {
  /** When non-empty, hashed instead of `token_ids` (and the prompt's ISL is its length). */
  routing_token_ids: readonly number[] | Uint32Array;
  /** Per block of `routing_token_ids`; replaces the top-level `block_mm_infos`. */
  block_mm_infos?: readonly (BlockExtraInfo | null)[] | undefined;
}

/** The flattened prompt fields every selection request accepts. */
export interface PromptFields {
  token_ids?: readonly number[] | Uint32Array | undefined;
  mm_routing_info?: MmRoutingInfo | undefined;
  /** Per block of `token_ids`: multimodal objects whose hashes enter that block's hash. */
  block_mm_infos?: readonly (BlockExtraInfo | null)[] | undefined;
  block_hashes?: readonly bigint[] | undefined;
  sequence_hashes?: readonly bigint[] | undefined;
  isl_tokens?: number | undefined;
  lora_name?: string | null | undefined;
  cache_salt?: string | null | undefined;
  is_eagle?: boolean | undefined;
}

export interface SessionContext {
  session_id: string;
  parent_session_id?: string | undefined;
  session_final?: boolean | undefined;
  input_trigger?: "user_message" | "tool_result" | "other" | undefined;
}

export interface SelectRequest extends PromptFields {
  model_name?: string | undefined;
  routing_group?: string | undefined;
  selection_id?: string | undefined;
  router_config_override?: RouterConfigOverrideWire | undefined;
  expected_output_tokens?: number | undefined;
  /** Queue priority boost, seconds (the reference's FCFS queue). kvmesh has no queue: accepted, ignored. */
  priority_jump?: number | undefined;
  /** Strict queue priority class (u32). kvmesh has no queue: accepted, ignored. */
  strict_priority?: number | undefined;
  session_id?: string | undefined;
  session_context?: SessionContext | undefined;
  /**
   * Steers to this worker (and rank, if given) while it is eligible. With `affinity_target` or
   * `pinned_worker` the request skips session handling (no binding lookup, commit or lease).
   */
  affinity_target?: WorkerRankRef | undefined;
  pinned_worker?: { worker_id: WorkerId; dp_rank: number } | undefined;
  allowed_worker_ids?: readonly WorkerId[] | undefined;
  routing_constraints?: { required_taints?: readonly string[]; preferred_taints?: Readonly<Record<string, number>> } | undefined;
  advisory?: boolean | undefined;
  /** Expected prefill duration hint, ms: lets peers decay this booking's prefill load. */
  expected_prefill_duration_ms?: number | undefined;
}

export type SelectAndReserveRequest = Omit<SelectRequest, "advisory">;

export interface ReservationRequest extends PromptFields {
  model_name?: string | undefined;
  routing_group?: string | undefined;
  selection_id: string;
  worker_id?: WorkerId | undefined;
  dp_rank?: number | undefined;
  router_config_override?: RouterConfigOverrideWire | undefined;
  expected_output_tokens?: number | undefined;
  effective_prefill_tokens?: number | undefined;
  track_prefill_tokens?: boolean | undefined;
  session_id?: string | undefined;
  session_context?: SessionContext | undefined;
}

export interface OverlapReport {
  longest_matched: number;
  gpu: number;
  dp: Record<string, number>;
  cpu: number;
  disk: number;
}

/**
 * How a selection treated the request's session: "none" (no session, or one the request skips),
 * "new" (a session without a binding yet), "followed" (steered to its bound worker), "moved" (its
 * bound worker was not eligible, so every candidate competed), "affinity_target" (steered to the
 * request's explicit affinity_target), "affinity_target_moved" (that target was not eligible).
 */
export type SessionSteer = "none" | "new" | "followed" | "moved" | "affinity_target" | "affinity_target_moved";

/**
 * What a caller of selectAndReserve needs in its answer. `sequenceHashes: false` leaves out the
 * response's `sequence_hashes`: one BigInt per prompt block, which an HTTP client needs to free
 * and complete its booking by hashes but an in-process caller holding the selection id does not
 * (the endpoint picker: 2,300 BigInts, ~100 KB of garbage, per 220 KB body at block size 16).
 */
export interface SelectReplyShape {
  readonly sequenceHashes: boolean;
}

/**
 * What a selection decided beyond its answer, for a caller's trace (src/http/tracing.ts). The
 * core fills one only when the caller passes it (select / selectAndReserve), so it stays free of
 * any tracing library and pays nothing without one. Times are the service clock's milliseconds
 * (performance.now() with the default systemClock, which the daemon uses).
 */
export interface SelectionNote {
  chooseStartMs?: number;
  chooseEndMs?: number;
  /** Around hashing the prompt into sequence hashes (a memoized prompt is a cache hit, near 0). */
  hashStartMs?: number;
  hashEndMs?: number;
  /** The chosen candidate's cost (the selector's number the argmin or softmax picked by). */
  cost?: number;
  /** Candidates left after the request's filters and session steering. */
  candidates?: number;
  /** Of those, how many were scored: all of them, or the few the candidate scan needs (candidate-scan.ts). */
  scored?: number;
  session?: SessionSteer;
}

export interface SelectResponse {
  selection_id?: string;
  sequence_hashes?: bigint[];
  isl_tokens?: number;
  track_prefill_tokens?: boolean;
  model_name: string;
  routing_group: string;
  worker_id: WorkerId;
  dp_rank: number;
  endpoint: string | null;
  block_size: number;
  overlap: OverlapReport;
  effective_prefill_tokens: number;
  potential_decode_blocks: number;
  decode_busy?: boolean;
  worker_load?: { active_prefill_tokens: number; prefill_token_capacity: number; total_kv_blocks?: number; prefill_busy?: boolean };
}

export interface ReservationResponse {
  selection_id: string;
  model_name: string;
  routing_group: string;
  worker_id: WorkerId;
  dp_rank: number;
  endpoint: string | null;
}

export interface RankLoad {
  worker_id: WorkerId;
  dp_rank: number;
  potential_prefill_tokens: number;
  potential_decode_blocks: number;
  active_requests: number;
}

export interface ModelLoadResponse {
  model_name: string;
  routing_group: string;
  loads: RankLoad[];
  pending_count: number;
  pending_isl_tokens: number;
}

export interface PotentialLoad extends RankLoad {
  cost: number;
  overlap_blocks: number;
}

export interface OverlapScoreRow {
  worker_id: WorkerId;
  dp_rank: number;
  device_blocks: number;
  host_pinned_blocks: number;
  disk_blocks: number;
  host_pinned_extension_blocks: number;
  router_credit_blocks: number;
}

export interface OverlapScoresResponse {
  num_blocks: number;
  workers: OverlapScoreRow[];
  shared_cache: { enabled: boolean };
}

export const DEFAULT_MODEL_NAME = "default";
export const DEFAULT_ROUTING_GROUP = "default";
