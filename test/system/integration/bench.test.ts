/**
 * `kvmesh bench` end to end with small sizes: generated sessions replayed through 2 meshed replica
 * processes against 4 mock engines publishing real KV events, beside round-robin.
 */
import { describe, expect, it } from "vitest";
import { defaultPlan, runBench } from "../../../src/bench/fleet-bench.js";
import { MockEngineFleet } from "../../../src/mock/engine-fleet.js";
import { generateSessions } from "../../../src/mock/session-workload.js";
import { promptTokensFor } from "../../../src/mock/token-blocks.js";

const BLOCK_SIZE = 64;

describe("kvmesh bench (short)", () => {
  it("2 meshed replicas keep sessions on their workers and beat round-robin on the engines' hit ratio", async () => {
    // 24 sessions of 2-5 turns arriving over ~1.5 s of wall time (speedup 10).
    const records = generateSessions({ seed: 7, sessions: 24, turnsMin: 2, turnsMax: 5, sessionArrivalMs: 600, thinkTimeMsMin: 500, thinkTimeMsMax: 2_000 });
    const logs: string[] = [];
    const rows = await runBench({
      records,
      plan: defaultPlan([2], ["kvmesh", "round-robin"]),
      blockSize: BLOCK_SIZE,
      speedup: 10,
      durationMs: 8_000,
      seed: 1,
      startEngines: () => MockEngineFleet.start({ engines: 4, blockSize: BLOCK_SIZE, kvBlocks: 4_096, speedup: 10, expectedSubscribers: 2 }),
      tokensOf: (r) => promptTokensFor(r.hash_ids, r.input_length),
      onLog: (l) => logs.push(l),
    });
    expect(rows.map((r) => `${r.policy}x${r.replicas}`)).toEqual(["kvmeshx2", "round-robinx0"]);
    const [mesh, rr] = rows as [(typeof rows)[0], (typeof rows)[0]];
    expect(mesh.failed, mesh.failure_sample ?? logs.join("\n")).toBe(0);
    expect(mesh.requests).toBe(records.length);
    expect(rr.requests).toBe(records.length);
    expect(mesh.stickiness).toBeGreaterThanOrEqual(0.99);
    expect(mesh.hit_ratio).toBeGreaterThan(rr.hit_ratio);
    expect(mesh.select_p99_ms).not.toBeNull();
    expect(mesh.lag_p99_ms).not.toBeNull();
    expect(mesh.shed).toBe(0);
    expect(rr.select_p99_ms).toBeNull();
  }, 60_000);
});
