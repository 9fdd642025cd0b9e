/**
 * Conformance, round 2 (issue 28): which check answers first when a request fails more than one,
 * and the eligibility rules a pinned or steered request must still pass. Each case failed on the
 * code before it (409 where the reference answers 404, 200 where it answers 400 or 503).
 *
 * Sources, noted beside each expectation (ai-dynamo/dynamo, lib/kv-router/src/):
 * - `create_reservation`: services/selection/core/reservations.rs. Replay form: peek the pending
 *   selection (404 "no pending selection") -> ready partition (503) -> cached worker and rank
 *   schedulable (404) -> claim the id (409) -> book. Explicit form: discard the cached selection
 *   -> ready partition (503) -> prompt and effective prefill (400) -> worker schedulable (404) ->
 *   claim (409) -> book.
 * - `run_selection`: services/selection/core/run.rs: running (503) -> ready partition (503) ->
 *   claim (409) for select_and_reserve.
 * - `select_worker_with_policy`: scheduling/selector/mod.rs with `RoutingEligibility`
 *   (scheduling/filter.rs): a pinned worker outside `allowed_worker_ids` is PinnedWorkerNotAllowed
 *   (400), checked first; then `validate_worker_rank` (not in the partition, rank out of range,
 *   required taints unsatisfied) is NoEndpoints (503). A preferred (steered) worker that
 *   `validate_worker_rank` refuses is not used: the request selects among the eligible ranks.
 * - `tests.rs NAME`: services/selection/tests.rs, the reference's HTTP tests.
 */
import { afterEach, describe, expect, it } from "vitest";

import { app, closeApps, expectErrorBody, MODEL, obj } from "../../helpers/harness.js";

afterEach(closeApps);

const TOKENS = [1, 2, 3, 4];
const sel = (extra: Record<string, unknown> = {}): Record<string, unknown> => ({ model_name: MODEL, token_ids: TOKENS, ...extra });
const replay = (id: string): Record<string, unknown> => ({ model_name: MODEL, selection_id: id });
const explicit = (id: string, extra: Record<string, unknown> = {}): Record<string, unknown> => ({ model_name: MODEL, selection_id: id, worker_id: 1, sequence_hashes: [1], isl_tokens: 4, ...extra });

describe("conformance: POST /reservations answers a consumed or discarded selection with 404 while its booking is live (create_reservation)", () => {
  it("select, replay, prefill_complete, replay again: 201 then 404, the booking untouched (tests.rs cached_reservation_books_from_select)", async () => {
    const a = await app();
    await a.registerWorker(1);
    expect((await a.post("/select", sel({ selection_id: "sel-1" }))).status).toBe(200);
    expect((await a.post("/reservations", replay("sel-1"))).status).toBe(201);
    expect((await a.post("/reservations/sel-1/prefill_complete", {})).status).toBe(200);
    const again = await a.post("/reservations", replay("sel-1"));
    // The entry is single-use; the lookup comes before the id claim, so 404, not 409.
    expect(again.status).toBe(404);
    const body = expectErrorBody(again);
    expect(body.code).toBe("KVMESH_PENDING_SELECTION_NOT_FOUND");
    expect(body.error).toContain("no pending selection sel-1");
    // The refused replay left the live booking alone.
    expect((await a.loads())[0]).toMatchObject({ active_requests: 1, potential_prefill_tokens: 0 });
    expect((await a.del("/reservations/sel-1")).status).toBe(200);
  });

  it("an explicit booking discards the cached selection: a replay of the live id is 404 (tests.rs explicit_reservation_discards_cached_selection)", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.post("/select", sel({ selection_id: "req-1" }));
    expect((await a.post("/reservations", explicit("req-1"))).status).toBe(201);
    const r = await a.post("/reservations", replay("req-1"));
    expect(r.status).toBe(404);
    expect(expectErrorBody(r).code).toBe("KVMESH_PENDING_SELECTION_NOT_FOUND");
  });

  it("an explicit booking of a live id is 409 and still discards the cached selection (create_reservation discards before it claims)", async () => {
    const a = await app();
    await a.registerWorker(1);
    expect((await a.post("/select_and_reserve", sel({ selection_id: "x" }))).status).toBe(200);
    await a.post("/select", sel({ selection_id: "x" }));
    const dup = await a.post("/reservations", explicit("x"));
    expect(dup.status).toBe(409);
    expect(expectErrorBody(dup).code).toBe("KVMESH_DUPLICATE_ID");
    expect((await a.del("/reservations/x")).status).toBe(200);
    // Before: the 409 kept the entry and this replay booked the stale selection (201).
    expect((await a.post("/reservations", replay("x"))).status).toBe(404);
  });

  it("a live id with a pending entry is 409 in both forms' last step, and the entry survives it (tests.rs cached_booking_retryable_after_scheduler_conflict)", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.post("/select", sel({ selection_id: "sel-1" }));
    expect((await a.post("/select_and_reserve", sel({ selection_id: "sel-1" }))).status).toBe(200);
    expect((await a.post("/reservations", replay("sel-1"))).status).toBe(409);
    await a.del("/reservations/sel-1");
    expect((await a.post("/reservations", replay("sel-1"))).status).toBe(201);
  });

  it("a replay whose cached rank left answers 404 worker not schedulable before the id's 409", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.registerWorker(2);
    const booked = obj(await a.post("/select_and_reserve", sel({ selection_id: "z", pinned_worker: { worker_id: 1, dp_rank: 0 } })));
    expect(booked.worker_id).toBe(1);
    await a.post("/select", sel({ selection_id: "z", pinned_worker: { worker_id: 1, dp_rank: 0 } }));
    // Draining: not schedulable, while its live booking stays.
    a.svc.patchWorker(1n, { lifecycle: "draining" });
    expect(a.svc.hasReservation("z")).toBe(true);
    const r = await a.post("/reservations", replay("z"));
    expect(r.status).toBe(404);
    expect(expectErrorBody(r).code).toBe("KVMESH_WORKER_NOT_SCHEDULABLE");
  });

  it("explicit form: a live id answers the partition's 503, the prompt's 400 and the worker's 404 before its own 409", async () => {
    const a = await app();
    await a.registerWorker(1);
    expect((await a.post("/select_and_reserve", sel({ selection_id: "live" }))).status).toBe(200);
    expect((await a.post("/reservations", { ...explicit("live"), model_name: "other" })).status).toBe(503);
    const tooLarge = await a.post("/reservations", explicit("live", { effective_prefill_tokens: 5 }));
    expect(tooLarge.status).toBe(400);
    expect(expectErrorBody(tooLarge).error).toContain("must not exceed isl_tokens");
    const unknown = await a.post("/reservations", explicit("live", { worker_id: 99 }));
    expect(unknown.status).toBe(404);
    expect(expectErrorBody(unknown).code).toBe("KVMESH_WORKER_NOT_SCHEDULABLE");
    expect((await a.post("/reservations", explicit("live"))).status).toBe(409);
    expect((await a.loads())[0]?.active_requests).toBe(1);
  });
});

describe("conformance: select_and_reserve checks the service and the partition before the id (run_selection)", () => {
  it("a live id is 503 for a partition without workers and when shutting down, 409 otherwise", async () => {
    const a = await app();
    await a.registerWorker(1);
    expect((await a.post("/select_and_reserve", sel({ selection_id: "s" }))).status).toBe(200);
    const other = await a.post("/select_and_reserve", sel({ selection_id: "s", model_name: "other" }));
    expect(other.status).toBe(503);
    expect(expectErrorBody(other).code).toBe("KVMESH_NOT_READY");
    expect((await a.post("/select_and_reserve", sel({ selection_id: "s" }))).status).toBe(409);
    a.svc.shutdown();
    const down = await a.post("/select_and_reserve", sel({ selection_id: "s" }));
    expect(down.status).toBe(503);
    expect(expectErrorBody(down).code).toBe("KVMESH_SHUTTING_DOWN");
  });
});

describe("conformance: a pinned worker passes the request's eligibility rules (select_worker_with_policy, RoutingEligibility)", () => {
  it("pinned_worker outside allowed_worker_ids is 400 naming pinned_worker, and books nothing (PinnedWorkerNotAllowed)", async () => {
    const a = await app();
    await a.registerWorker(3700);
    await a.registerWorker(3701);
    for (const path of ["/select", "/select_and_reserve"]) {
      const r = await a.post(path, sel({ selection_id: `p${path.length}`, pinned_worker: { worker_id: 3700, dp_rank: 0 }, allowed_worker_ids: [3701] }));
      expect(r.status).toBe(400);
      const body = expectErrorBody(r);
      expect(body.code).toBe("KVMESH_BAD_REQUEST");
      expect(body.error).toContain("pinned_worker 3700 is not in allowed_worker_ids");
    }
    expect((await a.loads()).every((l) => l.active_requests === 0)).toBe(true);
    // The allowlist is checked first: an unknown pinned worker outside it is 400 too, not 503.
    expect((await a.post("/select", sel({ pinned_worker: { worker_id: 9, dp_rank: 0 }, allowed_worker_ids: [3701] }))).status).toBe(400);
    const inside = await a.post("/select", sel({ pinned_worker: { worker_id: 3700, dp_rank: 0 }, allowed_worker_ids: [3700, 3701] }));
    expect(inside.status).toBe(200);
    expect(obj(inside).worker_id).toBe(3700);
  });

  it("a pinned worker short of a required taint is 503; one carrying it is chosen", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.registerWorker(2, { taints: ["gpu=h100"] });
    const r = await a.post("/select", sel({ pinned_worker: { worker_id: 1, dp_rank: 0 }, routing_constraints: { required_taints: ["gpu=h100"] } }));
    expect(r.status).toBe(503);
    expect(expectErrorBody(r).error).toContain("required_taints");
    const ok = await a.post("/select", sel({ pinned_worker: { worker_id: 2, dp_rank: 0 }, routing_constraints: { required_taints: ["gpu=h100"] } }));
    expect(ok.status).toBe(200);
    expect(obj(ok).worker_id).toBe(2);
  });

  it("a pinned rank outside its worker's data-parallel range is 503 (DpRankUnavailable -> NoEndpoints)", async () => {
    const a = await app();
    await a.registerWorker(1, { data_parallel_size: 2 });
    expect((await a.post("/select", sel({ pinned_worker: { worker_id: 1, dp_rank: 1 } }))).status).toBe(200);
    const r = await a.post("/select", sel({ pinned_worker: { worker_id: 1, dp_rank: 2 } }));
    expect(r.status).toBe(503);
    expect(expectErrorBody(r).code).toBe("KVMESH_NOT_READY");
  });
});

// This one already held before issue 28; it is here so the rule stays checked with the pinned ones.
describe("conformance: affinity_target steers only within the eligible ranks (the preferred worker must pass validate_worker_rank)", () => {
  it("a target outside allowed_worker_ids or short of a required taint is not used; an eligible one is", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.registerWorker(2, { taints: ["zone-a"] });
    await a.registerWorker(3, { taints: ["zone-a"] });
    for (let i = 0; i < 4; i++) {
      expect(obj(await a.post("/select", sel({ affinity_target: { worker_id: 1 }, allowed_worker_ids: [2] }))).worker_id).toBe(2);
      expect(obj(await a.post("/select", sel({ affinity_target: { worker_id: 1 }, routing_constraints: { required_taints: ["zone-a"] } }))).worker_id).not.toBe(1);
      expect(obj(await a.post("/select", sel({ affinity_target: { worker_id: 3 }, routing_constraints: { required_taints: ["zone-a"] } }))).worker_id).toBe(3);
    }
  });
});
