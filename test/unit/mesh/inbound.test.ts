import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { ManualClock, ManualTimers } from "../../../src/core/index.js";
import type { CatalogEvent, LoadEvent, WorkerStatusEvent } from "../../../src/core/index.js";
import { DEPARTED_IGNORE_MS, MeshInbound, MAX_CONCURRENT_SNAPSHOT_PULLS, WORKER_CHANGE_RESNAPSHOT_DELAY_MS, type InboundMembership } from "../../../mesh/inbound.js";
import { DEFAULT_SNAPSHOT_TIMEOUT_MS } from "../../../mesh/origin-tracker.js";
import { DEFAULT_DOWN_AFTER_MS, DEFAULT_SUSPECT_AFTER_MS } from "../../../mesh/peer-health.js";
import { TOPIC_HEARTBEAT, type Heartbeat, type MeshBatch, type Snapshot } from "../../../mesh/types.js";
import { encodeHeartbeat } from "../../../mesh/wire.js";
import { FakeReplicaPort } from "../../helpers/fake-replica-port.js";

const SELF = 7n;
const A = 0xa1n;
const EPOCH = 0xe1n;
const CONTROL_A = "tcp://10.0.0.1:7101";
const WALL_T0 = 1_764_000_000_000;

const hb = (seq: number, bookings = 0, origin = A, control = CONTROL_A): Heartbeat => ({
  v: 1,
  origin,
  epoch: EPOCH,
  seq,
  sentAtMs: WALL_T0,
  controlEndpoint: control,
  publishEndpoint: control.replace(/1$/, "0"),
  bookings,
});
const free = (i: number, origin = A): LoadEvent => ({ type: "free", origin, owner: origin, request_id: `r${i}`, partition: { model_name: "m", routing_group: "g" } });
const batch = (seq: number, origin = A): MeshBatch => ({ v: 1, origin, epoch: EPOCH, seq, sentAtMs: WALL_T0, events: [{ kind: "load", event: free(seq, origin) }] });
const snapshot = (seq: number, origin = A): Snapshot => ({ v: 1, origin, epoch: EPOCH, seq, bookings: [], bindings: [] });

/** Membership as inbound sees it, recording what it is told. */
function fakeMembership(): InboundMembership & { heard: [string, bigint][]; snapshotsFrom: [string, bigint][] } {
  const heard: [string, bigint][] = [];
  const snapshotsFrom: [string, bigint][] = [];
  return {
    heard,
    snapshotsFrom,
    peerHeard: (ep, origin) => heard.push([ep, origin]),
    snapshotFrom: (ep, origin) => snapshotsFrom.push([ep, origin]),
    registeredOrigins: () => new Set(),
  };
}

type SnapshotAnswer = (endpoint: string) => Promise<Snapshot>;

/** Inbound on a manual monotonic clock, a separate wall clock, and a scripted control client. */
function setup(answer: SnapshotAnswer = () => new Promise<Snapshot>(() => undefined)) {
  const timers = new ManualTimers(new ManualClock(5_000));
  const wall = new ManualClock(WALL_T0);
  const port = new FakeReplicaPort(SELF);
  const requests: { endpoint: string; atMs: number }[] = [];
  const inbound = new MeshInbound({
    origin: SELF,
    port,
    control: {
      snapshot: (endpoint) => {
        requests.push({ endpoint, atMs: timers.clock.now() });
        return answer(endpoint);
      },
      bindingPage: () => Promise.reject(new Error("these snapshots are never paged")),
    },
    logger: pino({ enabled: false }),
    clock: timers.clock,
    wallClock: wall,
    timers,
  });
  const membership = fakeMembership();
  inbound.bindMembership(membership);
  /** Advances both clocks by `ms` and runs housekeeping, as the mesh's 100 ms timer does. */
  const tick = async (ms: number): Promise<void> => {
    wall.advance(ms);
    timers.advance(ms);
    inbound.housekeeping(timers.clock.now());
    await new Promise<void>((resolve) => setImmediate(resolve));
  };
  return { inbound, port, timers, wall, requests, membership, tick };
}

/** Takes A live at `seq` through a snapshot. */
async function liveAt(s: ReturnType<typeof setup>, seq: number, resolveWith: (snap: Snapshot) => void): Promise<void> {
  s.inbound.onHeartbeat(hb(seq));
  resolveWith(snapshot(seq));
  await s.tick(0);
  expect(s.inbound.receiver.tracker(A)?.state).toBe("live");
}

describe("MeshInbound: peer health on the monotonic clock", () => {
  it("goes suspect after 3 s and down after 10 s of silence, and alive on the next message", async () => {
    const s = setup();
    s.inbound.onHeartbeat(hb(0));
    expect(s.inbound.peerStates().get(A)).toBe("alive");
    expect(s.membership.heard).toEqual([["tcp://10.0.0.1:7100", A]]);
    await s.tick(DEFAULT_SUSPECT_AFTER_MS - 1);
    expect(s.inbound.peerStates().get(A)).toBe("alive");
    await s.tick(1);
    expect(s.inbound.peerStates().get(A)).toBe("suspect");
    await s.tick(DEFAULT_DOWN_AFTER_MS - DEFAULT_SUSPECT_AFTER_MS);
    expect(s.inbound.peerStates().get(A)).toBe("down");
    s.inbound.onHeartbeat(hb(0));
    expect(s.inbound.peerStates().get(A)).toBe("alive");
  });

  it("does not take a wall-clock step back for silence", async () => {
    const s = setup();
    s.inbound.onHeartbeat(hb(0));
    s.wall.advance(-60_000);
    await s.tick(100);
    s.inbound.onHeartbeat(hb(0));
    await s.tick(DEFAULT_SUSPECT_AFTER_MS - 1);
    expect(s.inbound.peerStates().get(A)).toBe("alive");
  });
});

describe("MeshInbound: a peer that goes down", () => {
  const D = 0xd1n;
  const CONTROL_D = "tcp://10.0.0.4:7101";
  const aggregatesOfA = { origin: A, aggregates: [{ partition: { model_name: "m", routing_group: "g" }, block_size: 16, rows: [], added: [], removed: [] }] };

  /** A survivor that mirrored A up to `lastSeq` (what reached it before A died). */
  async function survivor(lastSeq: number) {
    const answers = new Map<string, Snapshot>([
      [CONTROL_A, snapshot(0)],
      [CONTROL_D, { v: 1, origin: D, epoch: EPOCH, seq: 0, bookings: [], bindings: [], mirrored: [aggregatesOfA] }],
    ]);
    const s = setup((ep) => Promise.resolve(answers.get(ep) as Snapshot));
    s.inbound.onHeartbeat(hb(0));
    await s.tick(0);
    for (let seq = 1; seq <= lastSeq; seq++) s.inbound.onBatch(batch(seq));
    expect(s.inbound.receiver.tracker(A)?.lastAppliedSeq).toBe(lastSeq);
    return s;
  }

  it("is dropped on every survivor, whatever prefix of its last batches each got (F16)", async () => {
    const [b, c] = [await survivor(3), await survivor(2)];
    for (const s of [b, c]) {
      await s.tick(DEFAULT_DOWN_AFTER_MS - 1);
      expect(s.port.dropped).toEqual([]);
      await s.tick(1);
      expect(s.inbound.peerStates().get(A)).toBe("down");
      expect(s.port.dropped).toEqual([A]);
      expect(s.inbound.receiver.tracker(A)).toBeUndefined();
      expect(s.inbound.stats.downOriginsDropped).toBe(1);
      // Later ticks do not drop it again.
      await s.tick(DEFAULT_DOWN_AFTER_MS);
      expect(s.port.dropped).toEqual([A]);
    }
  });

  it("adopted from a peer's snapshot and never heard here, it is dropped after the down timeout too", async () => {
    const answers = new Map<string, Snapshot>([[CONTROL_D, { v: 1, origin: D, epoch: EPOCH, seq: 0, bookings: [], bindings: [], mirrored: [aggregatesOfA] }]]);
    const s = setup((ep) => Promise.resolve(answers.get(ep) as Snapshot));
    s.inbound.onHeartbeat(hb(0, 0, D, CONTROL_D));
    await s.tick(0);
    expect(s.port.adopted.map((x) => x.mirrored.map((m) => m.origin))).toEqual([[A]]);
    for (let t = 0; t < DEFAULT_DOWN_AFTER_MS; t += 1_000) {
      s.inbound.onHeartbeat(hb(0, 0, D, CONTROL_D)); // D stays alive; A is never heard
      await s.tick(1_000);
    }
    expect(s.port.dropped).toEqual([A]);
    expect(s.inbound.stats.downOriginsDropped).toBe(1);
    // An origin adopted and then heard directly is left to the health path.
    const t = setup((ep) => Promise.resolve(answers.get(ep) as Snapshot));
    t.inbound.onHeartbeat(hb(0, 0, D, CONTROL_D));
    await t.tick(0);
    t.inbound.onHeartbeat(hb(0));
    for (let i = 0; i < 5; i++) {
      t.inbound.onHeartbeat(hb(0));
      t.inbound.onHeartbeat(hb(0, 0, D, CONTROL_D));
      await t.tick(DEFAULT_DOWN_AFTER_MS / 4);
    }
    expect(t.port.dropped).toEqual([]);
  });

  it("adopted from a peer's snapshot that says it was leaving, it is kept past the down timeout (G8)", async () => {
    const answers = new Map<string, Snapshot>([[CONTROL_D, { v: 1, origin: D, epoch: EPOCH, seq: 0, bookings: [], bindings: [], mirrored: [aggregatesOfA], drainingOrigins: [A] }]]);
    const s = setup((ep) => Promise.resolve(answers.get(ep) as Snapshot));
    s.inbound.onHeartbeat(hb(0, 0, D, CONTROL_D));
    await s.tick(0);
    for (let t = 0; t < DEFAULT_DOWN_AFTER_MS; t += 1_000) {
      s.inbound.onHeartbeat(hb(0, 0, D, CONTROL_D));
      await s.tick(1_000);
    }
    expect(s.port.dropped).toEqual([]);
    expect(s.inbound.stats.leftOriginsKept).toBe(1);
  });

  it("is not adopted back from another peer's snapshot, and comes back through a full snapshot", async () => {
    const s = await survivor(3);
    await s.tick(DEFAULT_DOWN_AFTER_MS);
    expect(s.inbound.peerStates().get(A)).toBe("down");

    // D still mirrors A's totals (its own down timer has not run yet): they are not installed here.
    s.inbound.onHeartbeat(hb(0, 0, D, CONTROL_D));
    await s.tick(0);
    const fromD = s.port.adopted.filter((x) => x.sender === D);
    expect(fromD).toHaveLength(1);
    expect(fromD[0]?.mirrored).toEqual([]);

    // A restarts at the same epoch and seq (or resumes after SIGCONT): a first contact, so a snapshot.
    const before = s.requests.filter((r) => r.endpoint === CONTROL_A).length;
    s.inbound.onHeartbeat(hb(4));
    await s.tick(0);
    expect(s.inbound.peerStates().get(A)).toBe("alive");
    expect(s.requests.filter((r) => r.endpoint === CONTROL_A)).toHaveLength(before + 1);
    expect(s.inbound.receiver.tracker(A)?.state).toBe("live");
  });
});

describe("MeshInbound: a deregistered peer", () => {
  it("is not brought back by a late heartbeat, batch or snapshot until it is welcome again", async () => {
    let answer: Snapshot = snapshot(0);
    const s = setup(() => Promise.resolve(answer));
    s.inbound.onHeartbeat(hb(0));
    await s.tick(0);
    expect(s.inbound.receiver.tracker(A)?.state).toBe("live");
    const pullsBefore = s.requests.length;
    s.inbound.forget(A);
    // In flight when it was deregistered: ignored, no snapshot pulled, nothing tracked.
    s.inbound.onHeartbeat(hb(1));
    s.inbound.onBatch(batch(1));
    await s.tick(0);
    expect(s.requests).toHaveLength(pullsBefore);
    expect(s.inbound.receiver.tracker(A)).toBeUndefined();
    expect(s.inbound.peerStates().has(A)).toBe(false);
    // A snapshot pull queued before the deregistration does not install either.
    answer = snapshot(1);
    s.inbound.pullSnapshot(CONTROL_A, null);
    await s.tick(0);
    expect(s.inbound.receiver.tracker(A)).toBeUndefined();
    // Registered again: its messages count at once.
    s.inbound.welcome(A);
    s.inbound.onHeartbeat(hb(2));
    await s.tick(0);
    expect(s.inbound.peerStates().get(A)).toBe("alive");
    expect(s.inbound.receiver.tracker(A)?.state).toBe("live");
  });

  it("is heard again once DEPARTED_IGNORE_MS has passed", async () => {
    const s = setup(() => Promise.resolve(snapshot(0)));
    s.inbound.onHeartbeat(hb(0));
    await s.tick(0);
    s.inbound.forget(A);
    await s.tick(DEPARTED_IGNORE_MS - 1);
    s.inbound.onHeartbeat(hb(0));
    expect(s.inbound.peerStates().has(A)).toBe(false);
    await s.tick(1);
    s.inbound.onHeartbeat(hb(0));
    expect(s.inbound.peerStates().get(A)).toBe("alive");
  });
});

describe("MeshInbound: snapshots", () => {
  it("retries a failed snapshot request after the tracker's timeout, doubling it", async () => {
    const s = setup(() => Promise.reject(new Error("peer not answering")));
    const t0 = s.timers.clock.now();
    s.inbound.onHeartbeat(hb(3)); // first contact: resync
    await s.tick(0);
    expect(s.requests.map((r) => r.atMs - t0)).toEqual([0]);
    expect(s.inbound.stats.snapshotFailures).toBe(1);
    await s.tick(DEFAULT_SNAPSHOT_TIMEOUT_MS - 1);
    expect(s.requests).toHaveLength(1);
    await s.tick(1);
    expect(s.requests.map((r) => r.atMs - t0)).toEqual([0, DEFAULT_SNAPSHOT_TIMEOUT_MS]);
    await s.tick(2 * DEFAULT_SNAPSHOT_TIMEOUT_MS - 1);
    expect(s.requests).toHaveLength(2);
    await s.tick(1);
    expect(s.requests.map((r) => r.atMs - t0)).toEqual([0, DEFAULT_SNAPSHOT_TIMEOUT_MS, 3 * DEFAULT_SNAPSHOT_TIMEOUT_MS]);
    expect(s.requests.every((r) => r.endpoint === CONTROL_A)).toBe(true);
    expect(s.inbound.stats.snapshotFailures).toBe(3);
  });

  it("installs a snapshot, then applies the batches buffered after it in order", async () => {
    let resolve: (snap: Snapshot) => void = () => undefined;
    const s = setup(() => new Promise<Snapshot>((r) => (resolve = r)));
    s.inbound.onHeartbeat(hb(2));
    s.inbound.onBatch(batch(4));
    s.inbound.onBatch(batch(3));
    expect(s.port.applied).toEqual([]);
    resolve(snapshot(2));
    await s.tick(0);
    expect(s.port.replaced).toEqual([{ origin: A, bookings: [] }]);
    expect(s.port.applied).toEqual([free(3), free(4)]);
    expect(s.membership.snapshotsFrom).toEqual([[CONTROL_A, A]]);
    expect(s.inbound.stats).toMatchObject({ snapshotsInstalled: 1, batchesApplied: 2, eventsApplied: 2 });
    s.inbound.onBatch(batch(5));
    expect(s.port.applied).toHaveLength(3);
  });

  it("installs a snapshot's catalogue entries and replaces the sender's worker statuses; a batch's go to the core with their origin", async () => {
    let resolve: (snap: Snapshot) => void = () => undefined;
    const s = setup(() => new Promise<Snapshot>((r) => (resolve = r)));
    const entry: CatalogEvent = { worker_id: 5n, sequence: 9n, writer_id: A, worker: null };
    const status: WorkerStatusEvent = { worker_id: 5n, sequence: 9n, writer_id: A, lifecycle: "incomplete", reasons: ["x"] };
    s.inbound.onHeartbeat(hb(2));
    resolve({ ...snapshot(2), catalog: [entry], statuses: [status] });
    await s.tick(0);
    expect(s.port.appliedCatalog).toEqual([entry]);
    expect(s.port.replacedStatuses).toEqual([{ origin: A, statuses: [status] }]);
    s.inbound.onBatch({ ...batch(3), events: [{ kind: "catalog", event: entry }, { kind: "worker_status", event: status }] });
    expect(s.port.appliedCatalog).toEqual([entry, entry]);
    expect(s.port.appliedStatuses).toEqual([{ origin: A, e: status }]);
  });

  it("re-snapshots after two heartbeats whose booking count disagrees with the mirror", async () => {
    let resolveNext: (snap: Snapshot) => void = () => undefined;
    const s = setup(() => new Promise<Snapshot>((r) => (resolveNext = r)));
    await liveAt(s, 1, (snap) => {
      resolveNext(snap);
    });
    s.port.owned.set(A, 2);
    s.inbound.onHeartbeat(hb(1, 2));
    s.inbound.onHeartbeat(hb(1, 3));
    expect(s.requests).toHaveLength(1);
    s.inbound.onHeartbeat(hb(1, 3));
    expect(s.inbound.stats.divergenceResyncs).toBe(1);
    expect(s.requests).toHaveLength(2);
    resolveNext(snapshot(1));
    await s.tick(0);
    expect(s.port.replaced).toHaveLength(2);
  });

  it(`keeps at most ${MAX_CONCURRENT_SNAPSHOT_PULLS} pulls in flight and counts the ones it defers`, async () => {
    const s = setup();
    const origins = Array.from({ length: MAX_CONCURRENT_SNAPSHOT_PULLS + 3 }, (_, i) => 0x100n + BigInt(i));
    for (const o of origins) s.inbound.onHeartbeat(hb(1, 0, o, `tcp://10.0.1.${o}:7101`));
    await s.tick(0);
    expect(s.requests).toHaveLength(MAX_CONCURRENT_SNAPSHOT_PULLS);
    expect(s.inbound.pullsInFlight).toBe(MAX_CONCURRENT_SNAPSHOT_PULLS);
    expect(s.inbound.stats.snapshotPullsDeferred).toBeGreaterThanOrEqual(3);
  });

  it("re-pulls only the origins named after a worker change, once, debounced (G6)", async () => {
    let resolveNext: (snap: Snapshot) => void = () => undefined;
    const s = setup(() => new Promise<Snapshot>((r) => (resolveNext = r)));
    await liveAt(s, 1, (snap) => {
      resolveNext(snap);
    });
    // A change that placed nothing missing (an idempotent re-registration, a PATCH): no pull at all.
    s.inbound.refreshSoon([]);
    await s.tick(WORKER_CHANGE_RESNAPSHOT_DELAY_MS);
    expect(s.requests).toHaveLength(1);
    s.inbound.refreshSoon([A]);
    s.inbound.refreshSoon([A]);
    await s.tick(WORKER_CHANGE_RESNAPSHOT_DELAY_MS - 1);
    expect(s.requests).toHaveLength(1);
    await s.tick(1);
    expect(s.requests).toHaveLength(2);
    expect(s.inbound.stats.missedStatePulls).toBe(1);
  });
});

describe("MeshInbound: a peer restarted many times at one endpoint (G7)", () => {
  const RESTARTS = 20;
  const origins = Array.from({ length: RESTARTS }, (_, i) => 0x500n + BigInt(i));

  it("forgets each down origin's control endpoint, and asks that endpoint once at a time", async () => {
    const s = setup(() => Promise.reject(new Error("timed out")));
    // Each process at CONTROL_A is heard, fails its snapshot requests, and goes down before the next starts.
    for (const o of origins) {
      s.inbound.onHeartbeat(hb(1, 0, o));
      await s.tick(DEFAULT_DOWN_AFTER_MS);
    }
    for (const o of origins) expect(s.inbound.controlEndpointOf(o)).toBeUndefined();
    // A refresh naming every one of them: none is pulled (their endpoint went with them).
    const before = s.requests.length;
    s.inbound.refreshSoon(origins);
    await s.tick(WORKER_CHANGE_RESNAPSHOT_DELAY_MS);
    expect(s.requests.length - before).toBe(0);
    // Several origins due at one endpoint at once (restarts within the down timeout): one request in flight.
    const fresh = [0x600n, 0x601n, 0x602n];
    const sent = s.requests.length;
    for (const o of fresh) s.inbound.onHeartbeat(hb(1, 0, o));
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(s.requests.length - sent).toBe(1);
  });
});

describe("MeshInbound: dead peers at first contact (G15)", () => {
  it("pulls a heard peer's snapshot at once, whatever number of dead endpoints are probed", async () => {
    const LIVE = "tcp://10.0.9.1:7101";
    const s = setup((endpoint) => (endpoint === LIVE ? Promise.resolve(snapshot(1, A)) : new Promise<Snapshot>(() => undefined)));
    for (let i = 0; i < 200; i++) s.inbound.pullSnapshot(`tcp://10.0.8.${i}:7101`, null);
    s.inbound.pullSnapshot(LIVE, null);
    // The live peer's heartbeat names its control endpoint: its pull does not queue behind the probes.
    s.inbound.onHeartbeat(hb(1, 0, A, LIVE));
    await s.tick(0);
    expect(s.inbound.receiver.tracker(A)?.state).toBe("live");
    expect(s.port.replaced.map((r) => r.origin)).toContain(A);
  });

  it("marks an endpoint whose probe failed unreachable until it is heard", async () => {
    const DEAD = "tcp://10.0.8.1:7101";
    const s = setup(() => Promise.reject(new Error("timed out")));
    s.inbound.pullSnapshot(DEAD, null);
    await s.tick(0);
    expect(s.inbound.unreachable(DEAD)).toBe(true);
    s.inbound.onHeartbeat(hb(1, 0, A, DEAD));
    expect(s.inbound.unreachable(DEAD)).toBe(false);
  });
});

describe("MeshInbound: a peer that said it was leaving (G8)", () => {
  it("keeps its mirrored bookings when it goes down; a silent one's are dropped", async () => {
    const B = 0xb1n;
    const s = setup(() => new Promise<Snapshot>(() => undefined));
    s.inbound.onHeartbeat(hb(1));
    s.inbound.onHeartbeat(hb(1, 0, B, "tcp://10.0.0.2:7101"));
    s.port.leaving.add(A);
    await s.tick(DEFAULT_DOWN_AFTER_MS);
    expect(s.inbound.peerStates().get(A)).toBe("down");
    expect(s.port.dropped).toEqual([B]);
    expect(s.inbound.stats.leftOriginsKept).toBe(1);
    expect(s.inbound.stats.downOriginsDropped).toBe(1);
  });
});

describe("MeshInbound: frames", () => {
  it("counts frames with the wrong frame count, unknown topics and undecodable payloads as malformed", () => {
    const s = setup();
    s.inbound.onMessage(TOPIC_HEARTBEAT, encodeHeartbeat(hb(0)), 3);
    s.inbound.onMessage("kvmesh.other", encodeHeartbeat(hb(0)), 2);
    s.inbound.onMessage(TOPIC_HEARTBEAT, Buffer.from("junk"), 2);
    expect(s.inbound.stats.malformed).toBe(3);
    s.inbound.onMessage(TOPIC_HEARTBEAT, encodeHeartbeat(hb(0)), 2);
    expect(s.inbound.stats.malformed).toBe(3);
    expect(s.inbound.peerStates().get(A)).toBe("alive");
  });

  it("ignores its own origin's frames", () => {
    const s = setup();
    s.inbound.onHeartbeat(hb(0, 0, SELF));
    s.inbound.onBatch(batch(1, SELF));
    expect(s.inbound.peerStates().size).toBe(0);
    expect(s.port.applied).toEqual([]);
  });
});
