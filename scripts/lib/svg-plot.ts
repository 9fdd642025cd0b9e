/** Minimal SVG line charts for benchmark reports (no plotting dependency needed for this). */

export interface Series {
  readonly name: string;
  readonly points: readonly (readonly [number, number])[];
  /** Defaults to the palette colour of the series' index. */
  readonly color?: string;
  /** A dashed line (its legend swatch too). */
  readonly dashed?: boolean;
}

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

export function lineChart(opts: { title: string; xLabel: string; yLabel: string; series: readonly Series[]; logX?: boolean; width?: number; height?: number; legendWidth?: number }): string {
  const W = opts.width ?? 720;
  const H = Math.max(opts.height ?? 420, 40 + opts.series.length * 20 + 50);
  const m = { l: 70, r: opts.legendWidth ?? 170, t: 40, b: 50 };
  const all = opts.series.flatMap((s) => s.points);
  const fx = (x: number): number => (opts.logX === true ? Math.log10(Math.max(x, 1e-9)) : x);
  const xs = all.map((p) => fx(p[0]));
  const ys = all.map((p) => p[1]);
  const x0 = Math.min(...xs);
  const x1 = Math.max(...xs, x0 + 1e-9);
  const y0 = Math.min(0, ...ys);
  const y1 = Math.max(...ys, y0 + 1e-9);
  const px = (x: number): number => m.l + ((fx(x) - x0) / (x1 - x0)) * (W - m.l - m.r);
  const py = (y: number): number => H - m.b - ((y - y0) / (y1 - y0)) * (H - m.t - m.b);
  const esc = (s: string): string => s.replace(/&/g, "&amp;").replace(/</g, "&lt;");
  const parts: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="white"/>`,
    `<text x="${W / 2}" y="22" text-anchor="middle" font-size="15">${esc(opts.title)}</text>`,
    `<line x1="${m.l}" y1="${H - m.b}" x2="${W - m.r}" y2="${H - m.b}" stroke="black"/>`,
    `<line x1="${m.l}" y1="${m.t}" x2="${m.l}" y2="${H - m.b}" stroke="black"/>`,
    `<text x="${(m.l + W - m.r) / 2}" y="${H - 12}" text-anchor="middle">${esc(opts.xLabel)}</text>`,
    `<text x="16" y="${(m.t + H - m.b) / 2}" text-anchor="middle" transform="rotate(-90 16 ${(m.t + H - m.b) / 2})">${esc(opts.yLabel)}</text>`,
  ];
  for (let i = 0; i <= 5; i++) {
    const yv = y0 + ((y1 - y0) * i) / 5;
    parts.push(`<text x="${m.l - 6}" y="${py(yv) + 4}" text-anchor="end">${fmt(yv)}</text>`);
    parts.push(`<line x1="${m.l}" y1="${py(yv)}" x2="${W - m.r}" y2="${py(yv)}" stroke="#eee"/>`);
    const xv = x0 + ((x1 - x0) * i) / 5;
    const label = opts.logX === true ? 10 ** xv : xv;
    const xp = m.l + ((xv - x0) / (x1 - x0)) * (W - m.l - m.r);
    parts.push(`<text x="${xp}" y="${H - m.b + 16}" text-anchor="middle">${fmt(label)}</text>`);
  }
  opts.series.forEach((s, i) => {
    const color = s.color ?? COLORS[i % COLORS.length] ?? "black";
    const dash = s.dashed === true ? ` stroke-dasharray="6 4"` : "";
    const d = s.points.map((p, k) => `${k === 0 ? "M" : "L"}${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join(" ");
    parts.push(`<path d="${d}" fill="none" stroke="${color}" stroke-width="2"${dash}/>`);
    parts.push(
      s.dashed === true
        ? `<line x1="${W - m.r + 8}" y1="${m.t + i * 20 + 6}" x2="${W - m.r + 26}" y2="${m.t + i * 20 + 6}" stroke="${color}" stroke-width="2"${dash}/>`
        : `<rect x="${W - m.r + 12}" y="${m.t + i * 20}" width="12" height="12" fill="${color}"/>`,
    );
    parts.push(`<text x="${W - m.r + 30}" y="${m.t + i * 20 + 10}">${esc(s.name)}</text>`);
  });
  parts.push("</svg>");
  return parts.join("\n");
}

function fmt(v: number): string {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1000) return v.toFixed(0);
  if (a >= 10) return v.toFixed(1);
  if (a >= 0.1) return v.toFixed(2);
  return v.toPrecision(2);
}

/** Empirical CDF points (x = value, y = fraction <= x), thinned to at most `max` points. */
export function cdf(samples: readonly number[], max = 200): [number, number][] {
  const s = Float64Array.from(samples).sort();
  const out: [number, number][] = [];
  const step = Math.max(1, Math.floor(s.length / max));
  for (let i = 0; i < s.length; i += step) out.push([s[i] as number, (i + 1) / s.length]);
  if (s.length > 0) out.push([s[s.length - 1] as number, 1]);
  return out;
}
