/**
 * Fault scenario 8 (short, #15 Tests): the 3 replicas restarted one at a time with draining while
 * a client spreads sessions over the ready ones. 0 failed requests, stickiness >= 0.99, and no
 * booking left behind.
 */
import { describe, expect, it } from "vitest";
import { ROLLING_SHORT, scenarioRollingRestart, STICKINESS_MIN } from "../../../scripts/lib/rolling-restart-scenario.js";
import { SCENARIO_TEST_TIMEOUT_MS } from "../../helpers/timeouts.js";

describe("fault: rolling restart under load", () => {
  it("drains and restarts each replica in turn with no failed request, sessions kept, nothing left booked", async () => {
    const row = await scenarioRollingRestart(ROLLING_SHORT);
    for (const c of row.checks) expect(c.ok, `${c.name}: ${c.value}`).toBe(true);
    expect(row.requests).toBeGreaterThan(100);
    expect(row.failures).toBe(0);
    expect((row.details.load as { stickiness: { turnShare: number } }).stickiness.turnShare).toBeGreaterThanOrEqual(STICKINESS_MIN);
    expect(row.divergence).toBe(0);
  }, SCENARIO_TEST_TIMEOUT_MS);
});
