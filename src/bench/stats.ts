/** Percentiles for benchmark reports. */

/** Nearest-rank percentile of ascending samples; NaN when empty. */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i] as number;
}

export interface Summary {
  readonly n: number;
  readonly p50: number;
  readonly p90: number;
  readonly p99: number;
  readonly max: number;
  readonly mean: number;
}

export function summarize(samples: readonly number[]): Summary {
  const s = Float64Array.from(samples).sort();
  const mean = samples.reduce((a, b) => a + b, 0) / Math.max(1, samples.length);
  return { n: s.length, p50: percentile(s, 50), p90: percentile(s, 90), p99: percentile(s, 99), max: s[s.length - 1] ?? Number.NaN, mean };
}

/**
 * histogram_quantile over cumulative Prometheus buckets (upper bounds in ms, +Inf last): linear
 * within the bucket that holds the rank, the last finite bound when it falls in +Inf.
 */
export function histogramQuantile(leMs: readonly number[], cum: readonly number[], q: number): number {
  const total = cum[cum.length - 1] ?? 0;
  if (total === 0) return Number.NaN;
  const rank = q * total;
  for (let i = 0; i < cum.length; i++) {
    const c = cum[i] as number;
    if (c < rank) continue;
    const hi = leMs[i] as number;
    const lo = i === 0 ? 0 : (leMs[i - 1] as number);
    if (!Number.isFinite(hi)) return lo;
    const prev = i === 0 ? 0 : (cum[i - 1] as number);
    return c === prev ? hi : lo + ((hi - lo) * (rank - prev)) / (c - prev);
  }
  return leMs[leMs.length - 2] ?? Number.NaN;
}

/** A Prometheus histogram's cumulative buckets: upper bounds in ms (+Inf last) and counts. */
export interface Histogram {
  leMs: number[];
  cum: number[];
}

const LABEL = /(\w+)="((?:[^"\\]|\\.)*)"/g;

/**
 * The buckets of one histogram in a /metrics text, summed over label sets other than `le`; with
 * `labels`, only the series that carry every one of them (e.g. { route: "/select_and_reserve" }),
 * in whatever order the exposition lists labels.
 */
export function scrapeHistogram(text: string, name: string, labels: Readonly<Record<string, string>> = {}): Histogram {
  const byLe = new Map<number, number>();
  const want = Object.entries(labels);
  const re = new RegExp(`^${name}_bucket\\{([^}]*)\\} (\\S+)$`, "gm");
  for (const m of text.matchAll(re)) {
    const set = new Map([...(m[1] ?? "").matchAll(LABEL)].map((l) => [l[1] ?? "", l[2] ?? ""]));
    const le = set.get("le");
    if (le === undefined || want.some(([k, v]) => set.get(k) !== v)) continue;
    const leMs = le === "+Inf" ? Infinity : Number(le) * 1000;
    byLe.set(leMs, (byLe.get(leMs) ?? 0) + Number(m[2]));
  }
  const les = [...byLe.keys()].sort((a, b) => a - b);
  return { leMs: les, cum: les.map((le) => byLe.get(le) ?? 0) };
}

/** Adds histogram b into a (same bucket bounds, as every replica of one build has). */
export function mergeHistograms(a: Histogram, b: Histogram): Histogram {
  if (a.leMs.length === 0) return b;
  if (b.leMs.length === 0) return a;
  return { leMs: a.leMs, cum: a.cum.map((c, i) => c + (b.cum[i] ?? 0)) };
}

/**
 * What a fleet's histograms gained over a window: the sum over replicas of after minus before
 * (replica i's scrapes at both ends; every replica shares the bucket bounds).
 */
export function histogramGrowth(before: readonly Histogram[], after: readonly Histogram[]): Histogram {
  const leMs = after[0]?.leMs ?? [];
  const cum = leMs.map((_, i) => after.reduce((s, a, j) => s + (a.cum[i] ?? 0) - (before[j]?.cum[i] ?? 0), 0));
  return { leMs, cum };
}
