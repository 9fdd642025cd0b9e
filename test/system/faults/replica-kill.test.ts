/**
 * Fault scenario 1 (short): SIGKILL a replica of three under session load. The survivors keep
 * routing, the restarted process converges on load and bindings from snapshots within a second,
 * and sessions keep their workers. (test/integration/mesh-restart.test.ts covers the idle case.)
 */
import { describe, expect, it } from "vitest";
import { KILL_SHORT, scenarioKill } from "../../../scripts/lib/fault-scenarios.js";

describe("fault: replica killed under load", () => {
  it("keeps routing, restarts into the fleet's state within 1 s, sessions stay put", async () => {
    const row = await scenarioKill(KILL_SHORT);
    expect(row.requests).toBeGreaterThan(100);
    for (const c of row.checks) expect(c.ok, `${c.name}: ${c.value}`).toBe(true);
    expect(row.failures).toBe(0);
    expect(row.convergeMs).not.toBeNull();
    expect(row.convergeMs as number).toBeLessThan(1_000);
    expect(row.divergence).toBe(0);
  }, 40_000);
});
