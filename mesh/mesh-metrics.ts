/**
 * The mesh's series, registered on the daemon's prom-client registry (src/metrics/registry.ts).
 * Counters are read at scrape time from the plain counters the components keep (publisher,
 * inbound, membership, control, transport), as src/metrics/collected.ts does for the core: the
 * publish and apply paths do no metrics work. The one exception is replication lag, observed into
 * prom-client histograms once per received batch or heartbeat (the LagObserver of
 * origin-tracker.ts), in seconds, on LAG_BUCKETS_MS.
 */
import { Gauge, Histogram, type Registry } from "prom-client";

import { collectedCounter, collectedGauge, collectedLabelledCounter, type LabelledSample } from "../src/metrics/collected.js";
import { KEY_LOOKUP_OUTCOMES } from "./curve-key-directory.js";
import { LAG_BUCKETS_MS, type LagObserver, type MeshReceiver } from "./origin-tracker.js";
import type { PeerHealth } from "./peer-health.js";
import type { MeshCurveStats } from "./transport.js";
import { HANDSHAKE_REJECT_REASONS } from "./zap-handler.js";

/** The mesh's counters, as ReplicaMesh.stats reports them. */
export interface MeshStats {
  batchesSent: number;
  eventsSent: number;
  heartbeatsSent: number;
  batchesApplied: number;
  eventsApplied: number;
  malformed: number;
  snapshotsServed: number;
  snapshotsInstalled: number;
  snapshotFailures: number;
  divergenceResyncs: number;
  /** Silent registered peers redialed (see SILENT_PEER_REDIAL_MS). */
  redials: number;
  /** Snapshot pulls deferred at MAX_CONCURRENT_SNAPSHOT_PULLS (retried by housekeeping). */
  snapshotPullsDeferred: number;
  /** Peers declared down whose mirrored state was dropped. */
  downOriginsDropped: number;
  /** Peers declared down that had said they were leaving: their bookings kept (G8). */
  leftOriginsKept: number;
  /** Snapshot pulls sent to re-place load that arrived for workers not known yet (G6). */
  missedStatePulls: number;
  /** Trace causes (tracing on) left out of a batch that already carried the maximum. */
  traceCausesDropped: number;
  /** Receive thread (0 without one): hand-overs to the main thread, batches folded into the one before, threads restarted. */
  receiveHandovers: number;
  receiveBatchesMerged: number;
  receiveThreadRestarts: number;
  /** `dns:` peers: names resolved, and resolutions that failed (the last known peers kept). */
  peerDnsResolutions: number;
  peerDnsFailures: number;
  /** Entries (events, bookings, bindings, catalogue entries...) left out of peers' batches and snapshots, by reason (entry-skips.ts). */
  readonly entriesSkipped: Readonly<Record<"over_bound" | "invalid", number>>;
  /** Control requests refused by membership's checks, by request (control.ts says which). */
  readonly controlRefused: Readonly<Record<"snapshot" | "peer" | "unpeer" | "lifecycle", number>>;
  /**
   * Lifecycle calls taken here for a peer's booking and sent to the owner directly (besides the
   * stream), by outcome: sent (acknowledged), failed, skipped (too many in flight).
   */
  readonly lifecycleForwards: Readonly<Record<"sent" | "failed" | "skipped", number>>;
  /** Paged snapshots pulled (#29 G16): pages and bindings applied, pulls whose pages stopped early (snapshot-binding-pages.ts). */
  readonly bindingPages: Readonly<Record<"pages" | "bindings" | "failed", number>>;
  /** Paged snapshots served: binding cursors opened, pages served, closed early (bound or idle), open now (binding-cursors.ts). */
  readonly bindingCursors: Readonly<Record<"opened" | "pagesServed" | "bindingsServed" | "shed" | "expired" | "open", number>>;
}

/** What the mesh's series read at each scrape. */
export interface MeshMetricsSources {
  readonly stats: () => MeshStats;
  /** Outbound events shed by the bounded queue. */
  readonly shed: () => number;
  readonly receiver: Pick<MeshReceiver, "evicted" | "refused" | "origins" | "tracker">;
  readonly health: Pick<PeerHealth, "counts">;
  /** CURVE counters; null without CURVE (then no CURVE family is registered). */
  readonly curve: () => MeshCurveStats | null;
}

type CountStat = { [K in keyof MeshStats]: MeshStats[K] extends number ? K : never }[keyof MeshStats];

const STAT_COUNTERS: readonly (readonly [name: string, help: string, key: CountStat])[] = [
  ["kvmesh_mesh_batches_sent_total", "Batches published to peers.", "batchesSent"],
  ["kvmesh_mesh_events_sent_total", "Events published to peers.", "eventsSent"],
  ["kvmesh_mesh_batches_applied_total", "Peer batches applied.", "batchesApplied"],
  ["kvmesh_mesh_events_applied_total", "Peer events applied.", "eventsApplied"],
  ["kvmesh_mesh_malformed_frames_total", "Mesh frames or control requests that failed to decode.", "malformed"],
  ["kvmesh_mesh_snapshots_served_total", "Snapshots served to peers.", "snapshotsServed"],
  ["kvmesh_mesh_snapshots_installed_total", "Peer snapshots installed.", "snapshotsInstalled"],
  ["kvmesh_mesh_snapshot_failures_total", "Snapshot requests that failed or timed out (retried).", "snapshotFailures"],
  ["kvmesh_mesh_snapshot_pulls_deferred_total", "Snapshot requests deferred because the bound of concurrent pulls was reached (retried).", "snapshotPullsDeferred"],
  ["kvmesh_mesh_divergence_resyncs_total", "Snapshots forced by heartbeat count mismatches.", "divergenceResyncs"],
  ["kvmesh_mesh_trace_causes_dropped_total", "Tracing on: requests whose trace context was left out of the next mesh batch because it already carried 16 (their changes are sent all the same; only the peers' span links are missing).", "traceCausesDropped"],
  ["kvmesh_mesh_down_peer_drops_total", "Peers declared down (silent past the down timeout) whose mirrored bookings or totals were dropped; a full snapshot is pulled when one is heard again.", "downOriginsDropped"],
  ["kvmesh_mesh_left_peer_keeps_total", "Peers declared down that had said they were leaving (a clean shutdown): their mirrored bookings or totals are kept until freed or expired.", "leftOriginsKept"],
  ["kvmesh_mesh_missed_state_pulls_total", "Snapshot pulls of peers whose load had arrived for a worker not known here yet, sent once the worker registered (a worker change pulls nothing else).", "missedStatePulls"],
  ["kvmesh_mesh_receive_handovers_total", "Hand-overs from the mesh receive thread to the main thread (each applies everything received in one apply interval).", "receiveHandovers"],
  ["kvmesh_mesh_receive_batches_merged_total", "Peer batches the receive thread folded into the batch before them (main-thread applies saved).", "receiveBatchesMerged"],
  ["kvmesh_mesh_receive_thread_restarts_total", "Mesh receive threads started again after one died (peers re-snapshot on the seq gap).", "receiveThreadRestarts"],
  ["kvmesh_mesh_peer_dns_resolutions_total", "Resolutions of dns:NAME:PORT peers that answered.", "peerDnsResolutions"],
  ["kvmesh_mesh_peer_dns_failures_total", "Resolutions of dns:NAME:PORT peers that failed (the last known peers are kept).", "peerDnsFailures"],
  ["kvmesh_mesh_peer_redials_total", "Silent registered peers redialed (a SUB session libzmq gave up on, or a peer that is down).", "redials"],
];

const MS_PER_SECOND = 1_000;

/** LAG_BUCKETS_MS in seconds, as both lag histograms expose them. */
export const LAG_BUCKETS_SECONDS: readonly number[] = Object.freeze(LAG_BUCKETS_MS.map((ms) => ms / MS_PER_SECOND));

/**
 * The replication-lag histograms: all peers, and per origin. Registered before the receiver is
 * built, as it observes into them; the per-origin series of an origin forgotten or evicted ends.
 */
export function registerLagMetrics(registry: Registry): LagObserver {
  const registers = [registry];
  const aggregate = new Histogram({
    name: "kvmesh_mesh_replication_lag_seconds",
    help: "Publish-to-receive lag of peer batches and heartbeats, all peers.",
    buckets: [...LAG_BUCKETS_SECONDS],
    registers,
  });
  // Per peer as well: one slow link hides in the aggregate when the other peers are fast. Keyed by
  // origin (GET /replica_sync/status maps origin to endpoint).
  const perOrigin = new Histogram<"origin">({
    name: "kvmesh_mesh_peer_replication_lag_seconds",
    help: "Publish-to-receive lag per origin (peer).",
    labelNames: ["origin"] as const,
    buckets: [...LAG_BUCKETS_SECONDS],
    registers,
  });
  return {
    observe(origin, seconds) {
      aggregate.observe(seconds);
      perOrigin.observe({ origin }, seconds);
    },
    forget(origin) {
      perOrigin.remove({ origin });
    },
  };
}

/** A record of counts as one label's samples: { sent: 2 } -> [[{ outcome: "sent" }, 2]]. */
function samplesOf<L extends string>(label: L, counts: Readonly<Record<string, number>>): LabelledSample<L>[] {
  return Object.entries(counts).map(([value, n]): LabelledSample<L> => [{ [label]: value } as LabelledSample<L>[0], n]);
}

/** Every other mesh series (and the CURVE ones with CURVE), read from `src` at each scrape. */
export function registerMeshMetrics(registry: Registry, src: MeshMetricsSources): void {
  for (const [name, help, key] of STAT_COUNTERS) collectedCounter(registry, { name, help }, () => src.stats()[key]);
  collectedCounter(registry, { name: "kvmesh_mesh_events_shed_total", help: "Outbound events shed by the bounded queue (repaired by snapshot)." }, src.shed);
  collectedCounter(registry, { name: "kvmesh_mesh_origins_evicted_total", help: "Tracked origins evicted (never synced, or silent) to make room for new ones." }, () => src.receiver.evicted);
  collectedCounter(registry, { name: "kvmesh_mesh_origins_refused_total", help: "Frames from new origins ignored because the origin table was full of live ones." }, () => src.receiver.refused);
  collectedLabelledCounter(
    registry,
    { name: "kvmesh_mesh_control_refused_total", help: "Control requests refused because their claims did not check out (an unpeer its sender does not confirm, a snapshot or peer request from a process that is not the replica it names), by request." },
    ["request"],
    () => samplesOf("request", src.stats().controlRefused),
  );
  collectedLabelledCounter(
    registry,
    {
      name: "kvmesh_mesh_entries_skipped_total",
      help: "Entries (an event, a booking, a binding, a catalogue entry, a status) left out of a peer's batch or snapshot whose other entries applied, by reason: over_bound (a count or length past the shared bounds), invalid (a wrong type or value).",
    },
    ["reason"],
    () => samplesOf("reason", src.stats().entriesSkipped),
  );
  collectedLabelledCounter(
    registry,
    { name: "kvmesh_mesh_lifecycle_forwards_total", help: "Lifecycle calls (free, prefill_complete) taken here for a peer's booking and sent to its owner over the control channel, by outcome (the stream carries them too)." },
    ["outcome"],
    () => samplesOf("outcome", src.stats().lifecycleForwards),
  );

  const paged: [string, string, () => number][] = [
    ["kvmesh_mesh_snapshot_binding_pages_total", "Pages of peers' snapshot bindings pulled, decoded on a thread and applied in slices (a paged snapshot, #29 G16).", () => src.stats().bindingPages.pages],
    ["kvmesh_mesh_snapshot_paged_bindings_total", "Bindings applied from peers' snapshot pages.", () => src.stats().bindingPages.bindings],
    ["kvmesh_mesh_snapshot_pages_failed_total", "Paged snapshot pulls whose pages stopped before the last one (a timeout, a closed cursor): the origin is pulled again.", () => src.stats().bindingPages.failed],
    ["kvmesh_mesh_binding_pages_served_total", "Pages of this replica's snapshot bindings served to pulling peers.", () => src.stats().bindingCursors.pagesServed],
  ];
  for (const [name, help, read] of paged) collectedCounter(registry, { name, help }, read);
  collectedLabelledCounter(
    registry,
    { name: "kvmesh_mesh_binding_cursors_closed_total", help: "Binding cursors of paged snapshots closed before their last page, by reason: shed (64 open, least recently used first), idle (10 s without a page)." },
    ["reason"],
    () => {
      const c = src.stats().bindingCursors;
      return samplesOf("reason", { shed: c.shed, idle: c.expired });
    },
  );
  collectedGauge(registry, { name: "kvmesh_mesh_binding_cursors_open", help: "Binding cursors of paged snapshots open now (peers pulling this replica's bindings)." }, () => src.stats().bindingCursors.open);

  // Per tracked origin; a forgotten origin's series end at the next scrape.
  const { receiver } = src;
  collectedLabelledCounter<"origin">(registry, { name: "kvmesh_mesh_gaps_total", help: "Sequence gaps detected per origin." }, ["origin"], function* (): Iterable<LabelledSample<"origin">> {
    for (const origin of receiver.origins()) {
      const t = receiver.tracker(origin);
      if (t !== undefined) yield [{ origin: origin.toString() }, t.gaps];
    }
  });
  new Gauge<"origin">({
    name: "kvmesh_mesh_last_seq",
    help: "Last batch seq applied per origin.",
    labelNames: ["origin"] as const,
    registers: [registry],
    collect(this: Gauge<"origin">) {
      this.reset();
      for (const origin of receiver.origins()) {
        const t = receiver.tracker(origin);
        if (t !== undefined) this.set({ origin: origin.toString() }, t.lastAppliedSeq);
      }
    },
  });
  new Gauge<"state">({
    name: "kvmesh_mesh_peers",
    help: "Peers by state.",
    labelNames: ["state"] as const,
    registers: [registry],
    collect(this: Gauge<"state">) {
      for (const [state, n] of Object.entries(src.health.counts())) this.set({ state }, n);
    },
  });
  registerCurveMetrics(registry, src.curve);
}

/**
 * CURVE series: handshakes, ZAP decisions, key lookups, refusals. Registers nothing when `read()`
 * is null: a transport is CURVE or not from the time it binds.
 */
export function registerCurveMetrics(registry: Registry, read: () => MeshCurveStats | null): void {
  const first = read();
  if (first === null) return;
  let last: MeshCurveStats = first;
  const curve = (): MeshCurveStats => (last = read() ?? last);
  new Gauge({ name: "kvmesh_mesh_curve_enabled", help: "1 when the mesh uses CURVE (encrypted, listed keys only).", registers: [registry] }).set(1);
  collectedCounter(registry, { name: "kvmesh_mesh_handshakes_accepted_total", help: "Inbound CURVE handshakes accepted (publish and control sockets)." }, () => curve().inbound.accepted);
  collectedLabelledCounter<"reason">(
    registry,
    {
      name: "kvmesh_mesh_handshakes_rejected_total",
      help: "Inbound handshakes rejected: unlisted_key (ZAP refused the key), no_curve (a plain peer), wrong_server_key (a stale key, or a peer probing the listed keys for ours), other.",
    },
    ["reason"],
    () => {
      const rejected = curve().inbound.rejected;
      return HANDSHAKE_REJECT_REASONS.map((reason): LabelledSample<"reason"> => [{ reason }, rejected[reason]]);
    },
  );
  collectedCounter(registry, { name: "kvmesh_mesh_zap_denied_total", help: "ZAP requests denied (public key not in --mesh-allow)." }, () => curve().zap.denied);
  collectedLabelledCounter<"outcome">(registry, { name: "kvmesh_mesh_key_lookups_total", help: "Lookups of a peer endpoint's CURVE key by probing the listed keys, by outcome." }, ["outcome"], () => {
    const lookups = curve().keyLookups.lookups;
    return KEY_LOOKUP_OUTCOMES.map((outcome): LabelledSample<"outcome"> => [{ outcome }, lookups[outcome]]);
  });
  collectedCounter(registry, { name: "kvmesh_mesh_key_rekeys_total", help: "Peer connections re-keyed after their cached key stopped working." }, () => curve().subscribers.rekeys);
  collectedCounter(
    registry,
    {
      name: "kvmesh_mesh_refused_by_peer_total",
      help: "Outbound connections and control requests a peer refused or could not authenticate (our key not in its allow list, or no listed key).",
    },
    () => {
      const s = curve();
      return s.subscribers.refusedByPeer + s.requestAuthFailures;
    },
  );
}
