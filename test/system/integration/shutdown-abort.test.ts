/**
 * #29: a replica stopped with SIGTERM while KV events, mesh traffic and selects flow exits 0, and
 * never with zeromq's native abort ("terminate called after throwing an instance of
 * 'Napi::Error'"), which a worker thread ended with a socket still receiving causes. A few rounds
 * here; `npx tsx scripts/shutdown-loop.ts --rounds 30` runs the long loop.
 */
import { describe, expect, it } from "vitest";

import { runShutdownAbort, SHUTDOWN_ABORT_SHORT } from "../../../scripts/lib/shutdown-abort-scenario.js";
import { SCENARIO_TEST_TIMEOUT_MS } from "../../helpers/timeouts.js";

describe("SIGTERM to a busy replica", () => {
  it("exits 0 every time, with no native abort on stderr", async () => {
    const report = await runShutdownAbort(SHUTDOWN_ABORT_SHORT);
    expect(report.rounds).toHaveLength(SHUTDOWN_ABORT_SHORT.rounds);
    for (const r of report.rounds) {
      expect(r.abortLines, `round ${r.round}`).toEqual([]);
      // Its threads ended by themselves: none had to be terminated with its sockets possibly open.
      expect(r.terminatedLines, `round ${r.round}`).toEqual([]);
      expect(r.exitCode, `round ${r.round}`).toBe(0);
      expect(r.published, `round ${r.round}: KV events flowed`).toBeGreaterThan(0);
    }
  }, SCENARIO_TEST_TIMEOUT_MS * 2);
});
