/**
 * The mesh's Prometheus text (appended to /metrics), written in this one file from the counters
 * the components keep (publisher, inbound, membership, control, transport), so moving the mesh to
 * a metrics registry changes only this file.
 */
import { HANDSHAKE_REJECT_REASONS } from "./zap-handler.js";
import { KEY_LOOKUP_OUTCOMES } from "./curve-key-directory.js";
import { LAG_BUCKETS_MS, type LagHistogram, type MeshReceiver } from "./origin-tracker.js";
import type { PeerHealth } from "./peer-health.js";
import type { MeshCurveStats } from "./transport.js";

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
}

export interface MeshMetricsSources {
  readonly stats: MeshStats;
  /** Outbound events shed by the bounded queue. */
  readonly shed: number;
  readonly receiver: MeshReceiver;
  readonly health: PeerHealth;
  /** Null without CURVE. */
  readonly curve: MeshCurveStats | null;
}

export function meshMetricsText(src: MeshMetricsSources): string {
  const { stats } = src;
  const lines: string[] = [];
  const counter = (name: string, help: string, v: number): void => {
    lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} counter`, `${name} ${v}`);
  };
  counter("kvmesh_mesh_batches_sent_total", "Batches published to peers.", stats.batchesSent);
  counter("kvmesh_mesh_events_sent_total", "Events published to peers.", stats.eventsSent);
  counter("kvmesh_mesh_batches_applied_total", "Peer batches applied.", stats.batchesApplied);
  counter("kvmesh_mesh_events_applied_total", "Peer events applied.", stats.eventsApplied);
  counter("kvmesh_mesh_events_shed_total", "Outbound events shed by the bounded queue (repaired by snapshot).", src.shed);
  counter("kvmesh_mesh_malformed_frames_total", "Mesh frames or control requests that failed to decode.", stats.malformed);
  counter("kvmesh_mesh_origins_evicted_total", "Tracked origins evicted (never synced, or silent) to make room for new ones.", src.receiver.evicted);
  counter("kvmesh_mesh_origins_refused_total", "Frames from new origins ignored because the origin table was full of live ones.", src.receiver.refused);
  counter("kvmesh_mesh_snapshots_served_total", "Snapshots served to peers.", stats.snapshotsServed);
  counter("kvmesh_mesh_snapshots_installed_total", "Peer snapshots installed.", stats.snapshotsInstalled);
  counter("kvmesh_mesh_snapshot_failures_total", "Snapshot requests that failed or timed out (retried).", stats.snapshotFailures);
  counter("kvmesh_mesh_snapshot_pulls_deferred_total", "Snapshot requests deferred because the bound of concurrent pulls was reached (retried).", stats.snapshotPullsDeferred);
  counter("kvmesh_mesh_divergence_resyncs_total", "Snapshots forced by heartbeat count mismatches.", stats.divergenceResyncs);
  counter("kvmesh_mesh_peer_redials_total", "Silent registered peers redialed (a SUB session libzmq gave up on, or a peer that is down).", stats.redials);
  const origins = src.receiver.stats();
  lines.push("# HELP kvmesh_mesh_gaps_total Sequence gaps detected per origin.", "# TYPE kvmesh_mesh_gaps_total counter");
  for (const o of origins) lines.push(`kvmesh_mesh_gaps_total{origin="${o.origin}"} ${o.gaps}`);
  lines.push("# HELP kvmesh_mesh_last_seq Last batch seq applied per origin.", "# TYPE kvmesh_mesh_last_seq gauge");
  for (const o of origins) lines.push(`kvmesh_mesh_last_seq{origin="${o.origin}"} ${o.lastAppliedSeq}`);
  lines.push("# HELP kvmesh_mesh_replication_lag_seconds Publish-to-receive lag of peer batches and heartbeats, all peers.", "# TYPE kvmesh_mesh_replication_lag_seconds histogram");
  histogramLines(lines, "kvmesh_mesh_replication_lag_seconds", "", src.receiver.lagHistogram);
  // Per peer as well: one slow link hides in the aggregate when the other peers are fast. Keyed by
  // origin (GET /replica_sync/peers maps origin to endpoint); a forgotten origin's series ends.
  lines.push("# HELP kvmesh_mesh_peer_replication_lag_seconds Publish-to-receive lag per origin (peer).", "# TYPE kvmesh_mesh_peer_replication_lag_seconds histogram");
  for (const origin of src.receiver.origins()) {
    const t = src.receiver.tracker(origin);
    if (t !== undefined) histogramLines(lines, "kvmesh_mesh_peer_replication_lag_seconds", `origin="${origin}",`, t.lagHistogram);
  }
  lines.push("# HELP kvmesh_mesh_peers Peers by state.", "# TYPE kvmesh_mesh_peers gauge");
  for (const [state, n] of Object.entries(src.health.counts())) lines.push(`kvmesh_mesh_peers{state="${state}"} ${n}`);
  return lines.join("\n") + "\n" + curveMetricsText(src.curve);
}

/** CURVE series (empty without CURVE): handshakes, ZAP decisions, key lookups, refusals. */
export function curveMetricsText(s: MeshCurveStats | null): string {
  if (s === null) return "";
  const lines: string[] = [];
  const family = (name: string, type: "counter" | "gauge", help: string, samples: readonly string[]): void => {
    lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`, ...samples);
  };
  family("kvmesh_mesh_curve_enabled", "gauge", "1 when the mesh uses CURVE (encrypted, listed keys only).", ["kvmesh_mesh_curve_enabled 1"]);
  family("kvmesh_mesh_handshakes_accepted_total", "counter", "Inbound CURVE handshakes accepted (publish and control sockets).", [`kvmesh_mesh_handshakes_accepted_total ${s.inbound.accepted}`]);
  family(
    "kvmesh_mesh_handshakes_rejected_total",
    "counter",
    "Inbound handshakes rejected: unlisted_key (ZAP refused the key), no_curve (a plain peer), wrong_server_key (a stale key, or a peer probing the listed keys for ours), other.",
    HANDSHAKE_REJECT_REASONS.map((r) => `kvmesh_mesh_handshakes_rejected_total{reason="${r}"} ${s.inbound.rejected[r]}`),
  );
  family("kvmesh_mesh_zap_denied_total", "counter", "ZAP requests denied (public key not in --mesh-allow).", [`kvmesh_mesh_zap_denied_total ${s.zap.denied}`]);
  family(
    "kvmesh_mesh_key_lookups_total",
    "counter",
    "Lookups of a peer endpoint's CURVE key by probing the listed keys, by outcome.",
    KEY_LOOKUP_OUTCOMES.map((r) => `kvmesh_mesh_key_lookups_total{outcome="${r}"} ${s.keyLookups.lookups[r]}`),
  );
  family("kvmesh_mesh_key_rekeys_total", "counter", "Peer connections re-keyed after their cached key stopped working.", [`kvmesh_mesh_key_rekeys_total ${s.subscribers.rekeys}`]);
  family(
    "kvmesh_mesh_refused_by_peer_total",
    "counter",
    "Outbound connections and control requests a peer refused or could not authenticate (our key not in its allow list, or no listed key).",
    [`kvmesh_mesh_refused_by_peer_total ${s.subscribers.refusedByPeer + s.requestAuthFailures}`],
  );
  return lines.join("\n") + "\n";
}

/** Prometheus histogram sample lines; `labels` is empty or ends with a comma. */
function histogramLines(lines: string[], name: string, labels: string, h: LagHistogram): void {
  const cum = h.cumulative();
  LAG_BUCKETS_MS.forEach((b, i) => lines.push(`${name}_bucket{${labels}le="${b / 1000}"} ${cum[i] ?? 0}`));
  lines.push(`${name}_bucket{${labels}le="+Inf"} ${h.count}`);
  const sel = labels === "" ? "" : `{${labels.slice(0, -1)}}`;
  lines.push(`${name}_sum${sel} ${h.sum / 1000}`, `${name}_count${sel} ${h.count}`);
}
