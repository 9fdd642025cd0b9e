import { describe, expect, it } from "vitest";
import { seededRandom, type Random } from "../../../src/core/random.js";
import { KvmeshError } from "../../../src/core/errors.js";
import {
  DEFAULT_SELECTOR_CONFIG,
  applyOverride,
  validateSelectorConfig,
  type RouterConfigOverride,
  type SelectorConfig,
} from "../../../src/core/selector-config.js";
import {
  computeCost,
  createCandidateTable,
  pickSoftmax,
  selectCandidate,
  type CandidateInputs,
  type CandidateTable,
  type SelectionRequest,
} from "../../../src/core/selector.js";
import { codeOf } from "../../helpers/errors.js";

const REQ: SelectionRequest = { islTokens: 256, blockSize: 16 };
const cfg = (patch: Partial<SelectorConfig> = {}): SelectorConfig => validateSelectorConfig({ ...DEFAULT_SELECTOR_CONFIG, ...patch });

function tableOf(rows: CandidateInputs[], withTaints = false): CandidateTable {
  const t = createCandidateTable(rows.length + 3, withTaints);
  rows.forEach((r, i) => {
    t.device[i] = r.device;
    t.host[i] = r.host ?? 0;
    t.disk[i] = r.disk ?? 0;
    t.shared[i] = r.shared ?? 0;
    t.activePrefillTokens[i] = r.activePrefillTokens;
    t.potentialDecodeBlocks[i] = r.potentialDecodeBlocks;
    t.activeRequests[i] = r.activeRequests ?? 0;
    if (t.preferredTaintWeight !== null) t.preferredTaintWeight[i] = r.preferredTaintWeight ?? 0;
  });
  t.count = rows.length;
  return t;
}

function histogram(draws: number, pick: (rng: Random) => number, seed = 99): Map<number, number> {
  const rng = seededRandom(seed);
  const counts = new Map<number, number>();
  for (let i = 0; i < draws; i++) {
    const k = pick(rng);
    counts.set(k, (counts.get(k) ?? 0) + 1);
  }
  return counts;
}

describe("cost function", () => {
  it("with defaults equals new prefill blocks (incl. queued backlog) + blocks held after admission", () => {
    // isl 256 / block 16 = 16 prompt blocks.
    // A: 10 cached, 32 queued prefill tokens (2 blocks), 20 active + 6 new blocks.
    //    prefill = 16 - 10 + 2 = 8, decode = 26 -> 34.
    // B: nothing cached, idle, 16 new blocks: 16 + 16 = 32.
    // C: all 16 cached and already active (20 held, 0 new): 0 + 20 = 20.
    const rows: CandidateInputs[] = [
      { device: 10, activePrefillTokens: 32, potentialDecodeBlocks: 26 },
      { device: 0, activePrefillTokens: 0, potentialDecodeBlocks: 16 },
      { device: 16, activePrefillTokens: 0, potentialDecodeBlocks: 20 },
    ];
    expect(rows.map((r) => computeCost(r, REQ, DEFAULT_SELECTOR_CONFIG))).toEqual([34, 32, 20]);
    const costs = new Float64Array(3);
    expect(selectCandidate(tableOf(rows), REQ, DEFAULT_SELECTOR_CONFIG, seededRandom(1), costs)).toBe(2);
    expect([...costs]).toEqual([34, 32, 20]);
  });

  it("credits host, disk and shared-cache blocks at their weights and adds r per active request", () => {
    const c = cfg({ sharedCacheMultiplier: 0.5, decodeActiveRequestWeight: 2 });
    const cost = computeCost(
      { device: 4, host: 4, disk: 4, shared: 2, activePrefillTokens: 0, potentialDecodeBlocks: 10, activeRequests: 3 },
      REQ,
      c,
    );
    // credit = 4 + 3 + 1 + 1 = 9; prefill = 16 - 9 = 7; + 10 decode + 2 x 3.
    expect(cost).toBe(7 + 10 + 6);
  });

  it("prefers the worker holding the prompt's prefix when loads are equal", () => {
    const rows: CandidateInputs[] = [
      { device: 0, activePrefillTokens: 64, potentialDecodeBlocks: 30 },
      { device: 8, activePrefillTokens: 64, potentialDecodeBlocks: 30 },
      { device: 0, activePrefillTokens: 64, potentialDecodeBlocks: 30 },
    ];
    const counts = histogram(50, (rng) => selectCandidate(tableOf(rows), REQ, DEFAULT_SELECTOR_CONFIG, rng));
    expect(counts.get(1)).toBe(50);
  });

  it("shrinks the credit of ranks with more queued prefill only when the decay is on", () => {
    const a: CandidateInputs = { device: 10, activePrefillTokens: 160, potentialDecodeBlocks: 16 };
    const b: CandidateInputs = { device: 0, activePrefillTokens: 0, potentialDecodeBlocks: 16 };
    const costs = new Float64Array(2);
    // δ = 0: the minimum is irrelevant; A costs (160+256)/16 - 10 + 16 = 32 with or without B.
    selectCandidate(tableOf([a, b]), REQ, DEFAULT_SELECTOR_CONFIG, seededRandom(1), costs);
    expect(costs[0]).toBe(32);
    expect(computeCost(a, REQ, DEFAULT_SELECTOR_CONFIG)).toBe(32);
    // δ = 1: f = 1 / (1 + (160/16) / 16) = 16/26 against B's minimum of 0.
    const decayed = cfg({ overlapScoreCreditDecay: 1 });
    const expected = 26 - (10 * 16) / 26 + 16;
    selectCandidate(tableOf([a, b]), REQ, decayed, seededRandom(1), costs);
    expect(costs[0]).toBeCloseTo(expected, 12);
    expect(costs[1]).toBe(32);
    expect(computeCost(a, REQ, decayed, 0)).toBeCloseTo(expected, 12);
    // Alone, A is its own minimum: no decay.
    selectCandidate(tableOf([a]), REQ, decayed, seededRandom(1), costs);
    expect(costs[0]).toBe(32);
    // With prefill tracking off the decay term is not applied either.
    expect(computeCost(a, REQ, cfg({ overlapScoreCreditDecay: 1, trackPrefillTokens: false }), 0)).toBe(16);
  });

  it("scores decode workers on blocks saved when prefill tracking is off", () => {
    const rows: CandidateInputs[] = [
      { device: 10, activePrefillTokens: 0, potentialDecodeBlocks: 30 },
      { device: 0, activePrefillTokens: 0, potentialDecodeBlocks: 25 },
    ];
    const noTrack = cfg({ trackPrefillTokens: false });
    const decodeReq: SelectionRequest = { ...REQ, workerType: "decode" };
    expect(rows.map((r) => computeCost(r, decodeReq, noTrack))).toEqual([20, 25]);
    expect(selectCandidate(tableOf(rows), decodeReq, noTrack, seededRandom(1))).toBe(0);
    // Aggregated (or c = 0): R = 0, so only the decode blocks count.
    expect(rows.map((r) => computeCost(r, REQ, noTrack))).toEqual([30, 25]);
    expect(rows.map((r) => computeCost(r, decodeReq, cfg({ trackPrefillTokens: false, overlapScoreCredit: 0 })))).toEqual([30, 25]);
    expect(selectCandidate(tableOf(rows), REQ, noTrack, seededRandom(1))).toBe(1);
    // Decode with tracking on uses the regular branch: 16 - 10 + 30 = 36 vs 16 + 25 = 41.
    expect(rows.map((r) => computeCost(r, decodeReq, DEFAULT_SELECTOR_CONFIG))).toEqual([36, 41]);
  });

  it("discounts ranks carrying preferred taints by exp(-tanh(weight))", () => {
    const base: CandidateInputs = { device: 0, activePrefillTokens: 0, potentialDecodeBlocks: 16 };
    expect(computeCost({ ...base, preferredTaintWeight: 1 }, REQ, DEFAULT_SELECTOR_CONFIG)).toBeCloseTo(32 * Math.exp(-Math.tanh(1)), 12);
    const rows = [base, { ...base, preferredTaintWeight: 0.5 }];
    expect(selectCandidate(tableOf(rows, true), REQ, DEFAULT_SELECTOR_CONFIG, seededRandom(1))).toBe(1);
  });

  it("rejects bad requests and empty tables", () => {
    const t = tableOf([{ device: 0, activePrefillTokens: 0, potentialDecodeBlocks: 1 }]);
    expect(codeOf(() => selectCandidate(t, { islTokens: 16, blockSize: 0 }, DEFAULT_SELECTOR_CONFIG, seededRandom(1)))).toBe(
      "KVMESH_BAD_REQUEST",
    );
    expect(codeOf(() => selectCandidate(t, { islTokens: -1, blockSize: 16 }, DEFAULT_SELECTOR_CONFIG, seededRandom(1)))).toBe(
      "KVMESH_BAD_REQUEST",
    );
    expect(codeOf(() => selectCandidate(t, REQ, DEFAULT_SELECTOR_CONFIG, seededRandom(1), new Float64Array(0)))).toBe(
      "KVMESH_BAD_REQUEST",
    );
    expect(codeOf(() => selectCandidate(tableOf([]), REQ, DEFAULT_SELECTOR_CONFIG, seededRandom(1)))).toBe("KVMESH_NOT_READY");
  });

  it("never picks a candidate whose cost is NaN", () => {
    const rows: CandidateInputs[] = [
      { device: 0, activePrefillTokens: Number.NaN, potentialDecodeBlocks: 0 },
      { device: 0, activePrefillTokens: 0, potentialDecodeBlocks: 1e6 },
    ];
    for (const temperature of [0, 1]) {
      const counts = histogram(40, (rng) => selectCandidate(tableOf(rows), REQ, cfg({ temperature }), rng));
      expect(counts.get(1)).toBe(40);
    }
  });
});

describe("picker", () => {
  const tied: CandidateInputs[] = [0, 1, 2].map(() => ({ device: 2, activePrefillTokens: 16, potentialDecodeBlocks: 20 }));

  it("spreads zero-temperature ties across tied workers (>= 2 of 3 in 120 draws)", () => {
    const t = tableOf(tied);
    const counts = histogram(120, (rng) => selectCandidate(t, REQ, DEFAULT_SELECTOR_CONFIG, rng), 2024);
    expect(counts.size).toBeGreaterThanOrEqual(2);
    for (const n of counts.values()) expect(n).toBeLessThan(80);
  });

  it("does not let a worse candidate into the tie", () => {
    const t = tableOf([...tied, { device: 0, activePrefillTokens: 16, potentialDecodeBlocks: 20 }]);
    const counts = histogram(120, (rng) => selectCandidate(t, REQ, DEFAULT_SELECTOR_CONFIG, rng));
    expect(counts.get(3)).toBeUndefined();
  });

  it("is stable for a given seed, for ties and for temperature sampling", () => {
    const rows: CandidateInputs[] = [...tied, { device: 0, activePrefillTokens: 0, potentialDecodeBlocks: 24 }];
    const run = (seed: number): number[] => {
      const rng = seededRandom(seed);
      const t = tableOf(rows);
      const picks: number[] = [];
      for (let i = 0; i < 40; i++) picks.push(selectCandidate(t, REQ, DEFAULT_SELECTOR_CONFIG, rng));
      for (let i = 0; i < 40; i++) picks.push(selectCandidate(t, REQ, cfg({ temperature: 0.7 }), rng));
      return picks;
    };
    expect(run(5)).toEqual(run(5));
    expect(run(5)).not.toEqual(run(6));
  });

  it("samples all-equal costs uniformly at temperature > 0", () => {
    const costs = new Float64Array([7, 7, 7, 7]);
    const counts = histogram(4000, (rng) => pickSoftmax(costs, 4, 0.5, rng));
    for (let i = 0; i < 4; i++) {
      expect(counts.get(i)).toBeGreaterThan(850);
      expect(counts.get(i)).toBeLessThan(1150);
    }
  });

  it("orders extreme finite costs sensibly (max - min overflows) and never picks infinite ones", () => {
    const costs = new Float64Array([Number.MAX_VALUE, -Number.MAX_VALUE, 0, Infinity]);
    // normalized [1, 0, 0.5]; weights e^-1 : 1 : e^-0.5 -> 0.19 / 0.51 / 0.31.
    const counts = histogram(6000, (rng) => pickSoftmax(costs, 4, 1, rng));
    const c0 = counts.get(0) ?? 0;
    const c1 = counts.get(1) ?? 0;
    const c2 = counts.get(2) ?? 0;
    expect(counts.get(3)).toBeUndefined();
    expect(c1).toBeGreaterThan(c2);
    expect(c2).toBeGreaterThan(c0);
    expect(c0).toBeGreaterThan(800);
    // Through the cost function: huge but finite decode loads lose to a sane worker at low T.
    const t = tableOf([
      { device: 0, activePrefillTokens: 0, potentialDecodeBlocks: 1e308 },
      { device: 0, activePrefillTokens: 0, potentialDecodeBlocks: 1.7e308 },
      { device: 0, activePrefillTokens: 0, potentialDecodeBlocks: 10 },
    ]);
    const viaSelect = histogram(200, (rng) => selectCandidate(t, REQ, cfg({ temperature: 0.05 }), rng));
    expect(viaSelect.get(2)).toBe(200);
  });

  it("falls back to uniform when every cost is infinite", () => {
    const costs = new Float64Array([Infinity, Infinity, Infinity]);
    const soft = histogram(300, (rng) => pickSoftmax(costs, 3, 1, rng));
    expect(soft.size).toBe(3);
    const t = tableOf([0, 1, 2].map(() => ({ device: 0, activePrefillTokens: 0, potentialDecodeBlocks: Infinity })));
    const arg = histogram(120, (rng) => selectCandidate(t, REQ, DEFAULT_SELECTOR_CONFIG, rng));
    expect(arg.size).toBeGreaterThanOrEqual(2);
  });
});

describe("per-request overrides", () => {
  // A: 12 cached but 64 queued prefill tokens: (64+256)/16 - 12 + 20 = 28. B: idle, 16 + 16 = 32.
  const rows: CandidateInputs[] = [
    { device: 12, activePrefillTokens: 64, potentialDecodeBlocks: 20 },
    { device: 0, activePrefillTokens: 0, potentialDecodeBlocks: 16 },
  ];
  const pick = (override: RouterConfigOverride | undefined): number =>
    selectCandidate(tableOf(rows), REQ, applyOverride(DEFAULT_SELECTOR_CONFIG, override), seededRandom(3));

  it("change the selection", () => {
    expect(pick(undefined)).toBe(0);
    expect(pick({ overlap_score_credit: 0 })).toBe(1); // 40 vs 32
    expect(pick({ prefill_load_scale: 0 })).toBe(1); // 20 vs 16
    expect(pick({ overlap_score_weight: 0 })).toBe(1);
    expect(pick({ track_prefill_tokens: false })).toBe(1); // 20 vs 16
    expect(pick({ prefill_load_scale: 2 })).toBe(0); // 36 vs 48
    const hot = histogram(400, (rng) => selectCandidate(tableOf(rows), REQ, applyOverride(DEFAULT_SELECTOR_CONFIG, { router_temperature: 5 }), rng));
    expect(hot.get(1)).toBeGreaterThan(100);
  });

  it("map the deprecated overlap_score_weight and let explicit fields win", () => {
    const zero = applyOverride(DEFAULT_SELECTOR_CONFIG, { overlap_score_weight: 0 });
    expect(zero.prefillLoadScale).toBe(0);
    expect(zero.overlapScoreCredit).toBe(0);
    const two = applyOverride(DEFAULT_SELECTOR_CONFIG, { overlap_score_weight: 2 });
    expect(two.prefillLoadScale).toBe(2);
    expect(two.overlapScoreCredit).toBe(1);
    const both = applyOverride(DEFAULT_SELECTOR_CONFIG, { overlap_score_weight: 0, overlap_score_credit: 0.5, prefill_load_scale: 3 });
    expect(both.overlapScoreCredit).toBe(0.5);
    expect(both.prefillLoadScale).toBe(3);
    const nulls = applyOverride(DEFAULT_SELECTOR_CONFIG, { router_temperature: null, assume_kv_reuse: false });
    expect(nulls.temperature).toBe(0);
    expect(nulls.assumeKvReuse).toBe(false);
    expect(applyOverride(DEFAULT_SELECTOR_CONFIG, null)).toBe(DEFAULT_SELECTOR_CONFIG);
  });

  it("are validated and name the offending field", () => {
    expect(() => applyOverride(DEFAULT_SELECTOR_CONFIG, { router_temperature: -1 })).toThrow(
      "router_config_override.router_temperature must be a finite number >= 0",
    );
    expect(() => applyOverride(DEFAULT_SELECTOR_CONFIG, { overlap_score_credit: Number.NaN })).toThrow(/overlap_score_credit/);
    expect(() => applyOverride(DEFAULT_SELECTOR_CONFIG, { shared_cache_multiplier: Infinity })).toThrow(/shared_cache_multiplier/);
    const wrongType = JSON.parse('{"track_prefill_tokens":"yes"}') as RouterConfigOverride;
    expect(() => applyOverride(DEFAULT_SELECTOR_CONFIG, wrongType)).toThrow("router_config_override.track_prefill_tokens must be a boolean");
    const unknown = JSON.parse('{"router_temprature":1}') as RouterConfigOverride;
    try {
      applyOverride(DEFAULT_SELECTOR_CONFIG, unknown);
      expect.unreachable();
    } catch (e) {
      expect(e).toBeInstanceOf(KvmeshError);
      expect((e as KvmeshError).code).toBe("KVMESH_BAD_REQUEST");
      expect((e as KvmeshError).details).toEqual({ field: "router_config_override.router_temprature" });
    }
  });
});

describe("selector config", () => {
  it("has the reference defaults", () => {
    expect(DEFAULT_SELECTOR_CONFIG).toEqual({
      overlapScoreCredit: 1,
      overlapScoreCreditDecay: 0,
      prefillLoadScale: 1,
      decodeActiveRequestWeight: 0,
      hostCacheHitWeight: 0.75,
      diskCacheHitWeight: 0.25,
      sharedCacheMultiplier: 0,
      temperature: 0,
      trackPrefillTokens: true,
      assumeKvReuse: true,
      costModel: "reference",
      ttftKeepWeight: 1,
      ttftPrefillMsPerToken: 0.05,
      ttftPrefillMsPerTokenPair: 1.3e-6,
      ttftDecodeStepMs: 10,
      ttftDecodeMsPerSequence: 0.05,
      ttftDecodeMsPerContextToken: 4e-5,
      ttftBatchTokens: 8_192,
    });
    expect(validateSelectorConfig(DEFAULT_SELECTOR_CONFIG)).toEqual(DEFAULT_SELECTOR_CONFIG);
  });

  it("rejects a negative temperature and non-finite knobs, naming the field", () => {
    let err: unknown;
    try {
      validateSelectorConfig({ ...DEFAULT_SELECTOR_CONFIG, temperature: -0.5 });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(KvmeshError);
    expect((err as KvmeshError).code).toBe("KVMESH_BAD_REQUEST");
    expect((err as KvmeshError).message).toMatch(/router_temperature must be a finite number >= 0/);
    expect(() => validateSelectorConfig({ ...DEFAULT_SELECTOR_CONFIG, prefillLoadScale: Infinity })).toThrow(/prefill_load_scale/);
    expect(() => validateSelectorConfig({ ...DEFAULT_SELECTOR_CONFIG, overlapScoreCreditDecay: -1 })).toThrow(/overlap_score_credit_decay/);
    const notBool = { ...DEFAULT_SELECTOR_CONFIG, assumeKvReuse: 1 } as unknown as SelectorConfig;
    expect(() => validateSelectorConfig(notBool)).toThrow(/router_assume_kv_reuse must be a boolean/);
  });
});
