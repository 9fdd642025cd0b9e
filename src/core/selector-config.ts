/**
 * Knobs of the cost function and picker (Dynamo's lib/kv-router/src/scheduling/config.rs), the per-request
 * `router_config_override` and its validation. Messages name the reference's snake_case knob
 * names, because those are what operators and clients type.
 */
import { badRequest } from "./errors.js";
import { COST_MODELS, DEFAULT_TTFT_COST, type CostModel, type TtftCostParams } from "./ttft-cost.js";

/** The ttft model's timing and keep weight (TtftCostParams, ttft-cost.ts) are knobs of it too (`--ttft-*`). */
export interface SelectorConfig extends TtftCostParams {
  /** c: weight of device-cached blocks as prefill credit. */
  readonly overlapScoreCredit: number;
  /** δ: shrinks the credit on ranks with more queued prefill than the least-loaded one. */
  readonly overlapScoreCreditDecay: number;
  /** s: weight of the prefill term. */
  readonly prefillLoadScale: number;
  /** r: cost per in-flight request. */
  readonly decodeActiveRequestWeight: number;
  readonly hostCacheHitWeight: number;
  readonly diskCacheHitWeight: number;
  /**
   * m: credit per shared-cache block beyond the device overlap. Accepted and validated for the
   * reference's API (`shared_cache_multiplier`, also per request), but inert in kvmesh: it has no
   * shared KV cache tier, so S = 0 for every candidate (overlap_scores says
   * `shared_cache.enabled: false`). The selector keeps the term so a shared tier can feed it.
   */
  readonly sharedCacheMultiplier: number;
  /** T: 0 = argmin with random tie-break; > 0 = softmax sampling over normalized costs. */
  readonly temperature: number;
  readonly trackPrefillTokens: boolean;
  /**
   * When true, the caller deduplicates a prompt's blocks against blocks already active on the
   * rank (LoadLedger.newBlocksFor); when false every prompt block counts as new.
   */
  readonly assumeKvReuse: boolean;
  /**
   * "reference" (the default): the reference's formula, exactly (selector.ts). "ttft": each rank's
   * estimated time to first token plus the value of keeping the prompt's cache together
   * (ttft-cost.ts); it reads the overlap, loads, host/disk hit weights and temperature, and none of
   * overlap_score_credit, its decay, prefill_load_scale or decode_active_request_weight. A kvmesh
   * knob: the reference has no such field, so no per-request override sets it.
   */
  readonly costModel: CostModel;
}

export const DEFAULT_SELECTOR_CONFIG: SelectorConfig = Object.freeze({
  overlapScoreCredit: 1.0,
  overlapScoreCreditDecay: 0,
  prefillLoadScale: 1.0,
  decodeActiveRequestWeight: 0,
  hostCacheHitWeight: 0.75,
  diskCacheHitWeight: 0.25,
  sharedCacheMultiplier: 0,
  temperature: 0,
  trackPrefillTokens: true,
  assumeKvReuse: true,
  costModel: "reference",
  ...DEFAULT_TTFT_COST,
});

/** Config field -> the reference's knob name (used in error messages and `details.field`). */
const NUMERIC_KNOBS = [
  ["overlapScoreCredit", "overlap_score_credit"],
  ["overlapScoreCreditDecay", "overlap_score_credit_decay"],
  ["prefillLoadScale", "prefill_load_scale"],
  ["decodeActiveRequestWeight", "decode_active_request_weight"],
  ["hostCacheHitWeight", "host_cache_hit_weight"],
  ["diskCacheHitWeight", "disk_cache_hit_weight"],
  ["sharedCacheMultiplier", "shared_cache_multiplier"],
  ["temperature", "router_temperature"],
  ["ttftKeepWeight", "ttft_keep_weight"],
  ["ttftPrefillMsPerToken", "ttft_prefill_ms_per_token"],
  ["ttftPrefillMsPerTokenPair", "ttft_prefill_ms_per_token_pair"],
  ["ttftDecodeStepMs", "ttft_decode_step_ms"],
  ["ttftDecodeMsPerSequence", "ttft_decode_ms_per_sequence"],
  ["ttftDecodeMsPerContextToken", "ttft_decode_ms_per_context_token"],
  ["ttftBatchTokens", "ttft_batch_tokens"],
] as const satisfies readonly (readonly [keyof SelectorConfig, string])[];

const BOOLEAN_KNOBS = [
  ["trackPrefillTokens", "router_track_prefill_tokens"],
  ["assumeKvReuse", "router_assume_kv_reuse"],
] as const satisfies readonly (readonly [keyof SelectorConfig, string])[];

const isNonNegativeFinite = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v) && v >= 0;

/** Throws KVMESH_BAD_REQUEST naming the first invalid knob; returns a frozen copy otherwise. */
export function validateSelectorConfig(config: SelectorConfig): SelectorConfig {
  for (const [key, knob] of NUMERIC_KNOBS) {
    const v: unknown = config[key];
    if (!isNonNegativeFinite(v)) {
      throw badRequest(`invalid selector configuration: ${knob} must be a finite number >= 0, got ${String(v)}`, knob);
    }
  }
  for (const [key, knob] of BOOLEAN_KNOBS) {
    const v: unknown = config[key];
    if (typeof v !== "boolean") {
      throw badRequest(`invalid selector configuration: ${knob} must be a boolean, got ${String(v)}`, knob);
    }
  }
  // The cost is in units of one block's prefill time (ttft-cost.ts), and a prefill spans
  // ceil(tokens / batch) steps: neither may be 0.
  if (!(config.ttftPrefillMsPerToken > 0)) {
    throw badRequest(`invalid selector configuration: ttft_prefill_ms_per_token must be > 0, got ${String(config.ttftPrefillMsPerToken)}`, "ttft_prefill_ms_per_token");
  }
  if (!(config.ttftBatchTokens >= 1)) {
    throw badRequest(`invalid selector configuration: ttft_batch_tokens must be >= 1, got ${String(config.ttftBatchTokens)}`, "ttft_batch_tokens");
  }
  if (!(COST_MODELS as readonly unknown[]).includes(config.costModel)) {
    throw badRequest(`invalid selector configuration: cost_model must be one of ${COST_MODELS.join(", ")}, got ${JSON.stringify(config.costModel)}`, "cost_model");
  }
  return Object.freeze({ ...config });
}

/** The reference's per-request `router_config_override` (JSON, snake_case; null = not set). */
export interface RouterConfigOverride {
  overlap_score_credit?: number | null | undefined;
  prefill_load_scale?: number | null | undefined;
  router_temperature?: number | null | undefined;
  assume_kv_reuse?: boolean | null | undefined;
  track_prefill_tokens?: boolean | null | undefined;
  shared_cache_multiplier?: number | null | undefined;
  /** Deprecated alias: sets prefill_load_scale = w, and overlap_score_credit = 0 when w == 0. */
  overlap_score_weight?: number | null | undefined;
}

const OVERRIDE_PREFIX = "router_config_override";
const OVERRIDE_FIELDS: ReadonlySet<string> = new Set([
  "overlap_score_credit",
  "prefill_load_scale",
  "router_temperature",
  "assume_kv_reuse",
  "track_prefill_tokens",
  "shared_cache_multiplier",
  "overlap_score_weight",
]);

function overrideNumber(o: Record<string, unknown>, field: string): number | undefined {
  const v = o[field];
  if (v === undefined || v === null) return undefined;
  if (!isNonNegativeFinite(v)) {
    throw badRequest(`${OVERRIDE_PREFIX}.${field} must be a finite number >= 0`, `${OVERRIDE_PREFIX}.${field}`);
  }
  return v;
}

function overrideBoolean(o: Record<string, unknown>, field: string): boolean | undefined {
  const v = o[field];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean") throw badRequest(`${OVERRIDE_PREFIX}.${field} must be a boolean`, `${OVERRIDE_PREFIX}.${field}`);
  return v;
}

/**
 * Applies a per-request override to a base config. Unknown fields are rejected (a misspelt knob
 * silently ignored would route with the wrong policy). The explicit fields win over the
 * deprecated `overlap_score_weight` alias when both are given.
 */
export function applyOverride(base: SelectorConfig, override: RouterConfigOverride | null | undefined): SelectorConfig {
  if (override === null || override === undefined) return base;
  if (typeof override !== "object" || Array.isArray(override)) {
    throw badRequest(`${OVERRIDE_PREFIX} must be an object`, OVERRIDE_PREFIX);
  }
  const o = override as Record<string, unknown>;
  for (const key of Object.keys(o)) {
    if (!OVERRIDE_FIELDS.has(key)) throw badRequest(`${OVERRIDE_PREFIX}.${key} is not a known field`, `${OVERRIDE_PREFIX}.${key}`);
  }
  const weight = overrideNumber(o, "overlap_score_weight");
  const credit = overrideNumber(o, "overlap_score_credit");
  const scale = overrideNumber(o, "prefill_load_scale");
  const temperature = overrideNumber(o, "router_temperature");
  const shared = overrideNumber(o, "shared_cache_multiplier");
  const reuse = overrideBoolean(o, "assume_kv_reuse");
  const trackPrefill = overrideBoolean(o, "track_prefill_tokens");

  let overlapScoreCredit = base.overlapScoreCredit;
  let prefillLoadScale = base.prefillLoadScale;
  if (weight !== undefined) {
    prefillLoadScale = weight;
    if (weight === 0) overlapScoreCredit = 0;
  }
  return Object.freeze({
    ...base,
    overlapScoreCredit: credit ?? overlapScoreCredit,
    prefillLoadScale: scale ?? prefillLoadScale,
    temperature: temperature ?? base.temperature,
    sharedCacheMultiplier: shared ?? base.sharedCacheMultiplier,
    assumeKvReuse: reuse ?? base.assumeKvReuse,
    trackPrefillTokens: trackPrefill ?? base.trackPrefillTokens,
  });
}
