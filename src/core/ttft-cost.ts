/**
 * The "ttft" cost model (`--cost-model ttft`, docs/cost-models.md): each rank's estimated time to
 * first token for this request, plus the value of keeping the prompt's cached context together.
 *
 * Why not the reference's formula: it charges every block a rank holds for running requests
 * (potential decode blocks, unbounded) against a cache credit clamped at the prompt's size, so one
 * other 13.5k-token request running where a conversation is cached is enough to send its next
 * turn elsewhere, where it recomputes its whole history (issue #27: 13% of requests not sent to
 * the worker with their longest cached prefix, even with perfect information). What a request
 * waits for on an engine that batches as vLLM's scheduler does (src/mock/step-time.ts,
 * docs/mock-engines.md) is:
 *
 *   queued   = activePrefill x ttftPrefillMsPerToken          prompts booked there, not yet prefilled
 *   own      = uncached x ttftPrefillMsPerToken               this prompt's tokens the rank lacks
 *            + uncached x (cached + uncached / 2) x ttftPrefillMsPerTokenPair   their causal attention
 *   decode   = steps x (ttftDecodeStepMs + requests x ttftDecodeMsPerSequence
 *                       + decodeBlocks x blockSize x ttftDecodeMsPerContextToken)   (0 on an idle rank)
 *              where steps = ceil((activePrefill + uncached) / ttftBatchTokens): the steps the prefill
 *              spans, each shared with every decoding request (decode interference)
 *   keep     = ttftKeepWeight x (bestCached - cached) x ttftPrefillMsPerToken
 *
 * `bestCached` is the most of this prompt any candidate holds. `keep` is the value of keeping a
 * conversation's cache together: a rank that lacks part of the best cached prefix would store a
 * second copy of it, evicting as much of other prefixes (which someone then recomputes), so
 * moving must save that much TTFT again to win. Without a session id, this is what keeps a
 * conversation's next turn where its context is, unless that worker is really busier.
 *
 * The cost is the sum in "cold block" units: ms / (blockSize x ttftPrefillMsPerToken), so the tie
 * spreader's near-tie width (DEFAULT_NEAR_TIE_BLOCKS) keeps its meaning, one block of prefill.
 * Every term is non-decreasing in activePrefill, decodeBlocks and activeRequests (IEEE rounding
 * keeps that), so a floor of those loads gives a floor of the cost: the candidate scan's
 * requirement (candidate-scan.ts).
 */

/**
 * The engine timing the estimate assumes, in the router's clock ms (wall ms: a deployment sets its
 * engines' speed with the `--ttft-*` flags; `kvmesh bench` passes the mock engines' timing divided
 * by their speedup), and the weight of keeping a cache together. Only their ratios decide a
 * choice; their absolute values decide when a booking's queued prefill is taken as computed
 * (load-ledger.ts, the prefill estimate).
 */
export interface TtftCostParams {
  /** 0.05 ms = 20,000 prefill tokens/s: an 8B model in bf16 on one H100-class GPU (as the mock's default). */
  readonly ttftPrefillMsPerToken: number;
  /** 1.3e-6 ms per causal (query, key) pair: a cold 40k-token prompt spends ~1 s on attention beside 2 s of linear compute. */
  readonly ttftPrefillMsPerTokenPair: number;
  /** 10 ms: the fixed cost of a step that decodes (weights read once, launches, sampling). */
  readonly ttftDecodeStepMs: number;
  /** 0.05 ms per decoding request a step: its token's linear compute. */
  readonly ttftDecodeMsPerSequence: number;
  /** 4e-5 ms per context token of every decoding request, every step: reading its KV. */
  readonly ttftDecodeMsPerContextToken: number;
  /** 8,192 tokens a step: vLLM's max_num_batched_tokens (chunked prefill), as Dynamo's mocker. */
  readonly ttftBatchTokens: number;
  /** 1: moving away from the best cached prefix costs its recompute once more (the evicted copy elsewhere); `--ttft-keep-weight` sets it. */
  readonly ttftKeepWeight: number;
}

export const DEFAULT_TTFT_COST: TtftCostParams = Object.freeze({
  ttftPrefillMsPerToken: 0.05,
  ttftPrefillMsPerTokenPair: 1.3e-6,
  ttftDecodeStepMs: 10,
  ttftDecodeMsPerSequence: 0.05,
  ttftDecodeMsPerContextToken: 4e-5,
  ttftBatchTokens: 8_192,
  ttftKeepWeight: 1,
});

/**
 * The estimated time (ms) one rank spends prefilling `uncached` tokens after `cached` ones: their
 * linear compute plus their causal attention, which still reads the cached prefix.
 */
export function ttftOwnPrefillMs(uncached: number, cached: number, k: TtftCostParams): number {
  return uncached * k.ttftPrefillMsPerToken + uncached * (cached + uncached / 2) * k.ttftPrefillMsPerTokenPair;
}

/** The cost models a selector can use: the reference's formula (selector.ts costOf) or this one. */
export const COST_MODELS = ["reference", "ttft"] as const;
export type CostModel = (typeof COST_MODELS)[number];

/**
 * Tokens of the prompt the rank holds, as the reference credits tiers: device blocks whole, host
 * and disk blocks at their hit weights (kvmesh has no shared tier). Clamped at the prompt.
 */
export function cachedTokensOf(device: number, host: number, disk: number, blockSize: number, hostWeight: number, diskWeight: number, islTokens: number): number {
  return Math.min(islTokens, (device + hostWeight * host + diskWeight * disk) * blockSize);
}

/**
 * The estimated TTFT of a request on one rank plus the keep term, in cold-block units (see the
 * file comment). `cached` and `bestCached` from cachedTokensOf; loads as the candidate table
 * holds them (potential decode blocks include the prompt's own new blocks).
 */
export function ttftCost(
  cached: number,
  bestCached: number,
  activePrefill: number,
  decodeBlocks: number,
  activeRequests: number,
  islTokens: number,
  blockSize: number,
  k: TtftCostParams,
  keepWeight: number = k.ttftKeepWeight,
): number {
  const uncached = Math.max(0, islTokens - cached);
  const prefillTokens = activePrefill + uncached;
  let ms = activePrefill * k.ttftPrefillMsPerToken + ttftOwnPrefillMs(uncached, cached, k);
  if (activeRequests > 0) {
    const steps = Math.max(1, Math.ceil(prefillTokens / k.ttftBatchTokens));
    ms += steps * (k.ttftDecodeStepMs + activeRequests * k.ttftDecodeMsPerSequence + decodeBlocks * blockSize * k.ttftDecodeMsPerContextToken);
  }
  ms += keepWeight * Math.max(0, bestCached - cached) * k.ttftPrefillMsPerToken;
  return ms / (blockSize * k.ttftPrefillMsPerToken);
}
