/** CPU time of processes from /proc, and a bounded-concurrency loop: shared by the benchmarks. */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

/** Clock ticks per second of /proc/<pid>/stat times (100 on Linux nearly everywhere). */
export const CLK_TCK = ((): number => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"]).toString().trim()) || 100;
  } catch {
    return 100;
  }
})();

/** User + system CPU time of a process so far, ms (proc(5): utime, stime after "(comm)", which may hold spaces). */
export function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${String(pid)}/stat`, "utf8");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return ((Number(f[11]) + Number(f[12])) * 1000) / CLK_TCK;
}

/** Runs fn over items with at most `limit` at once. */
export async function pool<T>(items: readonly T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) await fn(items[next++] as T);
    }),
  );
}
