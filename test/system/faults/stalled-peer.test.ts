/**
 * Fault scenario 4 (short): a peer frozen with SIGSTOP under load at the others. They keep
 * answering, their memory stays bounded, and the frozen peer repairs what it missed once it
 * runs again.
 */
import { describe, expect, it } from "vitest";
import { STALLED_SHORT, scenarioStalledPeer } from "../../../scripts/lib/fault-scenarios.js";
import { SCENARIO_TEST_TIMEOUT_MS } from "../../helpers/timeouts.js";

describe("fault: a stalled peer", () => {
  it("does not stall the others or grow their memory; the peer catches up by snapshot", async () => {
    const row = await scenarioStalledPeer(STALLED_SHORT);
    for (const f of row.figures ?? []) console.log(`stalled peer: ${f.name} ${f.value} (target ${f.target})`);
    for (const c of row.checks) expect(c.ok, `${c.name}: ${c.value}`).toBe(true);
    expect(row.failures).toBe(0);
    expect(row.snapshots).toBeGreaterThan(0);
    expect(row.divergence).toBe(0);
  }, SCENARIO_TEST_TIMEOUT_MS);
});
