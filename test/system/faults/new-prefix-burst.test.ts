/**
 * Fault scenario 12 (short, issue 25 item 4): bursts of 32 requests sharing a new 8k-token prefix,
 * round-robin over 4 replica processes, land on at most 2 workers with predicted cache; without it
 * (--approx-ttl-secs 0) they spread further.
 */
import { describe, expect, it } from "vitest";
import { BURST_MAX_WORKERS, BURST_SHORT, scenarioNewPrefixBurst } from "../../../scripts/lib/new-prefix-burst-scenario.js";
import { SCENARIO_TEST_TIMEOUT_MS } from "../../helpers/timeouts.js";

describe("fault: a burst sharing a new prefix over 4 replicas", () => {
  it("lands on at most 2 workers per burst with no failed request", async () => {
    const row = await scenarioNewPrefixBurst(BURST_SHORT);
    for (const c of row.checks) expect(c.ok, `${c.name}: ${c.value}`).toBe(true);
    const { withPredictions, withoutPredictions } = row.details as { withPredictions: number[]; withoutPredictions: number[] };
    expect(withPredictions).toHaveLength(BURST_SHORT.bursts);
    for (const n of withPredictions) expect(n).toBeLessThanOrEqual(BURST_MAX_WORKERS);
    expect(Math.max(...withoutPredictions)).toBeGreaterThan(BURST_MAX_WORKERS);
  }, SCENARIO_TEST_TIMEOUT_MS);
});
