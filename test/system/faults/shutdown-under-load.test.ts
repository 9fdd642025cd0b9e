/**
 * Fault scenario 6 (short): SIGTERM a replica while load runs at it. In-flight requests complete
 * or are refused cleanly, the process exits 0 (how fast is a figure of the report, printed), and
 * the survivor holds no partial state.
 */
import { describe, expect, it } from "vitest";
import { SHUTDOWN_SHORT, scenarioShutdown } from "../../../scripts/lib/fault-scenarios.js";
import { SCENARIO_TEST_TIMEOUT_MS } from "../../helpers/timeouts.js";

describe("fault: shutdown under load", () => {
  it("completes or cleanly refuses in-flight requests and publishes no partial state", async () => {
    const row = await scenarioShutdown(SHUTDOWN_SHORT);
    for (const f of row.figures ?? []) console.log(`shutdown under load: ${f.name} ${f.value} (target ${f.target})`);
    for (const c of row.checks) expect(c.ok, `${c.name}: ${c.value}`).toBe(true);
    expect(row.requests).toBeGreaterThan(100);
    expect(row.failures).toBe(0);
    expect(row.divergence).toBe(0);
  }, SCENARIO_TEST_TIMEOUT_MS);
});
