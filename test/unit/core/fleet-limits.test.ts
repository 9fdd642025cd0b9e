import { describe, expect, it } from "vitest";

import { ManualClock } from "../../../src/core/time.js";
import { seededRandom } from "../../../src/core/random.js";
import { DEFAULT_MAX_PARTITIONS, DEFAULT_MAX_RANKS, SelectionService } from "../../../src/core/selection-service.js";
import { makeService, tokens, worker } from "../../helpers/core-fixtures.js";
import { kvmeshErrorOf as fleetLimit } from "../../helpers/errors.js";
import { replicaView } from "../../helpers/replica-view.js";

describe("partitions leave with their last worker (#17 F4)", () => {
  it("a worker moved through 200 model names leaves one partition behind, not 200", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(200_000));
    for (let i = 0; i < 200; i++) svc.patchWorker(200_000n, { model_name: `m${i}` });
    expect(svc.sizes().partitions).toBe(1);
    expect(svc.listWorkers()).toHaveLength(1);
    expect(svc.select({ token_ids: tokens(2), model_name: "m199" }).worker_id).toBe(200_000n);
    // The old partitions are gone, not merely empty.
    expect(() => svc.select({ token_ids: tokens(2), model_name: "m0" })).toThrow(/no schedulable workers/);
    svc.deleteWorker(200_000n);
    expect(svc.sizes().partitions).toBe(0);
  });

  it("the affinity counters never go down when a partition leaves (they are Prometheus counters)", () => {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60, mode: "soft" } });
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    svc.selectAndReserve({ token_ids: tokens(2, 1), selection_id: "s1", session_id: "conv" });
    svc.selectAndReserve({ token_ids: tokens(2, 1), selection_id: "s2", session_id: "conv" });
    svc.freeReservation("s1");
    svc.freeReservation("s2");
    // A soft-mode move: the session's next request dispatched elsewhere by an explicit reservation.
    const bound = svc.select({ token_ids: tokens(2, 1), session_id: "conv" }).worker_id;
    const other = bound === 1n ? 2n : 1n;
    svc.createReservation({ selection_id: "s3", worker_id: other, token_ids: tokens(2, 1), session_id: "conv" });
    const before = svc.sizes().affinityRebinds;
    expect(before).toBe(1);
    svc.freeReservation("s3");
    svc.deleteWorker(1n);
    svc.deleteWorker(2n);
    expect(svc.sizes().partitions).toBe(0);
    expect(svc.sizes().affinityRebinds).toBe(before);
  });

  it("a partition with a remaining worker stays; re-registering after the last one left starts clean", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    svc.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "r1", pinned_worker: { worker_id: 1n, dp_rank: 0 } });
    svc.deleteWorker(1n);
    expect(svc.sizes().partitions).toBe(1);
    svc.deleteWorker(2n);
    expect(svc.sizes().partitions).toBe(0);
    expect(svc.hasReservation("r1")).toBe(false);
    svc.upsertWorker(worker(1));
    expect(svc.loads()[0]?.loads.map((l) => [l.worker_id, l.active_requests])).toEqual([[1n, 0]]);
    expect(svc.select({ token_ids: tokens(2) }).worker_id).toBe(1n);
  });

  it("in aggregate mode the last worker's zero rows and ended ids still reach peers after its partition is gone", () => {
    const clock = new ManualClock(1_000);
    const make = (id: bigint): SelectionService =>
      new SelectionService({ clock, random: seededRandom(Number(id)), replicaId: id, wallClockNs: () => 5_000n, loadReplication: "aggregate" });
    const a = make(1n);
    const b = make(2n);
    for (const s of [a, b]) s.upsertWorker(worker(7));
    a.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "r1" });
    for (const agg of replicaView(a).takeLoadAggregates()) replicaView(b).applyLoadAggregates(a.replicaId, agg);
    expect(b.loads()[0]?.loads[0]?.active_requests).toBe(1);
    // A's catalogue loses the worker (an operator removed it there only); B still has it.
    a.deleteWorker(7n);
    expect(a.sizes().partitions).toBe(0);
    const last = replicaView(a).takeLoadAggregates();
    expect(last).toHaveLength(1);
    expect(last[0]?.rows.map((r) => [r.worker_id, r.requests])).toEqual([[7n, 0]]);
    expect(last[0]?.removed).toEqual(["r1"]);
    for (const agg of last) replicaView(b).applyLoadAggregates(a.replicaId, agg);
    expect(b.loads()[0]?.loads[0]?.active_requests).toBe(0);
    expect(replicaView(a).takeLoadAggregates()).toEqual([]);
  });
});

describe("fleet limits (#17 F4, F5)", () => {
  it("defaults: 1,024 partitions and 16,384 ranks", () => {
    expect([DEFAULT_MAX_PARTITIONS, DEFAULT_MAX_RANKS]).toEqual([1_024, 16_384]);
    expect(() => makeService({ maxRanks: 0 })).toThrow(/maxRanks/);
    expect(() => makeService({ maxPartitions: 1.5 })).toThrow(/maxPartitions/);
  });

  it("a registration that would create a partition past the limit is refused, and nothing changes", () => {
    const { svc } = makeService({ maxPartitions: 2 });
    svc.upsertWorker(worker(1, { model_name: "a" }));
    svc.upsertWorker(worker(2, { model_name: "b" }));
    const err = fleetLimit(() => svc.upsertWorker(worker(3, { model_name: "c" })));
    expect([err.code, err.status]).toEqual(["KVMESH_FLEET_LIMIT", 409]);
    expect(err.message).toMatch(/limit of 2 partitions \(maxPartitions, serve --max-partitions\)/);
    expect(svc.getWorker(3n)).toBeUndefined();
    // Moving worker 2 to a new partition is refused too, and worker 2 keeps serving "b".
    expect(fleetLimit(() => svc.patchWorker(2n, { model_name: "c" })).code).toBe("KVMESH_FLEET_LIMIT");
    expect(svc.getWorker(2n)?.model_name).toBe("b");
    expect(svc.select({ token_ids: tokens(2), model_name: "b" }).worker_id).toBe(2n);
    // A freed partition frees its slot.
    svc.deleteWorker(1n);
    expect(svc.upsertWorker(worker(3, { model_name: "c" })).lifecycle).toBe("schedulable");
  });

  it("a registration that would pass the rank limit is refused, and nothing changes; shrinking is always allowed", () => {
    const { svc } = makeService({ maxRanks: 8 });
    svc.upsertWorker(worker(1, { data_parallel_size: 4 }));
    svc.upsertWorker(worker(2, { data_parallel_size: 4 }));
    const err = fleetLimit(() => svc.upsertWorker(worker(3)));
    expect(err.code).toBe("KVMESH_FLEET_LIMIT");
    expect(err.message).toMatch(/worker 3 would make 9 registered ranks, over the limit of 8 \(maxRanks, serve --max-ranks\)/);
    expect(err.details).toMatchObject({ field: "data_parallel_size", limit: "maxRanks" });
    expect(fleetLimit(() => svc.patchWorker(2n, { data_parallel_size: 5 })).code).toBe("KVMESH_FLEET_LIMIT");
    expect(svc.getWorker(2n)?.data_parallel_size).toBe(4);
    // Re-registering the same worker as it is, or smaller, is fine.
    svc.upsertWorker(worker(2, { data_parallel_size: 4 }));
    svc.patchWorker(2n, { data_parallel_size: 2 });
    expect(svc.upsertWorker(worker(3, { data_parallel_size: 2 })).data_parallel_size).toBe(2);
    svc.deleteWorker(1n);
    expect(svc.upsertWorker(worker(4, { data_parallel_size: 4 })).data_parallel_size).toBe(4);
  });
});
