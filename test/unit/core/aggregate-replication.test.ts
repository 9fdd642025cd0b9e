import { describe, expect, it } from "vitest";

import { ManualClock } from "../../../src/core/time.js";
import { seededRandom } from "../../../src/core/random.js";
import type { LoadAggregates, LoadEvent } from "../../../src/core/replica-events.js";
import { SelectionService } from "../../../src/core/selection-service.js";
import { tokens, worker } from "../../helpers/core-fixtures.js";
import { replicaView } from "../../helpers/replica-view.js";

/** N services in aggregate mode; `deliver` hands each one's changed totals and forwarded calls to the others. */
function mesh(n: number, workers = [1, 2, 3]) {
  const clock = new ManualClock(1_000);
  const services = Array.from(
    { length: n },
    (_, i) => new SelectionService({ clock, random: seededRandom(200 + i), replicaId: BigInt(i + 1), wallClockNs: () => 5_000n, loadReplication: "aggregate" }),
  );
  const events: { from: number; e: LoadEvent }[] = [];
  let changes = 0;
  services.forEach((s, i) => {
    replicaView(s).onLoadEvent((e) => events.push({ from: i, e }));
    replicaView(s).onLoadChange(() => changes++);
    for (const id of workers) s.upsertWorker(worker(id));
  });
  const sent: LoadAggregates[][] = [];
  const deliver = (): void => {
    for (let round = 0; round < 4; round++) {
      for (const e of events.splice(0)) services.forEach((s, j) => j !== e.from && replicaView(s).applyLoadEvent(e.e));
      services.forEach((s, i) => {
        const aggs = replicaView(s).takeLoadAggregates();
        if (aggs.length > 0) sent.push(aggs);
        for (const a of aggs) services.forEach((t, j) => j !== i && replicaView(t).applyLoadAggregates(s.replicaId, a));
      });
    }
  };
  return { services, clock, events, deliver, sent, changes: () => changes };
}

const loadsOf = (s: SelectionService) =>
  s.loads()[0]?.loads.map((l) => [l.worker_id, l.potential_prefill_tokens, l.potential_decode_blocks, l.active_requests]);
const totalRequests = (s: SelectionService) => s.loads()[0]?.loads.reduce((n, l) => n + l.active_requests, 0);

describe("aggregate load replication", () => {
  it("peers see an origin's totals, and the same /loads, through add, prefill complete and free", () => {
    const { services, deliver, changes } = mesh(2);
    const [a, b] = services as [SelectionService, SelectionService];
    a.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "r1" });
    b.selectAndReserve({ token_ids: tokens(3, 2), selection_id: "r2" });
    expect(changes()).toBe(2);
    deliver();
    expect(totalRequests(a)).toBe(2);
    expect(loadsOf(a)).toEqual(loadsOf(b));
    a.prefillComplete("r1");
    deliver();
    expect(loadsOf(a)).toEqual(loadsOf(b));
    a.freeReservation("r1");
    b.freeReservation("r2");
    deliver();
    expect(loadsOf(a)).toEqual(loadsOf(b));
    expect(b.loads()[0]?.loads.every((l) => l.active_requests === 0 && l.potential_decode_blocks === 0 && l.potential_prefill_tokens === 0)).toBe(true);
  });

  it("emits no per-booking load events and publishes only what changed, once", () => {
    const { services, events, sent, deliver } = mesh(2);
    const [a] = services as [SelectionService, SelectionService];
    a.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "r1" });
    expect(events).toHaveLength(0);
    deliver();
    expect(sent).toHaveLength(1);
    expect(sent[0]?.[0]?.rows).toHaveLength(1);
    expect(sent[0]?.[0]?.added.map((b) => b.id)).toEqual(["r1"]);
    deliver();
    expect(sent).toHaveLength(1);
    // A booking made and ended between two publishes is in neither list.
    a.selectAndReserve({ token_ids: tokens(2, 3), selection_id: "short" });
    a.freeReservation("short");
    deliver();
    expect(sent[1]?.[0]?.added).toEqual([]);
    expect(sent[1]?.[0]?.removed).toEqual([]);
  });

  it("a peer's load steers selection away from the worker it loaded", () => {
    const { services, deliver } = mesh(2, [1, 2]);
    const [a, b] = services as [SelectionService, SelectionService];
    const first = a.selectAndReserve({ token_ids: tokens(8, 1), selection_id: "big" });
    deliver();
    const next = b.select({ token_ids: tokens(8, 2) });
    expect(next.worker_id).not.toBe(first.worker_id);
  });

  it("resolves a lifecycle call on any replica by forwarding it to the booking's owner", () => {
    const { services, deliver, events } = mesh(2);
    const [a, b] = services as [SelectionService, SelectionService];
    a.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "r1" });
    deliver();
    // Known here by id and owner only, as a lifecycle call needs.
    expect(b.hasReservation("r1")).toBe(true);
    expect(b.reservationCount).toBe(1);
    b.prefillComplete("r1");
    expect(events.map((q) => [q.from, q.e.type, q.e.owner])).toEqual([[1, "prefill_complete", 1n]]);
    deliver();
    b.freeReservation("r1");
    // The id is forgotten at once: a second free is a 404 here, as on the owner.
    expect(() => { b.freeReservation("r1"); }).toThrow(/not found/);
    deliver();
    expect(a.hasReservation("r1")).toBe(false);
    expect(b.hasReservation("r1")).toBe(false);
    expect(totalRequests(a)).toBe(0);
    expect(totalRequests(b)).toBe(0);
    expect(() => { b.prefillComplete("never"); }).toThrow(/not found/);
  });

  it("frees taken elsewhere for a departed owner's bookings leave no load behind, on every peer", () => {
    const { services, deliver, events } = mesh(3, [1, 2]);
    const [a, b, c] = services as [SelectionService, SelectionService, SelectionService];
    for (let i = 0; i < 4; i++) a.selectAndReserve({ token_ids: tokens(4, i), selection_id: `a${i}` });
    deliver();
    expect(totalRequests(b)).toBe(4);
    // A is gone (killed): its frontends free its bookings through B and C.
    b.freeReservation("a0");
    b.freeReservation("a1");
    c.freeReservation("a2");
    // Delivered to the survivors only: the forwarded frees reach each other, not A.
    for (const q of events.splice(0)) for (const [j, s] of [b, c].entries()) if (j + 1 !== q.from) replicaView(s).applyLoadEvent(q.e);
    expect(totalRequests(b)).toBe(1);
    expect(totalRequests(c)).toBe(1);
    c.freeReservation("a3");
    for (const q of events.splice(0)) for (const [j, s] of [b, c].entries()) if (j + 1 !== q.from) replicaView(s).applyLoadEvent(q.e);
    for (const s of [b, c]) {
      expect(s.loads()[0]?.loads.every((l) => l.active_requests === 0 && l.potential_decode_blocks === 0 && l.potential_prefill_tokens === 0)).toBe(true);
    }
    // A late publish from the owner (absolute totals) still wins where it arrives.
    expect(b.hasReservation("a3")).toBe(false);
  });

  it("counts what heartbeats compare: the owner's published requests and a peer's applied ones", () => {
    const { services, deliver } = mesh(2);
    const [a, b] = services as [SelectionService, SelectionService];
    a.selectAndReserve({ token_ids: tokens(2, 1), selection_id: "x" });
    a.selectAndReserve({ token_ids: tokens(2, 2), selection_id: "y" });
    // Not published yet: the heartbeat must not claim them.
    expect(replicaView(a).countOwnedBy(a.replicaId)).toBe(0);
    deliver();
    expect(replicaView(a).countOwnedBy(a.replicaId)).toBe(2);
    expect(replicaView(b).countOwnedBy(a.replicaId)).toBe(2);
  });

  it("a snapshot replaces what is mirrored of an origin, ids included; dropOrigin forgets it", () => {
    const { services, deliver } = mesh(3);
    const [a, b, c] = services as [SelectionService, SelectionService, SelectionService];
    a.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "r1" });
    a.selectAndReserve({ token_ids: tokens(4, 2), selection_id: "r2" });
    replicaView(a).takeLoadAggregates(); // published to nobody: c and b missed it
    expect(replicaView(b).replaceOriginAggregates(a.replicaId, replicaView(a).loadAggregatesSnapshot())).toBe(2);
    expect(loadsOf(b)).toEqual(loadsOf(a));
    b.freeReservation("r2"); // resolvable: the snapshot carried the ids
    deliver();
    expect(a.hasReservation("r2")).toBe(false);
    // c missed the first publish: its count disagrees with the owner's (the heartbeat check's
    // trigger), until a snapshot repairs it.
    expect(replicaView(a).countOwnedBy(a.replicaId)).toBe(1);
    expect(replicaView(c).countOwnedBy(a.replicaId)).not.toBe(1);
    replicaView(c).replaceOriginAggregates(a.replicaId, replicaView(a).loadAggregatesSnapshot());
    expect(replicaView(c).countOwnedBy(a.replicaId)).toBe(1);
    expect(loadsOf(c)).toEqual(loadsOf(a));
    expect(replicaView(b).dropOrigin(a.replicaId)).toBe(1);
    expect(totalRequests(b)).toBe(0);
    expect(() => { b.freeReservation("r1"); }).toThrow(/not found/);
  });

  it("adopts a dead peer's totals from a survivor's snapshot, again once its workers register, never over its own view", () => {
    const { services, deliver, clock } = mesh(2, [1, 2]);
    const [a, b] = services as [SelectionService, SelectionService];
    a.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "a1" });
    deliver();
    // A dies. C starts with no workers yet and pulls B's snapshot: A's rows have nowhere to go.
    const c = new SelectionService({ clock, random: seededRandom(9), replicaId: 3n, wallClockNs: () => 5_000n, loadReplication: "aggregate" });
    replicaView(c).replaceOriginAggregates(b.replicaId, replicaView(b).loadAggregatesSnapshot());
    expect(replicaView(c).adoptMirroredAggregates(b.replicaId, replicaView(b).mirroredAggregatesSnapshot())).toBe(1);
    for (const id of [1, 2]) c.upsertWorker(worker(id));
    expect(totalRequests(c)).toBe(0);
    // Its workers registered: the fresh pull adopts A's totals again, now with somewhere to go.
    expect(replicaView(c).adoptMirroredAggregates(b.replicaId, replicaView(b).mirroredAggregatesSnapshot())).toBe(1);
    expect(loadsOf(c)).toEqual(loadsOf(b));
    expect(c.hasReservation("a1")).toBe(true);
    // An origin C hears itself is never overwritten by another replica's view of it.
    expect(replicaView(c).adoptMirroredAggregates(a.replicaId, replicaView(b).mirroredAggregatesSnapshot())).toBe(0);
    const fresh = replicaView(a).takeLoadAggregates();
    expect(fresh).toEqual([]);
    a.selectAndReserve({ token_ids: tokens(2, 2), selection_id: "a2" });
    for (const x of replicaView(a).takeLoadAggregates()) replicaView(c).applyLoadAggregates(a.replicaId, x);
    expect(replicaView(c).adoptMirroredAggregates(b.replicaId, replicaView(b).mirroredAggregatesSnapshot())).toBe(0);
    expect(replicaView(c).countOwnedBy(a.replicaId)).toBe(2);
  });

  it("a worker that leaves is published as zero, and peers' totals on it go", () => {
    const { services, deliver } = mesh(2, [1]);
    const [a, b] = services as [SelectionService, SelectionService];
    a.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "r1" });
    deliver();
    expect(totalRequests(b)).toBe(1);
    a.deleteWorker(1n);
    const aggs = replicaView(a).takeLoadAggregates();
    expect(aggs[0]?.rows).toEqual([{ worker_id: 1n, dp_rank: 0, prefill_tokens: 0, blocks: 0, requests: 0 }]);
    expect(aggs[0]?.removed).toEqual(["r1"]);
    for (const x of aggs) replicaView(b).applyLoadAggregates(a.replicaId, x);
    expect(totalRequests(b)).toBe(0);
    expect(replicaView(b).countOwnedBy(a.replicaId)).toBe(0);
  });

  it("a decaying prefill estimate is republished until it runs out", () => {
    const { services, clock } = mesh(2, [1]);
    const [a] = services as [SelectionService, SelectionService];
    a.selectAndReserve({ token_ids: tokens(4, 1), selection_id: "r1", expected_prefill_duration_ms: 100 });
    const first = replicaView(a).takeLoadAggregates()[0]?.rows[0]?.prefill_tokens ?? 0;
    expect(first).toBeGreaterThan(0);
    expect(replicaView(a).loadAggregatesDecaying).toBe(true);
    clock.advance(50);
    const half = replicaView(a).takeLoadAggregates()[0]?.rows[0]?.prefill_tokens ?? 0;
    expect(half).toBeCloseTo(first / 2);
    clock.advance(60);
    expect(replicaView(a).takeLoadAggregates()[0]?.rows[0]?.prefill_tokens).toBe(0);
    expect(replicaView(a).loadAggregatesDecaying).toBe(false);
  });

  it("ignores exact-mode events and its own totals; forgets a peer silent past the booking expiry", () => {
    const { services, deliver, clock } = mesh(2);
    const [a, b] = services as [SelectionService, SelectionService];
    const exact = new SelectionService({ clock, random: seededRandom(9), replicaId: 9n });
    exact.upsertWorker(worker(1));
    const seen: LoadEvent[] = [];
    replicaView(exact).onLoadEvent((e) => seen.push(e));
    exact.selectAndReserve({ token_ids: tokens(2), selection_id: "e1" });
    expect(replicaView(b).applyLoadEvent(seen[0] as LoadEvent)).toBe(false);
    expect(replicaView(exact).applyLoadAggregates(a.replicaId, { partition: { model_name: "default", routing_group: "default" }, block_size: 4, rows: [], added: [], removed: [] })).toBe(0);
    a.selectAndReserve({ token_ids: tokens(2), selection_id: "r1" });
    const aggs = replicaView(a).takeLoadAggregates();
    for (const x of aggs) expect(replicaView(a).applyLoadAggregates(a.replicaId, x)).toBe(0);
    for (const x of aggs) replicaView(b).applyLoadAggregates(a.replicaId, x);
    expect(totalRequests(b)).toBe(1);
    clock.advance(300_001);
    b.tick();
    expect(replicaView(b).countOwnedBy(a.replicaId)).toBe(0);
    deliver();
  });
});
