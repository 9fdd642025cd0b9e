/**
 * Waiting for a `kvmesh serve` child process to listen: it logs pino JSON on stdout, and its
 * "listening" record carries the HTTP port it bound (port 0 picks one). Shared by the benchmarks'
 * replica fleets and the tests' daemon and replica helpers.
 */
import type { ChildProcess } from "node:child_process";

import { onLines } from "../util/lines.js";

/** pino's level number for warn: records at or above it are worth showing. */
export const PINO_WARN = 40;
/** How much of the child's stderr an error message quotes. */
const STDERR_TAIL_CHARS = 2_000;

export interface ListeningOptions {
  /** Names the process in errors, e.g. "replica 2". */
  readonly label: string;
  readonly timeoutMs: number;
  /**
   * Stdout lines that are not JSON, and log records at warn or above, as they come (also after
   * the process listens, for as long as it runs).
   */
  readonly onLine?: (line: string) => void;
}

/**
 * Resolves with the port of the child's first "listening" record; rejects, quoting the tail of
 * its stderr, if it exits first or does not listen within `timeoutMs`.
 */
export function waitForListening(child: ChildProcess, o: ListeningOptions): Promise<number> {
  let stderr = "";
  child.stderr?.on("data", (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-STDERR_TAIL_CHARS);
  });
  return new Promise<number>((resolve, reject) => {
    let port = 0;
    const timer = setTimeout(() => {
      reject(new Error(`${o.label} did not log "listening" within ${o.timeoutMs} ms: ${stderr}`));
    }, o.timeoutMs);
    onLines(child.stdout, (line) => {
      let rec: { level?: number; msg?: string; port?: number } = {};
      try {
        rec = JSON.parse(line) as typeof rec;
      } catch {
        o.onLine?.(line);
        return;
      }
      if ((rec.level ?? 0) >= PINO_WARN) o.onLine?.(line);
      if (port === 0 && rec.msg === "listening" && typeof rec.port === "number") {
        port = rec.port;
        clearTimeout(timer);
        resolve(port);
      }
    });
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      if (port === 0) reject(new Error(`${o.label} exited before listening (code ${String(code)}, signal ${String(signal)}): ${stderr}`));
    });
  });
}
