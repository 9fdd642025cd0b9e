/**
 * Fault scenario 7 (#17 F8, F10, F11): a hostile engine's KV events into a real replica while
 * /select is probed: the index stays bounded, the oversized message, the flapping publisher and
 * the parent-hash cycle are each refused or damped and counted, /select never fails.
 */
import { describe, expect, it } from "vitest";

import { HOSTILE_SHORT, scenarioHostileInputs } from "../../../scripts/lib/hostile-inputs-scenario.js";

describe("fault: hostile KV inputs", () => {
  it("keeps the replica bounded and routing", async () => {
    const row = await scenarioHostileInputs(HOSTILE_SHORT);
    console.log(`hostile KV inputs: ${String(row.details.summary)}`);
    for (const c of row.checks) expect(c.ok, `${c.name}: ${c.value}`).toBe(true);
    expect(row.failures).toBe(0);
  }, 60_000);
});
