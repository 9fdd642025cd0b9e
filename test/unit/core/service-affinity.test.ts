import { describe, expect, it } from "vitest";
import { KvmeshError } from "../../../src/core/errors.js";
import type { BindingEvent } from "../../../src/core/replica-events.js";
import { makeService, storedBatch, tokens, worker } from "../../helpers/core-fixtures.js";
import { replicaView } from "../../helpers/replica-view.js";

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
    replicaView(svc).onBindingEvent((e) => seen.push(e));
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
    replicaView(svc).onBindingEvent((e) => seen.push(e));
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

// Spec §4.7 step 4 and the reference's `session_binding()` (core/run.rs): a request naming a worker
// explicitly (`affinity_target` or `pinned_worker`) gets `SessionBinding::None`: no hold or steer,
// no commit at booking (so no bind, rebind or conflict), no lease, and /select caches no session
// for the replayed reservation. The response is the ordinary one.
describe("an explicit worker skips session handling (spec §4.7 step 4)", () => {
  function boundSession(mode: "hard" | "soft"): { svc: ReturnType<typeof makeService>["svc"]; seen: BindingEvent[]; bound: bigint; other: bigint } {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60, mode } });
    const seen: BindingEvent[] = [];
    replicaView(svc).onBindingEvent((e) => seen.push(e));
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    const bound = svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "a" }).worker_id;
    return { svc, seen, bound, other: bound === 1n ? 2n : 1n };
  }

  it("pinned_worker away from a hard binding books (was 400) and leaves the binding alone", () => {
    const { svc, seen, bound, other } = boundSession("hard");
    const r = svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "b", pinned_worker: { worker_id: other, dp_rank: 0 } });
    expect(r.worker_id).toBe(other);
    expect(svc.hasReservation("b")).toBe(true);
    // No commit: no bind/rebind/refresh event, and freeing it releases no lease (no refresh).
    svc.freeReservation("b");
    expect(seen.map((e) => e.reason)).toEqual(["bind"]);
    // The session still steers to its worker.
    expect(svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "c" }).worker_id).toBe(bound);
  });

  it("affinity_target in soft mode steers without rebinding the session", () => {
    const { svc, seen, bound, other } = boundSession("soft");
    const r = svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "b", affinity_target: { worker_id: other } });
    expect(r.worker_id).toBe(other);
    expect(seen.filter((e) => e.reason !== "refresh").map((e) => e.worker_id)).toEqual([bound]);
    expect(svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "c" }).worker_id).toBe(bound);
  });

  it("affinity_target in hard mode books away from the binding (was 400)", () => {
    const { svc, bound, other } = boundSession("hard");
    expect(svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "b", affinity_target: { worker_id: other, dp_rank: 0 } }).worker_id).toBe(other);
    expect(svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "c" }).worker_id).toBe(bound);
  });

  it("a new session with a pinned worker is not bound, neither by select_and_reserve nor by a replayed /select", () => {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60 } });
    const seen: BindingEvent[] = [];
    replicaView(svc).onBindingEvent((e) => seen.push(e));
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    svc.selectAndReserve({ token_ids: tokens(2), session_id: "n", selection_id: "a", pinned_worker: { worker_id: 2n, dp_rank: 0 } });
    svc.select({ token_ids: tokens(2), session_context: { session_id: "m" }, selection_id: "b", affinity_target: { worker_id: 1n } });
    svc.createReservation({ selection_id: "b" });
    expect(seen).toEqual([]);
    expect(svc.sizes().affinityEntries).toBe(0);
  });
});
