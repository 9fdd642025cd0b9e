import { describe, expect, it } from "vitest";
import { ManualClock } from "../../../src/core/time.js";
import { seededRandom } from "../../../src/core/random.js";
import type { BindingEvent } from "../../../src/core/replica-events.js";
import { DEFAULT_PARKED_BINDING_TTL_MS, SelectionService, type SelectionServiceOptions } from "../../../src/core/selection-service.js";
import type { SessionBindingInput } from "../../../src/core/session-binding-input.js";
import type { SessionBindingBatch, SessionBindingSubscription } from "../../../src/core/session-binding-stream.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";
import { tokens, worker } from "../../helpers/core-fixtures.js";

type Mode = "hard" | "soft";

/** A host-replication service with workers `workerIds` registered. */
function hostService(writerId: bigint, o: { mode?: Mode; workerIds?: number[]; clock?: ManualClock; extra?: Partial<SelectionServiceOptions> } = {}): SelectionService {
  const svc = new SelectionService({
    clock: o.clock ?? new ManualClock(1_000),
    random: seededRandom(Number(writerId)),
    wallClockNs: () => 5_000n,
    sessionAffinity: { ttlSecs: 60, mode: o.mode ?? "soft" },
    sessionReplicationWriterId: writerId,
    ...o.extra,
  });
  for (const id of o.workerIds ?? [1, 2, 3]) svc.upsertWorker(worker(id));
  return svc;
}

/** The next batch, failing instead of hanging when none comes. */
async function nextBatch(sub: SessionBindingSubscription, timeoutMs = 1_000): Promise<SessionBindingBatch> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      reject(new Error(`no batch within ${timeoutMs} ms`));
    }, timeoutMs);
  });
  try {
    const r = await Promise.race([sub.next(), timeout]);
    if (r.done === true) throw new Error("stream ended");
    return r.value;
  } finally {
    clearTimeout(timer);
  }
}

/** Whether a batch arrives within `ms` (it must not, in the tests that call this). */
async function batchWithin(sub: SessionBindingSubscription, ms: number): Promise<boolean> {
  return nextBatch(sub, ms).then(
    () => true,
    () => false,
  );
}

const sessionTarget = (svc: SelectionService, sessionId: string): bigint => svc.select({ token_ids: tokens(1, 77), session_id: sessionId }).worker_id;

const binding = (over: Partial<Record<keyof SessionBindingInput, unknown>> = {}): SessionBindingInput =>
  ({ model_name: "default", routing_group: "default", session_id: "s", worker_id: 2n, dp_rank: 0, sequence: 10n, writer_id: 9n, reason: "bind", ...over }) as SessionBindingInput;

describe("host replication: the binding stream", () => {
  it("publishes a binding on commit and a refresh when the session's request finishes", async () => {
    const svc = hostService(7n);
    const sub = svc.sessionBindingUpdates();
    const r = svc.selectAndReserve({ token_ids: tokens(2), session_id: "conv-1", selection_id: "a" });
    const bound = await nextBatch(sub);
    expect(bound.dropped).toBe(0);
    expect(bound.bindings).toHaveLength(1);
    const b = bound.bindings[0] as BindingEvent;
    expect(b).toMatchObject({ model_name: "default", routing_group: "default", session_id: "conv-1", worker_id: r.worker_id, dp_rank: 0, writer_id: 7n, reason: "bind" });
    // Finishing the request is a use: the same version goes out again as a refresh.
    svc.freeReservation("a");
    const refreshed = await nextBatch(sub);
    expect(refreshed.bindings).toEqual([{ ...b, reason: "refresh" }]);
    expect(svc.stats.bindingsPublished).toBe(2);
    expect(await batchWithin(sub, 30)).toBe(false);
    await sub.return();
  });

  it("drains everything queued as one batch and coalesces a session's bindings while they wait", async () => {
    const svc = hostService(7n);
    const sub = svc.sessionBindingUpdates();
    for (let i = 0; i < 5; i++) svc.selectAndReserve({ token_ids: tokens(2, i), session_id: `s${i}`, selection_id: `r${i}` });
    // s0's request finishes before the consumer wakes: one binding for s0, still marked a bind.
    svc.freeReservation("r0");
    const batch = await nextBatch(sub);
    expect(batch.bindings.map((x) => x.session_id)).toEqual(["s0", "s1", "s2", "s3", "s4"]);
    expect(batch.bindings.map((x) => x.reason)).toEqual(["bind", "bind", "bind", "bind", "bind"]);
    expect(sub.coalesced).toBe(1);
    expect(svc.stats.bindingsPublished).toBe(6);
  });

  it("sheds past its bound, counts it, says so on the next batch, and a snapshot repairs it", async () => {
    const svc = hostService(7n);
    const sub = svc.sessionBindingUpdates({ maxPendingBindings: 2 });
    for (let i = 0; i < 3; i++) svc.selectAndReserve({ token_ids: tokens(2, i), session_id: `s${i}`, selection_id: `r${i}` });
    const batch = await nextBatch(sub);
    expect(batch.bindings.map((x) => x.session_id)).toEqual(["s0", "s1"]);
    expect(batch.dropped).toBe(1);
    expect(svc.stats.droppedBindings).toBe(1);
    expect(sub.dropped).toBe(1);
    // The repair a consumer publishes: every live binding, s2 included.
    expect(svc.bindingsSnapshot().map((x) => x.session_id).sort()).toEqual(["s0", "s1", "s2"]);
    // A binding for a session already waiting is never shed (it replaces the waiting one).
    svc.selectAndReserve({ token_ids: tokens(2, 0), session_id: "s0", selection_id: "again" });
    svc.freeReservation("again");
    expect(sub.pending).toBe(1);
    expect(svc.stats.droppedBindings).toBe(1);
  });

  it("gives every consumer all bindings; break, abort and shutdown end a subscription", async () => {
    const svc = hostService(7n);
    const a = svc.sessionBindingUpdates();
    const ctl = new AbortController();
    const b = svc.sessionBindingUpdates({ signal: ctl.signal });
    expect(svc.sessionBindingSubscribers).toBe(2);
    svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "x" });
    expect((await nextBatch(a)).bindings).toHaveLength(1);
    expect((await nextBatch(b)).bindings).toHaveLength(1);
    ctl.abort();
    expect(await b.next()).toEqual({ done: true, value: undefined });
    expect(svc.sessionBindingSubscribers).toBe(1);
    let seen = 0;
    svc.selectAndReserve({ token_ids: tokens(2), session_id: "t", selection_id: "y" });
    for await (const batch of a) {
      seen += batch.bindings.length;
      break;
    }
    expect(seen).toBe(1);
    expect(svc.sessionBindingSubscribers).toBe(0);
    // Shutdown: what is queued is still delivered, then the stream ends.
    const c = svc.sessionBindingUpdates();
    svc.freeReservation("y");
    svc.shutdown();
    const batches: SessionBindingBatch[] = [];
    for await (const batch of c) batches.push(batch);
    expect(batches.map((x) => x.bindings.map((y) => y.reason))).toEqual([["refresh"]]);
    expect(svc.sessionBindingSubscribers).toBe(0);
    // An already aborted signal gives an ended stream.
    const done = new AbortController();
    done.abort();
    expect(await hostService(8n).sessionBindingUpdates({ signal: done.signal }).next()).toEqual({ done: true, value: undefined });
  });

  it("refuses a second next() while one is pending", async () => {
    const sub = hostService(7n).sessionBindingUpdates();
    const first = sub.next();
    await expect(sub.next()).rejects.toThrow(/before the previous call resolved/);
    await sub.return();
    expect(await first).toEqual({ done: true, value: undefined });
  });
});

describe("host replication: applySessionBinding", () => {
  it("answers each outcome of the version merge", () => {
    const svc = hostService(7n);
    const out = svc.applySessionBinding([
      binding({ session_id: "a", sequence: 10n }),
      binding({ session_id: "a", sequence: 10n, reason: "refresh" }),
      binding({ session_id: "a", sequence: 12n, worker_id: 3n, reason: "rebind" }),
      binding({ session_id: "a", sequence: 11n, worker_id: 1n }),
      binding({ session_id: "b", writer_id: 7n }),
      binding({ session_id: "c", worker_id: 99n }),
      binding({ session_id: "d", worker_id: "2" }),
    ]);
    expect(out.map((o) => o.outcome)).toEqual(["inserted", "refreshed", "replaced-newer", "ignored-conflict", "ignored-own", "parked-unknown-worker", "rejected-invalid"]);
    expect(out[6]?.reason).toMatch(/^worker_id: /);
    expect(sessionTarget(svc, "a")).toBe(3n);
    // A single binding in, a single outcome out; numbers are fine for small u64s.
    expect(svc.applySessionBinding(binding({ session_id: "e", worker_id: 1, sequence: 20, writer_id: 9 }))).toEqual({ outcome: "inserted" });
    expect(sessionTarget(svc, "e")).toBe(1n);
    // Applied bindings are not re-published: no echo between replicas.
    expect(svc.stats.bindingsPublished).toBe(0);
  });

  it("validates every field and names it", () => {
    const svc = hostService(7n);
    const cases: [Partial<Record<keyof SessionBindingInput, unknown>>, string][] = [
      [{ model_name: 5 }, "model_name"],
      [{ routing_group: null }, "routing_group"],
      [{ session_id: "" }, "session_id"],
      [{ session_id: "x".repeat(257) }, "session_id"],
      [{ worker_id: -1n }, "worker_id"],
      [{ worker_id: 1n << 64n }, "worker_id"],
      [{ worker_id: 2 ** 60 }, "worker_id"],
      [{ dp_rank: -1 }, "dp_rank"],
      [{ dp_rank: 0.5 }, "dp_rank"],
      [{ dp_rank: undefined }, "dp_rank"],
      [{ sequence: "10" }, "sequence"],
      [{ writer_id: undefined }, "writer_id"],
      [{ reason: "moved" }, "reason"],
    ];
    for (const [over, field] of cases) {
      const out = svc.applySessionBinding(binding(over));
      expect(out.outcome, field).toBe("rejected-invalid");
      expect(out.reason, field).toMatch(new RegExp(`^${field}: `));
    }
    const notObject = svc.applySessionBinding([null as unknown as SessionBindingInput]);
    expect(notObject[0]).toEqual({ outcome: "rejected-invalid", reason: "binding: must be an object" });
    // A worker-only binding (dp_rank null) is valid.
    expect(svc.applySessionBinding(binding({ session_id: "wo", dp_rank: null })).outcome).toBe("inserted");
    expect(svc.stats.bindingsIgnored).toBe(cases.length + 1);
  });

  it("parks a binding that arrives before its worker and applies it when the worker registers", () => {
    const clock = new ManualClock(1_000);
    const svc = hostService(7n, { clock, workerIds: [1] });
    expect(svc.applySessionBinding(binding({ session_id: "early", worker_id: 2n })).outcome).toBe("parked-unknown-worker");
    expect(sessionTarget(svc, "early")).toBe(1n);
    svc.upsertWorker(worker(2));
    expect(svc.parkedBindings).toBe(0);
    expect(svc.stats.bindingsUnparked).toBe(1);
    expect(sessionTarget(svc, "early")).toBe(2n);
    // A partition nobody registered yet: parked too, applied with its first worker.
    expect(svc.applySessionBinding(binding({ model_name: "m2", session_id: "p", worker_id: 5n })).outcome).toBe("parked-unknown-worker");
    svc.upsertWorker(worker(5, { model_name: "m2" }));
    expect(svc.select({ token_ids: tokens(1), model_name: "m2", session_id: "p" }).worker_id).toBe(5n);
    // Parked bindings whose worker never comes expire.
    svc.applySessionBinding(binding({ session_id: "never", worker_id: 42n }));
    clock.advance(DEFAULT_PARKED_BINDING_TTL_MS);
    svc.tick();
    expect(svc.parkedBindings).toBe(0);
    expect(svc.stats.parkedBindingsExpired).toBe(1);
  });

  it("a parked peer binding still advances the Lamport clock of local binds", async () => {
    const svc = hostService(7n, { workerIds: [1] });
    const sub = svc.sessionBindingUpdates();
    svc.applySessionBinding(binding({ session_id: "x", worker_id: 2n, sequence: 1_000_000n }));
    svc.selectAndReserve({ token_ids: tokens(2), session_id: "y", selection_id: "r" });
    const [b] = (await nextBatch(sub)).bindings;
    expect(b?.sequence).toBe(1_000_001n);
  });
});

describe("host replication: services wired only through the stream and apply", () => {
  /** Drains each service's stream once and hands the batches to the others in a shuffled order. */
  async function relayShuffled(services: SelectionService[], subs: SessionBindingSubscription[], seed: number): Promise<string[]> {
    const items: { from: number; b: BindingEvent }[] = [];
    for (let i = 0; i < subs.length; i++) {
      const sub = subs[i] as SessionBindingSubscription;
      if (sub.pending === 0) continue;
      for (const b of (await nextBatch(sub)).bindings) items.push({ from: i, b });
    }
    const rnd = seededRandom(seed);
    for (let k = items.length - 1; k > 0; k--) {
      const j = Math.floor(rnd.next() * (k + 1));
      [items[k], items[j]] = [items[j] as (typeof items)[number], items[k] as (typeof items)[number]];
    }
    const outcomes: string[] = [];
    for (const { from, b } of items) services.forEach((s, j) => j !== from && outcomes.push(s.applySessionBinding(b).outcome));
    return outcomes;
  }

  it("three services converge by version whatever the arrival order", async () => {
    const seen = new Set<string>();
    for (let trial = 0; trial < 12; trial++) {
      const services = [1n, 2n, 3n].map((id) => hostService(id));
      const subs = services.map((s) => s.sessionBindingUpdates());
      // Each binds the same sessions to a different worker before hearing of the others. Equal
      // sequences (same wall-clock seed): writer id 3 wins the tie, so worker 3 everywhere.
      services.forEach((s, i) => {
        for (const sid of ["s", "t"]) s.selectAndReserve({ token_ids: tokens(1), session_id: sid, selection_id: `${sid}${i}`, allowed_worker_ids: [BigInt(i + 1)] });
      });
      for (const o of await relayShuffled(services, subs, trial)) seen.add(o);
      for (const sid of ["s", "t"]) expect(services.map((s) => sessionTarget(s, sid))).toEqual([3n, 3n, 3n]);
      // Nothing applied was re-published, so there is nothing more to relay.
      expect(subs.map((s) => s.pending)).toEqual([0, 0, 0]);
    }
    // The orders exercised both sides of the merge.
    expect(seen).toContain("replaced-newer");
    expect(seen).toContain("ignored-conflict");
  });

  it("soft mode follows a custom allowlist, rebinds with a newer version, and the move reaches the peers", async () => {
    const services = [1n, 2n, 3n].map((id) => hostService(id, { mode: "soft" }));
    const [a, b, c] = services as [SelectionService, SelectionService, SelectionService];
    const subs = services.map((s) => s.sessionBindingUpdates());
    const first = a.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "a1", allowed_worker_ids: [1n] });
    expect(first.worker_id).toBe(1n);
    await relayShuffled(services, subs, 1);
    expect(sessionTarget(b, "s")).toBe(1n);
    // B's caller only allows worker 2: B picks it and rebinds.
    const moved = b.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "b1", allowed_worker_ids: [2n] });
    expect(moved.worker_id).toBe(2n);
    const [rebind] = (await nextBatch(subs[1] as SessionBindingSubscription)).bindings;
    expect(rebind).toMatchObject({ session_id: "s", worker_id: 2n, writer_id: 2n, reason: "rebind" });
    expect(rebind?.sequence).toBeGreaterThan(5_000n);
    expect(a.applySessionBinding(rebind as BindingEvent).outcome).toBe("replaced-newer");
    expect(c.applySessionBinding(rebind as BindingEvent).outcome).toBe("replaced-newer");
    expect(services.map((s) => sessionTarget(s, "s"))).toEqual([2n, 2n, 2n]);
  });

  it("hard mode rejects the allowlist's move and publishes only the unbind", async () => {
    const svc = hostService(1n, { mode: "hard" });
    const sub = svc.sessionBindingUpdates();
    svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "a", allowed_worker_ids: [1n] });
    await nextBatch(sub);
    const err = kvmeshErrorOf(() => svc.selectAndReserve({ token_ids: tokens(2), session_id: "s", selection_id: "b", allowed_worker_ids: [2n] }));
    expect(err.code).toBe("KVMESH_SESSION_CONFLICT");
    expect(err.status).toBe(400);
    expect(svc.hasReservation("b")).toBe(false);
    const unbind = (await nextBatch(sub)).bindings;
    expect(unbind.map((b) => [b.session_id, b.worker_id, b.reason])).toEqual([["s", 1n, "unbind"]]);
    expect(await batchWithin(sub, 30)).toBe(false);
  });
});

describe("host replication: configuration", () => {
  const base = { clock: new ManualClock(0), sessionAffinity: { ttlSecs: 60 } } as const;

  it("takes the host's writer id (bigint or safe number) as writer id and default replica id", async () => {
    const svc = new SelectionService({ ...base, sessionReplicationWriterId: 42 });
    expect(svc.sessionReplicationWriterId).toBe(42n);
    expect(svc.replicaId).toBe(42n);
    const both = new SelectionService({ ...base, sessionReplicationWriterId: 42n, replicaId: 5n });
    expect([both.replicaId, both.sessionReplicationWriterId]).toEqual([5n, 42n]);
    both.upsertWorker(worker(1));
    const sub = both.sessionBindingUpdates();
    both.selectAndReserve({ token_ids: tokens(1), session_id: "s" });
    expect((await nextBatch(sub)).bindings[0]?.writer_id).toBe(42n);
    // Its own writer id coming back is an echo, whatever the replica id.
    expect(both.applySessionBinding(binding({ writer_id: 42n, worker_id: 1n })).outcome).toBe("ignored-own");
    expect(both.applySessionBinding(binding({ writer_id: 42n, worker_id: 99n })).outcome).toBe("ignored-own");
    expect(both.applySessionBinding(binding({ session_id: "other", writer_id: 5n, worker_id: 1n })).outcome).toBe("inserted");
  });

  it("rejects misconfigurations with a typed error naming the option", () => {
    const cases: [SelectionServiceOptions, string, RegExp][] = [
      [{ sessionReplicationWriterId: 1n }, "sessionReplicationWriterId", /needs sessionAffinity/],
      [{ ...base, sessionReplicationWriterId: 1n, replicaSync: { publishBind: "tcp://127.0.0.1:7100" } }, "sessionReplicationWriterId", /replicaSync/],
      [{ ...base, sessionReplicationWriterId: 0n }, "sessionReplicationWriterId", /non-zero/],
      [{ ...base, sessionReplicationWriterId: -3 }, "sessionReplicationWriterId", /non-zero/],
      [{ ...base, sessionReplicationWriterId: 1n << 64n }, "sessionReplicationWriterId", /64-bit/],
      [{ ...base, sessionReplicationWriterId: 2 ** 60 }, "sessionReplicationWriterId", /2\^53/],
      [{ ...base, sessionReplicationWriterId: 1.5 }, "sessionReplicationWriterId", /64-bit/],
      [{ ...base, replicaSync: { publishBind: "" } }, "replicaSync.publishBind", /non-empty/],
      [{ ...base, replicaSync: { publishBind: "tcp://a:1", peers: ["tcp://b:1", ""] } }, "replicaSync.peers[1]", /non-empty/],
    ];
    for (const [options, field, message] of cases) {
      const err = kvmeshErrorOf(() => new SelectionService(options));
      expect(err.code, field).toBe("KVMESH_BAD_REQUEST");
      expect(err.details, field).toEqual({ field });
      expect(err.message, field).toMatch(message);
      expect(err.message, field).toContain(field.split(/[.[]/)[0] as string);
    }
    // The mesh alone is fine (the daemon starts it; the service only checks).
    expect(() => new SelectionService({ ...base, replicaSync: { publishBind: "tcp://127.0.0.1:7100", peers: ["tcp://127.0.0.1:7102"] } })).not.toThrow();
  });

  it("refuses the host-replication calls without a writer id (409)", () => {
    const svc = new SelectionService(base);
    for (const call of [() => svc.sessionBindingUpdates(), () => svc.applySessionBinding([])]) {
      const err = kvmeshErrorOf(call);
      expect(err.code).toBe("KVMESH_HOST_REPLICATION_DISABLED");
      expect(err.status).toBe(409);
    }
    expect(svc.sessionReplicationWriterId).toBeUndefined();
    expect(() => new SelectionService(base).sessionBindingUpdates({ maxPendingBindings: 0 })).toThrow();
    expect(kvmeshErrorOf(() => hostService(1n).sessionBindingUpdates({ maxPendingBindings: 0 })).details).toEqual({ field: "maxPendingBindings" });
  });
});
