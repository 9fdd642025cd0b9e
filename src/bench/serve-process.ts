/**
 * One `kvmesh serve` child process, as the benchmarks, the fault suite and the system tests run
 * it: spawned from source through tsx (or from dist when built), awaited until it logs
 * "listening", and stopped with SIGTERM then SIGKILL. Real processes (not in-process daemons) so
 * replicas contend for the cores and talk over real sockets exactly as a deployment does.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { onLines } from "../util/lines.js";
import { waitForListening } from "./listening.js";

/** A child that has not logged "listening" in this long failed to start (tsx compiles for ~2 s here). */
export const DEFAULT_SERVE_START_TIMEOUT_MS = 30_000;
/** SIGTERM, then SIGKILL this long later: a draining daemon closes in well under a second. */
export const DEFAULT_SERVE_STOP_GRACE_MS = 3_000;

export type ServeLogLevel = "debug" | "info" | "warn";

export interface ServeProcessOptions {
  /** `serve` flags after `--port 0 --log-level LEVEL` (and `--host`, when given). */
  readonly args?: readonly string[];
  /** Names the process in errors and logs, e.g. "replica 2". */
  readonly label?: string;
  /** --host: the HTTP (and mesh) bind address. Default: the daemon's own (loopback). */
  readonly host?: string;
  /** Default "info": the "listening" record, which carries the port, is logged at info. */
  readonly logLevel?: ServeLogLevel;
  /** Node flags for the child (before the CLI), e.g. ["--cpu-prof"]. */
  readonly nodeArgs?: readonly string[];
  /** A command the child runs under, e.g. ["ip", "netns", "exec", "ns1"]. */
  readonly prefix?: readonly string[];
  readonly startTimeoutMs?: number;
  /**
   * Stderr lines, stdout lines that are not JSON, and log records at warn or above, one at a
   * time, for as long as the process runs.
   */
  readonly onLine?: (line: string) => void;
}

export interface ServeProcess {
  readonly label: string;
  readonly child: ChildProcess;
  readonly pid: number;
  /** The HTTP port it bound (the harness always passes --port 0). */
  readonly port: number;
  /** Resolves with the exit code (or signal name) when the process ends. */
  readonly exited: Promise<number | string>;
}

/**
 * The CLI entry point: cli/main.ts through tsx from source, dist/cli/main.js when built, after
 * the node flags in KVMESH_BENCH_NODE_ARGS (space-separated; node refuses --cpu-prof in
 * NODE_OPTIONS, so this is how a benchmark's daemons get profiled).
 */
export function cliCommand(): string[] {
  const fromSource = import.meta.url.endsWith(".ts");
  const main = fileURLToPath(new URL(`../../cli/main.${fromSource ? "ts" : "js"}`, import.meta.url));
  const extra = process.env.KVMESH_BENCH_NODE_ARGS?.split(" ").filter((a) => a !== "") ?? [];
  return fromSource ? [...extra, "--import", "tsx", main] : [...extra, main];
}

/** Every child still running: killed if this process exits first (a crash, Ctrl-C), so no daemon keeps its ports. */
const live = new Set<ChildProcess>();
let exitHookInstalled = false;

/** Kills `child` when this process exits, unless it ended first. */
export function killOnExit(child: ChildProcess): void {
  live.add(child);
  child.once("exit", () => live.delete(child));
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on("exit", () => {
    for (const c of live) c.kill("SIGKILL");
  });
}

/** The children spawned here that are still running (a script's Ctrl-C handler stops them with grace). */
export function liveChildren(): ChildProcess[] {
  return [...live];
}

/** A stream's non-blank lines. */
function eachLine(stream: NodeJS.ReadableStream | null, onLine: (line: string) => void): void {
  onLines(stream, (l) => {
    if (l.trim() !== "") onLine(l);
  });
}

export async function spawnServe(o: ServeProcessOptions = {}): Promise<ServeProcess> {
  const label = o.label ?? "kvmesh serve";
  const argv = [
    ...(o.nodeArgs ?? []),
    ...cliCommand(),
    "serve",
    ...(o.host === undefined ? [] : ["--host", o.host]),
    "--port",
    "0",
    "--log-level",
    o.logLevel ?? "info",
    // A harness stops its daemons with SIGTERM: no drain window unless the caller asks for one.
    ...((o.args ?? []).includes("--drain-secs") ? [] : ["--drain-secs", "0"]),
    ...(o.args ?? []),
  ];
  const [cmd, ...pre] = o.prefix !== undefined && o.prefix.length > 0 ? [...o.prefix, process.execPath] : [process.execPath];
  const child = spawn(cmd, [...pre, ...argv], { stdio: ["ignore", "pipe", "pipe"] });
  killOnExit(child);
  const exited = new Promise<number | string>((resolve) => {
    child.once("exit", (code, signal) => {
      resolve(code ?? signal ?? "unknown");
    });
  });
  if (o.onLine !== undefined) eachLine(child.stderr, o.onLine);
  const port = await waitForListening(child, {
    label,
    timeoutMs: o.startTimeoutMs ?? DEFAULT_SERVE_START_TIMEOUT_MS,
    ...(o.onLine === undefined ? {} : { onLine: o.onLine }),
  }).catch(async (err: unknown) => {
    await stopServe({ child, exited });
    throw err;
  });
  if (child.pid === undefined) throw new Error(`${label} has no pid`);
  return { label, child, pid: child.pid, port, exited };
}

export const isRunning = (child: ChildProcess): boolean => child.exitCode === null && child.signalCode === null;

/**
 * `signal` (default SIGTERM), then SIGKILL if it is still running `graceMs` later; resolves with
 * its exit code (or signal name) when it is gone.
 */
export async function stopServe(p: Pick<ServeProcess, "child" | "exited">, signal: NodeJS.Signals = "SIGTERM", graceMs = DEFAULT_SERVE_STOP_GRACE_MS): Promise<number | string> {
  if (!isRunning(p.child)) return p.exited;
  // A stopped (SIGSTOP) process must be continued to act on SIGTERM.
  p.child.kill("SIGCONT");
  p.child.kill(signal);
  const kill = setTimeout(() => p.child.kill("SIGKILL"), graceMs);
  const code = await p.exited;
  clearTimeout(kill);
  return code;
}

/** SIGTERM, then SIGKILL for any child still running `graceMs` later; resolves when all exited. */
export async function stopAll(children: readonly ChildProcess[], graceMs = DEFAULT_SERVE_STOP_GRACE_MS): Promise<void> {
  await Promise.all(
    children.map(
      (child) =>
        new Promise<void>((resolve) => {
          if (!isRunning(child)) {
            resolve();
            return;
          }
          const kill = setTimeout(() => child.kill("SIGKILL"), graceMs);
          child.once("exit", () => {
            clearTimeout(kill);
            resolve();
          });
          child.kill("SIGTERM");
        }),
    ),
  );
}
