import { describe, expect, it } from "vitest";

import { ManualTimers } from "../../../src/core/index.js";
import { MockEngine, type EngineResult, type EngineStepInfo, type MockEngineConfig } from "../../../src/mock/mock-engine.js";
import { DEFAULT_STEP_TIME, prefillPairs, stepTimeMs, stepTimeParams, type StepTimeParams } from "../../../src/mock/step-time.js";

const BLOCK = 16;
const prompt = (length: number, base = 1): Uint32Array => Uint32Array.from({ length }, (_, i) => base * 1_000_000 + i);

/** Round numbers, so every figure below can be worked out by hand. */
const P: StepTimeParams = { prefillMsPerToken: 0.1, prefillMsPerTokenPair: 0.001, decodeMsPerToken: 5, decodeMsPerSequence: 0.5, decodeMsPerContextToken: 0.01 };

describe("step time model", () => {
  it("adds up linear prefill, prefill attention, and the decode terms, by hand", () => {
    // 100 tokens after 50 in the KV: 100*50 + 100*101/2 = 10,050 pairs.
    expect(prefillPairs(50, 100)).toBe(10_050);
    const b = { prefillTokens: 100, prefillPairs: 10_050, decodeSequences: 4, decodeContextTokens: 1_000 };
    // 10 + 10.05 + 5 + 2 + 10
    expect(stepTimeMs(P, b)).toBeCloseTo(37.05, 10);
    // No decoder: no decode step cost at all.
    expect(stepTimeMs(P, { ...b, decodeSequences: 0, decodeContextTokens: 0 })).toBeCloseTo(20.05, 10);
    expect(stepTimeMs(P, { prefillTokens: 0, prefillPairs: 0, decodeSequences: 0, decodeContextTokens: 0 })).toBe(0);
  });

  it("charges a chunked prefill the same attention as one pass, and a long prompt more than twice a half", () => {
    expect(prefillPairs(0, 300) + prefillPairs(300, 200)).toBe(prefillPairs(0, 500));
    const cold = (n: number): number => stepTimeMs(DEFAULT_STEP_TIME, { prefillTokens: n, prefillPairs: prefillPairs(0, n), decodeSequences: 0, decodeContextTokens: 0 });
    expect(cold(40_000)).toBeGreaterThan(2 * cold(20_000));
    // The defaults: 2 s of linear compute and ~1 s of attention for a cold 40k-token prompt.
    expect(cold(40_000)).toBeCloseTo(40_000 * 0.05 + 1.3e-6 * prefillPairs(0, 40_000), 6);
  });

  it("grows a decode step with the batch and with the decoders' context", () => {
    const decode = (n: number, ctx: number): number => stepTimeMs(DEFAULT_STEP_TIME, { prefillTokens: 0, prefillPairs: 0, decodeSequences: n, decodeContextTokens: n * ctx });
    expect(decode(1, 1_000)).toBeCloseTo(10 + 0.05 + 0.04, 10);
    expect(decode(32, 1_000)).toBeGreaterThan(decode(1, 1_000));
    expect(decode(32, 10_000)).toBeGreaterThan(decode(32, 1_000));
  });

  it("fills defaults and names a bad parameter", () => {
    expect(stepTimeParams()).toEqual(DEFAULT_STEP_TIME);
    expect(stepTimeParams({ decodeMsPerToken: 3 })).toEqual({ ...DEFAULT_STEP_TIME, decodeMsPerToken: 3 });
    expect(() => stepTimeParams({ decodeMsPerContextToken: -1 })).toThrow(/decodeMsPerContextToken/);
    expect(() => stepTimeParams({ prefillMsPerTokenPair: Number.NaN })).toThrow(/prefillMsPerTokenPair/);
    expect(() => new MockEngine({ workerId: 1n, decodeMsPerSequence: -2 })).toThrow(/decodeMsPerSequence/);
  });
});

interface Run {
  results: EngineResult[];
  steps: EngineStepInfo[];
}

/** One engine on a manual clock: `submits` are [at ms, tokens, output tokens]. */
async function run(submits: readonly (readonly [number, Uint32Array, number])[], config: Partial<MockEngineConfig> = {}): Promise<Run> {
  const timers = new ManualTimers();
  const steps: EngineStepInfo[] = [];
  const engine = new MockEngine({ workerId: 1n, blockSize: BLOCK, kvBlocks: 4_096, maxBatchTokens: 512, ...P, clock: timers, timers, onStep: (s) => steps.push(s), ...config });
  const promises: Promise<EngineResult>[] = [];
  let now = 0;
  for (const [at, tokens, out] of submits) {
    // Submits at the same time share a tick (advancing by 0 would run the engine's 0 ms timer).
    if (at > now) timers.advance(at - now);
    now = at;
    promises.push(engine.submit({ requestId: `r${String(promises.length)}`, tokens, outputTokens: out }));
  }
  timers.runAll();
  return { results: await Promise.all(promises), steps };
}

describe("MockEngine timed by its batch", () => {
  it("times every step by the model, decode stretches included", async () => {
    const { steps } = await run([
      [0, prompt(40, 1), 20],
      [0, prompt(24, 2), 30],
    ]);
    // Step 1 prefills both prompts from scratch.
    expect(steps[0]).toMatchObject({ prefillTokens: 64, decodeRequests: 0 });
    expect((steps[0] as EngineStepInfo).endMs - (steps[0] as EngineStepInfo).startMs).toBeCloseTo(stepTimeMs(P, { prefillTokens: 64, prefillPairs: prefillPairs(0, 40) + prefillPairs(0, 24), decodeSequences: 0, decodeContextTokens: 0 }), 9);
    // Then both decode as one stretch: each step charged 2 sequences and their context (41 + 25).
    const stretch = steps[1] as EngineStepInfo;
    expect(stretch.decodeSteps).toBeGreaterThan(1);
    expect(stretch.endMs - stretch.startMs).toBeCloseTo(stretch.decodeSteps * stepTimeMs(P, { prefillTokens: 0, prefillPairs: 0, decodeSequences: 2, decodeContextTokens: 66 }), 9);
  });

  it("makes a worker busy decoding long contexts pay in TTFT", async () => {
    const newcomer = prompt(256, 99);
    const at = 60_000;
    const idle = await run([[at, newcomer, 1]]);
    // 16 requests with 2,048-token prompts, prefilled by 40 s and still decoding when the newcomer
    // arrives: its prefill shares a step with their decodes, and their steps are long.
    const busyLoad = Array.from({ length: 16 }, (_, i) => [0, prompt(2_048, i + 1), 2_000] as const);
    const busy = await run([...busyLoad, [at, newcomer, 1]]);
    const ttft = (r: Run): number => (r.results.at(-1) as EngineResult).ttftMs;
    expect(ttft(idle)).toBeCloseTo(256 * P.prefillMsPerToken + prefillPairs(0, 256) * P.prefillMsPerTokenPair, 6);
    expect(ttft(busy)).toBeGreaterThan(ttft(idle));
    // It did not queue: it was admitted at the first step boundary after it arrived.
    expect((busy.results.at(-1) as EngineResult).queueMs).toBeLessThan(ttft(busy));
    // Fewer decoders, shorter steps: TTFT grows with the load, not only with its presence.
    const lighter = await run([...busyLoad.slice(0, 2), [at, newcomer, 1]]);
    expect(ttft(lighter)).toBeGreaterThan(ttft(idle));
    expect(ttft(lighter)).toBeLessThan(ttft(busy));
  });

  it("makes a conversation moved away from its cache pay for recomputing the prefix", async () => {
    const history = prompt(4_096, 7);
    const next = Uint32Array.from([...history, ...prompt(256, 8)]);
    // Same worker: the history hits; another (cold) worker recomputes all 4,352 tokens.
    const stayed = await run([
      [0, history, 1],
      [100_000, next, 1],
    ]);
    const moved = await run([[100_000, next, 1]]);
    const warm = stayed.results[1] as EngineResult;
    const cold = moved.results[0] as EngineResult;
    expect(warm.cachedTokens).toBe(4_096);
    expect(cold.cachedTokens).toBe(0);
    // The warm turn computes 256 tokens that still attend to the 4,096 cached ones.
    expect(warm.ttftMs).toBeCloseTo(256 * P.prefillMsPerToken + prefillPairs(4_096, 256) * P.prefillMsPerTokenPair, 6);
    expect(cold.ttftMs).toBeGreaterThan(5 * warm.ttftMs);
  });
});
