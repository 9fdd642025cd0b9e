/**
 * Per worker rank KV-event ingest series, read at scrape time from the listeners' own counters.
 * Labelled by worker id and dp rank only (bounded by the fleet), never by anything per request.
 */
import type { Registry } from "prom-client";

import type { KvRankStats } from "../ingest/kv-ingest.js";
import { collectedCounter, collectedGauge, collectedLabelledCounter, type LabelledSample } from "./collected.js";

type RankCounters = KvRankStats["stats"];
type RankLabel = "worker_id" | "dp_rank";

const RANK_COUNTERS: readonly (readonly [name: string, help: string, pick: (s: RankCounters) => number])[] = [
  ["kvmesh_kv_batches_received_total", "Live KV-event messages received per worker rank.", (s) => s.received],
  ["kvmesh_kv_batches_applied_total", "KV-event batches applied per worker rank (live and replayed).", (s) => s.applied],
  ["kvmesh_kv_batches_replayed_total", "KV-event batches recovered through replay.", (s) => s.replayed],
  ["kvmesh_kv_batches_malformed_total", "Undecodable KV-event messages.", (s) => s.malformed],
  ["kvmesh_kv_batches_stale_total", "KV-event messages behind the sequence cursor, dropped.", (s) => s.stale],
  ["kvmesh_kv_batches_implausible_total", "KV-event messages whose seq jumped implausibly far ahead (> 1,000,000), dropped as corrupt.", (s) => s.implausible],
  ["kvmesh_kv_batches_lost_total", "KV-event sequence numbers never received.", (s) => s.lost],
  ["kvmesh_kv_batches_oversized_total", "KV-event messages refused (over 16 MiB) or cut (over 16,384 events, 131,072 hashes or 2,097,152 tokens).", (s) => s.oversized],
  ["kvmesh_kv_events_shed_total", "KV events not applied because their message was refused or cut at a per-message cap.", (s) => s.eventsShed],
  ["kvmesh_kv_batches_shed_total", "Live KV-event messages shed unread by the ingest thread while the main thread's hand-over window was full; each gap is replayed on the rank's next message, or counted lost.", (s) => s.shed],
  ["kvmesh_kv_publisher_resets_total", "KV-event publisher restarts detected.", (s) => s.resets],
  ["kvmesh_kv_publisher_resets_damped_total", "Of those, restarts past 4 in 60 s: numbering restarted, the rank's blocks kept (a flapping publisher).", (s) => s.resetsDamped],
];

export function registerIngestMetrics(registry: Registry, ingestStats: () => readonly KvRankStats[], budgetRefusals: () => number = () => 0): void {
  collectedCounter(registry, { name: "kvmesh_kv_ranks_refused_fd_budget_total", help: "KV ranks refused before opening a socket: the fd budget (the fd limit less a reserve for HTTP and the mesh) was spent." }, budgetRefusals);
  for (const [name, help, pick] of RANK_COUNTERS) {
    collectedLabelledCounter<RankLabel>(registry, { name, help }, ["worker_id", "dp_rank"], function* (): Iterable<LabelledSample<RankLabel>> {
      for (const r of ingestStats()) yield [{ worker_id: r.workerId, dp_rank: String(r.rank) }, pick(r.stats)];
    });
  }
}

/** What the ingest thread says of its own life (kv-ingest-worker.ts); absent with --no-kv-ingest-thread. */
export interface IngestThreadHealth {
  readonly restarts: number;
  readonly terminations: number;
  readonly up: boolean;
  /** The hand-over window (src/ingest/kv-ingest-window.ts). */
  readonly window: { readonly pendingBatches: number; readonly pendingBytes: number; readonly peakBatches: number; readonly peakBytes: number };
}

export function registerIngestThreadMetrics(registry: Registry, read: () => IngestThreadHealth): void {
  collectedCounter(registry, { name: "kvmesh_ingest_thread_restarts_total", help: "KV ingest threads started again after one died (its ranks resume from the index's position)." }, () => read().restarts);
  collectedCounter(registry, { name: "kvmesh_ingest_thread_terminations_total", help: "KV ingest threads terminated because they did not end by themselves within 5 s of closing (a last resort)." }, () => read().terminations);
  collectedGauge(registry, { name: "kvmesh_ingest_thread_up", help: "1 while a KV ingest thread reads the KV-event streams, 0 while a dead one waits for its restart." }, () => (read().up ? 1 : 0));
  collectedGauge(registry, { name: "kvmesh_kv_ingest_pending_batches", help: "KV batches the ingest thread handed over that the main thread has not applied yet (bounded by --kv-ingest-window-batches)." }, () => read().window.pendingBatches);
  collectedGauge(registry, { name: "kvmesh_kv_ingest_pending_bytes", help: "Their bytes (bounded by --kv-ingest-window-bytes)." }, () => read().window.pendingBytes);
  collectedGauge(registry, { name: "kvmesh_kv_ingest_pending_batches_peak", help: "The most KV batches ever pending at once between the ingest thread and the main thread since the start." }, () => read().window.peakBatches);
  collectedGauge(registry, { name: "kvmesh_kv_ingest_pending_bytes_peak", help: "Their most bytes ever pending at once since the start." }, () => read().window.peakBytes);
}
