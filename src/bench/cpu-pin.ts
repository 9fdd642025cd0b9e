/**
 * Pinning a benchmark's processes to CPUs with taskset(1) (Linux), so that a measurement can
 * tell one process's own cost from its neighbours' CPU: on a 2-core host a replica, a second
 * replica and the benchmark's client otherwise share both cores, and each one's CPU shows up in
 * the others' latency (bench:warm-join, issue 25).
 *
 * A layout maps a role (a process the benchmark starts, or "client": the benchmark's own
 * process) to a CPU list as taskset takes it ("0", "1", "0-1"). It is written
 * `role=cpus,role=cpus` (e.g. `peer=0,joiner=1,client=1`) or named (PIN_LAYOUTS).
 */
import { spawnSync } from "node:child_process";

/** A role's CPUs, as taskset's -c takes them: one CPU or a range ("0", "2-3"). */
const CPU_LIST = /^(\d+)(?:-(\d+))?$/;

export type PinLayout = ReadonlyMap<string, string>;

/** Named layouts (bench:warm-join's roles). */
export const PIN_LAYOUTS: Readonly<Record<string, Readonly<Record<string, string>>>> = {
  /** The serving peer alone on CPU 0; the joiner and the client share CPU 1. */
  "peer-alone": { peer: "0", joiner: "1", client: "1" },
  /**
   * The peer's main thread alone on CPU 0, the threads it starts once warmed (its index export
   * thread, started on the first join) on CPU 1 with the joiner and the client: as deployed, where
   * the peer has a core for its thread.
   */
  "peer-split": { peer: "0", "peer-threads": "1", joiner: "1", client: "1" },
};

/**
 * Parses a layout: "none" (nothing pinned), a name of PIN_LAYOUTS, or `role=cpus,...` over
 * `roles`, each CPU below `cpuCount`. Throws an Error naming what is wrong (a usage error).
 */
export function parsePinLayout(spec: string, roles: readonly string[], cpuCount: number): PinLayout {
  const out = new Map<string, string>();
  if (spec === "none") return out;
  const named = PIN_LAYOUTS[spec];
  const pairs = named !== undefined ? Object.entries(named) : spec.split(",").map((p) => p.trim().split("="));
  for (const pair of pairs) {
    const [role, cpus] = pair;
    if (pair.length !== 2 || role === undefined || cpus === undefined) {
      throw new Error(`takes "none", ${Object.keys(PIN_LAYOUTS).join(", ")} or role=cpus,... (e.g. peer=0,joiner=1,client=1), got ${JSON.stringify(spec)}`);
    }
    if (!roles.includes(role)) throw new Error(`role ${JSON.stringify(role)} is not one of ${roles.join(", ")}`);
    if (out.has(role)) throw new Error(`role ${role} is named twice`);
    const m = CPU_LIST.exec(cpus);
    const lo = Number(m?.[1]);
    const hi = m?.[2] === undefined ? lo : Number(m[2]);
    if (m === null || hi < lo) throw new Error(`${role}=${cpus}: CPUs are one number or a range "a-b"`);
    if (hi >= cpuCount) throw new Error(`${role}=${cpus}: this host has CPUs 0-${cpuCount - 1}`);
    out.set(role, cpus);
  }
  return out;
}

/**
 * Throws unless taskset(1) can run here (Linux, util-linux installed): a layout that cannot be
 * applied must fail before a measurement, not quietly measure unpinned.
 */
export function requireTaskset(): void {
  if (process.platform !== "linux") throw new Error(`pinning needs taskset(1) on Linux; this is ${process.platform}`);
  const r = spawnSync("taskset", ["--version"], { encoding: "utf8" });
  if (r.error !== undefined || r.status !== 0) throw new Error(`pinning needs taskset(1) (util-linux), which did not run: ${r.error?.message ?? r.stderr}`);
}

/** The command prefix that starts a process on `cpus` (spawnServe's `prefix`), [] when unpinned. */
export function tasksetPrefix(cpus: string | undefined): string[] {
  return cpus === undefined ? [] : ["taskset", "-c", cpus];
}

/** Pins one thread (a task id under /proc/<pid>/task) to `cpus`. */
export function pinThread(tid: number, cpus: string): void {
  const r = spawnSync("taskset", ["-p", "-c", cpus, String(tid)], { encoding: "utf8" });
  if (r.error !== undefined || r.status !== 0) throw new Error(`taskset -p -c ${cpus} ${tid} failed: ${r.error?.message ?? r.stderr}`);
}

/** Pins every thread of a running process (this one: the client) to `cpus`. */
export function pinProcess(pid: number, cpus: string): void {
  const r = spawnSync("taskset", ["-a", "-p", "-c", cpus, String(pid)], { encoding: "utf8" });
  if (r.error !== undefined || r.status !== 0) throw new Error(`taskset -a -p -c ${cpus} ${pid} failed: ${r.error?.message ?? r.stderr}`);
}
