/** `kvmesh bench` output: a text table, JSON rows and an SVG chart (no plotting dependency needed). */
import type { CeilingFigures } from "./ceiling.js";
import { type BenchRow, labelOf } from "./fleet-bench.js";

const pct = (v: number): string => `${(100 * v).toFixed(2)}%`;
const opt = (v: number | undefined, digits = 2): string => (v === undefined || !Number.isFinite(v) ? "-" : `${(100 * v).toFixed(digits)}%`);
const ms = (v: number | null): string => (v === null || !Number.isFinite(v) ? "-" : v < 10 ? v.toFixed(2) : v.toFixed(0));

/**
 * Each row with the ceilings of what it dispatched (`ceilingAt(n)`: the figures over the first n
 * requests) and its hit ratio as a share of them. A ceiling of 0 (no reuse) leaves the share out.
 */
export function withCeilings(rows: readonly BenchRow[], ceilingAt: (n: number) => CeilingFigures): BenchRow[] {
  return rows.map((r) => {
    const c = ceilingAt(r.dispatched);
    const share = (ceiling: number): number | undefined => (ceiling > 0 ? r.hit_ratio / ceiling : undefined);
    const one = share(c.oneCache);
    const oracle = share(c.oracle);
    return {
      ...r,
      ceiling_one_cache: c.oneCache,
      ceiling_oracle: c.oracle,
      ...(one === undefined ? {} : { share_of_ceiling: one }),
      ...(oracle === undefined ? {} : { share_of_oracle: oracle }),
    };
  });
}

export function benchTable(rows: readonly BenchRow[]): string {
  const head = ["policy", "requests", "failed", "hit ratio", "ceiling", "oracle", "of ceiling", "of oracle", "stickiness", "TTFT p50 ms", "TTFT p99 ms", "select p50 ms", "select p99 ms", "lag p99 ms", "shed"];
  const body = rows.map((r) => [
    labelOf(r),
    String(r.requests),
    String(r.failed),
    pct(r.hit_ratio),
    opt(r.ceiling_one_cache),
    opt(r.ceiling_oracle),
    opt(r.share_of_ceiling, 1),
    opt(r.share_of_oracle, 1),
    r.stickiness === null ? "-" : r.stickiness.toFixed(4),
    ms(r.ttft_p50_ms),
    ms(r.ttft_p99_ms),
    ms(r.select_p50_ms),
    ms(r.select_p99_ms),
    ms(r.lag_p99_ms),
    String(r.shed),
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => (b[i] ?? "").length)));
  const line = (cells: readonly string[]): string => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0))).join("  ");
  return [line(head), widths.map((w) => "-".repeat(w)).join("  "), ...body.map(line)].join("\n");
}

/**
 * What the issue asks the run to show: the hit-ratio gap of 4 meshed replicas to one, and the
 * gap 4 unmeshed replicas leave open. Lines only for the rows present.
 */
export function benchVerdict(rows: readonly BenchRow[]): string[] {
  const find = (policy: string, n: number): BenchRow | undefined => rows.find((r) => r.policy === policy && r.replicas === n);
  const one = find("kvmesh", 1);
  const out: string[] = [];
  if (one === undefined) return out;
  for (const r of rows) {
    if ((r.policy !== "kvmesh" && r.policy !== "unmeshed") || r.replicas === 1) continue;
    const gap = 100 * (one.hit_ratio - r.hit_ratio);
    const sticky = r.stickiness === null ? "" : `, stickiness ${r.stickiness.toFixed(4)}`;
    out.push(`${labelOf(r)}: hit ratio ${gap >= 0 ? "-" : "+"}${Math.abs(gap).toFixed(2)} points vs kvmesh x1${sticky}`);
  }
  return out;
}

const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
const esc = (s: string): string => s.replace(/&/g, "&amp;").replace(/</g, "&lt;");

/** Two bar panels side by side: engine-measured hit ratio and TTFT p50/p99, one bar group per row. */
export function benchSvg(rows: readonly BenchRow[], title: string): string {
  const W = 980;
  const H = 420;
  const panelW = (W - 60) / 2;
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${String(W)}" height="${String(H)}" font-family="sans-serif" font-size="11">`,
    `<rect width="${String(W)}" height="${String(H)}" fill="white"/>`,
    `<text x="${String(W / 2)}" y="20" text-anchor="middle" font-size="14">${esc(title)}</text>`,
  ];
  const labels = rows.map((r) => labelOf(r));
  parts.push(panel(20, panelW, H, "engine-measured KV hit ratio (%)", labels, [rows.map((r) => 100 * r.hit_ratio)], ["hit ratio"]));
  parts.push(panel(40 + panelW, panelW, H, "TTFT (queue + prefill), ms", labels, [rows.map((r) => r.ttft_p50_ms), rows.map((r) => r.ttft_p99_ms)], ["p50", "p99"]));
  parts.push("</svg>");
  return parts.join("\n");
}

function panel(x0: number, w: number, h: number, title: string, labels: readonly string[], series: readonly (readonly number[])[], names: readonly string[]): string {
  const m = { t: 50, b: 90, l: 50 };
  const plotH = h - m.t - m.b;
  const plotW = w - m.l;
  const max = Math.max(1e-9, ...series.flat().filter(Number.isFinite));
  const groupW = plotW / Math.max(1, labels.length);
  const barW = (groupW * 0.8) / series.length;
  const y = (v: number): number => m.t + plotH - (plotH * v) / max;
  const out = [`<g>`, `<text x="${String(x0 + w / 2)}" y="40" text-anchor="middle" font-size="12">${esc(title)}</text>`];
  out.push(`<line x1="${String(x0 + m.l)}" y1="${String(m.t + plotH)}" x2="${String(x0 + w)}" y2="${String(m.t + plotH)}" stroke="black"/>`);
  for (let i = 0; i <= 4; i++) {
    const v = (max * i) / 4;
    out.push(`<text x="${String(x0 + m.l - 4)}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end">${v >= 100 ? v.toFixed(0) : v.toFixed(1)}</text>`);
    out.push(`<line x1="${String(x0 + m.l)}" y1="${y(v).toFixed(1)}" x2="${String(x0 + w)}" y2="${y(v).toFixed(1)}" stroke="#eee"/>`);
  }
  labels.forEach((label, g) => {
    const gx = x0 + m.l + g * groupW + groupW * 0.1;
    series.forEach((s, k) => {
      const v = s[g] ?? 0;
      const safe = Number.isFinite(v) ? v : 0;
      out.push(`<rect x="${(gx + k * barW).toFixed(1)}" y="${y(safe).toFixed(1)}" width="${(barW - 1).toFixed(1)}" height="${(m.t + plotH - y(safe)).toFixed(1)}" fill="${COLORS[k % COLORS.length] ?? "black"}"><title>${esc(label)} ${esc(names[k] ?? "")}: ${safe.toFixed(2)}</title></rect>`);
    });
    const lx = gx + (groupW * 0.8) / 2;
    const ly = m.t + plotH + 12;
    out.push(`<text x="${lx.toFixed(1)}" y="${String(ly)}" text-anchor="end" transform="rotate(-35 ${lx.toFixed(1)} ${String(ly)})">${esc(label)}</text>`);
  });
  if (series.length > 1) {
    names.forEach((n, k) => {
      // Beside the panel title, above the bars: inside the plot a tall bar would hide it.
      out.push(`<rect x="${String(x0 + m.l + k * 50)}" y="${String(m.t - 16)}" width="10" height="10" fill="${COLORS[k % COLORS.length] ?? "black"}"/>`);
      out.push(`<text x="${String(x0 + m.l + k * 50 + 14)}" y="${String(m.t - 7)}">${esc(n)}</text>`);
    });
  }
  out.push("</g>");
  return out.join("\n");
}
