/**
 * The order of POST /reservations' and select_and_reserve's checks, at the service: each failure
 * answers what the reference's does when a request fails more than one check (issue 28).
 * Reference: `create_reservation` (services/selection/core/reservations.rs) and `run_selection`
 * (core/run.rs), ai-dynamo/dynamo lib/kv-router/src/; the HTTP-level cases are in
 * test/conformance/check-order.test.ts.
 */
import { describe, expect, it } from "vitest";
import { makeService, tokens, worker } from "../../helpers/core-fixtures.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";

const status = (fn: () => unknown): string => {
  const e = kvmeshErrorOf(fn);
  return `${e.status} ${e.code}`;
};

describe("createReservation, replay form", () => {
  it("a consumed entry is 404 while its booking is live; the booking is untouched", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.select({ token_ids: tokens(2), selection_id: "p" });
    svc.createReservation({ selection_id: "p" });
    svc.prefillComplete("p");
    expect(status(() => svc.createReservation({ selection_id: "p" }))).toBe("404 KVMESH_PENDING_SELECTION_NOT_FOUND");
    expect(svc.hasReservation("p")).toBe(true);
    expect(svc.loads()[0]?.loads[0]?.active_requests).toBe(1);
  });

  it("a live id with a cached selection: the partition's 503 and the rank's 404 come before the 409, which keeps the entry", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(2), selection_id: "p" });
    svc.select({ token_ids: tokens(2), selection_id: "p" });
    svc.patchWorker(1n, { lifecycle: "draining" });
    expect(status(() => svc.createReservation({ selection_id: "p" }))).toBe("503 KVMESH_NOT_READY");
    svc.upsertWorker(worker(2));
    expect(status(() => svc.createReservation({ selection_id: "p" }))).toBe("404 KVMESH_WORKER_NOT_SCHEDULABLE");
    svc.patchWorker(1n, { lifecycle: "schedulable" });
    expect(status(() => svc.createReservation({ selection_id: "p" }))).toBe("409 KVMESH_DUPLICATE_ID");
    svc.freeReservation("p");
    expect(svc.createReservation({ selection_id: "p" }).worker_id).toBe(1n);
  });
});

describe("createReservation, explicit form", () => {
  it("discards the cached selection first, even when it then fails (404, 400 or 503)", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const failures: [string, () => void][] = [
      ["404 KVMESH_WORKER_NOT_SCHEDULABLE", () => svc.createReservation({ selection_id: "e", token_ids: tokens(2), worker_id: 7n })],
      ["400 KVMESH_BAD_REQUEST", () => svc.createReservation({ selection_id: "e", token_ids: tokens(2), worker_id: 1n, effective_prefill_tokens: 100 })],
      [
        "503 KVMESH_NOT_READY",
        () => {
          svc.patchWorker(1n, { lifecycle: "draining" });
          try {
            svc.createReservation({ selection_id: "e", token_ids: tokens(2), worker_id: 1n });
          } finally {
            svc.patchWorker(1n, { lifecycle: "schedulable" });
          }
        },
      ],
    ];
    for (const [expected, explicit] of failures) {
      svc.select({ token_ids: tokens(2), selection_id: "e" });
      expect(status(explicit)).toBe(expected);
      expect(status(() => svc.createReservation({ selection_id: "e" }))).toBe("404 KVMESH_PENDING_SELECTION_NOT_FOUND");
    }
  });

  it("a live id answers 503, 400 and 404 before its 409", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(2), selection_id: "live" });
    const base = { selection_id: "live", token_ids: tokens(2) };
    expect(status(() => svc.createReservation({ ...base, worker_id: 1n, model_name: "none" }))).toBe("503 KVMESH_NOT_READY");
    expect(status(() => svc.createReservation({ ...base, worker_id: 1n, effective_prefill_tokens: 100 }))).toBe("400 KVMESH_BAD_REQUEST");
    expect(status(() => svc.createReservation({ ...base, worker_id: 7n }))).toBe("404 KVMESH_WORKER_NOT_SCHEDULABLE");
    expect(status(() => svc.createReservation({ ...base, worker_id: 1n }))).toBe("409 KVMESH_DUPLICATE_ID");
  });
});

describe("selectAndReserve", () => {
  it("a live id is 503 when shutting down or for a partition without workers, before the 409", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(2), selection_id: "s" });
    expect(status(() => svc.selectAndReserve({ token_ids: tokens(2), selection_id: "s", model_name: "none" }))).toBe("503 KVMESH_NOT_READY");
    expect(status(() => svc.selectAndReserve({ token_ids: tokens(2), selection_id: "s" }))).toBe("409 KVMESH_DUPLICATE_ID");
    svc.shutdown();
    expect(status(() => svc.selectAndReserve({ token_ids: tokens(2), selection_id: "s" }))).toBe("503 KVMESH_SHUTTING_DOWN");
  });
});
