/**
 * Fault scenario 7 (#17 F8, F10, F11): a hostile engine's KV events into a real replica while
 * /select is probed: the index stays bounded, the oversized message, the flapping publisher and
 * the parent-hash cycle are each refused or damped and counted, /select never fails. The slowest
 * /select (target 500 ms) is a figure of the report, printed, not asserted.
 */
import { describe, expect, it } from "vitest";

import { HOSTILE_SHORT, scenarioHostileInputs } from "../../../scripts/lib/hostile-inputs-scenario.js";
import { SCENARIO_TEST_TIMEOUT_MS } from "../../helpers/timeouts.js";

describe("fault: hostile KV inputs", () => {
  it("keeps the replica bounded and routing", async () => {
    const row = await scenarioHostileInputs(HOSTILE_SHORT);
    console.log(`hostile KV inputs: ${String(row.details.summary)}`);
    for (const f of row.figures ?? []) console.log(`hostile KV inputs: ${f.name} ${f.value} (target ${f.target})`);
    for (const c of row.checks) expect(c.ok, `${c.name}: ${c.value}`).toBe(true);
    expect(row.failures).toBe(0);
  }, SCENARIO_TEST_TIMEOUT_MS);
});
