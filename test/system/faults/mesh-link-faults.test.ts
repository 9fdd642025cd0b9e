/**
 * Fault scenario 3 (short): delay, chunk loss and truncation (which corrupt ZMTP and reset the
 * connections; after a protocol error libzmq never redials, so the mesh must) and a stall on every
 * mesh link, through fault proxies, under load. HTTP does not cross the proxies, so no request may
 * fail; after each fault the mesh must agree again.
 */
import { describe, expect, it } from "vitest";
import { PROXY_SHORT, scenarioProxyFaults, type PhaseResult } from "../../../scripts/lib/fault-scenarios.js";
import { SCENARIO_TEST_TIMEOUT_MS } from "../../helpers/timeouts.js";

describe("fault: delay, loss and stalls on the mesh links", () => {
  it("keeps routing, shows the lag, repairs losses by snapshot and recovers after each fault", async () => {
    const row = await scenarioProxyFaults(PROXY_SHORT);
    for (const c of row.checks) expect(c.ok, `${c.name}: ${c.value}`).toBe(true);
    const phases = row.details.phases as PhaseResult[];
    const [delay, drop, truncate, stall] = phases;
    // The faults really happened: delayed chunks (and lag beyond the added 20 ms), dropped
    // chunks with connections re-made, a stall.
    expect(delay?.proxy.chunksDelayed).toBeGreaterThan(0);
    expect(delay?.lag.p50Ms).toBeGreaterThanOrEqual(20);
    expect(drop?.proxy.chunksDropped).toBeGreaterThan(0);
    expect(drop?.proxy.connectionsAccepted).toBeGreaterThan(0);
    expect(truncate?.proxy.chunksTruncated).toBeGreaterThan(0);
    expect(stall?.proxy.stalls).toBeGreaterThan(0);
    expect(row.failures).toBe(0);
    expect(row.divergence).toBe(0);
  }, SCENARIO_TEST_TIMEOUT_MS);
});
