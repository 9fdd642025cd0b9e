/** CPU time of processes from /proc: shared by the benchmarks. */
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

/** User and system CPU time of a process so far, ms (proc(5): utime, stime after "(comm)", which may hold spaces). */
export function cpuSplitMs(pid: number): { userMs: number; systemMs: number } {
  const stat = readFileSync(`/proc/${String(pid)}/stat`, "utf8");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return { userMs: (Number(f[11]) * 1000) / CLK_TCK, systemMs: (Number(f[12]) * 1000) / CLK_TCK };
}

/** User + system CPU time of a process so far, ms. */
export function cpuMs(pid: number): number {
  const { userMs, systemMs } = cpuSplitMs(pid);
  return userMs + systemMs;
}

