/**
 * The mesh's series on a prom-client registry, without sockets: the lag histograms fed by a
 * MeshReceiver, and the counters and gauges read from their sources at scrape time.
 */
import { Registry } from "prom-client";
import { describe, expect, it } from "vitest";

import { LAG_BUCKETS_SECONDS, registerLagMetrics, registerMeshMetrics, type MeshStats } from "../../../mesh/mesh-metrics.js";
import { LAG_BUCKETS_MS, MeshReceiver } from "../../../mesh/origin-tracker.js";
import { PeerHealth } from "../../../mesh/peer-health.js";
import type { MeshBatch } from "../../../mesh/types.js";
import { ManualClock } from "../../../src/core/index.js";

const A = 0xa000_0000_0000_0001n;
const B = 0xb000_0000_0000_0002n;
const E1 = 0xe100_0000_0000_0001n;
const T0 = 1_764_000_000_000;
const batch = (seq: number, origin = A, sentAtMs = T0): MeshBatch => ({ v: 1, origin, epoch: E1, seq, sentAtMs, events: [] });

const AGG = "kvmesh_mesh_replication_lag_seconds";
const PER = "kvmesh_mesh_peer_replication_lag_seconds";

/** The value of the one sample line `series` (name and labels exactly as exposed), NaN if absent. */
function sample(text: string, series: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? NaN : Number(line.slice(series.length + 1));
}

function lagSetup(options: { maxOrigins?: number } = {}) {
  const registry = new Registry();
  const clock = new ManualClock(T0);
  const rx = new MeshReceiver({ clock, lagObserver: registerLagMetrics(registry), ...options });
  return { registry, clock, rx };
}

describe("lag histograms", () => {
  it("use LAG_BUCKETS_MS in seconds, with a 20 ms bound", () => {
    expect(LAG_BUCKETS_SECONDS).toEqual(LAG_BUCKETS_MS.map((ms) => ms / 1000));
    expect(LAG_BUCKETS_SECONDS).toContain(0.02);
  });

  it("count each batch and heartbeat's lag per origin and over all origins, cumulatively per bound", async () => {
    const { registry, clock, rx } = lagSetup();
    for (const ms of [3, 7, 7, 40, 2_000]) {
      clock.set(T0 + ms);
      rx.onBatch(batch(1, A));
    }
    clock.set(T0 + 15);
    rx.onBatch(batch(1, B));
    const text = await registry.metrics();
    const a = `origin="${A}"`;
    const le = (bound: number) => sample(text, `${PER}_bucket{le="${bound / 1000}",${a}}`);
    expect(le(2)).toBe(0);
    expect(le(5)).toBe(1);
    expect(le(10)).toBe(3);
    expect(le(20)).toBe(3);
    expect(le(50)).toBe(4);
    expect(le(1_000)).toBe(4);
    expect(le(2_500)).toBe(5);
    expect(sample(text, `${PER}_bucket{le="+Inf",${a}}`)).toBe(5);
    expect(sample(text, `${PER}_count{${a}}`)).toBe(5);
    expect(sample(text, `${PER}_sum{${a}}`)).toBeCloseTo(2.057, 9);
    // Every bound is exposed (and nothing else): LAG_BUCKETS_MS plus +Inf.
    expect([...text.matchAll(new RegExp(`^${PER}_bucket\\{le="([^"]+)",${a}\\}`, "gm"))].map((m) => m[1])).toEqual([...LAG_BUCKETS_SECONDS.map(String), "+Inf"]);
    // 15 ms falls in the 20 ms bucket, not only in the 25 ms one.
    expect(sample(text, `${PER}_bucket{le="0.01",origin="${B}"}`)).toBe(0);
    expect(sample(text, `${PER}_bucket{le="0.02",origin="${B}"}`)).toBe(1);
    expect(sample(text, `${AGG}_bucket{le="0.02"}`)).toBe(4);
    expect(sample(text, `${AGG}_bucket{le="+Inf"}`)).toBe(6);
    expect(sample(text, `${AGG}_count`)).toBe(6);
    expect(sample(text, `${AGG}_sum`)).toBeCloseTo(2.072, 9);
  });

  it("end an origin's series when it is forgotten or evicted; the aggregate keeps its samples", async () => {
    const { registry, rx } = lagSetup({ maxOrigins: 2 });
    rx.onBatch(batch(1, A));
    rx.onBatch(batch(1, B));
    const origins = async () => [...(await registry.metrics()).matchAll(new RegExp(`^${PER}_count\\{origin="(\\d+)"\\}`, "gm"))].map((m) => m[1]);
    expect((await origins()).sort()).toEqual([String(A), String(B)].sort());

    // The table is full and neither origin synced: a third evicts the least recently heard (A).
    const C = 0x77n;
    rx.onBatch(batch(1, C));
    expect(rx.evicted).toBe(1);
    expect((await origins()).sort()).toEqual([String(B), String(C)].sort());

    expect(rx.forget(B)).toBe(true);
    expect(await origins()).toEqual([String(C)]);
    expect(sample(await registry.metrics(), `${AGG}_count`)).toBe(3);
  });
});

describe("mesh counters and gauges", () => {
  const stats = (): MeshStats => ({
    batchesSent: 1,
    eventsSent: 2,
    heartbeatsSent: 3,
    batchesApplied: 4,
    eventsApplied: 5,
    malformed: 6,
    snapshotsServed: 7,
    snapshotsInstalled: 8,
    snapshotFailures: 9,
    divergenceResyncs: 10,
    redials: 11,
    snapshotPullsDeferred: 12,
    downOriginsDropped: 25,
    leftOriginsKept: 0,
    missedStatePulls: 0,
    traceCausesDropped: 26,
    receiveHandovers: 13,
    receiveBatchesMerged: 14,
    receiveThreadRestarts: 15,
    peerDnsResolutions: 16,
    peerDnsFailures: 17,
    controlRefused: { snapshot: 18, peer: 19, unpeer: 20, lifecycle: 21 },
    lifecycleForwards: { sent: 22, failed: 23, skipped: 24 },
    entriesSkipped: { over_bound: 27, invalid: 28 },
    bindingPages: { pages: 29, bindings: 30, failed: 31 },
    bindingCursors: { opened: 32, pagesServed: 33, bindingsServed: 34, shed: 35, expired: 36, open: 37 },
  });

  it("are read from their sources at each scrape; no CURVE family without CURVE", async () => {
    const registry = new Registry();
    const clock = new ManualClock(T0);
    const rx = new MeshReceiver({ clock });
    const health = new PeerHealth();
    let shed = 0;
    registerMeshMetrics(registry, { stats, shed: () => shed, receiver: rx, health, curve: () => null });

    let text = await registry.metrics();
    expect(sample(text, "kvmesh_mesh_batches_sent_total")).toBe(1);
    expect(sample(text, "kvmesh_mesh_events_applied_total")).toBe(5);
    expect(sample(text, "kvmesh_mesh_malformed_frames_total")).toBe(6);
    expect(sample(text, "kvmesh_mesh_snapshot_pulls_deferred_total")).toBe(12);
    expect(sample(text, "kvmesh_mesh_peer_redials_total")).toBe(11);
    expect(sample(text, "kvmesh_mesh_down_peer_drops_total")).toBe(25);
    expect(sample(text, "kvmesh_mesh_trace_causes_dropped_total")).toBe(26);
    expect(sample(text, "kvmesh_mesh_receive_handovers_total")).toBe(13);
    expect(sample(text, "kvmesh_mesh_receive_batches_merged_total")).toBe(14);
    expect(sample(text, "kvmesh_mesh_receive_thread_restarts_total")).toBe(15);
    expect(sample(text, 'kvmesh_mesh_control_refused_total{request="snapshot"}')).toBe(18);
    expect(sample(text, 'kvmesh_mesh_control_refused_total{request="unpeer"}')).toBe(20);
    expect(sample(text, 'kvmesh_mesh_control_refused_total{request="lifecycle"}')).toBe(21);
    expect(sample(text, 'kvmesh_mesh_lifecycle_forwards_total{outcome="failed"}')).toBe(23);
    expect(sample(text, 'kvmesh_mesh_entries_skipped_total{reason="over_bound"}')).toBe(27);
    expect(sample(text, 'kvmesh_mesh_entries_skipped_total{reason="invalid"}')).toBe(28);
    expect(sample(text, "kvmesh_mesh_snapshot_binding_pages_total")).toBe(29);
    expect(sample(text, "kvmesh_mesh_snapshot_paged_bindings_total")).toBe(30);
    expect(sample(text, "kvmesh_mesh_snapshot_pages_failed_total")).toBe(31);
    expect(sample(text, "kvmesh_mesh_binding_pages_served_total")).toBe(33);
    expect(sample(text, 'kvmesh_mesh_binding_cursors_closed_total{reason="shed"}')).toBe(35);
    expect(sample(text, 'kvmesh_mesh_binding_cursors_closed_total{reason="idle"}')).toBe(36);
    expect(sample(text, "kvmesh_mesh_binding_cursors_open")).toBe(37);
    expect(sample(text, "kvmesh_mesh_events_shed_total")).toBe(0);
    expect(sample(text, 'kvmesh_mesh_peers{state="alive"}')).toBe(0);
    expect(sample(text, 'kvmesh_mesh_peers{state="down"}')).toBe(0);
    expect(text).not.toMatch(/^kvmesh_mesh_last_seq\{/m);
    expect(text).not.toContain("curve");
    expect(text).not.toContain("handshakes");

    shed = 4;
    rx.onBatch(batch(1, A));
    rx.snapshotRequested(A, T0);
    rx.onSnapshot({ v: 1, origin: A, epoch: E1, seq: 9, bookings: [], bindings: [] });
    rx.onBatch(batch(12, A)); // a gap
    health.observe(A, 0);
    text = await registry.metrics();
    expect(sample(text, "kvmesh_mesh_events_shed_total")).toBe(4);
    expect(sample(text, `kvmesh_mesh_last_seq{origin="${A}"}`)).toBe(9);
    expect(sample(text, `kvmesh_mesh_gaps_total{origin="${A}"}`)).toBe(1);
    expect(sample(text, 'kvmesh_mesh_peers{state="alive"}')).toBe(1);

    rx.forget(A);
    text = await registry.metrics();
    expect(text).not.toMatch(/^kvmesh_mesh_last_seq\{/m);
    expect(text).not.toMatch(/^kvmesh_mesh_gaps_total\{/m);
  });
});
