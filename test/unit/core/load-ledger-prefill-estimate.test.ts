/**
 * The ttft model's prefill estimate in the load ledger (LoadLedger's `prefillMs` option,
 * docs/cost-models.md#prefill-estimate): a booking's queued prefill is taken as computed once the
 * rank's queue ahead of it and its own time have passed, before a late `prefill_complete`.
 */
import { describe, expect, it } from "vitest";
import { ManualClock } from "../../../src/core/time.js";
import { seededRandom } from "../../../src/core/random.js";
import { hashListFromBigInts, type HashList } from "../../../src/core/hash64.js";
import { LoadLedger } from "../../../src/core/load-ledger.js";

const hl = (...ns: number[]): HashList => hashListFromBigInts(ns.map(BigInt));
/** 1 ms per prefill token, as a test engine. */
const perToken = (tokens: number): number => tokens;
const estimating = (clock: ManualClock): LoadLedger => new LoadLedger({ clock, random: seededRandom(1), prefillMs: perToken });
const tracked = (prefillTokens: number, expectedPrefillDurationMs?: number) => ({ prefillTokens, trackPrefill: true, expectedPrefillDurationMs });

describe("LoadLedger prefill estimate", () => {
  it("runs bookings out one after another, as a FIFO engine, without prefill_complete", () => {
    const clock = new ManualClock();
    const ledger = estimating(clock);
    ledger.add("a", 0, hl(1), tracked(100));
    ledger.add("b", 0, hl(2), tracked(40));
    expect(ledger.activePrefillTokens(0)).toBe(140);
    clock.advance(50);
    expect(ledger.activePrefillTokens(0)).toBe(90); // half of a, all of b
    clock.advance(50);
    expect(ledger.activePrefillTokens(0)).toBe(40); // a due; b starts only now
    clock.advance(30);
    expect(ledger.activePrefillTokens(0)).toBeCloseTo(10, 9);
    expect(ledger.prefillDecaying(0)).toBe(true);
    clock.advance(10);
    expect(ledger.activePrefillTokens(0)).toBe(0);
    expect(ledger.prefillDecaying(0)).toBe(false);
    // The bookings stay live: only their prefill ran out.
    expect(ledger.activeRequests(0)).toBe(2);
  });

  it("starts a booking after the queue ahead of it, from its booking time when the rank is idle", () => {
    const clock = new ManualClock();
    const ledger = estimating(clock);
    ledger.add("a", 0, hl(1), tracked(100));
    clock.advance(500);
    ledger.add("b", 0, hl(2), tracked(100)); // a is long due: b starts now
    expect(ledger.activePrefillTokens(0)).toBe(100);
    clock.advance(50);
    expect(ledger.activePrefillTokens(0)).toBe(50);
    ledger.add("c", 1, hl(3), tracked(10));
    expect(ledger.activePrefillTokens(1)).toBe(10); // ranks queue apart
  });

  it("takes a request's expected_prefill_duration_ms over the estimate, and prefill_complete still removes early", () => {
    const clock = new ManualClock();
    const ledger = estimating(clock);
    ledger.add("a", 0, hl(1), tracked(100, 10));
    ledger.add("b", 0, hl(2), tracked(100));
    clock.advance(10);
    expect(ledger.activePrefillTokens(0)).toBe(100);
    expect(ledger.markPrefillComplete("b")).toBe(true);
    expect(ledger.activePrefillTokens(0)).toBe(0);
    ledger.add("c", 0, hl(3), tracked(20));
    expect(ledger.activePrefillTokens(0)).toBe(20);
  });

  it("publishes a prefill floor of 0 on a rank with queued prefill, below every value the estimate takes", () => {
    const clock = new ManualClock();
    const ledger = estimating(clock);
    ledger.add("a", 2, hl(1), tracked(100));
    expect(ledger.flatPrefillDecays[2]).toBe(1);
    expect(ledger.flatPrefillFloor[2]).toBe(0);
    const prefill = new Float64Array(1);
    ledger.fillCandidateLoads(Int32Array.of(2), 1, 1, new Int32Array(3), prefill, new Float64Array(1), new Float64Array(1));
    expect(prefill[0]).toBe(100);
  });

  it("leaves the reference's decay without the estimate: only the oldest booking decays, only with a hint", () => {
    const clock = new ManualClock();
    const ledger = new LoadLedger({ clock, random: seededRandom(1) });
    ledger.add("a", 0, hl(1), tracked(100));
    ledger.add("b", 0, hl(2), tracked(40));
    clock.advance(10_000);
    expect(ledger.activePrefillTokens(0)).toBe(140);
  });
});
