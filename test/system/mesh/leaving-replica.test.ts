/**
 * Issue 29's G8: a replica that shuts down cleanly (SIGTERM) says it is leaving, and its peers
 * keep its bookings once it is down, until they are freed or expire: a frontend's free sent to a
 * peer after the replica has exited still answers 200 and counts the booking out there. Before,
 * peers dropped the bookings 10 s after the shutdown (down) and the free answered 404. Both load
 * replication modes, on real daemons; the 10 s down timeout is waited for, not shortened.
 */
import { describe, expect, it } from "vitest";
import { freePortPair } from "../../../src/bench/ports.js";
import { DEFAULT_REPLICA_ARGS, httpCall, meshLive, peersOf, registerWorkers, startReplica, stopReplica, timeUntil, totalActive, type Replica } from "../../../scripts/lib/replica-cluster.js";

const BLOCK = 16;
const BOOKINGS = 4;
/** Down is 10 s of silence (mesh/peer-health.ts); the wait allows twice that on a loaded machine. */
const DOWN_WAIT_MS = 30_000;
const TEST_TIMEOUT_MS = 90_000;

describe.each(["aggregate", "exact"] as const)("a replica leaving cleanly (%s load replication)", (mode) => {
  it("keeps its bookings at peers once it is down, and a free sent to a peer after it exited answers 200", async () => {
    const args = [...DEFAULT_REPLICA_ARGS, "--load-replication", mode, "--drain-secs", "0"];
    let a: Replica | undefined;
    let b: Replica | undefined;
    try {
      b = await startReplica({ name: "B", syncPort: await freePortPair(), args });
      a = await startReplica({ name: "A", syncPort: await freePortPair(), peers: [b.syncEndpoint], args });
      const [ra, rb] = [a, b];
      await timeUntil(() => meshLive([ra, rb]), DOWN_WAIT_MS, "the mesh to come up");
      await registerWorkers(ra, 2, BLOCK);
      await timeUntil(async () => (await httpCall(rb, "GET", "/workers")).text.includes(`"worker_id":2`), DOWN_WAIT_MS, "B to hold the workers");
      for (let i = 0; i < BOOKINGS; i++) {
        const res = await httpCall(ra, "POST", "/select_and_reserve", { token_ids: Array.from({ length: 4 * BLOCK }, (_, k) => i * 1_000 + k), selection_id: `leave-${i}` });
        expect(res.status).toBe(200);
      }
      await timeUntil(async () => (await totalActive(rb)) === BOOKINGS, DOWN_WAIT_MS, "B to mirror A's bookings");

      expect(await stopReplica(ra)).toBe(0);
      await timeUntil(async () => (await peersOf(rb)).some((p) => p.state === "down"), DOWN_WAIT_MS, "B to see A down");
      expect(await totalActive(rb)).toBe(BOOKINGS);
      const metrics = (await httpCall(rb, "GET", "/metrics")).text;
      expect(metrics).toMatch(/^kvmesh_mesh_left_peer_keeps_total 1$/m);

      // A frontend frees at the survivor, after the owner has exited.
      expect((await httpCall(rb, "DELETE", "/reservations/leave-0")).status).toBe(200);
      await timeUntil(async () => (await totalActive(rb)) === BOOKINGS - 1, DOWN_WAIT_MS, "the free to count the booking out at B");
    } finally {
      await stopReplica(a);
      await stopReplica(b);
    }
  }, TEST_TIMEOUT_MS);
});
