/**
 * GET /ui/state: the status page's one JSON document, assembled from what the service and the
 * mesh already expose (GET /loads, /workers, /replica_sync/status, the service's counters). Pure:
 * no sockets, no timers (the sampler that feeds RoutingHistory lives in ui-routes.ts), so the
 * aggregation is unit-tested with plain values.
 *
 * Readable at 1,024 ranks: ranks are sorted busiest first (requests in flight, then active
 * blocks, then queued prefill tokens), filtered by a worker-id search, and only the top N are
 * sent, with totals over all of them. Worker ids are sent as decimal strings: a browser's
 * JSON.parse would round ids above 2^53.
 */
import { badRequest } from "../../core/index.js";
import type { Lifecycle, ModelLoadResponse, WorkerCatalogRecord } from "../../core/index.js";

/** Rank rows sent when the page does not ask for a number. */
export const DEFAULT_UI_TOP_RANKS = 48;
/** Most rank rows one answer carries (the page's "show" choices stay below it). */
export const MAX_UI_TOP_RANKS = 1_024;
/** Longest worker-id search accepted (a u64 is 20 digits). */
export const MAX_UI_QUERY_CHARS = 32;
/** Non-schedulable workers listed by name; the rest are counted. */
export const MAX_UI_LISTED_WORKERS = 32;
/** How often the routing counters are sampled, ms. */
export const UI_SAMPLE_INTERVAL_MS = 1_000;
/** Samples kept: 10 minutes at one a second. */
export const UI_HISTORY_SAMPLES = 600;
/** Samples sent as the page's sparkline: the last two minutes. */
export const UI_SERIES_SAMPLES = 120;
/** The "now" figures are rates over this much of the history, ms. */
export const UI_RECENT_WINDOW_MS = 10_000;

const LIFECYCLES: readonly Lifecycle[] = ["schedulable", "draining", "incomplete", "unschedulable"];

/** The cumulative counters one routing sample holds (each only grows, except liveBindings). */
export interface RoutingCounters {
  readonly selections: number;
  readonly promptBlocks: number;
  readonly overlapBlocks: number;
  readonly selectionErrors: number;
  readonly reservations: number;
  /** Soft affinity: bindings that followed a dispatch elsewhere. */
  readonly bindingsMoved: number;
  /** Peer or host bindings ignored or rejected (stale, conflicting, invalid, table full). */
  readonly bindingsRejected: number;
  /** Hard affinity: dispatches refused with KVMESH_SESSION_CONFLICT. */
  readonly conflicts: number;
  /** Sessions routed unpinned because the affinity table was full. */
  readonly unpinned: number;
  /** Session bindings held now (a gauge). */
  readonly liveBindings: number;
}

export interface RoutingSample extends RoutingCounters {
  /** Monotonic ms. */
  readonly t: number;
}

/** Rates between two samples (per second; ratios null when nothing was selected). */
export interface RoutingRates {
  readonly selections_per_s: number;
  readonly errors_per_s: number;
  readonly reservations_per_s: number;
  /** Mean overlap of the chosen ranks: blocks they held on device per selection. */
  readonly mean_overlap_blocks: number | null;
  /** Of the selections' prompt blocks, the share the chosen ranks held. */
  readonly hit_ratio: number | null;
  readonly moved_per_s: number;
  readonly rejected_per_s: number;
  readonly conflicts_per_s: number;
}

/** Three decimals: enough for a page, and a smaller answer. */
const r3 = (x: number): number => Math.round(x * 1_000) / 1_000;

/** Rates from `a` to a later `b`; zero rates over an empty or backwards interval. */
export function ratesBetween(a: RoutingSample, b: RoutingSample): RoutingRates {
  const secs = (b.t - a.t) / 1_000;
  const per = (x: number, y: number): number => (secs > 0 ? r3(Math.max(0, y - x) / secs) : 0);
  const sel = Math.max(0, b.selections - a.selections);
  const prompt = Math.max(0, b.promptBlocks - a.promptBlocks);
  const overlap = Math.max(0, b.overlapBlocks - a.overlapBlocks);
  return {
    selections_per_s: per(a.selections, b.selections),
    errors_per_s: per(a.selectionErrors, b.selectionErrors),
    reservations_per_s: per(a.reservations, b.reservations),
    mean_overlap_blocks: sel > 0 ? r3(overlap / sel) : null,
    hit_ratio: prompt > 0 ? r3(overlap / prompt) : null,
    moved_per_s: per(a.bindingsMoved, b.bindingsMoved),
    rejected_per_s: per(a.bindingsRejected, b.bindingsRejected),
    conflicts_per_s: per(a.conflicts, b.conflicts),
  };
}

/** A fixed ring of routing samples: the last `capacity` of them, oldest first. */
export class RoutingHistory {
  readonly #ring: (RoutingSample | undefined)[];
  #next = 0;
  #size = 0;

  constructor(readonly capacity: number = UI_HISTORY_SAMPLES) {
    if (!(Number.isInteger(capacity) && capacity >= 2)) throw badRequest(`RoutingHistory capacity must be an integer >= 2, got ${capacity}`, "capacity");
    this.#ring = new Array<RoutingSample | undefined>(capacity);
  }

  get size(): number {
    return this.#size;
  }

  record(sample: RoutingSample): void {
    this.#ring[this.#next] = sample;
    this.#next = (this.#next + 1) % this.capacity;
    if (this.#size < this.capacity) this.#size++;
  }

  /** The samples, oldest first (the last `n` when given). */
  samples(n = this.#size): RoutingSample[] {
    const k = Math.min(Math.max(0, n), this.#size);
    const out: RoutingSample[] = [];
    for (let i = this.#size - k; i < this.#size; i++) out.push(this.#ring[(this.#next - this.#size + i + this.capacity) % this.capacity] as RoutingSample);
    return out;
  }

  /** The oldest sample taken at or after `t` (the newest when none is). */
  sampleSince(t: number): RoutingSample | undefined {
    const all = this.samples();
    return all.find((s) => s.t >= t) ?? all.at(-1);
  }
}

export interface RoutingView {
  readonly sample_interval_ms: number;
  /** Seconds the history covers (up to 10 minutes). */
  readonly window_s: number;
  /** Rates over the last UI_RECENT_WINDOW_MS, measured up to `current` (the sampler's figures plus this answer's read). */
  readonly recent: RoutingRates;
  /** Rates over the whole history. */
  readonly window: RoutingRates;
  /** Per sample interval, oldest first: the page's sparklines. */
  readonly series: readonly { readonly t_ms: number; readonly selections_per_s: number; readonly hit_ratio: number | null; readonly mean_overlap_blocks: number | null }[];
  readonly totals: { readonly selections: number; readonly selection_errors: number; readonly reservations: number };
  readonly bindings: { readonly live: number; readonly moved: number; readonly rejected: number; readonly unpinned: number; readonly conflicts: number };
}

/** The routing section: `current` is read now and is the end of every rate. */
export function routingView(history: RoutingHistory, current: RoutingSample): RoutingView {
  const all = history.samples();
  const first = all[0] ?? current;
  const recentFrom = history.sampleSince(current.t - UI_RECENT_WINDOW_MS) ?? current;
  const tail = history.samples(UI_SERIES_SAMPLES + 1);
  const series = [];
  for (let i = 1; i < tail.length; i++) {
    const r = ratesBetween(tail[i - 1] as RoutingSample, tail[i] as RoutingSample);
    series.push({ t_ms: Math.round((tail[i] as RoutingSample).t - current.t), selections_per_s: r.selections_per_s, hit_ratio: r.hit_ratio, mean_overlap_blocks: r.mean_overlap_blocks });
  }
  return {
    sample_interval_ms: UI_SAMPLE_INTERVAL_MS,
    window_s: Math.round(Math.max(0, current.t - first.t) / 100) / 10,
    recent: ratesBetween(recentFrom, current),
    window: ratesBetween(first, current),
    series,
    totals: { selections: current.selections, selection_errors: current.selectionErrors, reservations: current.reservations },
    bindings: { live: current.liveBindings, moved: current.bindingsMoved, rejected: current.bindingsRejected, unpinned: current.unpinned, conflicts: current.conflicts },
  };
}

/** One rank's row: its load, and its worker's capacity and lifecycle. */
export interface RankRow {
  readonly worker_id: string;
  readonly dp_rank: number;
  readonly model_name: string;
  readonly routing_group: string;
  readonly lifecycle: Lifecycle | null;
  readonly active_requests: number;
  readonly active_blocks: number;
  /** The worker's total_kv_blocks (per rank), null when it registered none. */
  readonly capacity_blocks: number | null;
  readonly prefill_tokens: number;
}

export interface RankTable {
  /** Ranks with a load row (schedulable workers' ranks). */
  readonly total: number;
  /** Of those, the ranks whose worker id matched the search. */
  readonly matched: number;
  readonly query: string;
  readonly top: number;
  /** Over the matched ranks, not just those shown. */
  readonly totals: {
    readonly active_requests: number;
    readonly active_blocks: number;
    /** Summed over the matched ranks that have a capacity. */
    readonly capacity_blocks: number;
    readonly prefill_tokens: number;
    /** Matched ranks with a request in flight. */
    readonly busy_ranks: number;
    readonly max_active_requests: number;
    readonly max_active_blocks: number;
    readonly max_prefill_tokens: number;
  };
  /** The busiest `top` matched ranks, busiest first. */
  readonly rows: readonly RankRow[];
}

/** Busiest first: requests in flight, then active blocks, then queued prefill tokens; ties by id then rank. */
export function compareBusiest(a: RankRow, b: RankRow): number {
  return (
    b.active_requests - a.active_requests ||
    b.active_blocks - a.active_blocks ||
    b.prefill_tokens - a.prefill_tokens ||
    a.worker_id.length - b.worker_id.length ||
    (a.worker_id < b.worker_id ? -1 : a.worker_id > b.worker_id ? 1 : 0) ||
    a.dp_rank - b.dp_rank
  );
}

/** The rank table of `loads`, joined with `workers` for capacity and lifecycle. `query` matches worker ids as a substring. */
export function rankTable(loads: readonly ModelLoadResponse[], workers: readonly WorkerCatalogRecord[], query: string, top: number): RankTable {
  const byId = new Map<bigint, WorkerCatalogRecord>();
  for (const w of workers) byId.set(w.worker_id, w);
  const rows: RankRow[] = [];
  let total = 0;
  let requests = 0;
  let blocks = 0;
  let capacity = 0;
  let prefill = 0;
  let busy = 0;
  let maxRequests = 0;
  let maxBlocks = 0;
  let maxPrefill = 0;
  for (const m of loads) {
    for (const l of m.loads) {
      total++;
      const id = l.worker_id.toString();
      if (query !== "" && !id.includes(query)) continue;
      const w = byId.get(l.worker_id);
      const row: RankRow = {
        worker_id: id,
        dp_rank: l.dp_rank,
        model_name: m.model_name,
        routing_group: m.routing_group,
        lifecycle: w?.lifecycle ?? null,
        active_requests: l.active_requests,
        active_blocks: l.potential_decode_blocks,
        capacity_blocks: w?.total_kv_blocks ?? null,
        prefill_tokens: l.potential_prefill_tokens,
      };
      rows.push(row);
      requests += row.active_requests;
      blocks += row.active_blocks;
      capacity += row.capacity_blocks ?? 0;
      prefill += row.prefill_tokens;
      if (row.active_requests > 0) busy++;
      maxRequests = Math.max(maxRequests, row.active_requests);
      maxBlocks = Math.max(maxBlocks, row.active_blocks);
      maxPrefill = Math.max(maxPrefill, row.prefill_tokens);
    }
  }
  rows.sort(compareBusiest);
  return {
    total,
    matched: rows.length,
    query,
    top,
    totals: {
      active_requests: requests,
      active_blocks: blocks,
      capacity_blocks: capacity,
      prefill_tokens: prefill,
      busy_ranks: busy,
      max_active_requests: maxRequests,
      max_active_blocks: maxBlocks,
      max_prefill_tokens: maxPrefill,
    },
    rows: rows.slice(0, top),
  };
}

export interface WorkerSummary {
  readonly total: number;
  readonly by_lifecycle: Readonly<Record<Lifecycle, number>>;
  /** Workers not schedulable (up to MAX_UI_LISTED_WORKERS), with why. */
  readonly not_schedulable: readonly { readonly worker_id: string; readonly lifecycle: Lifecycle; readonly reasons: readonly string[] }[];
}

/** Lifecycle counts of `workers`, and the first non-schedulable ones by id (filtered by `query`). */
export function workerSummary(workers: readonly WorkerCatalogRecord[], query: string): WorkerSummary {
  const by = Object.fromEntries(LIFECYCLES.map((l) => [l, 0])) as Record<Lifecycle, number>;
  const listed: { worker_id: string; lifecycle: Lifecycle; reasons: readonly string[] }[] = [];
  const sorted = [...workers].sort((a, b) => (a.worker_id < b.worker_id ? -1 : a.worker_id > b.worker_id ? 1 : 0));
  for (const w of sorted) {
    by[w.lifecycle]++;
    const id = w.worker_id.toString();
    if (w.lifecycle !== "schedulable" && listed.length < MAX_UI_LISTED_WORKERS && (query === "" || id.includes(query))) {
      listed.push({ worker_id: id, lifecycle: w.lifecycle, reasons: w.not_schedulable_reasons });
    }
  }
  return { total: workers.length, by_lifecycle: by, not_schedulable: listed };
}

/** The page's query: `q` (a worker-id search, digits only) and `top` (rank rows, 1..MAX_UI_TOP_RANKS). */
export function parseUiQuery(q: URLSearchParams | undefined): { query: string; top: number } {
  const query = (q?.get("q") ?? "").trim();
  if (query.length > MAX_UI_QUERY_CHARS || !/^[0-9]*$/.test(query)) throw badRequest(`q: a worker id search is up to ${MAX_UI_QUERY_CHARS} decimal digits`, "q");
  const rawTop = q?.get("top");
  if (rawTop === null || rawTop === undefined || rawTop === "") return { query, top: DEFAULT_UI_TOP_RANKS };
  const top = /^[0-9]{1,5}$/.test(rawTop) ? Number(rawTop) : Number.NaN;
  if (!(top >= 1 && top <= MAX_UI_TOP_RANKS)) throw badRequest(`top: an integer in [1, ${MAX_UI_TOP_RANKS}]`, "top");
  return { query, top };
}
