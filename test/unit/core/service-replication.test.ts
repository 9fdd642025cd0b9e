import { describe, expect, it } from "vitest";
import { ManualClock } from "../../../src/core/time.js";
import { seededRandom } from "../../../src/core/random.js";
import type { BindingEvent, LoadEvent } from "../../../src/core/replica-events.js";
import { SelectionService } from "../../../src/core/selection-service.js";
import { tokens, worker } from "../../helpers/core-fixtures.js";
import { replicaView } from "../../helpers/replica-view.js";

/** N services sharing a clock whose emitted events are queued, to be delivered in any order. */
function mesh(n: number, affinity?: { ttlSecs: number; mode?: "hard" | "soft" }) {
  const clock = new ManualClock(1_000);
  const services = Array.from(
    { length: n },
    (_, i) =>
      new SelectionService({
        clock,
        random: seededRandom(100 + i),
        replicaId: BigInt(i + 1),
        wallClockNs: () => 5_000n,
        ...(affinity === undefined ? {} : { sessionAffinity: affinity }),
      }),
  );
  const loadQ: { from: number; e: LoadEvent }[] = [];
  const bindQ: { from: number; e: BindingEvent }[] = [];
  services.forEach((s, i) => {
    replicaView(s).onLoadEvent((e) => loadQ.push({ from: i, e }));
    replicaView(s).onBindingEvent((e) => bindQ.push({ from: i, e }));
    for (const id of [1, 2, 3]) s.upsertWorker(worker(id));
  });
  const deliver = (order: (q: number) => number = (q) => q): void => {
    while (loadQ.length > 0 || bindQ.length > 0) {
      const lq = loadQ.splice(0);
      const bq = bindQ.splice(0);
      const idx = lq.map((_, k) => order(k));
      for (const k of idx.sort((a, b) => a - b)) {
        const item = lq[k];
        if (item !== undefined) services.forEach((s, j) => j !== item.from && replicaView(s).applyLoadEvent(item.e));
      }
      for (const item of bq) services.forEach((s, j) => j !== item.from && replicaView(s).applyBindingEvent(item.e));
    }
  };
  return { services, clock, loadQ, bindQ, deliver };
}

const loadsOf = (s: SelectionService) =>
  s.loads()[0]?.loads.map((l) => [l.worker_id, l.potential_prefill_tokens, l.potential_decode_blocks, l.active_requests]);

describe("two cores exchanging events in memory", () => {
  it("converge on load through add, prefill complete and free", () => {
    const { services, deliver } = mesh(2);
    const [a, b] = services as [SelectionService, SelectionService];
    a.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "r1" });
    b.selectAndReserve({ token_ids: tokens(3, 2), selection_id: "r2" });
    deliver();
    expect(loadsOf(a)).toEqual(loadsOf(b));
    expect(a.loads()[0]?.loads.reduce((n, l) => n + l.active_requests, 0)).toBe(2);
    a.prefillComplete("r1");
    deliver();
    expect(loadsOf(a)).toEqual(loadsOf(b));
    // A lifecycle call for a mirrored booking resolves on the other replica.
    b.freeReservation("r1");
    deliver();
    expect(a.hasReservation("r1")).toBe(false);
    expect(loadsOf(a)).toEqual(loadsOf(b));
    a.freeReservation("r2");
    deliver();
    expect(loadsOf(a)).toEqual(loadsOf(b));
    expect(b.loads()[0]?.loads.every((l) => l.active_requests === 0 && l.potential_decode_blocks === 0)).toBe(true);
  });

  it("a free that overtakes its add is not lost, and an early prefill mark applies with the add", () => {
    const { services, loadQ } = mesh(2);
    const [a, b] = services as [SelectionService, SelectionService];
    a.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "x" });
    a.freeReservation("x");
    a.selectAndReserve({ token_ids: tokens(4, 2), selection_id: "y" });
    a.prefillComplete("y");
    const events = loadQ.splice(0).map((q) => q.e);
    // Deliver in reverse: free(x) before add(x), prefill(y) before add(y).
    for (const e of events.reverse()) replicaView(b).applyLoadEvent(e);
    expect(b.hasReservation("x")).toBe(false);
    expect(b.hasReservation("y")).toBe(true);
    expect(loadsOf(b)).toEqual(loadsOf(a));
    // Duplicates are no-ops.
    for (const e of events) replicaView(b).applyLoadEvent(e);
    expect(loadsOf(b)).toEqual(loadsOf(a));
  });

  it("ignores its own echo and events for unknown partitions or workers", () => {
    const { services, loadQ } = mesh(2);
    const [a, b] = services as [SelectionService, SelectionService];
    a.selectAndReserve({ token_ids: tokens(2), selection_id: "z" });
    const add = loadQ.splice(0)[0]?.e;
    if (add?.type !== "add") throw new Error("expected an add");
    expect(replicaView(a).applyLoadEvent(add)).toBe(false);
    expect(replicaView(b).applyLoadEvent({ ...add, partition: { model_name: "other", routing_group: "default" } })).toBe(false);
    expect(replicaView(b).applyLoadEvent({ ...add, worker_id: 99n })).toBe(false);
    expect(replicaView(b).applyLoadEvent(add)).toBe(true);
  });
});

describe("replicated session bindings", () => {
  it("a session bound on one replica is steered on the other", () => {
    const { services, deliver } = mesh(2, { ttlSecs: 60 });
    const [a, b] = services as [SelectionService, SelectionService];
    const first = a.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "1" });
    deliver();
    for (let i = 0; i < 5; i++) expect(b.selectAndReserve({ token_ids: tokens(2, i), session_id: "s", selection_id: `b${i}` }).worker_id).toBe(first.worker_id);
  });

  it("conflicting bindings converge to the same winner whatever the arrival order", () => {
    for (let trial = 0; trial < 20; trial++) {
      const { services, bindQ } = mesh(3, { ttlSecs: 60, mode: "soft" });
      // Each replica binds the same session to a different worker before hearing of the others.
      services.forEach((s, i) => s.selectAndReserve({ token_ids: tokens(1), session_id: "s", selection_id: `r${i}`, allowed_worker_ids: [BigInt(i + 1)] }));
      const events = bindQ.splice(0);
      const rnd = seededRandom(trial);
      for (let k = events.length - 1; k > 0; k--) {
        const j = Math.floor(rnd.next() * (k + 1));
        [events[k], events[j]] = [events[j] as (typeof events)[number], events[k] as (typeof events)[number]];
      }
      for (const item of events) services.forEach((s, j) => j !== item.from && replicaView(s).applyBindingEvent(item.e));
      const winners = services.map((s) => s.select({ token_ids: tokens(1, 50), session_id: "s" }).worker_id);
      expect(new Set(winners).size).toBe(1);
    }
  });
});

describe("a binding stays alive where it was written while a peer serves the session", () => {
  it("a peer's refresh of our binding extends our idle TTL; an echo or a stale version does not", () => {
    const { services, clock, deliver, bindQ } = mesh(2, { ttlSecs: 10 });
    const [a, b] = services as [SelectionService, SelectionService];
    const first = a.selectAndReserve({ token_ids: tokens(2, 1), session_id: "conv", selection_id: "t1" });
    a.freeReservation("t1");
    deliver();
    // From now on only B serves the session, every 6 s (inside the 10 s TTL each time).
    for (let i = 0; i < 4; i++) {
      clock.advance(6_000);
      const r = b.selectAndReserve({ token_ids: tokens(2, 10 + i), session_id: "conv", selection_id: `u${i}` });
      expect(r.worker_id).toBe(first.worker_id);
      b.freeReservation(`u${i}`);
      const refreshes = bindQ.filter((q) => q.from === 1 && q.e.reason === "refresh");
      expect(refreshes.length).toBeGreaterThan(0);
      expect(refreshes.map((q) => replicaView(a).applyBindingEvent(q.e))).toContain("refreshed");
      bindQ.splice(0);
    }
    // 24 s after A last served it, A still holds the binding: B kept it in use.
    expect(a.sizes().affinityEntries).toBe(1);
    // A plain echo of A's own binding, or a refresh for another worker, is still ignored.
    const own = a.bindingsSnapshot()[0];
    if (own === undefined) throw new Error("A lost the binding");
    expect(replicaView(a).applyBindingEvent({ ...own, reason: "bind" })).toBe("ignored-own");
    expect(replicaView(a).applyBindingEvent({ ...own, reason: "refresh", worker_id: own.worker_id === 1n ? 2n : 1n })).toBe("ignored-own");
    // With nobody serving it, the binding idles out after the TTL as before.
    clock.advance(11_000);
    a.tick();
    expect(a.sizes().affinityEntries).toBe(0);
  });
});

describe("a hard-mode conflict unbinds the session on every replica (F18)", () => {
  const live = (s: SelectionService) => s.bindingsSnapshot().filter((e) => e.reason !== "unbind" && e.session_id === "s");

  /** Session "s" bound on A and replicated to B and C; then A refuses a dispatch away from it. */
  function conflicted() {
    const m = mesh(3, { ttlSecs: 60, mode: "hard" });
    const [a, b, c] = m.services as [SelectionService, SelectionService, SelectionService];
    const first = a.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "1" });
    m.deliver();
    expect(live(b).map((e) => e.worker_id)).toEqual([first.worker_id]);
    const other = first.worker_id === 1n ? 2n : 1n;
    expect(() => a.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "2", allowed_worker_ids: [other] })).toThrow(/bound to worker/);
    return { ...m, a, b, c, first, other };
  }

  it("publishes the unbind, and peers drop their copy", () => {
    const { a, b, c, bindQ, deliver } = conflicted();
    const unbind = bindQ.find((q) => q.e.reason === "unbind")?.e;
    expect(unbind?.session_id).toBe("s");
    expect(live(a)).toEqual([]);
    deliver();
    expect(live(b)).toEqual([]);
    expect(live(c)).toEqual([]);
    // Each holds the unbind for its snapshots, so a peer that missed it in a gap learns it.
    for (const s of [a, b, c]) expect(s.bindingsSnapshot().filter((e) => e.reason === "unbind").map((e) => e.sequence)).toEqual([unbind?.sequence]);
  });

  it("an older copy arriving after the unbind does not bring the binding back; a newer bind does", () => {
    const { services, a, b, c, bindQ, deliver, other } = conflicted();
    const staleCopy = b.bindingsSnapshot().find((e) => e.session_id === "s" && e.reason !== "unbind") as BindingEvent;
    deliver();
    // B's refresh of the copy it held, delayed past the unbind (a reordering or a snapshot).
    for (const s of services) replicaView(s).applyBindingEvent({ ...staleCopy, reason: "refresh" });
    for (const s of services) expect(live(s)).toEqual([]);
    // The session's next request binds afresh on C, and that newer binding reaches everyone.
    const again = c.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "3", allowed_worker_ids: [other] });
    expect(bindQ.some((q) => q.e.reason === "bind")).toBe(true);
    deliver();
    for (const s of [a, b, c]) expect(live(s).map((e) => e.worker_id)).toEqual([again.worker_id]);
  });

  it("an unbind older than the binding held is ignored", () => {
    const { b, bindQ } = conflicted();
    const unbind = bindQ.find((q) => q.e.reason === "unbind")?.e as BindingEvent;
    const held = live(b)[0] as BindingEvent;
    expect(replicaView(b).applyBindingEvent({ ...unbind, sequence: held.sequence - 1n })).toBe("ignored-conflict");
    expect(live(b)).toHaveLength(1);
    expect(replicaView(b).applyBindingEvent(unbind)).toBe("unbound");
    expect(replicaView(b).applyBindingEvent(unbind)).toBe("ignored-conflict");
  });
});
