/**
 * The mesh figures bench:scale reads from a replica's /metrics: replication lag (the
 * kvmesh_mesh_replication_lag_seconds histogram: publish-to-receive of every peer batch and
 * heartbeat), events shed by its outbound queue, gaps, snapshots, divergence resyncs, and
 * batches/events sent and applied. Deltas over a window make the per-window figures.
 */
import { metricSum } from "../../src/bench/router-client.js";
import { histogramQuantile, mergeHistograms, scrapeHistogram } from "../../src/bench/stats.js";

export const LAG_HISTOGRAM = "kvmesh_mesh_replication_lag_seconds";

const COUNTERS = {
  shed: "kvmesh_mesh_events_shed_total",
  gaps: "kvmesh_mesh_gaps_total",
  snapshotsInstalled: "kvmesh_mesh_snapshots_installed_total",
  divergenceResyncs: "kvmesh_mesh_divergence_resyncs_total",
  batchesSent: "kvmesh_mesh_batches_sent_total",
  eventsSent: "kvmesh_mesh_events_sent_total",
  batchesApplied: "kvmesh_mesh_batches_applied_total",
  eventsApplied: "kvmesh_mesh_events_applied_total",
} as const;

export type MeshCounter = keyof typeof COUNTERS;

export interface MeshScrape {
  readonly counters: Readonly<Record<MeshCounter, number>>;
  /** Upper bounds in ms (+Inf last) and cumulative counts. */
  readonly lag: { leMs: number[]; cum: number[] };
}

export function parseMeshMetrics(text: string): MeshScrape {
  const counters = {} as Record<MeshCounter, number>;
  for (const [k, name] of Object.entries(COUNTERS) as [MeshCounter, string][]) counters[k] = metricSum(text, name);
  return { counters, lag: scrapeHistogram(text, LAG_HISTOGRAM) };
}

export interface MeshWindow {
  readonly counters: Readonly<Record<MeshCounter, number>>;
  readonly lag: { leMs: number[]; cum: number[] };
}

/** What happened between two scrapes of one replica. */
export function meshWindow(before: MeshScrape, after: MeshScrape): MeshWindow {
  const counters = {} as Record<MeshCounter, number>;
  for (const k of Object.keys(COUNTERS) as MeshCounter[]) counters[k] = after.counters[k] - before.counters[k];
  const cum = after.lag.cum.map((c, i) => c - (before.lag.cum[i] ?? 0));
  return { counters, lag: { leMs: after.lag.leMs, cum } };
}

/** Lag p50 / p99 (ms, interpolated within buckets like histogram_quantile) over windows summed. */
export function lagQuantiles(windows: readonly MeshWindow[]): { samples: number; p50Ms: number; p99Ms: number } {
  let h: { leMs: number[]; cum: number[] } = { leMs: [], cum: [] };
  for (const w of windows) h = mergeHistograms(h, w.lag);
  return { samples: h.cum[h.cum.length - 1] ?? 0, p50Ms: histogramQuantile(h.leMs, h.cum, 0.5), p99Ms: histogramQuantile(h.leMs, h.cum, 0.99) };
}
