/** The status page's server side without sockets: the aggregation of GET /ui/state, its query, its files. */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/index.js";

import type { ModelLoadResponse, WorkerCatalogRecord } from "../../../src/core/index.js";
import { loadUiAssets, UI_ASSET_FILES } from "../../../src/http/ui/ui-assets.js";
import { StatusPage } from "../../../src/http/ui/ui-routes.js";
import {
  DEFAULT_UI_TOP_RANKS,
  MAX_UI_LISTED_WORKERS,
  MAX_UI_TOP_RANKS,
  parseUiQuery,
  rankTable,
  ratesBetween,
  RoutingHistory,
  routingView,
  UI_SERIES_SAMPLES,
  workerSummary,
  type RoutingSample,
} from "../../../src/http/ui/ui-state.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";
import { makeService, tokens, worker } from "../../helpers/core-fixtures.js";

const ZERO: Omit<RoutingSample, "t"> = {
  selections: 0,
  promptBlocks: 0,
  overlapBlocks: 0,
  selectionErrors: 0,
  reservations: 0,
  bindingsMoved: 0,
  bindingsRejected: 0,
  conflicts: 0,
  unpinned: 0,
  liveBindings: 0,
};
const sample = (t: number, c: Partial<RoutingSample> = {}): RoutingSample => ({ ...ZERO, t, ...c });

const record = (id: bigint, lifecycle: WorkerCatalogRecord["lifecycle"], totalKvBlocks: number | null = null, reasons: string[] = []): WorkerCatalogRecord =>
  ({ worker_id: id, lifecycle, total_kv_blocks: totalKvBlocks, not_schedulable_reasons: reasons }) as unknown as WorkerCatalogRecord;

const loadsOf = (rows: [id: bigint, rank: number, requests: number, blocks: number, prefill: number][], model = "m"): ModelLoadResponse => ({
  model_name: model,
  routing_group: "g",
  pending_count: 0,
  pending_isl_tokens: 0,
  loads: rows.map(([worker_id, dp_rank, active_requests, potential_decode_blocks, potential_prefill_tokens]) => ({ worker_id, dp_rank, active_requests, potential_decode_blocks, potential_prefill_tokens })),
});

describe("routing rates", () => {
  it("are per second between two samples, with overlap per selection and the hit ratio", () => {
    const r = ratesBetween(sample(0, { selections: 10, promptBlocks: 100, overlapBlocks: 20 }), sample(2_000, { selections: 30, promptBlocks: 300, overlapBlocks: 120, selectionErrors: 4, bindingsMoved: 2, conflicts: 1 }));
    expect(r).toEqual({
      selections_per_s: 10,
      errors_per_s: 2,
      reservations_per_s: 0,
      mean_overlap_blocks: 5,
      hit_ratio: 0.5,
      moved_per_s: 1,
      rejected_per_s: 0,
      conflicts_per_s: 0.5,
    });
  });

  it("give zeros and null ratios over an empty or backwards interval, and never negative rates", () => {
    const same = ratesBetween(sample(5, { selections: 3 }), sample(5, { selections: 9 }));
    expect(same.selections_per_s).toBe(0);
    expect(same.mean_overlap_blocks).toBe(0);
    const idle = ratesBetween(sample(0), sample(1_000));
    expect([idle.selections_per_s, idle.mean_overlap_blocks, idle.hit_ratio]).toEqual([0, null, null]);
    // A counter read lower (a partition removed with its affinity table) is not a negative rate.
    expect(ratesBetween(sample(0, { bindingsMoved: 5 }), sample(1_000, { bindingsMoved: 2 })).moved_per_s).toBe(0);
  });
});

describe("RoutingHistory", () => {
  it("keeps the last `capacity` samples, oldest first, across wrap-around", () => {
    const h = new RoutingHistory(3);
    expect(h.samples()).toEqual([]);
    for (let t = 1; t <= 5; t++) h.record(sample(t));
    expect(h.size).toBe(3);
    expect(h.samples().map((s) => s.t)).toEqual([3, 4, 5]);
    expect(h.samples(2).map((s) => s.t)).toEqual([4, 5]);
    expect(h.samples(10).map((s) => s.t)).toEqual([3, 4, 5]);
    expect(h.sampleSince(4)?.t).toBe(4);
    expect(h.sampleSince(0)?.t).toBe(3);
    expect(h.sampleSince(99)?.t).toBe(5);
  });

  it("refuses a capacity below 2", () => {
    expect(() => new RoutingHistory(1)).toThrow(KvmeshError);
    expect(() => new RoutingHistory(2.5)).toThrow(KvmeshError);
  });
});

describe("routingView", () => {
  it("rates the last 10 s and the whole window up to the current read, and sends the last samples as a series", () => {
    const h = new RoutingHistory(600);
    // 200 s at one sample a second: 1 selection/s for the first 190 s, then 5/s.
    let sel = 0;
    for (let t = 0; t <= 200; t++) {
      h.record(sample(t * 1_000, { selections: sel, promptBlocks: sel * 4, overlapBlocks: sel * 3 }));
      sel += t < 190 ? 1 : 5;
    }
    const last = h.samples(1)[0] as RoutingSample;
    const v = routingView(h, { ...last, t: last.t, liveBindings: 7, bindingsMoved: 2, conflicts: 1 });
    expect(v.recent.selections_per_s).toBe(5);
    expect(v.recent.hit_ratio).toBe(0.75);
    expect(v.window.selections_per_s).toBeCloseTo(last.selections / 200, 3);
    expect(v.window_s).toBe(200);
    expect(v.series).toHaveLength(UI_SERIES_SAMPLES);
    expect(v.series.at(-1)).toEqual({ t_ms: 0, selections_per_s: 5, hit_ratio: 0.75, mean_overlap_blocks: 3 });
    expect(v.series[0]?.t_ms).toBe(-(UI_SERIES_SAMPLES - 1) * 1_000);
    expect(v.bindings).toEqual({ live: 7, moved: 2, rejected: 0, unpinned: 0, conflicts: 1 });
    expect(v.totals.selections).toBe(last.selections);
  });

  it("answers with an empty history (zeros, no series)", () => {
    const v = routingView(new RoutingHistory(), sample(1_000, { selections: 4 }));
    expect(v.series).toEqual([]);
    expect(v.recent.selections_per_s).toBe(0);
    expect(v.window_s).toBe(0);
  });
});

describe("rankTable", () => {
  const workers = [record(1n, "schedulable", 1_000), record(2n, "draining"), record(18446744073709551615n, "schedulable", 500)];
  const loads = [
    loadsOf([
      [1n, 0, 2, 10, 0],
      [1n, 1, 5, 3, 7],
      [2n, 0, 5, 3, 9],
    ]),
    loadsOf([[18446744073709551615n, 0, 0, 40, 0]], "other"),
  ];

  it("sorts busiest first (requests, then blocks, then prefill tokens) and joins capacity and lifecycle", () => {
    const t = rankTable(loads, workers, "", 10);
    expect(t.rows.map((r) => `${r.worker_id}/${r.dp_rank}`)).toEqual(["2/0", "1/1", "1/0", "18446744073709551615/0"]);
    expect(t.rows[0]).toEqual({ worker_id: "2", dp_rank: 0, model_name: "m", routing_group: "g", lifecycle: "draining", active_requests: 5, active_blocks: 3, capacity_blocks: null, prefill_tokens: 9 });
    // A u64 id beyond 2^53 is sent exact, as a string.
    expect(t.rows[3]).toMatchObject({ worker_id: "18446744073709551615", model_name: "other", capacity_blocks: 500 });
    expect(t.totals).toEqual({
      active_requests: 12,
      active_blocks: 56,
      capacity_blocks: 2_500,
      prefill_tokens: 16,
      busy_ranks: 3,
      max_active_requests: 5,
      max_active_blocks: 40,
      max_prefill_tokens: 9,
    });
    expect([t.total, t.matched]).toEqual([4, 4]);
  });

  it("shows the top N but totals every matched rank, and searches worker ids as a substring", () => {
    const t = rankTable(loads, workers, "", 1);
    expect(t.rows).toHaveLength(1);
    expect(t.totals.active_requests).toBe(12);
    const s = rankTable(loads, workers, "1", 10);
    expect(s.rows.map((r) => r.worker_id)).toEqual(["1", "1", "18446744073709551615"]);
    expect([s.total, s.matched, s.totals.active_requests]).toEqual([4, 3, 7]);
    expect(rankTable(loads, workers, "999", 10).rows).toEqual([]);
  });

  it("stays within the top N at 1,024 ranks and orders ids numerically among equals", () => {
    const many = loadsOf(Array.from({ length: 1_024 }, (_, i): [bigint, number, number, number, number] => [BigInt(1_024 - i), 0, i % 7 === 0 ? 3 : 0, 0, 0]));
    const t = rankTable([many], [], "", DEFAULT_UI_TOP_RANKS);
    expect(t.rows).toHaveLength(DEFAULT_UI_TOP_RANKS);
    expect(t.total).toBe(1_024);
    expect(t.rows.every((r) => r.active_requests === 3)).toBe(true);
    const ids = t.rows.map((r) => Number(r.worker_id));
    expect(ids).toEqual([...ids].sort((a, b) => a - b));
    expect(t.rows[0]?.lifecycle).toBeNull();
  });
});

describe("workerSummary", () => {
  it("counts lifecycles and lists non-schedulable workers by id, with reasons, up to the cap", () => {
    const ws = [record(3n, "incomplete", null, ["block_size missing"]), record(1n, "schedulable"), record(2n, "draining")];
    expect(workerSummary(ws, "")).toEqual({
      total: 3,
      by_lifecycle: { schedulable: 1, draining: 1, incomplete: 1, unschedulable: 0 },
      not_schedulable: [
        { worker_id: "2", lifecycle: "draining", reasons: [] },
        { worker_id: "3", lifecycle: "incomplete", reasons: ["block_size missing"] },
      ],
    });
    expect(workerSummary(ws, "3").not_schedulable.map((w) => w.worker_id)).toEqual(["3"]);
    const lots = Array.from({ length: MAX_UI_LISTED_WORKERS + 5 }, (_, i) => record(BigInt(i), "draining"));
    const s = workerSummary(lots, "");
    expect(s.not_schedulable).toHaveLength(MAX_UI_LISTED_WORKERS);
    expect(s.by_lifecycle.draining).toBe(MAX_UI_LISTED_WORKERS + 5);
  });
});

describe("parseUiQuery", () => {
  const q = (s: string): URLSearchParams => new URLSearchParams(s);

  it("defaults, and takes a digit search and a top in range", () => {
    expect(parseUiQuery(undefined)).toEqual({ query: "", top: DEFAULT_UI_TOP_RANKS });
    expect(parseUiQuery(q("q=%2012%20&top=1024"))).toEqual({ query: "12", top: MAX_UI_TOP_RANKS });
    expect(parseUiQuery(q("top=&q="))).toEqual({ query: "", top: DEFAULT_UI_TOP_RANKS });
  });

  it("refuses a non-digit or over-long search and a top out of range, naming the field", () => {
    for (const [s, field] of [
      ["q=abc", "q"],
      ["q=1%3Cscript", "q"],
      [`q=${"1".repeat(33)}`, "q"],
      ["top=0", "top"],
      ["top=1025", "top"],
      ["top=1.5", "top"],
      ["top=-3", "top"],
      ["top=1e3", "top"],
    ] as const) {
      const e = kvmeshErrorOf(() => parseUiQuery(q(s)));
      expect(e.code, s).toBe("KVMESH_BAD_REQUEST");
      expect(e.details, s).toEqual({ field });
    }
  });
});

describe("the page's files", () => {
  it("loads every file with its content type; the HTML references only the daemon's own script and style", () => {
    const a = loadUiAssets();
    expect([...a.keys()]).toEqual(UI_ASSET_FILES.map(([p]) => p));
    const html = a.get("/ui")?.body ?? "";
    expect(a.get("/ui")?.contentType).toMatch(/^text\/html/);
    expect(a.get("/ui/app.js")?.contentType).toMatch(/^text\/javascript/);
    expect(html).toContain('src="/ui/app.js"');
    expect(html).toContain('href="/ui/app.css"');
    // No CDN, no inline script: the page works offline and under its CSP (script-src 'self').
    expect(html).not.toMatch(/https?:\/\//);
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/);
    expect(a.get("/ui/app.js")?.body).not.toMatch(/\.innerHTML\b|fetch\(\s*["'`]https?:/);
  });

  it("names the missing file when a build did not copy them", () => {
    const dir = mkdtempSync(join(tmpdir(), "kvmesh-ui-"));
    try {
      writeFileSync(join(dir, "index.html"), "<!doctype html>");
      expect(() => loadUiAssets(pathToFileURL(`${dir}/`))).toThrow(/app\.js is missing \(npm run build copies src\/http\/ui\/static/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("StatusPage.state", () => {
  it("assembles replica, workers, ranks and routing from a live service, with rates from its samples", () => {
    const { svc } = makeService({ sessionAffinity: { ttlSecs: 60, mode: "soft" } });
    let now = 0;
    const page = new StatusPage({ service: svc, now: () => now, meshSelf: () => ({ endpoint: "tcp://10.0.0.1:7100", events_shed: 3, snapshots_served: 1, snapshots_installed: 2, divergence_resyncs: 0 }) });
    svc.upsertWorker(worker(1, { total_kv_blocks: 100 }));
    svc.upsertWorker(worker(2, { total_kv_blocks: 100 }));
    page.sample();
    now = 2_000;
    const first = svc.selectAndReserve({ token_ids: tokens(4), session_id: "s", selection_id: "a" });
    const other = first.worker_id === 1n ? 2n : 1n;
    svc.selectAndReserve({ token_ids: tokens(4), session_id: "s", selection_id: "b", allowed_worker_ids: [other] });
    page.sample();
    const s = page.state({ query: new URLSearchParams("top=1") }) as {
      replica: Record<string, unknown>;
      peers: unknown[];
      workers: { total: number };
      ranks: { total: number; rows: { worker_id: string; active_requests: number; capacity_blocks: number }[]; totals: { active_requests: number } };
      routing: { recent: { selections_per_s: number }; bindings: { live: number; moved: number } };
    };
    expect(s.replica).toMatchObject({ id: "11", mesh_endpoint: "tcp://10.0.0.1:7100", mesh: false, ready: true, reservations_active: 2, events_shed: 3, snapshots_installed: 2, uptime_s: 2 });
    expect(s.peers).toEqual([]);
    expect(s.workers.total).toBe(2);
    expect(s.ranks.total).toBe(2);
    expect(s.ranks.rows).toHaveLength(1);
    expect(s.ranks.rows[0]).toMatchObject({ active_requests: 1, capacity_blocks: 100 });
    expect(s.ranks.totals.active_requests).toBe(2);
    expect(s.routing.recent.selections_per_s).toBe(1);
    expect(s.routing.bindings).toMatchObject({ live: 1, moved: 1 });
  });

  it("refuses a bad query with KVMESH_BAD_REQUEST before reading anything", () => {
    const { svc } = makeService();
    const page = new StatusPage({ service: svc });
    expect(kvmeshErrorOf(() => page.state({ query: new URLSearchParams("top=5000") })).details).toEqual({ field: "top" });
  });
});
