/** What the benchmarks print while they run: a progress line on stderr, and durations in ms or us. */

export function progress(label: string, done: number, total: number): void {
  const step = Math.max(1, Math.floor(total / 10));
  if (done !== total && done % step !== 0) return;
  const line = `${label}: ${done}/${total} (${Math.round((100 * done) / total)}%)`;
  // On a terminal the line redraws in place; in a log each tenth is its own line.
  if (process.stderr.isTTY) process.stderr.write(`\r${line}${done === total ? "\n" : ""}`);
  else process.stderr.write(`${line}\n`);
}

export const fmtMs = (ms: number): string => (ms < 1 ? `${(ms * 1000).toFixed(1)} us` : `${ms.toFixed(3)} ms`);
