/**
 * What bench:scale measures, and how it is printed, saved and plotted. One report per run
 * (`label` names the build measured); `--compare` loads another run's JSON and shows it beside.
 */
import type { LoadReplication } from "../../src/core/index.js";
import { capacityCurve, MODEL_REPLICA_COUNTS, modelledCapacity, type IdleCpu, type ReplicaCpu } from "./scale-model.js";
import { lineChart, type Series } from "./svg-plot.js";

export type { IdleCpu, MarginalCpu, ReplicaCpu } from "./scale-model.js";

export interface ScalePoint {
  readonly rate: number;
  readonly peers: number;
  readonly routed: number;
  /** Requests routed per second of issuing (the window also holds the drain to the last free). */
  readonly achievedRatePerS: number;
  readonly windowMs: number;
  readonly errors: number;
  readonly errorSample: string;
  readonly droppedTicks: number;
  readonly origin: ReplicaCpu;
  readonly peerCpu: readonly ReplicaCpu[];
  /** Mean over peers of peer main / origin main (null without peers). */
  readonly ratio: number | null;
  readonly capacity: readonly { readonly n: number; readonly x: number }[];
  /**
   * Mean over peers of peer marginal main / origin marginal main, the model for replicas at
   * saturation (null without peers or an idle window; absent from older reports).
   */
  readonly marginalRatio?: number | null;
  readonly marginalCapacity?: readonly { readonly n: number; readonly x: number }[];
  readonly meshBytes: {
    /** TCP payload the origin's XPUB sent, all peers together, per routed request. */
    readonly originSentPerRequest: number;
    readonly perPeerPerRequest: number | null;
    /** Every mesh connection (XPUB and control ports of every replica), both directions. */
    readonly allPerRequest: number;
    readonly connectionsOpened: number;
    readonly connectionsClosed: number;
  };
  readonly lag: { readonly samples: number; readonly p50Ms: number; readonly p99Ms: number };
  /** The origin's outbound events shed: in the window, and since it started. */
  readonly shed: number;
  readonly shedTotal: number;
  /** Over the window, all peers. */
  readonly gaps: number;
  readonly snapshotsInstalled: number;
  readonly divergenceResyncs: number;
  /** The origin's, over the window. */
  readonly batchesSent: number;
  readonly eventsSent: number;
  readonly loadGeneratorCpuMs: number;
  /** 1-minute load average at the end of the window: above the core count, everyone waits. */
  readonly machineLoad1m: number;
}

export interface StressStep {
  readonly rate: number;
  /** 1, or 2 and on for a step measured again after it failed (--stress-retries). */
  readonly attempt: number;
  readonly requests: number;
  readonly windowMs: number;
  readonly lag: { readonly samples: number; readonly p50Ms: number; readonly p99Ms: number };
  /** The peer's own p99 over its last 1,024 lag samples (GET /replica_sync/status). */
  readonly peerReservoirP99Ms: number | null;
  readonly gaps: number;
  readonly snapshotsInstalled: number;
  readonly divergenceResyncs: number;
  /** The fake origin's failed publishes (nothing is queued and dropped on our side otherwise). */
  readonly shed: number;
  /** The peer applied every batch of the step within the catch-up timeout. */
  readonly caughtUp: boolean;
  readonly catchUpMs: number;
  readonly peer: ReplicaCpu;
  /** The fake origin (this process): CPU cores busy, worst tick gap, most publishes queued. */
  readonly generator: { readonly cores: number; readonly maxTickGapMs: number; readonly maxPendingPublishes: number };
  /**
   * Published by the fake origin in the window: exact mode cuts them every 2 ms tick (<= 256
   * events); aggregate mode sends one per flush (at most one per aggregation interval).
   */
  readonly batches: number;
  /** batches over the window's seconds (absent from reports before the load replication modes). */
  readonly batchesPerS?: number;
  readonly events: number;
  readonly machineLoad1m: number;
  readonly keptUp: boolean;
  readonly why: string;
}

export interface StressResult {
  readonly lagTargetMs: number;
  /** The peer's idle rates, over one window before the steps (null with --idle-seconds 0; absent from older reports). */
  readonly idle?: IdleCpu | null;
  /** What the fake origin spoke and the peer ran (absent from reports before the modes: exact). */
  readonly loadReplication?: LoadReplication;
  /** Aggregate mode: the fake origin's flush spacing, ms; null in exact mode. */
  readonly aggregateIntervalMs?: number | null;
  readonly steps: readonly StressStep[];
  /** The highest rate kept up with, and the step it was measured in (null: not even the first). */
  readonly maxRate: number | null;
  readonly atMax: StressStep | null;
}

export interface ScaleReport {
  readonly tool: "bench:scale";
  readonly label: string;
  readonly measuredAt: string;
  /** Every serve's --load-replication (absent from reports before the modes: exact). */
  readonly loadReplication?: LoadReplication;
  /** Aggregate mode: --mesh-aggregate-interval-ms in effect, ms; null in exact mode. */
  readonly aggregateIntervalMs?: number | null;
  readonly config: Readonly<Record<string, unknown>>;
  readonly method: readonly string[];
  readonly points: readonly ScalePoint[];
  readonly stress: StressResult | null;
}

const f = (v: number | null | undefined, digits = 0): string => (v === null || v === undefined || !Number.isFinite(v) ? "-" : v.toFixed(digits));
const us = (v: number): string => f(v, 0);

/** Marks a marginal figure clamped at 0 in the tables. */
export const CLAMPED_MARK = "*";
export const CLAMPED_NOTE = `${CLAMPED_MARK} marginal cost clamped at 0: the window's CPU was below the idle rate x the window's length`;

const clamped = (c: ReplicaCpu): boolean => c.marginal !== undefined && (c.marginal.mainClamped || c.marginal.allClamped);

/** A replica's marginal us per request on one thread set, `*` when clamped at 0, `-` without an idle window. */
export function marginal(c: ReplicaCpu, which: "main" | "all"): string {
  const m = c.marginal;
  if (m === undefined) return "-";
  return which === "main" ? `${us(m.mainUs)}${m.mainClamped ? CLAMPED_MARK : ""}` : `${us(m.allUs)}${m.allClamped ? CLAMPED_MARK : ""}`;
}

const each = (p: ScalePoint, g: (c: ReplicaCpu) => string): string => (p.peerCpu.length === 0 ? "-" : p.peerCpu.map(g).join(" / "));

/** Rows = figures, columns = (label, rate, K) points. */
export function pointsTable(reports: readonly ScaleReport[]): string {
  const cols = reports.flatMap((r) => r.points.map((p) => ({ label: r.label, p, base: r.points.find((q) => q.rate === p.rate && q.peers === 0) })));
  const rows: [string, (c: (typeof cols)[number]) => string][] = [
    ["routed / achieved req/s", ({ p }) => `${p.routed} / ${f(p.achievedRatePerS, 1)}`],
    ["errors / dropped ticks", ({ p }) => `${p.errors} / ${p.droppedTicks}`],
    ["origin main us/req", ({ p }) => us(p.origin.mainUs)],
    ["origin all threads us/req", ({ p }) => us(p.origin.allUs)],
    ["origin main vs K=0", ({ p, base }) => (base === undefined || p.peers === 0 ? "-" : `${f(p.origin.mainUs / base.origin.mainUs, 2)}x`)],
    ["peer main us/req (each)", ({ p }) => (p.peerCpu.length === 0 ? "-" : p.peerCpu.map((c) => us(c.mainUs)).join(" / "))],
    ["peer all threads us/req", ({ p }) => (p.peerCpu.length === 0 ? "-" : p.peerCpu.map((c) => us(c.allUs)).join(" / "))],
    ["ratio peer/origin main", ({ p }) => f(p.ratio, 3)],
    ...MODEL_REPLICA_COUNTS.map((n): [string, (c: (typeof cols)[number]) => string] => [`modelled capacity N=${n}`, ({ p }) => (p.ratio === null ? "-" : `${f(modelledCapacity(n, p.ratio), 2)}x`)]),
    ["idle window s (before warm-up)", ({ p }) => (p.origin.idle === undefined ? "-" : f(p.origin.idle.windowMs / 1000, 1))],
    ["origin idle main ms/s", ({ p }) => f(p.origin.idle?.mainMsPerS, 1)],
    ["origin idle all ms/s", ({ p }) => f(p.origin.idle?.allMsPerS, 1)],
    ["peer idle main ms/s (each)", ({ p }) => each(p, (c) => f(c.idle?.mainMsPerS, 1))],
    ["peer idle all ms/s", ({ p }) => each(p, (c) => f(c.idle?.allMsPerS, 1))],
    ["origin marginal main us/req", ({ p }) => marginal(p.origin, "main")],
    ["origin marginal all us/req", ({ p }) => marginal(p.origin, "all")],
    ["peer marginal main us/req (each)", ({ p }) => each(p, (c) => marginal(c, "main"))],
    ["peer marginal all us/req", ({ p }) => each(p, (c) => marginal(c, "all"))],
    ["marginal ratio peer/origin main", ({ p }) => f(p.marginalRatio, 3)],
    ...MODEL_REPLICA_COUNTS.map((n): [string, (c: (typeof cols)[number]) => string] => [`marginal capacity N=${n} (saturated)`, ({ p }) => (p.marginalRatio === null || p.marginalRatio === undefined ? "-" : `${f(modelledCapacity(n, p.marginalRatio), 2)}x`)]),
    ["mesh bytes/req origin out", ({ p }) => f(p.meshBytes.originSentPerRequest)],
    ["mesh bytes/req per peer", ({ p }) => f(p.meshBytes.perPeerPerRequest)],
    ["mesh bytes/req all links", ({ p }) => f(p.meshBytes.allPerRequest)],
    ["batches / events per batch", ({ p }) => (p.batchesSent === 0 ? "-" : `${p.batchesSent} / ${f(p.eventsSent / p.batchesSent, 2)}`)],
    ["lag p50 / p99 ms", ({ p }) => (p.peers === 0 ? "-" : `${f(p.lag.p50Ms, 2)} / ${f(p.lag.p99Ms, 2)}`)],
    ["shed window / total", ({ p }) => `${p.shed} / ${p.shedTotal}`],
    ["gaps / snapshots / resyncs", ({ p }) => `${p.gaps} / ${p.snapshotsInstalled} / ${p.divergenceResyncs}`],
    ["load generator cores", ({ p }) => f(p.loadGeneratorCpuMs / p.windowMs, 2)],
    ["machine load (1 min)", ({ p }) => f(p.machineLoad1m, 1)],
  ];
  const head = cols.map(({ label, p }) => `${reports.length > 1 ? `${label} ` : ""}${p.rate}/s K=${p.peers}`);
  const w0 = Math.max(...rows.map(([n]) => n.length));
  const widths = cols.map((c, i) => Math.max(12, (head[i] ?? "").length, ...rows.map(([, g]) => g(c).length)));
  const line = (name: string, cells: string[]): string => `${name.padEnd(w0)}  ${cells.map((c, i) => c.padStart(widths[i] ?? 0)).join("  ")}`;
  const table = [line("", head), ...rows.map(([name, g]) => line(name, cols.map(g)))];
  if (cols.some(({ p }) => [p.origin, ...p.peerCpu].some(clamped))) table.push(CLAMPED_NOTE);
  return table.join("\n");
}

export function stressTable(reports: readonly ScaleReport[]): string {
  const out: string[] = [];
  for (const r of reports) {
    const s = r.stress;
    if (s === null) continue;
    const mode = s.loadReplication === undefined ? "" : s.loadReplication === "aggregate" ? `, aggregate load replication every ${s.aggregateIntervalMs ?? "?"} ms` : ", exact load replication";
    out.push(`${r.label}: stress, one peer${mode} (keeping up: lag p99 <= ${s.lagTargetMs} ms, 0 gaps, 0 snapshots, 0 divergence resyncs, 0 shed)`);
    if (s.idle !== undefined && s.idle !== null) out.push(`${r.label}: peer idle before the steps (${f(s.idle.windowMs / 1000, 1)} s, no traffic): main thread ${f(s.idle.mainMsPerS, 1)} ms/s, all threads ${f(s.idle.allMsPerS, 1)} ms/s; marg: (CPU - idle rate x window) / requests`);
    out.push(`${"rate/s".padStart(7)} ${"lag p50/p99 ms".padStart(15)} ${"rsv p99".padStart(8)} ${"gaps".padStart(5)} ${"snap".padStart(5)} ${"rsync".padStart(5)} ${"shed".padStart(5)} ${"peer main us".padStart(12)} ${"peer all us".padStart(11)} ${"marg main us".padStart(12)} ${"marg all us".padStart(11)} ${"peer main cores".padStart(15)} ${"ceiling/s".padStart(9)} ${"batches/s".padStart(9)} ${"ev/batch".padStart(8)} ${"gen cores".padStart(9)} ${"gen stall ms".padStart(12)} ${"load".padStart(5)}  verdict`);
    for (const st of s.steps) {
      out.push(
        `${`${st.rate}${st.attempt > 1 ? `#${st.attempt}` : ""}`.padStart(7)} ${`${f(st.lag.p50Ms, 2)}/${f(st.lag.p99Ms, 2)}`.padStart(15)} ${f(st.peerReservoirP99Ms, 1).padStart(8)} ${String(st.gaps).padStart(5)} ${String(st.snapshotsInstalled).padStart(5)} ${String(st.divergenceResyncs).padStart(5)} ${String(st.shed).padStart(5)} ${us(st.peer.mainUs).padStart(12)} ${us(st.peer.allUs).padStart(11)} ${marginal(st.peer, "main").padStart(12)} ${marginal(st.peer, "all").padStart(11)} ${f(st.peer.mainCores, 2).padStart(15)} ${f(1e6 / st.peer.mainUs).padStart(9)} ${f(st.batchesPerS ?? (st.batches * 1000) / st.windowMs).padStart(9)} ${f(st.events / Math.max(1, st.batches), 1).padStart(8)} ${f(st.generator.cores, 2).padStart(9)} ${f(st.generator.maxTickGapMs, 0).padStart(12)} ${f(st.machineLoad1m, 1).padStart(5)}  ${st.keptUp ? "kept up" : `behind: ${st.why}`}`,
      );
    }
    out.push(
      s.atMax === null
        ? `${r.label}: the peer fell behind at the first rate`
        : `${r.label}: highest rate kept up with: ${s.maxRate} replicated requests/s; peer CPU there ${us(s.atMax.peer.mainUs)} us main thread, ${us(s.atMax.peer.allUs)} us all threads per request`,
    );
    out.push("ceiling/s: 1 core / the peer's main-thread us per request at that step, the rate at which its event loop alone would saturate (an extrapolation at that step's batch size, not a measurement)");
    if (s.steps.some((st) => clamped(st.peer))) out.push(CLAMPED_NOTE);
  }
  return out.join("\n");
}

/**
 * Capacity against N for every point with peers, of every report, and the linear ideal: per point
 * the per-request model (solid) and, when an idle window was measured, the marginal one (dashed,
 * same colour).
 */
export function capacitySvg(reports: readonly ScaleReport[]): string {
  const series: Series[] = [{ name: "linear (ideal)", points: [1, ...MODEL_REPLICA_COUNTS].map((n) => [n, n] as const), color: "#7f7f7f" }];
  let k = 0;
  for (const r of reports) {
    for (const p of r.points) {
      if (p.ratio === null) continue;
      const color = PLOT_COLORS[k++ % PLOT_COLORS.length] ?? "black";
      const name = `${r.label} ${p.rate}/s K=${p.peers}`;
      series.push({ name: `${name} per req`, points: capacityCurve(p.ratio), color });
      if (p.marginalRatio !== null && p.marginalRatio !== undefined) series.push({ name: `${name} marginal`, points: capacityCurve(p.marginalRatio), color, dashed: true });
    }
  }
  const legendChars = Math.max(...series.map((s) => s.name.length));
  return lineChart({
    title: "Modelled capacity N / (1 + (N-1) x peer main / origin main): solid per request, dashed marginal",
    xLabel: "replicas N",
    yLabel: "capacity (x one replica)",
    series,
    width: 560 + Math.max(170, 30 + legendChars * 7),
    legendWidth: Math.max(170, 30 + legendChars * 7),
  });
}

const PLOT_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

export function parseReport(text: string, file: string): ScaleReport {
  const r = JSON.parse(text) as Partial<ScaleReport>;
  if (r.tool !== "bench:scale" || !Array.isArray(r.points)) throw new Error(`${file} is not a bench:scale report`);
  return { ...r, stress: r.stress ?? null } as ScaleReport;
}
