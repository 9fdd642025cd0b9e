/**
 * The reference's busy signals for conditional disaggregation, reported on a selection and never
 * used to choose: `decode_busy` on every /select and /select_and_reserve answer, and
 * `worker_load.prefill_busy` on an advisory one (services/selection/core/run.rs `select_response`;
 * scheduling/types.rs `AdvisoryWorkerLoad::prefill_load_exceeds`, ai-dynamo/dynamo
 * lib/kv-router/src/). Each is present only when its threshold is set and the capacity it is a
 * fraction of is known, as in the reference (core/tests.rs
 * advisory_select_reports_worker_load_and_busy_evaluation,
 * busy_evaluation_is_absent_without_thresholds_or_capacity).
 */
import { badRequest } from "./errors.js";
import type { SelectResponse } from "./types.js";

/** Fractions of capacity (the reference's conditional_disagg_{decode,prefill}_busy_threshold); unset = not reported. */
export interface BusyThresholds {
  /** decode_busy: the chosen rank's potential decode blocks above this fraction of its worker's total_kv_blocks. */
  readonly decode?: number | undefined;
  /** prefill_busy: the chosen rank's active prefill tokens above this fraction of its prefill_token_capacity. */
  readonly prefill?: number | undefined;
}

/** Throws KVMESH_BAD_REQUEST naming `busyThresholds.<key>` for a threshold that is not a finite number >= 0. */
export function validateBusyThresholds(t: BusyThresholds | undefined): BusyThresholds {
  const out = { decode: t?.decode, prefill: t?.prefill };
  for (const [key, value] of Object.entries(out)) {
    if (value !== undefined && !(Number.isFinite(value) && value >= 0)) throw badRequest(`busyThresholds.${key} must be a finite number >= 0`, `busyThresholds.${key}`);
  }
  return out;
}

/** Adds decode_busy (and, on an advisory answer, worker_load.prefill_busy) where they are defined. */
export function addBusySignals(resp: SelectResponse, t: BusyThresholds, totalKvBlocks: number | null | undefined): void {
  if (t.decode !== undefined && totalKvBlocks !== undefined && totalKvBlocks !== null) {
    resp.decode_busy = resp.potential_decode_blocks > t.decode * totalKvBlocks;
  }
  const load = resp.worker_load;
  if (t.prefill !== undefined && load !== undefined) load.prefill_busy = load.active_prefill_tokens > t.prefill * load.prefill_token_capacity;
}
