/**
 * A pinned worker must pass the request's eligibility rules, in the reference's order
 * (`select_worker_with_policy`, scheduling/selector/mod.rs; `RoutingEligibility`,
 * scheduling/filter.rs, ai-dynamo/dynamo lib/kv-router/src/): outside allowed_worker_ids is 400
 * (PinnedWorkerNotAllowed) before anything else; a rank not schedulable in the partition, or a
 * worker short of a required taint, is 503 (NoEndpoints). An affinity_target steers only among
 * the ranks that pass the filters. Issue 28; HTTP cases in test/conformance/check-order.test.ts.
 */
import { describe, expect, it } from "vitest";
import { makeService, tokens, worker } from "../../helpers/core-fixtures.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";

describe("pinned_worker eligibility", () => {
  it("allowed_worker_ids: 400 naming pinned_worker, checked before the rank (an unknown one too)", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(3700));
    svc.upsertWorker(worker(3701));
    for (const id of [3700n, 9n]) {
      const e = kvmeshErrorOf(() => svc.select({ token_ids: tokens(1), pinned_worker: { worker_id: id, dp_rank: 0 }, allowed_worker_ids: [3701n] }));
      expect([e.status, e.code, e.details]).toEqual([400, "KVMESH_BAD_REQUEST", { field: "pinned_worker" }]);
    }
    const booked = kvmeshErrorOf(() => svc.selectAndReserve({ token_ids: tokens(1), selection_id: "b", pinned_worker: { worker_id: 3700n, dp_rank: 0 }, allowed_worker_ids: [3701n] }));
    expect(booked.status).toBe(400);
    expect(svc.hasReservation("b")).toBe(false);
    expect(svc.select({ token_ids: tokens(1), pinned_worker: { worker_id: 3700n, dp_rank: 0 }, allowed_worker_ids: [3701n, 3700n] }).worker_id).toBe(3700n);
  });

  it("required taints: 503 when the pinned worker lacks one, chosen when it carries them all", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1, { taints: ["a"] }));
    svc.upsertWorker(worker(2, { taints: ["a", "b"] }));
    const e = kvmeshErrorOf(() => svc.select({ token_ids: tokens(1), pinned_worker: { worker_id: 1n, dp_rank: 0 }, routing_constraints: { required_taints: ["a", "b"] } }));
    expect([e.status, e.code]).toEqual([503, "KVMESH_NOT_READY"]);
    expect(svc.select({ token_ids: tokens(1), pinned_worker: { worker_id: 2n, dp_rank: 0 }, routing_constraints: { required_taints: ["a", "b"] } }).worker_id).toBe(2n);
    // No required taints (or an empty list) constrains nothing.
    expect(svc.select({ token_ids: tokens(1), pinned_worker: { worker_id: 1n, dp_rank: 0 }, routing_constraints: { required_taints: [] } }).worker_id).toBe(1n);
  });

  it("a rank that is not schedulable (unknown, out of range, draining) is 503", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1, { data_parallel_size: 2 }));
    svc.upsertWorker(worker(2));
    expect(svc.select({ token_ids: tokens(1), pinned_worker: { worker_id: 1n, dp_rank: 1 } }).dp_rank).toBe(1);
    svc.patchWorker(2n, { lifecycle: "draining" });
    for (const pinned of [{ worker_id: 5n, dp_rank: 0 }, { worker_id: 1n, dp_rank: 2 }, { worker_id: 2n, dp_rank: 0 }]) {
      expect(kvmeshErrorOf(() => svc.select({ token_ids: tokens(1), pinned_worker: pinned })).status).toBe(503);
    }
  });
});

describe("affinity_target eligibility", () => {
  it("a target the filters exclude is not used; the request picks among the eligible ranks", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2, { taints: ["a"] }));
    for (let i = 0; i < 5; i++) {
      expect(svc.select({ token_ids: tokens(1, i), affinity_target: { worker_id: 1n, dp_rank: null }, allowed_worker_ids: [2n] }).worker_id).toBe(2n);
      expect(svc.select({ token_ids: tokens(1, i), affinity_target: { worker_id: 1n, dp_rank: null }, routing_constraints: { required_taints: ["a"] } }).worker_id).toBe(2n);
      expect(svc.select({ token_ids: tokens(1, i), affinity_target: { worker_id: 1n, dp_rank: null } }).worker_id).toBe(1n);
    }
  });
});
