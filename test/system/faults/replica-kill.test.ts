/**
 * Fault scenario 1 (short): SIGKILL a replica of three under session load. The survivors keep
 * routing, the restarted process converges on load and bindings from snapshots, and sessions keep
 * their workers. (test/system/integration/mesh-restart.test.ts covers the idle case.) How fast it
 * converges (target < 1 s) is a figure of the scenario's report, printed here and by `npm run faults`.
 */
import { describe, expect, it } from "vitest";
import { KILL_SHORT, scenarioKill } from "../../../scripts/lib/fault-scenarios.js";
import { SCENARIO_TEST_TIMEOUT_MS } from "../../helpers/timeouts.js";

describe("fault: replica killed under load", () => {
  it("keeps routing, restarts into the fleet's state, sessions stay put", async () => {
    const row = await scenarioKill(KILL_SHORT);
    for (const f of row.figures ?? []) console.log(`replica kill: ${f.name} ${f.value} (target ${f.target})`);
    expect(row.requests).toBeGreaterThan(100);
    for (const c of row.checks) expect(c.ok, `${c.name}: ${c.value}`).toBe(true);
    expect(row.failures).toBe(0);
    expect(row.convergeMs).not.toBeNull();
    expect(row.divergence).toBe(0);
  }, SCENARIO_TEST_TIMEOUT_MS);
});
