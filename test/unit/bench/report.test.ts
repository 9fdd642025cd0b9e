import { describe, expect, it } from "vitest";
import { defaultPlan, type BenchRow } from "../../../src/bench/fleet-bench.js";
import { benchSvg, benchTable, benchVerdict, withCeilings } from "../../../src/bench/report.js";
import { histogramGrowth, histogramQuantile, mergeHistograms, scrapeHistogram } from "../../../src/bench/stats.js";

const row = (policy: BenchRow["policy"], replicas: number, hit: number, sticky: number | null): BenchRow => ({
  policy,
  replicas,
  dispatched: 100,
  requests: 100,
  failed: 0,
  hit_ratio: hit,
  stickiness: sticky,
  ttft_p50_ms: 12,
  ttft_p99_ms: 80,
  select_p50_ms: policy === "kvmesh" || policy === "unmeshed" ? 0.8 : null,
  select_p99_ms: policy === "kvmesh" || policy === "unmeshed" ? 3 : null,
  lag_p50_ms: null,
  lag_p99_ms: replicas > 1 && policy === "kvmesh" ? 4 : null,
  shed: 0,
  wall_s: 30,
});

describe("bench plan and report", () => {
  it("plans meshed runs per replica count, unmeshed only above one, and one run per baseline", () => {
    expect(defaultPlan([1, 2, 4], ["kvmesh", "unmeshed", "round-robin", "random"])).toEqual([
      { policy: "kvmesh", replicas: 1 },
      { policy: "kvmesh", replicas: 2 },
      { policy: "kvmesh", replicas: 4 },
      { policy: "unmeshed", replicas: 2 },
      { policy: "unmeshed", replicas: 4 },
      { policy: "round-robin", replicas: 0 },
      { policy: "random", replicas: 0 },
    ]);
    expect(defaultPlan([1], ["unmeshed"])).toEqual([]);
  });

  it("prints one line per run and the hit-ratio gap of each multi-replica run to one replica", () => {
    const rows = [row("kvmesh", 1, 0.6, 1), row("kvmesh", 4, 0.598, 0.995), row("unmeshed", 4, 0.41, 0.3), row("round-robin", 0, 0.2, 0.25)];
    const table = benchTable(rows).split("\n");
    expect(table).toHaveLength(2 + rows.length);
    expect(table[2]).toMatch(/^kvmesh x1 .* 60\.00% .* 1\.0000/);
    expect(table[5]).toMatch(/^round-robin .* 20\.00% .* 0\.2500 .* - .* - /);
    expect(benchVerdict(rows)).toEqual(["kvmesh x4: hit ratio -0.20 points vs kvmesh x1, stickiness 0.9950", "unmeshed x4: hit ratio -19.00 points vs kvmesh x1, stickiness 0.3000"]);
    expect(benchVerdict([row("round-robin", 0, 0.2, null)])).toEqual([]);
  });

  it("draws a bar per run in each panel, labelled", () => {
    const rows = [row("kvmesh", 1, 0.6, 1), row("random", 0, 0.1, null)];
    const svg = benchSvg(rows, "t <1>");
    expect(svg.startsWith("<svg")).toBe(true);
    expect(svg).toContain("t &lt;1>");
    // hit ratio: one bar per row; TTFT: p50 and p99 per row.
    expect(svg.match(/<rect [^>]*><title>/g)?.length).toBe(rows.length * 3);
    expect(svg).toContain("kvmesh x1 hit ratio: 60.00");
  });
});

describe("Prometheus histogram scraping", () => {
  const text = [
    'kvmesh_mesh_replication_lag_seconds_bucket{le="0.001"} 10',
    'kvmesh_mesh_replication_lag_seconds_bucket{le="0.01"} 90',
    'kvmesh_mesh_replication_lag_seconds_bucket{le="+Inf"} 100',
    'kvmesh_mesh_peer_replication_lag_seconds_bucket{origin="7",le="0.001"} 1',
  ].join("\n");

  it("reads cumulative buckets in ms and interpolates quantiles", () => {
    const h = scrapeHistogram(text, "kvmesh_mesh_replication_lag_seconds");
    expect(h).toEqual({ leMs: [1, 10, Infinity], cum: [10, 90, 100] });
    expect(histogramQuantile(h.leMs, h.cum, 0.5)).toBeCloseTo(1 + (9 * 40) / 80, 9);
    // The 99th sample lies in +Inf: the last finite bound is the honest answer.
    expect(histogramQuantile(h.leMs, h.cum, 0.99)).toBe(10);
    expect(Number.isNaN(histogramQuantile([], [], 0.5))).toBe(true);
  });

  it("sums per-label series and merges replicas", () => {
    const two = scrapeHistogram(text.replaceAll("le=", 'origin="1",le=') + "\n" + text.replaceAll("le=", 'origin="2",le='), "kvmesh_mesh_replication_lag_seconds");
    expect(two.cum).toEqual([20, 180, 200]);
    expect(mergeHistograms(two, two).cum).toEqual([40, 360, 400]);
    expect(mergeHistograms({ leMs: [], cum: [] }, two)).toEqual(two);
  });

  it("keeps only the series that carry the asked labels, in any label order", () => {
    const http = [
      'kvmesh_http_request_duration_seconds_bucket{route="/select",le="0.001"} 5',
      'kvmesh_http_request_duration_seconds_bucket{route="/select",le="+Inf"} 6',
      'kvmesh_http_request_duration_seconds_bucket{route="/select_and_reserve",le="0.001"} 3',
      'kvmesh_http_request_duration_seconds_bucket{le="+Inf",route="/select_and_reserve"} 4',
    ].join("\n");
    expect(scrapeHistogram(http, "kvmesh_http_request_duration_seconds", { route: "/select_and_reserve" })).toEqual({ leMs: [1, Infinity], cum: [3, 4] });
    expect(scrapeHistogram(http, "kvmesh_http_request_duration_seconds").cum).toEqual([8, 10]);
    expect(scrapeHistogram(http, "kvmesh_http_request_duration_seconds", { route: "/nope" })).toEqual({ leMs: [], cum: [] });
  });

  it("sums a window's growth over replicas", () => {
    const before = [
      { leMs: [1, Infinity], cum: [1, 2] },
      { leMs: [1, Infinity], cum: [0, 0] },
    ];
    const after = [
      { leMs: [1, Infinity], cum: [4, 6] },
      { leMs: [1, Infinity], cum: [2, 3] },
    ];
    expect(histogramGrowth(before, after)).toEqual({ leMs: [1, Infinity], cum: [5, 7] });
    expect(histogramGrowth([], [])).toEqual({ leMs: [], cum: [] });
  });
});

describe("bench report with the workload's ceiling", () => {
  it("shows each row's hit ratio beside the ceilings of what it dispatched, and as a share of them", () => {
    const rows = [row("kvmesh", 1, 0.24, null), { ...row("round-robin", 0, 0.06, null), dispatched: 50 }];
    const asked: number[] = [];
    const shown = withCeilings(rows, (n) => {
      asked.push(n);
      return { requests: n, skipped: 0, promptTokens: 1_000 * n, oneCache: 0.32, oracle: 0.3 };
    });
    expect(asked).toEqual([100, 50]);
    expect(shown[0]).toMatchObject({ ceiling_one_cache: 0.32, ceiling_oracle: 0.3 });
    expect(shown[0]?.share_of_ceiling).toBeCloseTo(0.75, 12);
    expect(shown[0]?.share_of_oracle).toBeCloseTo(0.8, 12);
    const table = benchTable(shown).split("\n");
    expect(table[0]).toMatch(/hit ratio +ceiling +oracle +of ceiling +of oracle/);
    expect(table[2]).toMatch(/^kvmesh x1 .* 24\.00% +32\.00% +30\.00% +75\.0% +80\.0% /);
    expect(table[3]).toMatch(/^round-robin .* 6\.00% +32\.00% +30\.00% +18\.8% +20\.0% /);
    // Without a ceiling, the columns say so.
    expect(benchTable(rows).split("\n")[2]).toMatch(/ 24\.00% +- +- +- +- /);
  });

  it("leaves the share out when the workload has no reuse at all", () => {
    const [r] = withCeilings([row("random", 0, 0, null)], () => ({ requests: 100, skipped: 0, promptTokens: 1, oneCache: 0, oracle: 0 }));
    expect(r).toMatchObject({ ceiling_one_cache: 0, ceiling_oracle: 0 });
    expect(r?.share_of_ceiling).toBeUndefined();
    expect(benchTable([r as BenchRow]).split("\n")[2]).toMatch(/ 0\.00% +0\.00% +0\.00% +- +- /);
  });
});
