/** Small helpers shared by the benchmarks: percentiles and a progress line on stderr. */

export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i] as number;
}

export function summarize(samplesMs: number[]): { n: number; p50: number; p90: number; p99: number; max: number; mean: number } {
  const s = Float64Array.from(samplesMs).sort();
  const mean = samplesMs.reduce((a, b) => a + b, 0) / Math.max(1, samplesMs.length);
  return { n: s.length, p50: percentile(s, 50), p90: percentile(s, 90), p99: percentile(s, 99), max: s[s.length - 1] ?? Number.NaN, mean };
}

export function progress(label: string, done: number, total: number): void {
  const step = Math.max(1, Math.floor(total / 10));
  if (done !== total && done % step !== 0) return;
  const line = `${label}: ${done}/${total} (${Math.round((100 * done) / total)}%)`;
  // On a terminal the line redraws in place; in a log each tenth is its own line.
  if (process.stderr.isTTY) process.stderr.write(`\r${line}${done === total ? "\n" : ""}`);
  else process.stderr.write(`${line}\n`);
}

export const fmtMs = (ms: number): string => (ms < 1 ? `${(ms * 1000).toFixed(1)} us` : `${ms.toFixed(3)} ms`);
