/** One `kvmesh serve` child for the system tests: the shared harness (src/bench/serve-process.ts) with a URL. */
import { spawnServe, stopServe, type ServeProcess } from "../../src/bench/serve-process.js";

/** A deadline for liveness, not a speed target: tsx start-up on a loaded 2-core machine takes seconds. */
const DAEMON_START_TIMEOUT_MS = 60_000;

export interface DaemonProcess extends ServeProcess {
  readonly url: string;
}

/** `onLine`: the child's warnings and errors, and lines that are not log records (src/bench/serve-process.ts). */
export async function spawnDaemon(args: readonly string[], timeoutMs = DAEMON_START_TIMEOUT_MS, onLine?: (line: string) => void): Promise<DaemonProcess> {
  const p = await spawnServe({ label: "daemon", args, startTimeoutMs: timeoutMs, ...(onLine === undefined ? {} : { onLine }) });
  return { ...p, url: `http://127.0.0.1:${String(p.port)}` };
}

export async function stopDaemon(d: DaemonProcess | undefined): Promise<void> {
  if (d !== undefined) await stopServe(d);
}
