/**
 * The default selector: a per-candidate cost in KV blocks and a picker (after Dynamo's
 * lib/kv-router/src/scheduling/selector/default.rs, github.com/ai-dynamo/dynamo).
 *
 * Candidates arrive as a struct of parallel typed arrays the caller owns and reuses, so scoring
 * 1,024 ranks allocates nothing: costs go to the caller's `costsOut` or a module scratch buffer.
 * The functions are pure apart from the injected Random (side-effect free, as the reference
 * requires of selectors).
 */
import type { Random } from "./random.js";
import { KvmeshError, badRequest } from "./errors.js";
import type { SelectorConfig } from "./selector-config.js";
import { cachedTokensOf, ttftCost } from "./ttft-cost.js";

export type WorkerType = "decode" | "prefill" | "aggregated";

/**
 * One row per eligible candidate rank, in a canonical order (e.g. ascending rank key): with a
 * seeded Random the pick is then reproducible. Rows [0, count) are read; arrays may be longer.
 */
export interface CandidateTable {
  count: number;
  /** D: prompt blocks cached on the device (prefix overlap). */
  device: Float64Array;
  /** H: host-pinned extension blocks beyond D. */
  host: Float64Array;
  /** K: disk extension blocks beyond D + H. */
  disk: Float64Array;
  /** S: shared-cache blocks beyond the device overlap (always 0 in kvmesh: no shared cache tier). */
  shared: Float64Array;
  activePrefillTokens: Float64Array;
  /** Dec: blocks the rank would hold after admission (active + additional). */
  potentialDecodeBlocks: Float64Array;
  /** A: in-flight requests on the rank. */
  activeRequests: Float64Array;
  /** Sum of the weights of the request's preferred taints this rank carries; null = no preference. */
  preferredTaintWeight: Float64Array | null;
}

export interface SelectionRequest {
  islTokens: number;
  blockSize: number;
  workerType?: WorkerType | undefined;
  /**
   * The ttft cost model's bestCached (ttft-cost.ts): the most prompt tokens any eligible candidate
   * holds. Undefined: the rows scored are every candidate, and the scoring finds it over them (the
   * candidate scan, which scores a few rows, passes it from the prefix match).
   */
  bestCachedTokens?: number | undefined;
}

/** One candidate's inputs, for `computeCost` (e.g. /potential_loads, tests). Missing terms are 0. */
export interface CandidateInputs {
  device: number;
  host?: number;
  disk?: number;
  shared?: number;
  activePrefillTokens: number;
  potentialDecodeBlocks: number;
  activeRequests?: number;
  preferredTaintWeight?: number;
}

export function createCandidateTable(capacity: number, withTaints = false): CandidateTable {
  return {
    count: 0,
    device: new Float64Array(capacity),
    host: new Float64Array(capacity),
    disk: new Float64Array(capacity),
    shared: new Float64Array(capacity),
    activePrefillTokens: new Float64Array(capacity),
    potentialDecodeBlocks: new Float64Array(capacity),
    activeRequests: new Float64Array(capacity),
    preferredTaintWeight: withTaints ? new Float64Array(capacity) : null,
  };
}

function checkRequest(req: SelectionRequest): void {
  if (!Number.isFinite(req.islTokens) || req.islTokens < 0) throw badRequest("isl_tokens must be a finite number >= 0", "isl_tokens");
  if (!Number.isFinite(req.blockSize) || req.blockSize <= 0) throw badRequest("block_size must be a finite number > 0", "block_size");
}

/** Blocks the prompt spans, floored at 1 so the credit-decay ratio never divides by zero. */
const requestBlocksOf = (req: SelectionRequest): number => Math.max(1, Math.ceil(req.islTokens / req.blockSize));

/** The cost formula over scalars (shared by the table loop and computeCost). */
function costOf(
  device: number,
  host: number,
  disk: number,
  shared: number,
  activePrefill: number,
  decodeBlocks: number,
  activeRequests: number,
  taintWeight: number,
  req: SelectionRequest,
  requestBlocks: number,
  decodeBranch: boolean,
  minActivePrefill: number,
  cfg: SelectorConfig,
): number {
  const bs = req.blockSize;
  if (cfg.costModel === "ttft") {
    const cached = cachedTokensOf(device, host, disk, bs, cfg.hostCacheHitWeight, cfg.diskCacheHitWeight, req.islTokens);
    const best = Math.max(cached, req.bestCachedTokens ?? cached);
    const t = ttftCost(cached, best, activePrefill, decodeBlocks, activeRequests, req.islTokens, bs, cfg);
    return taintWeight === 0 ? t : t * Math.exp(-Math.tanh(taintWeight));
  }
  const track = cfg.trackPrefillTokens;
  const delta = cfg.overlapScoreCreditDecay;
  const f = track && delta > 0 ? 1 / (1 + (delta * ((activePrefill - minActivePrefill) / bs)) / requestBlocks) : 1;
  const credit =
    cfg.overlapScoreCredit * f * device +
    cfg.hostCacheHitWeight * host +
    cfg.diskCacheHitWeight * disk +
    cfg.sharedCacheMultiplier * shared;
  const requestTerm = cfg.decodeActiveRequestWeight * activeRequests;
  let cost: number;
  if (decodeBranch) {
    cost = Math.max(0, decodeBlocks - credit) + requestTerm;
  } else {
    const prefillBlocks = track ? (activePrefill + req.islTokens) / bs : 0;
    cost = cfg.prefillLoadScale * Math.max(0, prefillBlocks - credit) + decodeBlocks + requestTerm;
  }
  if (taintWeight !== 0) cost *= Math.exp(-Math.tanh(taintWeight));
  return cost;
}

/** A decode worker without prefill tracking is scored on the blocks its cache saves it. */
const usesDecodeBranch = (req: SelectionRequest, cfg: SelectorConfig): boolean =>
  req.workerType === "decode" && !cfg.trackPrefillTokens && cfg.overlapScoreCredit > 0;

/**
 * Cost of one candidate. `minActivePrefillTokens` is the minimum active prefill over the
 * eligible candidates; it only matters when overlap_score_credit_decay > 0 (default: this rank's
 * own value, i.e. no decay).
 */
export function computeCost(
  c: CandidateInputs,
  req: SelectionRequest,
  config: SelectorConfig,
  minActivePrefillTokens: number = c.activePrefillTokens,
): number {
  checkRequest(req);
  return costOf(
    c.device,
    c.host ?? 0,
    c.disk ?? 0,
    c.shared ?? 0,
    c.activePrefillTokens,
    c.potentialDecodeBlocks,
    c.activeRequests ?? 0,
    c.preferredTaintWeight ?? 0,
    req,
    requestBlocksOf(req),
    usesDecodeBranch(req, config),
    minActivePrefillTokens,
    config,
  );
}

/**
 * The cost of a candidate with no cached block of the prompt (device = host = disk = shared = 0,
 * no preferred taint) from its loads: the very expression scoreRows evaluates for such a row, so
 * with equal inputs the result is bit-identical, and (for prefillLoadScale >= 0, every operation
 * being monotone under IEEE rounding) a floor of any input gives a floor of the cost. The
 * candidate scan (candidate-scan.ts) relies on both. Decay must be off (overlap_score_credit_decay
 * 0 or untracked prefill): the minimum prefill it would read is not passed.
 */
export function loadOnlyCost(activePrefill: number, decodeBlocks: number, activeRequests: number, req: SelectionRequest, config: SelectorConfig): number {
  const cost = costOf(0, 0, 0, 0, activePrefill, decodeBlocks, activeRequests, 0, req, requestBlocksOf(req), usesDecodeBranch(req, config), 0, config);
  // 1 / 0, not `Infinity`: the global is read through an inline cache, and one never run (no cost
  // is NaN) leaves the merged result untyped to the optimiser, so every cost was boxed first: a
  // heap number per rank the candidate scan reads (12 KB a select_and_reserve at 1,024 ranks).
  return cost !== cost ? 1 / 0 : cost;
}

let scratchCosts = new Float64Array(64);
let scratchWeights = new Float64Array(64);

const grown = (buf: Float64Array<ArrayBuffer>, n: number): Float64Array<ArrayBuffer> => (buf.length >= n ? buf : new Float64Array(Math.max(n, buf.length * 2)));

/**
 * Scores every candidate and returns the chosen row index. Costs are left in `costsOut` when
 * given (rows [0, count)). Throws KVMESH_NOT_READY for an empty table.
 */
export function selectCandidate(
  table: CandidateTable,
  req: SelectionRequest,
  config: SelectorConfig,
  random: Random,
  costsOut?: Float64Array,
): number {
  checkRequest(req);
  const n = table.count;
  if (n <= 0) throw new KvmeshError("KVMESH_NOT_READY", "no eligible candidate to select from");
  const costs = scoreRows(table, req, config, costsOut);
  return config.temperature > 0 ? pickSoftmax(costs, n, config.temperature, random) : pickArgmin(costs, n, random);
}

/**
 * The costs of rows [0, count) without picking (what /potential_loads reports): the same
 * arithmetic as selectCandidate's, into `costsOut` or a module scratch buffer reused by the next
 * call. An empty table scores nothing.
 */
export function scoreCandidates(table: CandidateTable, req: SelectionRequest, config: SelectorConfig, costsOut?: Float64Array): Float64Array {
  checkRequest(req);
  return scoreRows(table, req, config, costsOut);
}

function scoreRows(table: CandidateTable, req: SelectionRequest, config: SelectorConfig, costsOut: Float64Array | undefined): Float64Array {
  const n = table.count;
  if (costsOut !== undefined && costsOut.length < n) throw badRequest(`costsOut holds ${costsOut.length} rows, need ${n}`, "costsOut");
  let costs: Float64Array;
  if (costsOut !== undefined) {
    costs = costsOut;
  } else {
    scratchCosts = grown(scratchCosts, n);
    costs = scratchCosts;
  }

  const { device, host, disk, shared, activePrefillTokens, potentialDecodeBlocks, activeRequests, preferredTaintWeight } = table;
  // The minimum is an O(n) pass; only pay for it when the decay term reads it.
  let minPrefill = 0;
  if (config.trackPrefillTokens && config.overlapScoreCreditDecay > 0) {
    minPrefill = Infinity;
    for (let i = 0; i < n; i++) minPrefill = Math.min(minPrefill, activePrefillTokens[i] as number);
  }
  const requestBlocks = requestBlocksOf(req);
  const decodeBranch = usesDecodeBranch(req, config);
  const rowReq = config.costModel === "ttft" && req.bestCachedTokens === undefined ? { ...req, bestCachedTokens: bestCachedOver(table, req, config) } : req;
  for (let i = 0; i < n; i++) {
    const cost = costOf(
      device[i] as number,
      host[i] as number,
      disk[i] as number,
      shared[i] as number,
      activePrefillTokens[i] as number,
      potentialDecodeBlocks[i] as number,
      activeRequests[i] as number,
      preferredTaintWeight === null ? 0 : (preferredTaintWeight[i] as number),
      rowReq,
      requestBlocks,
      decodeBranch,
      minPrefill,
      config,
    );
    // NaN (from garbage inputs) must never win an argmin nor poison the softmax total. Two
    // stores, not `isNaN ? Infinity : cost`: TurboFan kept that phi tagged and boxed every cost
    // (a 16-byte HeapNumber per candidate, 16 KiB of garbage per selection at 1,024 ranks).
    costs[i] = cost;
    if (cost !== cost) costs[i] = Infinity;
  }
  return costs;
}

/** The ttft model's bestCached over the table's rows (ttft-cost.ts cachedTokensOf). */
function bestCachedOver(table: CandidateTable, req: SelectionRequest, config: SelectorConfig): number {
  let best = 0;
  for (let i = 0; i < table.count; i++) {
    const c = cachedTokensOf(table.device[i] as number, table.host[i] as number, table.disk[i] as number, req.blockSize, config.hostCacheHitWeight, config.diskCacheHitWeight, req.islTokens);
    if (c > best) best = c;
  }
  return best;
}

/** Argmin; the k-th tied candidate replaces the pick with probability 1/k (uniform tie-break). */
export function pickArgmin(costs: Float64Array, n: number, random: Random): number {
  let best = Infinity;
  let pick = 0;
  let ties = 0;
  for (let i = 0; i < n; i++) {
    const c = costs[i] as number;
    if (c < best) {
      best = c;
      pick = i;
      ties = 1;
    } else if (c === best) {
      ties++;
      if (random.next() * ties < 1) pick = i;
    }
  }
  return pick;
}

/**
 * Samples with probability proportional to exp(-normalized / T), normalized = (cost - min) /
 * (max - min) over finite costs. The minimum always weighs exp(0) = 1, so the total never
 * underflows however small T is; infinite costs weigh 0.
 */
export function pickSoftmax(costs: Float64Array, n: number, temperature: number, random: Random): number {
  let min = Infinity;
  let max = -Infinity;
  for (let i = 0; i < n; i++) {
    const c = costs[i] as number;
    if (!Number.isFinite(c)) continue;
    if (c < min) min = c;
    if (c > max) max = c;
  }
  if (min === Infinity) return Math.min(n - 1, Math.floor(random.next() * n));

  // max - min overflows to Infinity for extreme finite costs (e.g. -1e308 and 1e308); dividing
  // both by their magnitude first keeps the normalization finite and order-preserving.
  let scale = 1;
  let range = max - min;
  if (!Number.isFinite(range)) {
    scale = Math.max(Math.abs(min), Math.abs(max));
    range = max / scale - min / scale;
  }
  const lo = min / scale;
  scratchWeights = grown(scratchWeights, n);
  const weights = scratchWeights;
  let total = 0;
  for (let i = 0; i < n; i++) {
    const c = costs[i] as number;
    let w = 0;
    if (Number.isFinite(c)) {
      const normalized = range === 0 ? 0 : (c / scale - lo) / range;
      w = Math.exp(-normalized / temperature);
    }
    weights[i] = w;
    total += w;
  }
  const u = random.next() * total;
  let acc = 0;
  let last = 0;
  for (let i = 0; i < n; i++) {
    const w = weights[i] as number;
    if (w === 0) continue;
    acc += w;
    last = i;
    if (u < acc) return i;
  }
  // Rounding can leave u a hair above the summed CDF: the last weighted row is the right answer.
  return last;
}
