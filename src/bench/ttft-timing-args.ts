/**
 * The `--ttft-*` timing flags `kvmesh bench` gives replicas that run `--cost-model ttft`: the mock
 * engines' step-time parameters (src/mock/step-time.ts, trace ms) divided by their speedup, so the
 * router's wall-clock prefill estimate runs at the engines' wall-clock speed. At speedup 10 a
 * 10,000-token prompt prefills in 50 wall ms, not the 500 the unscaled defaults would expect: with
 * those, a booking's queued prefill would outlive its computation tenfold (docs/cost-models.md).
 */
import { DEFAULT_STEP_TIME } from "../mock/step-time.js";
import { DEFAULT_MAX_BATCH_TOKENS } from "../mock/mock-engine.js";

export function ttftTimingArgs(speedup: number): string[] {
  const t = DEFAULT_STEP_TIME;
  const wall = (traceMs: number): string => String(traceMs / speedup);
  return [
    "--ttft-prefill-ms-per-token",
    wall(t.prefillMsPerToken),
    "--ttft-prefill-ms-per-token-pair",
    wall(t.prefillMsPerTokenPair),
    "--ttft-decode-step-ms",
    wall(t.decodeMsPerToken),
    "--ttft-decode-ms-per-sequence",
    wall(t.decodeMsPerSequence),
    "--ttft-decode-ms-per-context-token",
    wall(t.decodeMsPerContextToken),
    "--ttft-batch-tokens",
    String(DEFAULT_MAX_BATCH_TOKENS),
  ];
}
