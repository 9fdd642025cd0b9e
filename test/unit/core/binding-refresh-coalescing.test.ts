/**
 * Coalescing of session-binding refreshes (issue 13, "Coalesce binding refreshes"). The reference
 * (dynamo lib/kv-router/src/services/selection/affinity.rs) replicates every binding change and
 * says nothing about how often a refresh must travel; what is fixed here is kvmesh's own rule
 * (docs/mesh.md, Refresh coalescing): a refresh of a binding published less than
 * min(window, TTL / 8) ago is not emitted but counted; binds, rebinds and the half-TTL keepalive
 * always are. Every expectation below fails on the code before the option existed (each refresh
 * was emitted, and there was no counter).
 */
import { describe, expect, it } from "vitest";

import { AffinityTable, refreshCoalesceWindowMs, type AffinityTableOptions, type BindingReason, type Lease } from "../../../src/core/affinity-table.js";
import { ManualClock } from "../../../src/core/time.js";
import type { BindingEvent } from "../../../src/core/replica-events.js";
import { makeService, tokens, worker } from "../../helpers/core-fixtures.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";
import { replicaView } from "../../helpers/replica-view.js";

const TTL_MS = 10_000;
const W1 = { workerId: 1n, dpRank: 0 };
const W2 = { workerId: 2n, dpRank: 0 };

function setup(overrides: Partial<AffinityTableOptions> = {}): { table: AffinityTable; clock: ManualClock; reasons: BindingReason[]; coalesced: () => number } {
  const clock = new ManualClock(0);
  let coalesced = 0;
  const table = new AffinityTable({
    ttlMs: TTL_MS,
    mode: "hard",
    writerId: 1n,
    clock,
    refreshCoalesceMs: 500,
    onRefreshCoalesced: () => {
      coalesced++;
    },
    ...overrides,
  });
  const reasons: BindingReason[] = [];
  table.onBinding((_, reason) => reasons.push(reason));
  return { table, clock, reasons, coalesced: () => coalesced };
}

function leaseOf(outcome: ReturnType<AffinityTable["commit"]>): Lease {
  if (outcome.kind === "unpinned") throw new Error("expected a lease");
  return outcome.lease;
}

describe("AffinityTable refresh coalescing", () => {
  it("suppresses and counts refreshes within the window, and emits the first one after it", () => {
    const { table, clock, reasons, coalesced } = setup();
    const a = leaseOf(table.commit("s", W1)); // t=0: bind
    clock.set(100);
    const b = leaseOf(table.commit("s", W1)); // commit refresh, 100 ms after the bind
    clock.set(200);
    table.release(a); // release refresh
    expect(reasons).toEqual(["bind"]);
    expect(coalesced()).toBe(2);
    // The local idle deadline still follows every use; only the publication is skipped.
    expect(table.get("s")?.idleDeadlineMs).toBe(200 + TTL_MS);
    expect(table.get("s")?.leases).toBe(1);

    clock.set(500); // the window (500 ms) has passed since the bind: published
    table.release(b);
    expect(reasons).toEqual(["bind", "refresh"]);
    clock.set(999); // measured from that refresh, not from the bind
    table.release(leaseOf(table.commit("s", W1)));
    expect(reasons).toEqual(["bind", "refresh"]);
    expect(coalesced()).toBe(4);
    clock.set(1_000);
    table.release(leaseOf(table.commit("s", W1)));
    expect(reasons).toEqual(["bind", "refresh", "refresh"]);
    expect(coalesced()).toBe(5);
  });

  it("never suppresses a bind or a rebind", () => {
    const soft = setup({ mode: "soft" });
    leaseOf(soft.table.commit("s", W1));
    soft.clock.set(10);
    expect(soft.table.commit("s", W2).kind).toBe("rebound");
    soft.clock.set(20);
    expect(soft.table.commit("s", W1).kind).toBe("rebound");
    expect(soft.reasons).toEqual(["bind", "rebind", "rebind"]);
    expect(soft.coalesced()).toBe(0);

    // Hard mode: a conflict drops the binding; the next request binds afresh, 20 ms later.
    const hard = setup();
    leaseOf(hard.table.commit("s", W1));
    hard.clock.set(10);
    expect(() => hard.table.commit("s", W2)).toThrow();
    hard.clock.set(20);
    expect(hard.table.commit("s", W2).kind).toBe("bound");
    expect(hard.reasons).toEqual(["bind", "unbind", "bind"]);
  });

  it("leaves the keepalive alone, and a suppressed refresh does not postpone it", () => {
    const { table, clock, reasons, coalesced } = setup({ refreshCoalesceMs: 1_000 });
    leaseOf(table.commit("s", W1)); // t=0, held (a long request)
    clock.set(900);
    leaseOf(table.commit("s", W1)); // suppressed: the binding was published 900 ms ago
    expect(coalesced()).toBe(1);
    // Half a TTL after the last *publication* (t=0), not after the suppressed refresh (t=900):
    // before coalescing, that refresh was published and moved the keepalive to t=5,900.
    clock.set(5_000);
    table.sweep();
    expect(reasons).toEqual(["bind", "refresh"]);
    // The keepalive is a publication: a refresh right after it is coalesced.
    clock.set(5_100);
    leaseOf(table.commit("s", W1));
    expect(reasons).toEqual(["bind", "refresh"]);
    expect(coalesced()).toBe(2);
  });

  it("counts a binding merged from a peer as a publication", () => {
    const { table, clock, reasons, coalesced } = setup();
    expect(table.applyReplica({ sessionId: "s", target: W1, version: { sequence: 5n, writerId: 2n } })).toBe("inserted");
    clock.set(100);
    expect(table.commit("s", W1).kind).toBe("refreshed");
    expect(reasons).toEqual([]);
    expect(coalesced()).toBe(1);
  });

  it("caps the window at TTL / 8", () => {
    expect(refreshCoalesceWindowMs(1_000, 1_000)).toBe(125);
    expect(refreshCoalesceWindowMs(1_000, 8_000)).toBe(1_000);
    expect(refreshCoalesceWindowMs(1_000, 300_000)).toBe(1_000);
    expect(refreshCoalesceWindowMs(0, 300_000)).toBe(0);

    const { table, clock, reasons, coalesced } = setup({ ttlMs: 1_000, refreshCoalesceMs: 1_000 });
    expect(table.refreshCoalesceMs).toBe(125);
    const a = leaseOf(table.commit("s", W1));
    clock.set(124);
    const b = leaseOf(table.commit("s", W1));
    expect(coalesced()).toBe(1);
    clock.set(125);
    table.release(a);
    expect(reasons).toEqual(["bind", "refresh"]);
    table.release(b);
    expect(coalesced()).toBe(2);
  });

  it("emits every refresh with the default window 0, even on a clock that steps back", () => {
    const clock = new ManualClock(0);
    let coalesced = 0;
    const table = new AffinityTable({ ttlMs: TTL_MS, mode: "hard", writerId: 1n, clock, onRefreshCoalesced: () => coalesced++ });
    const reasons: BindingReason[] = [];
    table.onBinding((_, reason) => reasons.push(reason));
    expect(table.refreshCoalesceMs).toBe(0);
    const a = leaseOf(table.commit("s", W1));
    table.release(leaseOf(table.commit("s", W1)));
    clock.set(-5);
    table.release(a);
    expect(reasons).toEqual(["bind", "refresh", "refresh", "refresh"]);
    expect(coalesced).toBe(0);
  });

  it("rejects a negative or fractional window naming bindingRefreshCoalesceMs", () => {
    for (const refreshCoalesceMs of [-1, 0.5, Number.NaN]) {
      const err = kvmeshErrorOf(() => setup({ refreshCoalesceMs }));
      expect(err.code).toBe("KVMESH_BAD_REQUEST");
      expect(err.details).toEqual({ field: "bindingRefreshCoalesceMs" });
    }
  });
});

describe("SelectionService bindingRefreshCoalesceMs", () => {
  it("publishes a continuing session's refreshes at most once per window and counts the rest", () => {
    const { svc, clock } = makeService({ sessionAffinity: { ttlSecs: 60 }, bindingRefreshCoalesceMs: 1_000 });
    const seen: BindingEvent[] = [];
    replicaView(svc).onBindingEvent((e) => seen.push(e));
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "a" });
    clock.advance(100);
    svc.freeReservation("a"); // release refresh
    clock.advance(100);
    svc.selectAndReserve({ token_ids: tokens(3), session_id: "s", selection_id: "b" }); // commit refresh
    expect(seen.map((e) => e.reason)).toEqual(["bind"]);
    expect(svc.stats.bindingRefreshesCoalesced).toBe(2);
    expect(svc.stats.bindingsPublished).toBe(1);

    clock.advance(800); // 1,000 ms after the bind
    svc.freeReservation("b");
    expect(seen.map((e) => e.reason)).toEqual(["bind", "refresh"]);
    expect(svc.stats.bindingsPublished).toBe(2);
    expect(svc.stats.bindingRefreshesCoalesced).toBe(2);
  });

  it("defaults to 0 (every refresh published) and rejects a bad value naming the option", () => {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60 } });
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "a" });
    svc.freeReservation("a");
    expect(svc.stats.bindingsPublished).toBe(2);
    expect(svc.stats.bindingRefreshesCoalesced).toBe(0);

    const err = kvmeshErrorOf(() => makeService({ sessionAffinity: { ttlSecs: 60 }, bindingRefreshCoalesceMs: -1 }));
    expect(err.code).toBe("KVMESH_BAD_REQUEST");
    expect(err.details).toEqual({ field: "bindingRefreshCoalesceMs" });
  });
});
