/**
 * Prometheus text exposition (format 0.0.4), hand-written because prom-client is not a
 * dependency. Request metrics are recorded here per call (two map lookups, ~50 ns); everything
 * else is read from the service and the ingest at scrape time, so the hot path pays nothing for it.
 *
 * Labels are bounded: route pattern (never the raw path), status, worker id and dp rank. Never a
 * request, selection or session id (unbounded cardinality).
 */
import type { KvRankStats } from "../ingest/kv-ingest.js";
import type { SelectionService } from "../core/selection-service.js";
import { AUTH_FAILURES, type AuthFailure } from "./auth.js";

/** Request latency buckets, seconds: 50 µs (a cached select) .. 1 s (a stuck mesh call). */
export const HTTP_DURATION_BUCKETS_SECONDS = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1] as const;

export interface MetricsOptions {
  readonly service: SelectionService;
  readonly ingestStats?: () => readonly KvRankStats[];
  /** More exposition text (e.g. the mesh's metrics), appended verbatim. */
  readonly extra?: () => string;
}

interface Histogram {
  readonly buckets: Float64Array;
  sum: number;
  count: number;
}

export class Metrics {
  readonly contentType = "text/plain; version=0.0.4; charset=utf-8";
  readonly #o: MetricsOptions;
  /** `route\tstatus` -> count */
  readonly #requests = new Map<string, number>();
  readonly #durations = new Map<string, Histogram>();
  readonly #unauthorized: Record<AuthFailure, number> = { missing: 0, malformed: 0, invalid: 0 };

  constructor(options: MetricsOptions) {
    this.#o = options;
  }

  observeRequest(route: string, status: number, ms: number): void {
    const key = `${route}\t${status}`;
    this.#requests.set(key, (this.#requests.get(key) ?? 0) + 1);
    let h = this.#durations.get(route);
    if (h === undefined) {
      h = { buckets: new Float64Array(HTTP_DURATION_BUCKETS_SECONDS.length), sum: 0, count: 0 };
      this.#durations.set(route, h);
    }
    const s = ms / 1000;
    const i = HTTP_DURATION_BUCKETS_SECONDS.findIndex((b) => s <= b);
    if (i >= 0) h.buckets[i] = (h.buckets[i] as number) + 1;
    h.sum += s;
    h.count++;
  }

  /** A request refused for a missing, malformed or wrong API token (401). */
  observeUnauthorized(reason: AuthFailure): void {
    this.#unauthorized[reason]++;
  }

  render(): string {
    const out: string[] = [];
    const metric = (name: string, type: "counter" | "gauge" | "histogram", help: string, samples: readonly string[]): void => {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`, ...samples);
    };
    const one = (name: string, type: "counter" | "gauge", help: string, value: number): void => {
      metric(name, type, help, [`${name} ${fmt(value)}`]);
    };

    metric(
      "kvmesh_http_requests_total",
      "counter",
      "HTTP requests by route pattern and status.",
      [...this.#requests].map(([k, n]) => {
        const [route = "", status = ""] = k.split("\t");
        return `kvmesh_http_requests_total${labels({ route, status })} ${n}`;
      }),
    );
    const hist: string[] = [];
    for (const [route, h] of this.#durations) {
      let cum = 0;
      HTTP_DURATION_BUCKETS_SECONDS.forEach((b, i) => {
        cum += h.buckets[i] as number;
        hist.push(`kvmesh_http_request_duration_seconds_bucket${labels({ route, le: String(b) })} ${cum}`);
      });
      hist.push(
        `kvmesh_http_request_duration_seconds_bucket${labels({ route, le: "+Inf" })} ${h.count}`,
        `kvmesh_http_request_duration_seconds_sum${labels({ route })} ${fmt(h.sum)}`,
        `kvmesh_http_request_duration_seconds_count${labels({ route })} ${h.count}`,
      );
    }
    metric("kvmesh_http_request_duration_seconds", "histogram", "HTTP request latency by route pattern.", hist);
    metric(
      "kvmesh_http_unauthorized_total",
      "counter",
      "Requests refused (401) for a missing, malformed or invalid API token.",
      AUTH_FAILURES.map((r) => `kvmesh_http_unauthorized_total${labels({ reason: r })} ${this.#unauthorized[r]}`),
    );

    const svc = this.#o.service;
    const st = svc.stats;
    one("kvmesh_selections_total", "counter", "Workers selected (select and select_and_reserve).", st.selections);
    one("kvmesh_reservations_total", "counter", "Bookings made by this replica.", st.reservations);
    one("kvmesh_selection_errors_total", "counter", "Selections that failed.", st.selectionErrors);
    one("kvmesh_kv_events_applied_total", "counter", "Worker KV events applied to the prefix index.", st.kvEventsApplied);
    one("kvmesh_kv_events_dropped_total", "counter", "Worker KV events dropped (unknown rank, block size or parent mismatch).", st.kvEventsDropped);
    one("kvmesh_replica_events_applied_total", "counter", "Peer load events applied.", st.replicaEventsApplied);
    one("kvmesh_replica_events_ignored_total", "counter", "Peer load events ignored (duplicate, unknown partition or rank, tombstoned).", st.replicaEventsIgnored);
    one("kvmesh_bindings_applied_total", "counter", "Peer session bindings applied.", st.bindingsApplied);
    one("kvmesh_bindings_ignored_total", "counter", "Peer session bindings ignored or rejected.", st.bindingsIgnored);
    one("kvmesh_expired_requests_total", "counter", "Bookings force-freed after the active-request expiry.", st.expiredRequests);
    one("kvmesh_reservations_refused_total", "counter", "Bookings refused (429) at the live-booking limit (--max-reservations).", st.reservationsRefused);
    one("kvmesh_bindings_parked_total", "counter", "Peer bindings parked because their worker or partition was not known yet.", st.bindingsParked);
    one("kvmesh_bindings_unparked_total", "counter", "Parked bindings applied once their worker registered.", st.bindingsUnparked);
    one("kvmesh_parked_bindings_expired_total", "counter", "Parked bindings dropped after their TTL without the worker appearing.", st.parkedBindingsExpired);
    one("kvmesh_parked_bindings_shed_total", "counter", "Parked bindings shed because the parking table was full.", st.parkedBindingsShed);
    one("kvmesh_parked_bindings", "gauge", "Peer bindings parked now.", svc.parkedBindings);
    one("kvmesh_session_bindings_published_total", "counter", "Session bindings this replica committed, rebound or refreshed.", st.bindingsPublished);
    one("kvmesh_session_bindings_dropped_total", "counter", "Bindings shed by full sessionBindingUpdates() queues (host replication; repaired by a snapshot).", st.droppedBindings);
    one("kvmesh_session_binding_subscribers", "gauge", "Live sessionBindingUpdates() subscriptions.", svc.sessionBindingSubscribers);

    const z = svc.sizes();
    one("kvmesh_partitions", "gauge", "Partitions (model_name, routing_group).", z.partitions);
    one("kvmesh_index_blocks", "gauge", "(rank, block) entries in the prefix indexes.", z.indexedBlocks);
    one("kvmesh_index_nodes", "gauge", "Nodes in the prefix indexes.", z.indexNodes);
    one("kvmesh_affinity_entries", "gauge", "Session bindings held.", z.affinityEntries);
    one("kvmesh_affinity_fallbacks_total", "counter", "Sessions routed unpinned because the affinity table was full.", z.affinityFallbacks);
    one("kvmesh_pending_selections", "gauge", "Cached selections awaiting POST /reservations.", z.pendingSelections);
    one("kvmesh_pending_selection_evictions_total", "counter", "Cached selections evicted (entry or byte bound) before use.", z.pendingEvictions);
    one("kvmesh_reorder_state_shed_total", "counter", "Tombstones or early prefill marks shed at their bound.", z.reorderShed);
    one("kvmesh_reservations_active", "gauge", "Live bookings (local and mirrored from peers).", svc.reservationCount);

    const ranks = this.#o.ingestStats?.() ?? [];
    const perRank = (name: string, help: string, pick: (s: KvRankStats["stats"]) => number): void => {
      metric(name, "counter", help, ranks.map((r) => `${name}${labels({ worker_id: r.workerId, dp_rank: String(r.rank) })} ${pick(r.stats)}`));
    };
    perRank("kvmesh_kv_batches_received_total", "Live KV-event messages received per worker rank.", (s) => s.received);
    perRank("kvmesh_kv_batches_applied_total", "KV-event batches applied per worker rank (live and replayed).", (s) => s.applied);
    perRank("kvmesh_kv_batches_replayed_total", "KV-event batches recovered through replay.", (s) => s.replayed);
    perRank("kvmesh_kv_batches_malformed_total", "Undecodable KV-event messages.", (s) => s.malformed);
    perRank("kvmesh_kv_batches_stale_total", "KV-event messages behind the sequence cursor, dropped.", (s) => s.stale);
    perRank("kvmesh_kv_batches_lost_total", "KV-event sequence numbers never received.", (s) => s.lost);
    perRank("kvmesh_kv_publisher_resets_total", "KV-event publisher restarts detected.", (s) => s.resets);

    const mem = process.memoryUsage();
    one("process_resident_memory_bytes", "gauge", "Resident set size, bytes.", mem.rss);
    one("nodejs_heap_size_used_bytes", "gauge", "V8 heap used, bytes.", mem.heapUsed);
    one("nodejs_heap_size_total_bytes", "gauge", "V8 heap allocated, bytes.", mem.heapTotal);

    let text = out.join("\n") + "\n";
    const extra = this.#o.extra?.();
    if (extra !== undefined && extra.length > 0) text += extra.endsWith("\n") ? extra : extra + "\n";
    return text;
  }
}

const fmt = (v: number): string => (Number.isFinite(v) ? String(v) : v > 0 ? "+Inf" : v < 0 ? "-Inf" : "NaN");

/** Label values escaped per the exposition format: backslash, double quote, newline. */
function labels(l: Readonly<Record<string, string>>): string {
  const parts = Object.entries(l).map(([k, v]) => `${k}="${v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")}"`);
  return `{${parts.join(",")}}`;
}
