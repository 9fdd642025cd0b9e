/**
 * The fleet bench:mesh and bench:host drive: N `kvmesh serve` replicas (src/bench/replica-fleet.ts)
 * that route sessions without KV events (the prompt only sizes the booking), each with the same
 * mock workers registered, their logs on stderr prefixed with the replica, and stopped on Ctrl-C.
 */
import { cpuMs } from "../../src/bench/process-usage.js";
import { ReplicaFleet } from "../../src/bench/replica-fleet.js";
import { liveChildren, stopAll } from "../../src/bench/serve-process.js";

/** Long enough that no session's binding expires inside a run. */
export const SESSION_AFFINITY_TTL_SECS = 600;
export const FLEET_START_TIMEOUT_MS = 30_000;
/** SIGTERM, then SIGKILL this long later. */
export const FLEET_STOP_GRACE_MS = 2_000;
/** select_and_reserve may queue on a saturated replica; a request that takes this long has failed. */
export const REQUEST_TIMEOUT_MS = 30_000;
/** Worker registrations in flight per replica. */
export const ADMIN_CONCURRENCY = 16;

export interface SessionFleetOptions {
  /** Prefixes the replicas' log lines: "[replica 2] ...". */
  readonly name: string;
  readonly replicas: number;
  readonly mesh: boolean;
  /** With mesh: false keeps the mesh ports but peers nobody (see ReplicaFleetOptions.peer). */
  readonly peer?: boolean;
  readonly workers: number;
  readonly blockSize: number;
  /** Keep-alive connections per replica. */
  readonly sockets: number;
  readonly serveArgs?: readonly string[];
  readonly serveArgsOf?: (index: number) => readonly string[];
  readonly nodeArgs?: readonly string[];
}

/** Starts the replicas, waits for the mesh, and registers workers 1..workers on each. */
export async function startSessionFleet(o: SessionFleetOptions): Promise<ReplicaFleet> {
  const fleet = await ReplicaFleet.start({
    replicas: o.replicas,
    mesh: o.mesh,
    ...(o.peer === undefined ? {} : { peer: o.peer }),
    serveArgs: ["--no-kv-events", "--session-affinity-ttl-secs", String(SESSION_AFFINITY_TTL_SECS), ...(o.serveArgs ?? [])],
    ...(o.serveArgsOf === undefined ? {} : { serveArgsOf: o.serveArgsOf }),
    ...(o.nodeArgs === undefined ? {} : { nodeArgs: o.nodeArgs }),
    client: { sockets: o.sockets, timeoutMs: REQUEST_TIMEOUT_MS },
    startTimeoutMs: FLEET_START_TIMEOUT_MS,
    stopGraceMs: FLEET_STOP_GRACE_MS,
    onLog: (i, line) => process.stderr.write(`[${o.name} ${String(i)}] ${line}\n`),
  });
  try {
    await fleet.registerWorkers(o.workers, o.blockSize, ADMIN_CONCURRENCY);
  } catch (err) {
    await fleet.stop();
    throw err;
  }
  return fleet;
}

/** Each replica's CPU time so far (utime + stime from /proc), ms. */
export const fleetCpuMs = (fleet: ReplicaFleet): number[] => fleet.pids().map(cpuMs);

/** Sum over replicas of CPU time spent between two fleetCpuMs samples, ms. */
export const cpuSpentMs = (before: readonly number[], after: readonly number[]): number => after.reduce((s, c, i) => s + c - (before[i] ?? 0), 0);

/**
 * On SIGINT or SIGTERM, stops every replica with grace (so a --cpu-prof replica writes its
 * profile) and exits 130. A crash needs nothing: serve-process.ts kills the children on exit.
 */
export function exitOnSignals(script: string): void {
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    process.once(sig, () => {
      process.stderr.write(`${script}: ${sig}, stopping replicas\n`);
      void stopAll(liveChildren(), FLEET_STOP_GRACE_MS).then(() => process.exit(130));
    });
  }
}
