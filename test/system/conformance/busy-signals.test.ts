/**
 * Conformance: the busy signals of conditional disaggregation on /select answers (issue 28).
 * Reference (ai-dynamo/dynamo lib/kv-router/src/): services/selection/core/run.rs
 * `select_response` (decode_busy = potential_decode_blocks > threshold x total_kv_blocks, on every
 * answer; prefill_busy = active_prefill_tokens > threshold x prefill_token_capacity, advisory only),
 * with the thresholds of DYN_ROUTER_CONDITIONAL_DISAGG_{DECODE,PREFILL}_BUSY_THRESHOLD; ported
 * from core/tests.rs advisory_select_reports_worker_load_and_busy_evaluation and
 * busy_evaluation_is_absent_without_thresholds_or_capacity.
 */
import { afterEach, describe, expect, it } from "vitest";

import { resolveServiceOptions } from "../../../src/core/index.js";
import { app, closeApps, MODEL, obj } from "../../helpers/harness.js";

afterEach(closeApps);

const sel = (extra: Record<string, unknown> = {}): Record<string, unknown> => ({ model_name: MODEL, token_ids: [1, 2, 3, 4], ...extra });

describe("conformance: decode_busy and worker_load.prefill_busy", () => {
  it("advisory_select_reports_worker_load_and_busy_evaluation: decode_busy on every answer, prefill_busy on an advisory one", async () => {
    const a = await app({ busyThresholds: { prefill: 0.5, decode: 0 } });
    await a.registerWorker(1, { total_kv_blocks: 1000, max_num_batched_tokens: 1024 });
    const plain = obj(await a.post("/select", sel()));
    expect(plain.potential_decode_blocks).toBeGreaterThan(0);
    expect(plain.decode_busy).toBe(true); // threshold 0.0 is always exceeded
    expect(plain.worker_load).toBeUndefined();
    const advisory = obj(await a.post("/select", sel({ advisory: true })));
    expect(advisory.decode_busy).toBe(true);
    expect(advisory.worker_load).toEqual({ active_prefill_tokens: 0, prefill_token_capacity: 1024, total_kv_blocks: 1000, prefill_busy: false });
    expect((await a.loads())[0]?.potential_prefill_tokens).toBe(0);
    // Bookings carry decode_busy too (select_response serves both).
    expect(obj(await a.post("/select_and_reserve", sel({ selection_id: "b" }))).decode_busy).toBe(true);
  });

  it("compares against the fractions: below the line false, above it true", async () => {
    const a = await app({ busyThresholds: { prefill: 0.5, decode: 0.5 } });
    await a.registerWorker(1, { total_kv_blocks: 2, max_num_batched_tokens: 4 });
    // One block of two (0.5 x 2 = 1, not above); prefill 0 of 4.
    let r = obj(await a.post("/select", sel({ advisory: true })));
    expect([r.potential_decode_blocks, r.decode_busy, (r.worker_load as Record<string, unknown>).prefill_busy]).toEqual([1, false, false]);
    // A booking of another prompt's block: 4 prefill tokens active (> 0.5 x 4), and this prompt
    // would add its block to the one held (2 > 0.5 x 2).
    await a.post("/select_and_reserve", sel({ token_ids: [5, 6, 7, 8], selection_id: "x" }));
    r = obj(await a.post("/select", sel({ advisory: true })));
    expect([r.potential_decode_blocks, r.decode_busy, (r.worker_load as Record<string, unknown>).prefill_busy]).toEqual([2, true, true]);
  });

  it("busy_evaluation_is_absent_without_thresholds_or_capacity", async () => {
    const none = await app();
    await none.registerWorker(1, { total_kv_blocks: 1000 });
    const r = obj(await none.post("/select", sel({ advisory: true })));
    expect("decode_busy" in r).toBe(false);
    expect("prefill_busy" in (r.worker_load as object)).toBe(false);
    // A threshold without the worker's total_kv_blocks: still no decode_busy.
    const noCapacity = await app({ busyThresholds: { decode: 0 } });
    await noCapacity.registerWorker(1);
    const s = obj(await noCapacity.post("/select", sel({ advisory: true })));
    expect("decode_busy" in s).toBe(false);
    expect((s.worker_load as Record<string, unknown>).total_kv_blocks).toBeUndefined();
  });

  it("refuses a threshold that is negative or not finite, naming it", () => {
    expect(() => resolveServiceOptions({ busyThresholds: { decode: -1 } })).toThrow("busyThresholds.decode must be a finite number >= 0");
    expect(() => resolveServiceOptions({ busyThresholds: { prefill: Number.NaN } })).toThrow("busyThresholds.prefill must be a finite number >= 0");
  });
});
