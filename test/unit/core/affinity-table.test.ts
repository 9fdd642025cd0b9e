import { describe, it, expect } from "vitest";
import {
  AffinityTable,
  affinitySweepIntervalMs,
  compareVersions,
  type AffinityTableOptions,
  type BindingReason,
  type Lease,
  type SessionBinding,
} from "../../../src/core/affinity-table.js";
import { ManualClock } from "../../../src/core/time.js";
import { seededRandom } from "../../../src/core/random.js";
import { KvmeshError } from "../../../src/core/errors.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";

const TTL_MS = 10_000;

function makeTable(overrides: Partial<AffinityTableOptions> = {}, clock = new ManualClock(0)): AffinityTable {
  return new AffinityTable({ ttlMs: TTL_MS, mode: "hard", writerId: 1n, clock, ...overrides });
}

function leaseOf(outcome: ReturnType<AffinityTable["commit"]>): Lease {
  if (outcome.kind === "unpinned") throw new Error("expected a lease");
  return outcome.lease;
}

function record(table: AffinityTable): { binding: SessionBinding; reason: BindingReason }[] {
  const events: { binding: SessionBinding; reason: BindingReason }[] = [];
  table.onBinding((binding, reason) => events.push({ binding, reason }));
  return events;
}

const catchError = kvmeshErrorOf;

describe("AffinityTable configuration", () => {
  it("rejects a TTL outside 1 s .. 1 year, naming session_affinity_ttl_secs", () => {
    for (const ttlMs of [0, 999, 31_536_000_001, Number.NaN]) {
      const err = catchError(() => makeTable({ ttlMs }));
      expect(err.code).toBe("KVMESH_BAD_REQUEST");
      expect(err.message).toContain("session_affinity_ttl_secs");
      expect(err.details).toEqual({ field: "session_affinity_ttl_secs" });
    }
    expect(makeTable({ ttlMs: 1_000 }).ttlMs).toBe(1_000);
    expect(makeTable({ ttlMs: 31_536_000_000 }).ttlMs).toBe(31_536_000_000);
  });

  it("applies the documented defaults", () => {
    const table = makeTable();
    expect(table.maxEntries).toBe(65_536);
    expect(table.maxSessionIdBytes).toBe(256);
    expect(table.nextSequence).toBe(1n);
    expect(makeTable({ initialSequence: 1_700_000_000_000_000_000n }).nextSequence).toBe(1_700_000_000_000_000_000n);
  });

  it("sweeps a quarter TTL, at most every 30 s", () => {
    expect(affinitySweepIntervalMs(1_000)).toBe(250);
    expect(affinitySweepIntervalMs(31_536_000_000)).toBe(30_000);
  });
});

describe("AffinityTable commit", () => {
  it("binds a vacant session with a new version and one lease, and emits it", () => {
    const clock = new ManualClock(5_000);
    const table = makeTable({ writerId: 7n, initialSequence: 100n }, clock);
    const events = record(table);
    const outcome = table.commit("s1", { workerId: 3n, dpRank: 1 });
    expect(outcome.kind).toBe("bound");
    expect(leaseOf(outcome).version).toEqual({ sequence: 100n, writerId: 7n });
    expect(table.resolve("s1")).toEqual({ workerId: 3n, dpRank: 1 });
    expect(table.get("s1")).toEqual({
      target: { workerId: 3n, dpRank: 1 },
      version: { sequence: 100n, writerId: 7n },
      leases: 1,
      idleDeadlineMs: 15_000,
    });
    expect(table.nextSequence).toBe(101n);
    expect(events).toEqual([
      { binding: { sessionId: "s1", target: { workerId: 3n, dpRank: 1 }, version: { sequence: 100n, writerId: 7n } }, reason: "bind" },
    ]);
  });

  it("refreshes a binding dispatched to the same target without a new version", () => {
    const clock = new ManualClock(0);
    const table = makeTable({}, clock);
    const events = record(table);
    table.commit("s", { workerId: 1n, dpRank: 0 });
    clock.advance(4_000);
    const outcome = table.commit("s", { workerId: 1n, dpRank: 0 });
    expect(outcome.kind).toBe("refreshed");
    expect(leaseOf(outcome).version.sequence).toBe(1n);
    expect(table.get("s")?.leases).toBe(2);
    expect(table.get("s")?.idleDeadlineMs).toBe(14_000);
    expect(events.map((e) => e.reason)).toEqual(["bind", "refresh"]);
    expect(table.nextSequence).toBe(2n);
  });

  it("hard mode rejects dispatch away from a live binding and drops it", () => {
    const table = makeTable({ mode: "hard" });
    const events = record(table);
    leaseOf(table.commit("sess-a", { workerId: 1n, dpRank: 0 }));
    const err = catchError(() => table.commit("sess-a", { workerId: 2n, dpRank: 0 }));
    expect(err.code).toBe("KVMESH_SESSION_CONFLICT");
    expect(err.status).toBe(400);
    expect(err.message).toContain("sess-a");
    expect(err.message).toContain("worker 1");
    expect(err.message).toContain("worker 2");
    expect(table.get("sess-a")).toBeUndefined();
    expect(table.resolve("sess-a")).toBeUndefined();
    // The unbind is published with a newer version, so peers drop their copy too (F18).
    expect(events).toHaveLength(2);
    const [bind, unbind] = events as [(typeof events)[number], (typeof events)[number]];
    expect(unbind.reason).toBe("unbind");
    expect(unbind.binding.target).toEqual({ workerId: 1n, dpRank: 0 });
    expect(unbind.binding.version.sequence > bind.binding.version.sequence).toBe(true);
    // The session binds afresh on its next request.
    expect(table.commit("sess-a", { workerId: 2n, dpRank: 0 }).kind).toBe("bound");
  });

  it("remembers a peer's unbind for a TTL, bounded by maxEntries, counting what it sheds", () => {
    const clock = new ManualClock(0);
    const table = makeTable({ maxEntries: 2 }, clock);
    const peer = (session: string, sequence: bigint): SessionBinding => ({ sessionId: session, target: { workerId: 5n, dpRank: 0 }, version: { sequence, writerId: 9n } });
    expect(table.applyReplica(peer("a", 10n))).toBe("inserted");
    expect(table.applyReplicaUnbind(peer("a", 11n))).toBe("unbound");
    expect(table.get("a")).toBeUndefined();
    // The older bind again (a delayed refresh): ignored while the unbind is remembered.
    expect(table.applyReplica(peer("a", 10n))).toBe("ignored-conflict");
    expect(table.unbinds().map((b) => b.sessionId)).toEqual(["a"]);
    // After the TTL the unbind is forgotten by the sweep.
    clock.set(TTL_MS);
    table.sweep();
    expect(table.unbinds()).toEqual([]);
    expect(table.applyReplica(peer("a", 10n))).toBe("inserted");
    // Bounded: a third unbind sheds the oldest.
    for (const [i, session] of ["x", "y", "z"].entries()) table.applyReplicaUnbind(peer(session, 20n + BigInt(i)));
    expect(table.unbinds().map((b) => b.sessionId)).toEqual(["y", "z"]);
    expect(table.unbindsShed).toBe(1);
  });

  it("counts hard-mode conflicts and soft-mode rebinds (not refreshes or fresh binds)", () => {
    const hard = makeTable({ mode: "hard" });
    hard.commit("s", { workerId: 1n, dpRank: 0 });
    hard.commit("s", { workerId: 1n, dpRank: 0 });
    catchError(() => hard.commit("s", { workerId: 2n, dpRank: 0 }));
    hard.commit("s", { workerId: 2n, dpRank: 0 });
    expect([hard.conflicts, hard.rebinds]).toEqual([1, 0]);

    const soft = makeTable({ mode: "soft" });
    soft.commit("s", { workerId: 1n, dpRank: 0 });
    soft.commit("s", { workerId: 2n, dpRank: 0 });
    soft.commit("s", { workerId: 2n, dpRank: 0 });
    soft.commit("s", { workerId: 3n, dpRank: 0 });
    expect([soft.conflicts, soft.rebinds]).toEqual([0, 2]);
  });

  it("hard mode rejects a different rank of a ranked binding", () => {
    const table = makeTable({ mode: "hard" });
    table.commit("s", { workerId: 1n, dpRank: 0 });
    expect(catchError(() => table.commit("s", { workerId: 1n, dpRank: 1 })).code).toBe("KVMESH_SESSION_CONFLICT");
  });

  it("a worker-only binding accepts any rank of its worker", () => {
    const table = makeTable({ mode: "hard", writerId: 1n });
    expect(table.applyReplica({ sessionId: "s", target: { workerId: 4n, dpRank: null }, version: { sequence: 10n, writerId: 2n } })).toBe(
      "inserted",
    );
    expect(table.commit("s", { workerId: 4n, dpRank: 3 }).kind).toBe("refreshed");
    expect(table.commit("s", { workerId: 4n, dpRank: 0 }).kind).toBe("refreshed");
    expect(table.resolve("s")).toEqual({ workerId: 4n, dpRank: null });
    expect(table.get("s")?.leases).toBe(2);
  });

  it("soft mode follows the dispatch with a new version and keeps worker-only affinity", () => {
    const table = makeTable({ mode: "soft", writerId: 1n });
    const events = record(table);
    table.applyReplica({ sessionId: "wo", target: { workerId: 4n, dpRank: null }, version: { sequence: 10n, writerId: 2n } });
    const first = leaseOf(table.commit("wo", { workerId: 4n, dpRank: 2 }));
    const moved = table.commit("wo", { workerId: 5n, dpRank: 1 });
    expect(moved.kind).toBe("rebound");
    expect(leaseOf(moved).version).toEqual({ sequence: 11n, writerId: 1n });
    expect(table.resolve("wo")).toEqual({ workerId: 5n, dpRank: null });
    expect(table.get("wo")?.leases).toBe(2);

    table.commit("ranked", { workerId: 1n, dpRank: 0 });
    expect(table.commit("ranked", { workerId: 1n, dpRank: 3 }).kind).toBe("rebound");
    expect(table.resolve("ranked")).toEqual({ workerId: 1n, dpRank: 3 });
    expect(events.map((e) => e.reason)).toEqual(["refresh", "rebind", "bind", "rebind"]);

    // The lease taken before the rebind still counts down, but does not republish the old binding.
    table.release(first);
    expect(table.get("wo")?.leases).toBe(1);
    expect(events).toHaveLength(4);
  });

  it("a full table evicts the least recently used binding without a lease for a new session", () => {
    const clock = new ManualClock(0);
    const table = makeTable({ maxEntries: 3 }, clock);
    for (const s of ["a", "b", "c"]) table.release(leaseOf(table.commit(s, { workerId: 1n, dpRank: 0 })));
    // "a" used again (a select's lookup) and "b" refreshed by a peer: "c" is now the oldest use.
    clock.advance(1);
    expect(table.resolve("a")).toBeDefined();
    expect(table.applyReplica({ sessionId: "b", target: { workerId: 1n, dpRank: 0 }, version: { sequence: 90n, writerId: 9n } })).toBe("refreshed");
    expect(table.commit("d", { workerId: 2n, dpRank: 0 }).kind).toBe("bound");
    expect(table.get("c")).toBeUndefined();
    expect(["a", "b", "d"].map((s) => table.get(s) !== undefined)).toEqual([true, true, true]);
    expect(table.evictions).toBe(1);
    // A peer's new binding makes room the same way (the LRU now is "a").
    expect(table.applyReplica({ sessionId: "e", target: { workerId: 1n, dpRank: 0 }, version: { sequence: 91n, writerId: 9n } })).toBe("inserted");
    expect(table.get("a")).toBeUndefined();
    expect(table.fallbacks).toBe(0);
  });

  it("a full table of leased bindings routes new sessions unpinned and counts the fallback", () => {
    const clock = new ManualClock(0);
    const table = makeTable({ maxEntries: 2 }, clock);
    table.commit("a", { workerId: 1n, dpRank: 0 });
    table.commit("b", { workerId: 1n, dpRank: 0 });
    expect(table.commit("c", { workerId: 1n, dpRank: 0 })).toEqual({ kind: "unpinned" });
    expect(table.fallbacks).toBe(1);
    expect(table.resolve("c")).toBeUndefined();
    // Existing sessions still work at capacity.
    expect(table.commit("a", { workerId: 1n, dpRank: 0 }).kind).toBe("refreshed");
    expect(table.applyReplica({ sessionId: "d", target: { workerId: 1n, dpRank: 0 }, version: { sequence: 50n, writerId: 9n } })).toBe(
      "rejected-capacity",
    );
    expect(table.fallbacks).toBe(1);
  });

  it("a full table reclaims idle-expired entries before refusing", () => {
    const clock = new ManualClock(0);
    const table = makeTable({ maxEntries: 1 }, clock);
    table.release(leaseOf(table.commit("a", { workerId: 1n, dpRank: 0 })));
    clock.advance(TTL_MS);
    expect(table.commit("b", { workerId: 1n, dpRank: 0 }).kind).toBe("bound");
    expect(table.get("a")).toBeUndefined();
    expect(table.fallbacks).toBe(0);
  });

  it("limits session ids to 256 UTF-8 bytes and rejects empty ids", () => {
    const table = makeTable();
    expect(table.commit("x".repeat(256), { workerId: 1n, dpRank: 0 }).kind).toBe("bound");
    const tooLong = catchError(() => table.commit("x".repeat(257), { workerId: 1n, dpRank: 0 }));
    expect(tooLong.code).toBe("KVMESH_BAD_REQUEST");
    expect(tooLong.details).toEqual({ field: "session_id" });
    expect(tooLong.message).toContain("session_id");
    // "é" is 2 bytes, "€" is 3, "😀" is 4: 128 × 2 fits, 86 × 3 = 258 does not.
    expect(table.resolve("é".repeat(128))).toBeUndefined();
    expect(() => table.resolve("é".repeat(129))).toThrow(KvmeshError);
    expect(() => table.resolve("€".repeat(86))).toThrow(/258 bytes/);
    expect(table.resolve("😀".repeat(64))).toBeUndefined();
    expect(() => table.resolve("😀".repeat(65))).toThrow(KvmeshError);
    expect(catchError(() => table.resolve("")).details).toEqual({ field: "session_id" });
    expect(
      table.applyReplica({ sessionId: "€".repeat(86), target: { workerId: 1n, dpRank: 0 }, version: { sequence: 1n, writerId: 2n } }),
    ).toBe("rejected-invalid");
  });
});

describe("AffinityTable leases and expiry", () => {
  it("leases keep a binding alive past the TTL; the release refreshes and republishes it", () => {
    const clock = new ManualClock(0);
    const table = makeTable({}, clock);
    const events = record(table);
    const lease = leaseOf(table.commit("s", { workerId: 1n, dpRank: 0 }));
    clock.advance(TTL_MS * 5);
    expect(table.sweep()).toBe(0);
    expect(table.resolve("s")).toEqual({ workerId: 1n, dpRank: 0 });
    table.release(lease);
    expect(table.get("s")).toMatchObject({ leases: 0, idleDeadlineMs: TTL_MS * 6 });
    expect(events.at(-1)).toEqual({
      binding: { sessionId: "s", target: { workerId: 1n, dpRank: 0 }, version: { sequence: 1n, writerId: 1n } },
      reason: "refresh",
    });
    const count = events.length;
    table.release(lease); // double release is a no-op
    expect(table.get("s")?.leases).toBe(0);
    expect(events).toHaveLength(count);
    clock.advance(TTL_MS - 1);
    expect(table.resolve("s")).toBeDefined();
    clock.advance(1);
    expect(table.resolve("s")).toBeUndefined();
  });

  it("idle bindings expire after the TTL and sweep removes them", () => {
    const clock = new ManualClock(0);
    const table = makeTable({}, clock);
    table.release(leaseOf(table.commit("a", { workerId: 1n, dpRank: 0 })));
    clock.advance(5_000);
    table.release(leaseOf(table.commit("b", { workerId: 1n, dpRank: 0 })));
    clock.advance(5_000);
    expect(table.snapshot().map((b) => b.sessionId)).toEqual(["b"]);
    expect(table.size).toBe(2);
    expect(table.sweep()).toBe(1);
    expect(table.size).toBe(1);
    expect(table.get("a")).toBeUndefined();
    // An expired session binds afresh with a new version.
    clock.advance(5_000);
    const outcome = table.commit("b", { workerId: 2n, dpRank: 0 });
    expect(outcome.kind).toBe("bound");
    expect(leaseOf(outcome).version.sequence).toBe(3n);
  });

  it("a lease on a dropped binding does not touch the session's next binding", () => {
    const table = makeTable();
    const old = leaseOf(table.commit("s", { workerId: 1n, dpRank: 0 }));
    expect(table.dropWorker(1n)).toBe(1);
    table.commit("s", { workerId: 2n, dpRank: 0 });
    table.release(old);
    expect(table.get("s")?.leases).toBe(1);
  });

  it("sweep republishes leased bindings every half TTL so peers keep them alive", () => {
    const clock = new ManualClock(0);
    const a = makeTable({ writerId: 1n }, clock);
    const b = makeTable({ writerId: 2n }, clock);
    a.onBinding((binding) => b.applyReplica(binding));
    const lease = leaseOf(a.commit("s", { workerId: 1n, dpRank: 0 }));
    const interval = affinitySweepIntervalMs(TTL_MS);
    for (let t = 0; t < TTL_MS * 4; t += interval) {
      clock.advance(interval);
      a.sweep();
      b.sweep();
      expect(b.resolve("s")).toEqual({ workerId: 1n, dpRank: 0 });
    }
    a.release(lease);
    clock.advance(TTL_MS);
    a.sweep();
    b.sweep();
    expect(b.resolve("s")).toBeUndefined();
    expect(a.resolve("s")).toBeUndefined();
  });
});

describe("AffinityTable departures", () => {
  it("dropWorker removes every binding to the worker", () => {
    const table = makeTable();
    table.commit("a", { workerId: 1n, dpRank: 0 });
    table.commit("b", { workerId: 1n, dpRank: 1 });
    table.commit("c", { workerId: 2n, dpRank: 0 });
    table.applyReplica({ sessionId: "d", target: { workerId: 1n, dpRank: null }, version: { sequence: 9n, writerId: 5n } });
    expect(table.dropWorker(1n)).toBe(3);
    expect(table.snapshot().map((b) => b.sessionId)).toEqual(["c"]);
    expect(table.dropWorker(1n)).toBe(0);
  });

  it("dropTarget removes only ranked bindings to the removed rank", () => {
    const table = makeTable();
    table.commit("r0", { workerId: 1n, dpRank: 0 });
    table.commit("r1", { workerId: 1n, dpRank: 1 });
    table.applyReplica({ sessionId: "wo", target: { workerId: 1n, dpRank: null }, version: { sequence: 9n, writerId: 5n } });
    expect(table.dropTarget(1n, 1)).toBe(1);
    expect(table.resolve("r1")).toBeUndefined();
    expect(table.resolve("r0")).toEqual({ workerId: 1n, dpRank: 0 });
    expect(table.resolve("wo")).toEqual({ workerId: 1n, dpRank: null });
  });
});

describe("AffinityTable replica merge", () => {
  const bind = (sessionId: string, workerId: bigint, dpRank: number | null, sequence: bigint, writerId: bigint): SessionBinding => ({
    sessionId,
    target: { workerId, dpRank },
    version: { sequence, writerId },
  });

  it("compares versions by sequence, then writer id", () => {
    expect(compareVersions({ sequence: 2n, writerId: 1n }, { sequence: 1n, writerId: 9n })).toBe(1);
    expect(compareVersions({ sequence: 2n, writerId: 1n }, { sequence: 2n, writerId: 3n })).toBe(-1);
    expect(compareVersions({ sequence: 2n, writerId: 3n }, { sequence: 2n, writerId: 3n })).toBe(0);
  });

  it("inserts a vacant session with no leases and a fresh deadline, without re-emitting", () => {
    const clock = new ManualClock(1_000);
    const table = makeTable({ writerId: 1n }, clock);
    const events = record(table);
    expect(table.applyReplica(bind("s", 3n, 0, 40n, 2n))).toBe("inserted");
    expect(table.get("s")).toEqual({
      target: { workerId: 3n, dpRank: 0 },
      version: { sequence: 40n, writerId: 2n },
      leases: 0,
      idleDeadlineMs: 11_000,
    });
    expect(table.nextSequence).toBe(41n);
    expect(events).toHaveLength(0);
  });

  it("refreshes the same target at an equal or newer version, ignores an older one", () => {
    const clock = new ManualClock(0);
    const table = makeTable({ writerId: 1n }, clock);
    table.applyReplica(bind("s", 3n, 0, 40n, 2n));
    clock.advance(3_000);
    expect(table.applyReplica(bind("s", 3n, 0, 40n, 2n))).toBe("refreshed");
    expect(table.get("s")?.idleDeadlineMs).toBe(13_000);
    expect(table.applyReplica(bind("s", 3n, 0, 45n, 3n))).toBe("refreshed");
    expect(table.get("s")?.version).toEqual({ sequence: 45n, writerId: 3n });
    clock.advance(1_000);
    expect(table.applyReplica(bind("s", 3n, 0, 44n, 9n))).toBe("ignored-conflict");
    expect(table.get("s")?.version).toEqual({ sequence: 45n, writerId: 3n });
    expect(table.get("s")?.idleDeadlineMs).toBe(13_000);
  });

  it("replaces a different target only with a newer version", () => {
    const table = makeTable({ writerId: 1n });
    table.applyReplica(bind("s", 3n, 0, 40n, 5n));
    expect(table.applyReplica(bind("s", 4n, 0, 40n, 4n))).toBe("ignored-conflict");
    expect(table.applyReplica(bind("s", 4n, 0, 39n, 9n))).toBe("ignored-conflict");
    expect(table.resolve("s")).toEqual({ workerId: 3n, dpRank: 0 });
    expect(table.applyReplica(bind("s", 4n, 0, 40n, 6n))).toBe("replaced-newer");
    expect(table.resolve("s")).toEqual({ workerId: 4n, dpRank: 0 });
    expect(table.applyReplica(bind("s", 4n, null, 41n, 2n))).toBe("replaced-newer");
    expect(table.resolve("s")).toEqual({ workerId: 4n, dpRank: null });
  });

  it("replaces an idle-expired binding whatever its version", () => {
    const clock = new ManualClock(0);
    const table = makeTable({ writerId: 1n }, clock);
    table.applyReplica(bind("s", 3n, 0, 90n, 5n));
    clock.advance(TTL_MS);
    expect(table.applyReplica(bind("s", 4n, 0, 10n, 2n))).toBe("replaced-expired");
    expect(table.get("s")).toMatchObject({ target: { workerId: 4n, dpRank: 0 }, leases: 0, idleDeadlineMs: 2 * TTL_MS });
  });

  it("keeps local leases when a newer peer binding replaces the target", () => {
    const clock = new ManualClock(0);
    const table = makeTable({ writerId: 1n }, clock);
    const events = record(table);
    const lease = leaseOf(table.commit("s", { workerId: 1n, dpRank: 0 }));
    expect(table.applyReplica(bind("s", 2n, 0, 50n, 2n))).toBe("replaced-newer");
    expect(table.get("s")?.leases).toBe(1);
    clock.advance(TTL_MS * 2);
    expect(table.resolve("s")).toEqual({ workerId: 2n, dpRank: 0 });
    table.release(lease);
    expect(table.get("s")?.leases).toBe(0);
    expect(events.map((e) => e.reason)).toEqual(["bind"]); // the stale lease does not republish
  });

  it("advances the Lamport clock on every event, including ignored and rejected ones", () => {
    const table = makeTable({ writerId: 1n, maxEntries: 1 });
    table.commit("mine", { workerId: 1n, dpRank: 0 });
    expect(table.nextSequence).toBe(2n);
    expect(table.applyReplica(bind("x", 1n, 0, 10n, 1n))).toBe("ignored-own");
    expect(table.nextSequence).toBe(11n);
    expect(table.applyReplica(bind("mine", 2n, 0, 1n, 0n))).toBe("ignored-conflict");
    expect(table.applyReplica(bind("mine", 2n, 0, 20n, 0n))).toBe("replaced-newer");
    expect(table.nextSequence).toBe(21n);
    expect(table.applyReplica(bind("other", 2n, 0, 30n, 2n))).toBe("rejected-capacity");
    expect(table.nextSequence).toBe(31n);
    expect(table.applyReplica(bind("x".repeat(300), 2n, 0, 40n, 2n))).toBe("rejected-invalid");
    expect(table.nextSequence).toBe(41n);
    expect(table.applyReplica(bind("y", 2n, 0, 5n, 2n))).toBe("rejected-capacity");
    expect(table.nextSequence).toBe(41n); // never goes backwards
    table.dropWorker(2n);
    const outcome = table.commit("later", { workerId: 3n, dpRank: 0 });
    expect(leaseOf(outcome).version).toEqual({ sequence: 41n, writerId: 1n });
  });

  it("rejects malformed bindings", () => {
    const table = makeTable({ writerId: 1n });
    expect(table.applyReplica(bind("s", -1n, 0, 1n, 2n))).toBe("rejected-invalid");
    expect(table.applyReplica(bind("s", 1n, -1, 1n, 2n))).toBe("rejected-invalid");
    expect(table.applyReplica(bind("s", 1n, 0.5, 1n, 2n))).toBe("rejected-invalid");
    expect(table.applyReplica(bind("s", 1n, 0, 1n << 64n, 2n))).toBe("rejected-invalid");
    expect(table.applyReplica(bind("", 1n, 0, 1n, 2n))).toBe("rejected-invalid");
    expect(table.size).toBe(0);
  });

  it("snapshot round-trips into a fresh replica", () => {
    const clock = new ManualClock(0);
    const source = makeTable({ writerId: 1n }, clock);
    source.commit("a", { workerId: 1n, dpRank: 0 });
    source.commit("b", { workerId: 2n, dpRank: 3 });
    source.applyReplica(bind("c", 3n, null, 70n, 9n));
    source.release(leaseOf(source.commit("gone", { workerId: 1n, dpRank: 0 })));
    clock.advance(TTL_MS); // "gone" idles out; the others are leased or refreshed below
    source.applyReplica(bind("c", 3n, null, 70n, 9n));
    const snap = source.snapshot();
    expect(snap.map((b) => b.sessionId).sort()).toEqual(["a", "b", "c"]);
    const replica = makeTable({ writerId: 2n }, clock);
    for (const binding of snap) expect(replica.applyReplica(binding)).toBe("inserted");
    expect(replica.snapshot()).toEqual(snap);
    expect(replica.nextSequence).toBe(71n);
  });
});

describe("AffinityTable replication convergence", () => {
  interface Event {
    readonly to: 0 | 1;
    readonly binding: SessionBinding;
  }

  function shuffle<T>(items: T[], next: () => number): T[] {
    for (let i = items.length - 1; i > 0; i--) {
      const j = Math.floor(next() * (i + 1));
      const tmp = items[i] as T;
      items[i] = items[j] as T;
      items[j] = tmp;
    }
    return items;
  }

  const view = (table: AffinityTable): string[] =>
    table
      .snapshot()
      .map((b) => `${b.sessionId}->${b.target.workerId.toString()}/${String(b.target.dpRank)}@${b.version.sequence.toString()}.${b.version.writerId.toString()}`)
      .sort();

  it("two soft tables converge whatever order their bindings arrive in", () => {
    for (let seed = 1; seed <= 200; seed++) {
      const random = seededRandom(seed);
      const clock = new ManualClock(0);
      const tables = [
        makeTable({ mode: "soft", writerId: 1n, initialSequence: 1n }, clock),
        makeTable({ mode: "soft", writerId: 2n, initialSequence: 1n }, clock),
      ] as const;
      const inFlight: Event[] = [];
      tables[0].onBinding((binding) => inFlight.push({ to: 1, binding }));
      tables[1].onBinding((binding) => inFlight.push({ to: 0, binding }));

      // Both replicas route the same few sessions to different workers while bindings are in
      // flight, delivered in a random order, so concurrent bindings conflict.
      const sessions = ["s0", "s1", "s2"];
      const emitted = new Set<string>();
      for (let step = 0; step < 40; step++) {
        if (inFlight.length > 0 && random.next() < 0.4) {
          const [event] = inFlight.splice(Math.floor(random.next() * inFlight.length), 1);
          if (event !== undefined) tables[event.to].applyReplica(event.binding);
          continue;
        }
        const table = tables[Math.floor(random.next() * 2) as 0 | 1];
        const sessionId = sessions[Math.floor(random.next() * sessions.length)] as string;
        const workerId = BigInt(1 + Math.floor(random.next() * 3));
        table.commit(sessionId, { workerId, dpRank: 0 });
        emitted.add(sessionId);
      }
      for (const event of shuffle(inFlight.splice(0), () => random.next())) tables[event.to].applyReplica(event.binding);

      expect(view(tables[0])).toEqual(view(tables[1]));
      expect(view(tables[0])).toHaveLength(emitted.size);
    }
  });

  it("a hard-mode replica follows a peer's newer binding and steers the next commit to it", () => {
    const clock = new ManualClock(0);
    const a = makeTable({ writerId: 1n }, clock);
    const b = makeTable({ writerId: 2n }, clock);
    a.onBinding((binding) => b.applyReplica(binding));
    b.onBinding((binding) => a.applyReplica(binding));
    a.release(leaseOf(a.commit("s", { workerId: 1n, dpRank: 0 })));
    expect(b.resolve("s")).toEqual({ workerId: 1n, dpRank: 0 });
    // Worker 1 departs on both replicas; b binds the session to worker 2, a follows.
    a.dropWorker(1n);
    b.dropWorker(1n);
    b.commit("s", { workerId: 2n, dpRank: 0 });
    expect(a.resolve("s")).toEqual({ workerId: 2n, dpRank: 0 });
    expect(a.commit("s", { workerId: 2n, dpRank: 0 }).kind).toBe("refreshed");
    expect(() => a.commit("s", { workerId: 3n, dpRank: 0 })).toThrow(KvmeshError);
  });
});
