/**
 * `kvmesh serve ...args` run in this process through the real command parser, with a fake
 * daemon: the DaemonConfig serve would start, or the usage error commander reported.
 */
import { EventEmitter } from "node:events";
import { CommanderError, type Command } from "commander";

import { buildCli, defaultCliDeps } from "../../cli/program.js";
import type { RunningDaemon, ShutdownSignal } from "../../cli/serve.js";
import type { DaemonConfig } from "../../src/app/daemon.js";
import { waitFor } from "./wait.js";

export interface ServeOutcome {
  /** What serve would have started the daemon with (absent on a usage error). */
  readonly config?: DaemonConfig;
  /** commander's exit code, on a usage error. */
  readonly code?: number;
  /** What serve wrote to stderr. */
  readonly err: string;
}

/** Starts serve with `args`, stops it with SIGTERM once it listens, and says what it got. */
export async function serveInProcess(args: readonly string[]): Promise<ServeOutcome> {
  const signals = new EventEmitter();
  let err = "";
  let config: DaemonConfig | undefined;
  const daemon: RunningDaemon = { host: "127.0.0.1", port: 1, close: () => Promise.resolve() };
  const program = buildCli({
    ...defaultCliDeps(),
    startDaemon: (c) => {
      config = c;
      return Promise.resolve(daemon);
    },
    signals: {
      on: (s: ShutdownSignal, h: (s: ShutdownSignal) => void) => signals.on(s, h),
      off: (s: ShutdownSignal, h: (s: ShutdownSignal) => void) => signals.off(s, h),
    },
    logDestination: { write: () => undefined },
    exit: () => undefined,
    writeOut: () => undefined,
    writeErr: (t: string) => {
      err += t;
    },
  });
  const all = (c: Command): Command[] => [c, ...c.commands.flatMap(all)];
  for (const c of all(program)) c.exitOverride();
  const run = program.parseAsync(["serve", ...args], { from: "user" });
  try {
    await Promise.race([run, waitFor(() => signals.listenerCount("SIGTERM") > 0 || err !== "", 5_000, "serve to start")]);
    if (err === "") signals.emit("SIGTERM", "SIGTERM");
    await run;
  } catch (e) {
    if (e instanceof CommanderError) return { code: e.exitCode, err };
    throw e;
  }
  return config === undefined ? { err } : { config, err };
}
