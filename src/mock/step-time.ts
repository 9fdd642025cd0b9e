/**
 * How long one scheduler step of a mock engine takes, as a function of its batch (docs/mock-engines.md).
 *
 * vLLM's v1 scheduler (vllm/v1/core/sched/scheduler.py) has no prefill or decode phase: each step
 * gives every running request its next tokens (1 for a decoding request, the next chunk of the
 * prompt for one in prefill) and then admits waiting requests, all within one token budget
 * (max_num_batched_tokens), and runs the whole batch as one forward pass. So a step's time grows
 * with everything in it, and a decoding request slows down when prefill chunks share its steps.
 * The model, in trace ms:
 *
 *   step = prefillTokens x prefillMsPerToken                  linear compute of prompt tokens
 *        + prefillPairs x prefillMsPerTokenPair               causal attention of those tokens
 *        + (decodeSequences > 0 ? decodeMsPerToken : 0)       a decoding step's fixed cost
 *        + decodeSequences x decodeMsPerSequence              linear compute of the decode tokens
 *        + decodeContextTokens x decodeMsPerContextToken      reading the decoders' KV (attention)
 *
 * where prefillPairs counts (query, key) pairs: a chunk of n tokens starting after s computed or
 * cached tokens attends n*s + n(n+1)/2 of them. A cached prefix thus saves its own linear and
 * quadratic compute, but the tokens after it still attend to it. Decoding is memory-bound: each
 * step reads the weights once (decodeMsPerToken) and every decoding request's whole KV.
 *
 * The defaults are an 8B Llama-3-class model in bf16 on one H100-class GPU (see each constant).
 * With only prefillMsPerToken and decodeMsPerToken set (the other terms 0) this is the mock's former
 * linear model: prefill at a fixed rate plus a fixed cost per decode step, independent of the batch.
 */

/** 0.05 ms/token = 20,000 prefill tokens/s: 16 GFLOP a token (2 x 8B parameters) at ~320 TFLOP/s. */
export const DEFAULT_PREFILL_MS_PER_TOKEN = 0.05;
/**
 * 1.3e-6 ms per (query, key) pair: 4 x 32 layers x 4,096 hidden = 0.5 MFLOP a pair at ~400
 * TFLOP/s. A cold 40k-token prompt spends ~1 s on attention beside 2 s of linear compute.
 */
export const DEFAULT_PREFILL_MS_PER_TOKEN_PAIR = 1.3e-6;
/**
 * 10 ms: a decode step's fixed cost (reading 16 GB of weights, kernel launches, sampling), so the
 * time per output token of a lone request with a short context. The name predates the batch terms.
 */
export const DEFAULT_DECODE_MS_PER_TOKEN = 10;
/** 0.05 ms per decoding request a step: its token's linear compute, as a prompt token's. */
export const DEFAULT_DECODE_MS_PER_SEQUENCE = 0.05;
/**
 * 4e-5 ms per context token of every decoding request, every step: 128 KiB of KV a token
 * (2 x 32 layers x 8 KV heads x 128 dims x 2 bytes) read at ~3.3 TB/s. 32 requests with 10k
 * tokens of context add ~13 ms to every step they share.
 */
export const DEFAULT_DECODE_MS_PER_CONTEXT_TOKEN = 4e-5;

/** The model's parameters, trace ms (see the file comment). */
export interface StepTimeParams {
  readonly prefillMsPerToken: number;
  readonly prefillMsPerTokenPair: number;
  readonly decodeMsPerToken: number;
  readonly decodeMsPerSequence: number;
  readonly decodeMsPerContextToken: number;
}

export const DEFAULT_STEP_TIME: StepTimeParams = {
  prefillMsPerToken: DEFAULT_PREFILL_MS_PER_TOKEN,
  prefillMsPerTokenPair: DEFAULT_PREFILL_MS_PER_TOKEN_PAIR,
  decodeMsPerToken: DEFAULT_DECODE_MS_PER_TOKEN,
  decodeMsPerSequence: DEFAULT_DECODE_MS_PER_SEQUENCE,
  decodeMsPerContextToken: DEFAULT_DECODE_MS_PER_CONTEXT_TOKEN,
};

/** What one step computes. */
export interface StepBatch {
  /** Prompt tokens computed (all chunks). */
  readonly prefillTokens: number;
  /** Attention (query, key) pairs of those chunks: sum of prefillPairs(start, chunk). */
  readonly prefillPairs: number;
  /** Requests producing one token each. */
  readonly decodeSequences: number;
  /** Tokens in the KV of those requests (prompt + generated so far), summed. */
  readonly decodeContextTokens: number;
}

/** Causal attention pairs of a prefill chunk of `chunk` tokens after `start` tokens already in the KV. */
export function prefillPairs(start: number, chunk: number): number {
  return chunk * start + (chunk * (chunk + 1)) / 2;
}

/** The step's duration, trace ms. */
export function stepTimeMs(p: StepTimeParams, b: StepBatch): number {
  const prefill = b.prefillTokens * p.prefillMsPerToken + b.prefillPairs * p.prefillMsPerTokenPair;
  if (b.decodeSequences === 0) return prefill;
  return prefill + p.decodeMsPerToken + b.decodeSequences * p.decodeMsPerSequence + b.decodeContextTokens * p.decodeMsPerContextToken;
}

/** Fills the defaults and checks every parameter is a finite number >= 0 (RangeError naming it). */
export function stepTimeParams(overrides: Partial<StepTimeParams> = {}): StepTimeParams {
  const out = { ...DEFAULT_STEP_TIME };
  for (const key of Object.keys(DEFAULT_STEP_TIME) as (keyof StepTimeParams)[]) {
    const v = overrides[key] ?? DEFAULT_STEP_TIME[key];
    if (!Number.isFinite(v) || v < 0) throw new RangeError(`${key} must be a non-negative number, got ${String(v)}`);
    out[key] = v;
  }
  return out;
}
