/**
 * CPU time per thread of a process, from /proc/<pid>/task/<tid>/stat (proc(5)). A Node process's
 * main thread (tid == pid) runs the event loop; the rest are V8 helpers (GC, compiler), libuv's
 * pool and ZeroMQ's I/O threads. The process total (cpuMs in src/bench/process-usage.ts) also
 * keeps the time of threads that have exited, so it is "all threads".
 */
import { readdirSync, readFileSync } from "node:fs";

import { CLK_TCK, cpuMs } from "../../src/bench/process-usage.js";

export interface ThreadCpu {
  /** The main thread (the event loop), ms. */
  readonly mainMs: number;
  /** Every thread, past and present, ms. */
  readonly allMs: number;
  /** Live threads' time by thread name (comm), ms: where the non-main time goes. */
  readonly byName: Readonly<Record<string, number>>;
}

/** Name and user + system ms of one /proc stat line (the name may hold spaces and parentheses). */
export function parseStat(stat: string): { name: string; ms: number } {
  const open = stat.indexOf("(");
  const close = stat.lastIndexOf(")");
  const f = stat.slice(close + 2).split(" ");
  return { name: stat.slice(open + 1, close), ms: ((Number(f[11]) + Number(f[12])) * 1000) / CLK_TCK };
}

export function threadCpu(pid: number): ThreadCpu {
  const p = String(pid);
  const byName: Record<string, number> = {};
  let mainMs = 0;
  for (const tid of readdirSync(`/proc/${p}/task`)) {
    let t: { name: string; ms: number };
    try {
      t = parseStat(readFileSync(`/proc/${p}/task/${tid}/stat`, "utf8"));
    } catch {
      continue; // the thread exited between the listing and the read
    }
    if (tid === p) mainMs = t.ms;
    byName[t.name] = (byName[t.name] ?? 0) + t.ms;
  }
  return { mainMs, allMs: cpuMs(pid), byName };
}

/** after - before, by field (a thread name missing before counts from 0). */
export function threadCpuDelta(before: ThreadCpu, after: ThreadCpu): ThreadCpu {
  const byName: Record<string, number> = {};
  for (const [name, ms] of Object.entries(after.byName)) byName[name] = ms - (before.byName[name] ?? 0);
  return { mainMs: after.mainMs - before.mainMs, allMs: after.allMs - before.allMs, byName };
}
