import { describe, expect, it } from "vitest";

import { MeshOptionError } from "../../../mesh/errors.js";

import { ManualClock } from "../../../src/core/index.js";
import type { Heartbeat, MeshBatch, Snapshot } from "../../../mesh/types.js";
import {
  DEFAULT_SNAPSHOT_TIMEOUT_MS,
  LAG_BUCKETS_MS,
  LagReservoir,
  type LagObserver,
  MeshReceiver,
  OriginTracker,
} from "../../../mesh/origin-tracker.js";

const A = 0xa000_0000_0000_0001n;
const B = 0xb000_0000_0000_0002n;
const E1 = 0xe100_0000_0000_0001n;
const E2 = 0xe200_0000_0000_0002n;

const T0 = 1_764_000_000_000;
const batch = (seq: number, epoch = E1, origin = A, sentAtMs = T0): MeshBatch => ({ v: 1, origin, epoch, seq, sentAtMs, events: [] });
const hb = (seq: number, epoch = E1, origin = A): Heartbeat => ({
  v: 1,
  origin,
  epoch,
  seq,
  sentAtMs: T0,
  controlEndpoint: "tcp://a:2",
  publishEndpoint: "tcp://a:1",
  bookings: 0,
});
const snap = (seq: number, epoch = E1, origin = A): Snapshot => ({ v: 1, origin, epoch, seq, bookings: [], bindings: [] });

/** A LagObserver that records what it is told (the mesh's is prom-client histograms). */
class LagLog implements LagObserver {
  readonly samples: (readonly [origin: string, seconds: number])[] = [];
  readonly forgotten: string[] = [];
  observe(origin: string, seconds: number): void {
    this.samples.push([origin, seconds]);
  }
  forget(origin: string): void {
    this.forgotten.push(origin);
  }
}

function tracker(opts: { resyncBufferMaxBatches?: number } = {}) {
  const clock = new ManualClock(T0);
  const lag = new LagLog();
  return { clock, lag, t: new OriginTracker(A, { clock, ...opts }, lag) };
}

/** A tracker that went live at `seq` through a snapshot. */
function live(seq = 5) {
  const r = tracker();
  expect(r.t.onBatch(batch(seq))).toEqual({ action: "resync", reason: "first-contact" });
  r.t.snapshotRequested(T0);
  expect(r.t.onSnapshot(snap(seq))).toEqual([]);
  expect(r.t.state).toBe("live");
  return r;
}

describe("OriginTracker: first contact and snapshot", () => {
  it("snapshots on first contact even for seq 1 of a fresh epoch, buffers meanwhile, then replays in order", () => {
    const { t } = tracker();
    expect(t.onBatch(batch(1))).toEqual({ action: "resync", reason: "first-contact" });
    expect(t.state).toBe("syncing");
    expect(t.snapshotDue(T0)).toBe(true);
    t.snapshotRequested(T0);
    expect(t.snapshotDue(T0)).toBe(false);
    expect(t.onBatch(batch(3))).toEqual({ action: "buffer" });
    expect(t.onBatch(batch(2))).toEqual({ action: "buffer" });
    expect(t.onBatch(batch(4))).toEqual({ action: "buffer" });
    expect(t.buffered).toBe(4);
    // The snapshot already reflects 1 and 2: only 3 and 4 are replayed, in seq order.
    expect(t.onSnapshot(snap(2)).map((b) => b.seq)).toEqual([3, 4]);
    expect(t.state).toBe("live");
    expect(t.lastAppliedSeq).toBe(4);
    expect(t.buffered).toBe(0);
    expect(t.onBatch(batch(5))).toEqual({ action: "apply" });
    const s = t.stats();
    expect(s).toMatchObject({ snapshots: 1, snapshotRequests: 1, gaps: 0, staleDropped: 2, epoch: E1, lastAppliedSeq: 5, state: "live" });
  });

  it("treats a heartbeat from an unknown origin as first contact", () => {
    const { t } = tracker();
    expect(t.onHeartbeat(hb(0))).toEqual({ action: "resync", reason: "first-contact" });
    // Announced once per sync episode.
    expect(t.onHeartbeat(hb(0))).toEqual({ action: "ok" });
    expect(t.onBatch(batch(1))).toEqual({ action: "buffer" });
    t.snapshotRequested(T0);
    expect(t.onSnapshot(snap(0)).map((b) => b.seq)).toEqual([1]);
    expect(t.state).toBe("live");
  });
});

describe("OriginTracker: live", () => {
  it("applies in-order batches and drops duplicates as stale", () => {
    const { t } = live(5);
    const before = t.stats().staleDropped;
    expect(t.onBatch(batch(6))).toEqual({ action: "apply" });
    expect(t.onBatch(batch(6))).toEqual({ action: "drop-stale" });
    expect(t.onBatch(batch(2))).toEqual({ action: "drop-stale" });
    expect(t.stats().staleDropped - before).toBe(2);
  });

  it("resyncs on a gap, buffers until the snapshot and replays what follows it", () => {
    const { t } = live(5);
    expect(t.onBatch(batch(8))).toEqual({ action: "resync", reason: "gap" });
    expect(t.onBatch(batch(9))).toEqual({ action: "buffer" });
    expect(t.stats().gaps).toBe(1);
    t.snapshotRequested(T0);
    expect(t.onSnapshot(snap(8)).map((b) => b.seq)).toEqual([9]);
    expect(t.state).toBe("live");
    expect(t.onBatch(batch(10))).toEqual({ action: "apply" });
  });

  it("applies a merged batch (firstSeq..seq) that continues or overlaps what was applied, and resyncs on one past a gap", () => {
    const { t, lag } = live(5);
    const merged = (first: number, seq: number): MeshBatch => ({ ...batch(seq), firstSeq: first });
    expect(t.onBatch(merged(6, 9), [1, 2, 3, 4])).toEqual({ action: "apply" });
    expect(t.lastAppliedSeq).toBe(9);
    // Lags measured by the receive thread are recorded as given, one per batch merged.
    expect(lag.samples.slice(-4).map(([, s]) => s * 1_000)).toEqual([1, 2, 3, 4]);
    expect(t.onBatch(merged(8, 11))).toEqual({ action: "apply" });
    expect(t.lastAppliedSeq).toBe(11);
    expect(t.onBatch(merged(10, 11))).toEqual({ action: "drop-stale" });
    expect(t.onBatch(merged(13, 14))).toEqual({ action: "resync", reason: "gap" });
    expect(t.onBatch(merged(15, 16))).toEqual({ action: "buffer" });
    t.snapshotRequested(T0);
    // The snapshot at 13 is overlapped by the buffered 13..14 (re-applied, idempotent) and continued by 15..16.
    expect(t.onSnapshot(snap(13)).map((b) => `${b.firstSeq}-${b.seq}`)).toEqual(["13-14", "15-16"]);
    expect(t.state).toBe("live");
    expect(t.lastAppliedSeq).toBe(16);
  });

  it("resyncs on a heartbeat ahead of what was applied (a lost batch while idle)", () => {
    const { t } = live(5);
    expect(t.onHeartbeat(hb(5))).toEqual({ action: "ok" });
    expect(t.onHeartbeat(hb(4))).toEqual({ action: "ok" });
    expect(t.onHeartbeat(hb(6))).toEqual({ action: "resync", reason: "gap" });
    expect(t.state).toBe("syncing");
    expect(t.stats().gaps).toBe(1);
  });

  it("resyncs on a new epoch, then drops the dead epoch's late batches and heartbeats", () => {
    const { t } = live(5);
    expect(t.onBatch(batch(1, E2))).toEqual({ action: "resync", reason: "new-epoch" });
    t.snapshotRequested(T0);
    expect(t.onSnapshot(snap(1, E2))).toEqual([]);
    expect(t.epoch).toBe(E2);
    expect(t.state).toBe("live");
    expect(t.onBatch(batch(6, E1))).toEqual({ action: "drop-stale" });
    expect(t.onHeartbeat(hb(6, E1))).toEqual({ action: "drop-stale" });
    expect(t.onBatch(batch(2, E2))).toEqual({ action: "apply" });
    expect(t.stats().newEpochs).toBe(1);
  });

  it("resyncs on a heartbeat with a new epoch", () => {
    const { t } = live(5);
    expect(t.onHeartbeat(hb(0, E2))).toEqual({ action: "resync", reason: "new-epoch" });
  });
});

describe("OriginTracker: snapshot retries and buffer bounds", () => {
  it("retries a snapshot request after the timeout, doubling it per attempt", () => {
    const { t } = tracker();
    t.onBatch(batch(1));
    t.snapshotRequested(0);
    expect(t.snapshotDue(DEFAULT_SNAPSHOT_TIMEOUT_MS - 1)).toBe(false);
    expect(t.snapshotDue(DEFAULT_SNAPSHOT_TIMEOUT_MS)).toBe(true);
    t.snapshotRequested(1_000);
    expect(t.snapshotDue(1_000 + 1_999)).toBe(false);
    expect(t.snapshotDue(1_000 + 2_000)).toBe(true);
    t.snapshotRequested(3_000);
    expect(t.snapshotDue(3_000 + 3_999)).toBe(false);
    expect(t.snapshotDue(3_000 + 4_000)).toBe(true);
    expect(t.stats()).toMatchObject({ snapshotRequests: 3, snapshotRetries: 2 });
  });

  it("caps the backoff", () => {
    const clock = new ManualClock(0);
    const t = new OriginTracker(A, { clock, snapshotTimeoutMs: 100, snapshotTimeoutMaxMs: 250 });
    t.onBatch(batch(1));
    for (let i = 0; i < 10; i++) t.snapshotRequested(0);
    expect(t.snapshotDue(249)).toBe(false);
    expect(t.snapshotDue(250)).toBe(true);
  });

  it("drops the buffer on overflow and asks for a newer snapshot, counted", () => {
    const { t } = tracker({ resyncBufferMaxBatches: 3 });
    t.onBatch(batch(1));
    t.snapshotRequested(T0);
    t.onBatch(batch(2));
    t.onBatch(batch(3));
    expect(t.onBatch(batch(4))).toEqual({ action: "resync", reason: "gap" });
    expect(t.buffered).toBe(1);
    expect(t.snapshotDue(T0)).toBe(true);
    expect(t.stats()).toMatchObject({ bufferOverflows: 1, staleDropped: 3 });
    t.snapshotRequested(T0 + 1);
    // The newer snapshot covers 4; 5 continues it.
    t.onBatch(batch(5));
    expect(t.onSnapshot(snap(4)).map((b) => b.seq)).toEqual([5]);
    expect(t.state).toBe("live");
  });

  it("stays syncing when the buffer does not continue the snapshot, and recovers with the next one", () => {
    const { t } = tracker();
    t.onBatch(batch(10));
    t.snapshotRequested(T0);
    t.onBatch(batch(11));
    t.onBatch(batch(13)); // 12 was lost
    t.onBatch(batch(14));
    expect(t.onSnapshot(snap(10)).map((b) => b.seq)).toEqual([11]);
    expect(t.state).toBe("syncing");
    expect(t.lastAppliedSeq).toBe(11);
    expect(t.buffered).toBe(2);
    expect(t.snapshotDue(T0)).toBe(true);
    t.snapshotRequested(T0);
    expect(t.onSnapshot(snap(13)).map((b) => b.seq)).toEqual([14]);
    expect(t.state).toBe("live");
    expect(t.stats().gaps).toBe(1);
  });

  it("does not re-request after a hole while a later request is still in flight", () => {
    const { t } = tracker();
    t.onBatch(batch(10));
    t.snapshotRequested(T0);
    t.snapshotRequested(T0 + 5);
    t.onBatch(batch(12));
    t.onSnapshot(snap(10));
    expect(t.state).toBe("syncing");
    expect(t.snapshotDue(T0 + 5)).toBe(false);
  });
});

describe("OriginTracker: late and foreign snapshots", () => {
  it("wantsSnapshot refuses a duplicate older reply while live; installing it anyway still converges", () => {
    const { t } = live(5);
    t.onBatch(batch(6));
    t.onBatch(batch(7));
    expect(t.wantsSnapshot(snap(6))).toBe(false);
    expect(t.wantsSnapshot(snap(9))).toBe(true);
    // Installed anyway: lastApplied rewinds to 6, the next batch shows the gap and a resync follows.
    expect(t.onSnapshot(snap(6))).toEqual([]);
    expect(t.onBatch(batch(8))).toEqual({ action: "resync", reason: "gap" });
  });

  it("does not end the sync on a snapshot of an epoch other than the one last heard", () => {
    const { t } = live(5);
    t.onBatch(batch(1, E2));
    t.snapshotRequested(T0);
    expect(t.wantsSnapshot(snap(9, E1))).toBe(false);
    expect(t.onSnapshot(snap(9, E1))).toEqual([]);
    expect(t.state).toBe("syncing");
    expect(t.snapshotDue(T0)).toBe(true);
    t.snapshotRequested(T0);
    expect(t.onSnapshot(snap(1, E2))).toEqual([]);
    expect(t.state).toBe("live");
    expect(t.epoch).toBe(E2);
    // E1 is now dead: its snapshots are refused and its batches stale.
    expect(t.wantsSnapshot(snap(20, E1))).toBe(false);
    expect(t.onBatch(batch(10, E1))).toEqual({ action: "drop-stale" });
  });

  it("discards buffered batches of an older epoch when the newer epoch's snapshot arrives", () => {
    const { t } = tracker();
    t.onBatch(batch(7, E1));
    t.onBatch(batch(1, E2));
    t.onBatch(batch(2, E2));
    t.snapshotRequested(T0);
    expect(t.onSnapshot(snap(1, E2)).map((b) => [b.epoch, b.seq])).toEqual([[E2, 2]]);
    expect(t.state).toBe("live");
    expect(t.onBatch(batch(8, E1))).toEqual({ action: "drop-stale" });
  });

  it("rejects messages of another origin", () => {
    const { t } = tracker();
    expect(() => t.onBatch(batch(1, E1, B))).toThrow(RangeError);
    expect(() => t.onSnapshot(snap(1, E1, B))).toThrow(RangeError);
  });

  it("rejects invalid options", () => {
    const clock = new ManualClock();
    expect(() => new OriginTracker(A, { clock, snapshotTimeoutMs: 0 })).toThrow(MeshOptionError);
    expect(() => new OriginTracker(A, { clock, snapshotTimeoutMs: 500, snapshotTimeoutMaxMs: 100 })).toThrow(MeshOptionError);
    expect(() => new OriginTracker(A, { clock, resyncBufferMaxBatches: 0 })).toThrow(MeshOptionError);
    expect(() => new OriginTracker(A, { clock, lagSamples: 0 })).toThrow(MeshOptionError);
  });
});

describe("lag", () => {
  it("records receive time - sentAtMs into a reservoir and the lag observer (seconds, by origin)", () => {
    const { clock, lag, t } = tracker();
    for (const ms of [3, 7, 7, 40, 2_000]) {
      clock.set(T0 + ms);
      t.onBatch(batch(1, E1, A, T0));
    }
    const s = t.stats();
    expect(s.lagP50Ms).toBe(7);
    expect(s.lagP99Ms).toBe(2_000);
    expect(lag.samples).toEqual([3, 7, 7, 40, 2_000].map((ms) => [A.toString(), ms / 1000]));
    // The observations land in the same Prometheus buckets as before (bucket bounds in ms).
    const le = (bound: number) => lag.samples.filter(([, sec]) => sec * 1000 <= bound).length;
    expect(le(2)).toBe(0);
    expect(le(5)).toBe(1);
    expect(le(10)).toBe(3);
    expect(le(20)).toBe(3);
    expect(le(50)).toBe(4);
    expect(le(1_000)).toBe(4);
    expect(le(2_500)).toBe(5);
  });

  it("clamps negative lag (clock skew) to zero", () => {
    const { clock, lag, t } = tracker();
    clock.set(T0 - 50);
    t.onHeartbeat(hb(0));
    expect(t.stats().lagP50Ms).toBe(0);
    expect(lag.samples).toEqual([[A.toString(), 0]]);
  });

  it("keeps only the last N samples", () => {
    const r = new LagReservoir(3);
    expect(r.percentile(50)).toBeNull();
    for (const v of [1_000, 1_000, 1, 2, 3]) r.add(v);
    expect(r.size).toBe(3);
    expect(r.percentile(100)).toBe(3);
    expect(r.percentile(0)).toBe(1);
  });

  it("has strictly increasing buckets with a 20 ms bound (the scale-out lag p99 target)", () => {
    for (let i = 1; i < LAG_BUCKETS_MS.length; i++) expect(LAG_BUCKETS_MS[i]).toBeGreaterThan(LAG_BUCKETS_MS[i - 1] as number);
    expect(LAG_BUCKETS_MS).toContain(20);
  });
});

describe("MeshReceiver", () => {
  it("keeps one tracker per origin, lists due snapshots and forgets origins", () => {
    const clock = new ManualClock(T0);
    const lag = new LagLog();
    const rx = new MeshReceiver({ clock, lagObserver: lag });
    expect(rx.onBatch(batch(1, E1, A))).toEqual({ action: "resync", reason: "first-contact" });
    expect(rx.onHeartbeat(hb(4, E2, B))).toEqual({ action: "resync", reason: "first-contact" });
    expect(rx.snapshotsDue(T0).sort()).toEqual([A, B].sort());
    rx.snapshotRequested(A, T0);
    expect(rx.snapshotsDue(T0)).toEqual([B]);
    expect(rx.wantsSnapshot(snap(0, E1, 0x77n))).toBe(false);
    expect(rx.wantsSnapshot(snap(0, E1, A))).toBe(true);
    expect(rx.onSnapshot(snap(0, E1, A)).map((b) => b.seq)).toEqual([1]);
    expect(rx.tracker(A)?.state).toBe("live");
    expect(rx.tracker(B)?.state).toBe("syncing");
    expect(rx.origins().sort()).toEqual([A, B].sort());
    expect(lag.samples.map(([origin]) => origin)).toEqual([A.toString(), B.toString()]);
    expect(rx.stats().map((s) => s.origin).sort()).toEqual([A, B].sort());

    expect(rx.forget(A)).toBe(true);
    expect(rx.forget(A)).toBe(false);
    expect(lag.forgotten).toEqual([A.toString()]);
    expect(rx.tracker(A)).toBeUndefined();
    expect(rx.onBatch(batch(2, E1, A))).toEqual({ action: "resync", reason: "first-contact" });
  });

  it("tells the lag observer about an origin evicted to make room", () => {
    const clock = new ManualClock(T0);
    const lag = new LagLog();
    const rx = new MeshReceiver({ clock, maxOrigins: 1, lagObserver: lag });
    rx.onBatch(batch(1, E1, A));
    // A never synced, so B may evict it.
    expect(rx.onBatch(batch(1, E1, B))).toEqual({ action: "resync", reason: "first-contact" });
    expect(rx.evicted).toBe(1);
    expect(lag.forgotten).toEqual([A.toString()]);
  });

  it("validates its options up front", () => {
    expect(() => new MeshReceiver({ clock: new ManualClock(), snapshotTimeoutMs: -1 })).toThrow(MeshOptionError);
  });
});
