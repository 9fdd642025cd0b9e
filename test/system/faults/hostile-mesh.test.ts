/**
 * Fault scenario 9 (#29 G1, G2, G3, G6, G9, G10): issue 29's hostile inputs against three meshed
 * replica processes. Each is refused where it enters and counted, /health answers throughout,
 * RSS stays bounded, a catalogue change pulls no snapshot, and the replicas agree afterwards. The
 * slowest /health is a figure of the report, printed, not asserted.
 */
import { describe, expect, it } from "vitest";

import { HOSTILE_MESH_SHORT, scenarioHostileMesh } from "../../../scripts/lib/hostile-mesh-scenario.js";
import { SCENARIO_TEST_TIMEOUT_MS } from "../../helpers/timeouts.js";

describe("fault: hostile inputs against a mesh", () => {
  it("refuses and counts each, keeps every replica bounded and answering, and the replicas agree", async () => {
    const row = await scenarioHostileMesh(HOSTILE_MESH_SHORT);
    console.log(`hostile inputs, meshed: ${String(row.details.summary)}`);
    for (const f of row.figures ?? []) console.log(`hostile inputs, meshed: ${f.name} ${f.value} (target ${f.target})`);
    for (const c of row.checks) expect(c.ok, `${c.name}: ${c.value}`).toBe(true);
    expect(row.failures).toBe(0);
    expect(row.divergence).toBe(0);
  }, SCENARIO_TEST_TIMEOUT_MS);
});
