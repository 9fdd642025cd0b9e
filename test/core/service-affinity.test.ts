import { describe, expect, it } from "vitest";
import { KvmeshError } from "../../src/core/errors.js";
import type { BindingEvent } from "../../src/core/replica-events.js";
import { makeService, storedBatch, tokens, worker } from "../helpers/core-fixtures.js";

describe("session affinity through the service", () => {
  it("keeps a session on its worker even when another worker holds the prompt", () => {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60 } });
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    const first = svc.selectAndReserve({ token_ids: tokens(2, 1), session_id: "s", selection_id: "t1" });
    const other = first.worker_id === 1n ? 2n : 1n;
    const next = tokens(6, 2);
    svc.applyKvEvents(other, 0, storedBatch(next));
    for (let i = 0; i < 5; i++) {
      expect(svc.selectAndReserve({ token_ids: next, session_id: "s", selection_id: `t${i + 2}` }).worker_id).toBe(first.worker_id);
    }
    // Without the session the cache wins.
    expect(svc.select({ token_ids: next }).worker_id).toBe(other);
  });

  it("hard mode rejects a dispatch the allowlist forces away from the binding, without leaking load", () => {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60, mode: "hard" } });
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    const first = svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "a" });
    const other = first.worker_id === 1n ? 2n : 1n;
    let err: unknown;
    try {
      svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "b", allowed_worker_ids: [other] });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(KvmeshError);
    expect((err as KvmeshError).status).toBe(400);
    expect(svc.hasReservation("b")).toBe(false);
    expect(svc.loads()[0]?.loads.find((l) => l.worker_id === other)?.active_requests).toBe(0);
  });

  it("soft mode follows a custom allowlist, rebinds with a newer version and publishes it", () => {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60, mode: "soft" } });
    const seen: BindingEvent[] = [];
    svc.onBindingEvent((e) => seen.push(e));
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    const first = svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "a" });
    const other = first.worker_id === 1n ? 2n : 1n;
    const moved = svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "b", allowed_worker_ids: [other] });
    expect(moved.worker_id).toBe(other);
    // The session now follows the new worker without an allowlist.
    expect(svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "c" }).worker_id).toBe(other);
    const binds = seen.filter((e) => e.reason !== "refresh");
    expect(binds.map((e) => e.worker_id)).toEqual([first.worker_id, other]);
    expect((binds[1]?.sequence ?? 0n) > (binds[0]?.sequence ?? 0n)).toBe(true);
  });

  it("a session whose worker left is re-initialized on another worker", () => {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60 } });
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    const first = svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "a" });
    svc.freeReservation("a");
    svc.deleteWorker(first.worker_id);
    const other = first.worker_id === 1n ? 2n : 1n;
    expect(svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "b" }).worker_id).toBe(other);
  });

  it("publishes a refresh when a request of the session finishes", () => {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60 } });
    const seen: BindingEvent[] = [];
    svc.onBindingEvent((e) => seen.push(e));
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "a" });
    expect(seen.map((e) => e.reason)).toEqual(["bind"]);
    svc.freeReservation("a");
    expect(seen.map((e) => e.reason)).toEqual(["bind", "refresh"]);
    expect(seen[1]?.sequence).toBe(seen[0]?.sequence);
  });

  it("rejects an affinity TTL out of range naming the option", () => {
    expect(() => makeService({ sessionAffinity: { ttlSecs: 0 } })).toThrow(/session_affinity_ttl_secs/);
    expect(() => makeService({ sessionAffinity: { ttlSecs: 31_536_001 } })).toThrow(/session_affinity_ttl_secs/);
  });

  it("rejects session ids longer than 256 bytes", () => {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60 } });
    svc.upsertWorker(worker(1));
    expect(() => svc.selectAndReserve({ token_ids: tokens(1), session_id: "é".repeat(129) })).toThrow(/session_id/);
  });
});
