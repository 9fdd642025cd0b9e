/**
 * SelectionService.moveReservation (#24): the endpoint picker's response path moves a booking to
 * the worker a gateway actually served it on, as one free and one add published together.
 */
import { describe, expect, it } from "vitest";
import { KvmeshError } from "../../../src/core/errors.js";
import type { BindingEvent, LoadEvent } from "../../../src/core/replica-events.js";
import { makeService, tokens, worker } from "../../helpers/core-fixtures.js";
import { replicaView } from "../../helpers/replica-view.js";

const activeOn = (svc: ReturnType<typeof makeService>["svc"], id: bigint): number | undefined => svc.loads()[0]?.loads.find((l) => l.worker_id === id)?.active_requests;

describe("moveReservation", () => {
  it("frees the pick and books the served worker under a new id, both changes published back to back", () => {
    const { svc } = makeService({ loadReplication: "exact" });
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    const events: LoadEvent[] = [];
    replicaView(svc).onLoadEvent((e) => events.push(e));
    const picked = svc.selectAndReserve({ token_ids: tokens(3), selection_id: "a" });
    const other = picked.worker_id === 1n ? 2n : 1n;
    events.length = 0;
    const moved = svc.moveReservation("a", { worker_id: other, dp_rank: 0 });
    expect(moved.worker_id).toBe(other);
    expect(moved.selection_id).not.toBe("a");
    expect(events.map((e) => [e.type, e.request_id])).toEqual([
      ["free", "a"],
      ["add", moved.selection_id],
    ]);
    expect(activeOn(svc, picked.worker_id)).toBe(0);
    expect(activeOn(svc, other)).toBe(1);
    expect(svc.hasReservation("a")).toBe(false);
    svc.freeReservation(moved.selection_id);
    expect(activeOn(svc, other)).toBe(0);
    expect(svc.reservationCount).toBe(0);
  });

  it("keeps the booking where it was when the target is not a schedulable rank of its partition", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(2), selection_id: "a" });
    expect(() => svc.moveReservation("a", { worker_id: 9n, dp_rank: 0 })).toThrow(KvmeshError);
    expect(svc.hasReservation("a")).toBe(true);
    expect(activeOn(svc, 1n)).toBe(1);
  });

  it("answers 404 for an unknown booking", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    let err: unknown;
    try {
      svc.moveReservation("nope", { worker_id: 1n, dp_rank: 0 });
    } catch (e) {
      err = e;
    }
    expect((err as KvmeshError).code).toBe("KVMESH_RESERVATION_NOT_FOUND");
  });

  it("soft mode: the session's binding follows the served worker", () => {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60, mode: "soft" } });
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    const picked = svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "a" });
    const other = picked.worker_id === 1n ? 2n : 1n;
    const moved = svc.moveReservation("a", { worker_id: other, dp_rank: 0 });
    svc.freeReservation(moved.selection_id);
    expect(svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "b" }).worker_id).toBe(other);
  });

  it("hard mode: the booking moves, the conflicting binding is unbound (published), and the session binds afresh", () => {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60, mode: "hard" } });
    const seen: BindingEvent[] = [];
    replicaView(svc).onBindingEvent((e) => seen.push(e));
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    const picked = svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "a" });
    const other = picked.worker_id === 1n ? 2n : 1n;
    const moved = svc.moveReservation("a", { worker_id: other, dp_rank: 0 });
    expect(moved.worker_id).toBe(other);
    expect(activeOn(svc, other)).toBe(1);
    expect(seen.some((e) => e.reason === "unbind")).toBe(true);
    svc.freeReservation(moved.selection_id);
    expect(svc.reservationCount).toBe(0);
    // Not refused: the session has no binding left to conflict with.
    expect(() => svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "b", allowed_worker_ids: [other] })).not.toThrow();
  });
});
