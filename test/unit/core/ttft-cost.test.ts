/**
 * The ttft cost model (src/core/ttft-cost.ts) as the selector applies it: continuity where it is
 * cheap, a move where the caching worker is really busier, cold work spread by queued prefill,
 * and the reference's formula untouched unless the model is chosen.
 */
import { describe, expect, it } from "vitest";
import { seededRandom } from "../../../src/core/random.js";
import { computeCost, createCandidateTable, selectCandidate, type CandidateInputs } from "../../../src/core/selector.js";
import { DEFAULT_SELECTOR_CONFIG, validateSelectorConfig, type SelectorConfig } from "../../../src/core/selector-config.js";
import { DEFAULT_TTFT_COST, ttftCost } from "../../../src/core/ttft-cost.js";

const BS = 64;
const TTFT: SelectorConfig = { ...DEFAULT_SELECTOR_CONFIG, costModel: "ttft" };

/** Picks among `rows` with the given config (argmin, seeded tie-break). */
function choose(rows: CandidateInputs[], isl: number, config: SelectorConfig): number {
  const t = createCandidateTable(rows.length);
  t.count = rows.length;
  rows.forEach((r, i) => {
    t.device[i] = r.device;
    t.activePrefillTokens[i] = r.activePrefillTokens;
    t.potentialDecodeBlocks[i] = r.potentialDecodeBlocks;
    t.activeRequests[i] = r.activeRequests ?? 0;
  });
  return selectCandidate(t, { islTokens: isl, blockSize: BS }, config, seededRandom(1));
}

describe("the ttft cost model", () => {
  // A conversation's next turn: 30k tokens, 28k of them cached on worker 0.
  const isl = 30_000;
  const cachedBlocks = 28_000 / BS;
  const newBlocks = Math.ceil(isl / BS);

  it("keeps the next turn where its context is cached though other long requests decode there", () => {
    // Worker 0 also decodes five 13.5k-token requests (211 blocks each); worker 1 is idle.
    const rows = [
      { device: cachedBlocks, activePrefillTokens: 0, potentialDecodeBlocks: 5 * 211 + (newBlocks - cachedBlocks), activeRequests: 5 },
      { device: 0, activePrefillTokens: 0, potentialDecodeBlocks: newBlocks, activeRequests: 0 },
    ];
    expect(choose(rows, isl, TTFT)).toBe(0);
    // The reference's formula sends it away: the running requests' blocks outweigh the clamped credit.
    expect(choose(rows, isl, DEFAULT_SELECTOR_CONFIG)).toBe(1);
  });

  it("moves it when the caching worker is really busier: more queued prefill than the recompute and the keep term", () => {
    const recomputeMs = ttftCost(0, 28_000, 0, newBlocks, 0, isl, BS, DEFAULT_TTFT_COST) * BS * DEFAULT_TTFT_COST.ttftPrefillMsPerToken;
    // Queued prefill worth well more than recomputing the history (twice, with the keep term).
    const queued = Math.ceil((2 * recomputeMs) / DEFAULT_TTFT_COST.ttftPrefillMsPerToken);
    const busy = [
      { device: cachedBlocks, activePrefillTokens: queued, potentialDecodeBlocks: newBlocks, activeRequests: 3 },
      { device: 0, activePrefillTokens: 0, potentialDecodeBlocks: newBlocks, activeRequests: 0 },
    ];
    expect(choose(busy, isl, TTFT)).toBe(1);
    // A little queued prefill does not move it.
    const light = [{ ...(busy[0] as CandidateInputs), activePrefillTokens: 4_000 }, busy[1] as CandidateInputs];
    expect(choose(light, isl, TTFT)).toBe(0);
  });

  it("sends a cold prompt to the rank with the least queued prefill, then the fewest decoders", () => {
    const rows = [
      { device: 0, activePrefillTokens: 9_000, potentialDecodeBlocks: 100, activeRequests: 1 },
      { device: 0, activePrefillTokens: 1_000, potentialDecodeBlocks: 900, activeRequests: 8 },
      { device: 0, activePrefillTokens: 1_000, potentialDecodeBlocks: 300, activeRequests: 2 },
    ];
    expect(choose(rows, 5_000, TTFT)).toBe(2);
  });

  it("charges the keep term only against the best cached candidate, and the attention of uncached tokens", () => {
    const k = DEFAULT_TTFT_COST;
    // Alone (best = its own cache): no keep term.
    const alone = computeCost({ device: 10, activePrefillTokens: 0, potentialDecodeBlocks: 0 }, { islTokens: 1_000, blockSize: BS }, TTFT);
    const uncached = 1_000 - 640;
    expect(alone).toBeCloseTo((uncached * k.ttftPrefillMsPerToken + uncached * (640 + uncached / 2) * k.ttftPrefillMsPerTokenPair) / (BS * k.ttftPrefillMsPerToken), 9);
    // Beside a candidate caching everything but the last token: the 640 tokens it lacks count again.
    const beside = computeCost({ device: 10, activePrefillTokens: 0, potentialDecodeBlocks: 0 }, { islTokens: 1_000, blockSize: BS, bestCachedTokens: 960 }, TTFT);
    expect(beside - alone).toBeCloseTo((k.ttftKeepWeight * 320) / BS, 9);
  });

  it("is non-decreasing in every load (the candidate scan's floors rely on it)", () => {
    const g = seededRandom(7);
    for (let i = 0; i < 2_000; i++) {
      const cached = Math.floor(g.next() * 20_000);
      const isl = cached + Math.floor(g.next() * 20_000);
      const best = cached + Math.floor(g.next() * 5_000);
      const p = Math.floor(g.next() * 50_000);
      const d = Math.floor(g.next() * 5_000);
      const r = Math.floor(g.next() * 40);
      const base = ttftCost(cached, best, p, d, r, isl, BS, DEFAULT_TTFT_COST);
      expect(ttftCost(cached, best, p + 1 + Math.floor(g.next() * 9_000), d, r, isl, BS, DEFAULT_TTFT_COST)).toBeGreaterThanOrEqual(base);
      expect(ttftCost(cached, best, p, d + 1 + Math.floor(g.next() * 900), r, isl, BS, DEFAULT_TTFT_COST)).toBeGreaterThanOrEqual(base);
      expect(ttftCost(cached, best, p, d, r + 1, isl, BS, DEFAULT_TTFT_COST)).toBeGreaterThanOrEqual(base);
    }
  });

  it("is a validated selector knob, reference by default", () => {
    expect(DEFAULT_SELECTOR_CONFIG.costModel).toBe("reference");
    expect(validateSelectorConfig(TTFT).costModel).toBe("ttft");
    expect(() => validateSelectorConfig({ ...TTFT, costModel: "fast" as never })).toThrow(/cost_model must be one of reference, ttft/);
  });

  it("takes its engine timing as knobs, refusing a zero prefill rate or batch (the cost divides by one, steps by the other)", () => {
    expect(validateSelectorConfig({ ...TTFT, ttftPrefillMsPerToken: 0.005 }).ttftPrefillMsPerToken).toBe(0.005);
    expect(() => validateSelectorConfig({ ...TTFT, ttftPrefillMsPerToken: 0 })).toThrow(/ttft_prefill_ms_per_token must be > 0/);
    expect(() => validateSelectorConfig({ ...TTFT, ttftBatchTokens: 0 })).toThrow(/ttft_batch_tokens must be >= 1/);
    expect(() => validateSelectorConfig({ ...TTFT, ttftDecodeStepMs: -1 })).toThrow(/ttft_decode_step_ms must be a finite number >= 0/);
    // Only the ratios decide: the same timing ten times faster scores every rank the same.
    const fast = { ...DEFAULT_TTFT_COST, ttftPrefillMsPerToken: 0.005, ttftPrefillMsPerTokenPair: 1.3e-7, ttftDecodeStepMs: 1, ttftDecodeMsPerSequence: 0.005, ttftDecodeMsPerContextToken: 4e-6 };
    expect(ttftCost(1_024, 4_096, 9_000, 300, 4, 8_000, BS, fast)).toBeCloseTo(ttftCost(1_024, 4_096, 9_000, 300, 4, 8_000, BS, DEFAULT_TTFT_COST), 9);
  });
});
