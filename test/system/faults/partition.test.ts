/**
 * Fault scenario 2 (short): a real partition (two network namespaces, a veth pair cut with
 * `ip link set down`). Skipped, with the reason printed, where namespaces are unavailable.
 */
import { describe, expect, it } from "vitest";
import { PARTITION_SHORT, scenarioPartition } from "../../../scripts/lib/fault-scenarios.js";
import { netnsUnavailableReason } from "../../../scripts/lib/netns-partition.js";
import { SCENARIO_TEST_TIMEOUT_MS } from "../../helpers/timeouts.js";

const unavailable = netnsUnavailableReason();
if (unavailable !== null) console.warn(`partition fault test skipped: ${unavailable}`);

describe("fault: network partition between replicas", () => {
  it("routes on both sides, converges after the heal, resolves conflicting bindings alike", async (ctx) => {
    if (unavailable !== null) ctx.skip(`ip netns unavailable: ${unavailable}`);
    const row = await scenarioPartition(PARTITION_SHORT);
    expect(row.skipped).toBeUndefined();
    expect(row.requests).toBeGreaterThan(50);
    for (const c of row.checks) expect(c.ok, `${c.name}: ${c.value}`).toBe(true);
    expect(row.failures).toBe(0);
    expect(row.convergeMs).not.toBeNull();
    expect(row.divergence).toBe(0);
  }, SCENARIO_TEST_TIMEOUT_MS);
});
