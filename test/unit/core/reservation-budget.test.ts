import { describe, expect, it } from "vitest";

import { BOOKED_BLOCK_BYTES, BOOKING_OVERHEAD_BYTES, bookingBytes } from "../../../src/core/reservations.js";
import { DEFAULT_MAX_RESERVATION_BYTES } from "../../../src/core/selection-service.js";
import { makeService, tokens, worker } from "../../helpers/core-fixtures.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";
import { replicaView } from "../../helpers/replica-view.js";

describe("the byte budget of live bookings (#17 F3)", () => {
  it("charges 1 KiB + 192 bytes per booked block, 1 GiB by default", () => {
    expect([BOOKING_OVERHEAD_BYTES, BOOKED_BLOCK_BYTES, DEFAULT_MAX_RESERVATION_BYTES]).toEqual([1_024, 192, 1_073_741_824]);
    expect(bookingBytes(31_250)).toBe(1_024 + 31_250 * 192);
    expect(() => makeService({ maxReservationBytes: 0 })).toThrow(/maxReservationBytes/);
  });

  it("refuses a booking past the budget with 429, keeps what was booked, and books again once some are freed", () => {
    // Two 4-block bookings fit (2 x 1,792 bytes), a third does not.
    const { svc } = makeService({ maxReservationBytes: 4_000 });
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "a" });
    svc.createReservation({ selection_id: "b", worker_id: 1n, token_ids: tokens(4, 2) });
    expect(svc.sizes().reservationBytes).toBe(2 * bookingBytes(4));
    const err = kvmeshErrorOf(() => svc.selectAndReserve({ token_ids: tokens(4, 3), selection_id: "c" }));
    expect([err.code, err.status]).toEqual(["KVMESH_OVERLOADED", 429]);
    expect(err.message).toMatch(/4 blocks, ~1792 bytes\) would pass the live bookings' byte budget of 4000 \(3584 held\)/);
    expect(svc.hasReservation("c")).toBe(false);
    expect(svc.stats.reservationsRefused).toBe(1);
    // Even a 1-block booking (1,216 bytes) would pass it now.
    expect(kvmeshErrorOf(() => svc.createReservation({ selection_id: "d", worker_id: 1n, token_ids: tokens(1, 4) })).code).toBe("KVMESH_OVERLOADED");
    svc.freeReservation("a");
    expect(svc.sizes().reservationBytes).toBe(bookingBytes(4));
    svc.selectAndReserve({ token_ids: tokens(4, 3), selection_id: "c" });
    expect([svc.hasReservation("b"), svc.hasReservation("c")]).toEqual([true, true]);
  });

  it("counts bookings mirrored from a peer (exact mode) apart, against no budget of ours", () => {
    const a = makeService({ replicaId: 1n, maxReservationBytes: 2_000 }).svc;
    const b = makeService({ replicaId: 2n, maxReservationBytes: 2_000 }).svc;
    for (const s of [a, b]) s.upsertWorker(worker(1));
    replicaView(a).onLoadEvent((e) => replicaView(b).applyLoadEvent(e));
    a.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "from-a" });
    expect(b.sizes()).toMatchObject({ reservationBytes: 0, mirroredReservationBytes: bookingBytes(4) });
    // B's own budget is untouched by what it mirrors.
    b.selectAndReserve({ token_ids: tokens(4, 2), selection_id: "from-b" });
    expect(b.sizes()).toMatchObject({ reservationBytes: bookingBytes(4), mirroredReservationBytes: bookingBytes(4) });
    a.freeReservation("from-a");
    expect(b.sizes().mirroredReservationBytes).toBe(0);
  });
});
