/**
 * The `kvmesh` command tree. Everything that touches the process (daemon start, fetch, output,
 * signals, exit, files) comes in through CliDeps so tests can drive the real parser.
 */
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Command } from "commander";
import { runBenchMain, runDemoMain, type BenchIo } from "../src/bench/bench-main.js";
import { startDaemon } from "../src/app/daemon.js";
import { addBenchCommands, type BenchDeps } from "./bench.js";
import type { ClientDeps } from "./http-client.js";
import { addKeysCommand } from "./keys.js";
import { refuseNegatablePairConflicts } from "./negatable-pairs.js";
import { addPeersCommand } from "./peers.js";
import { addSelectCommand } from "./select.js";
import { addServeCommand, type ServeDeps, type ShutdownSignal } from "./serve.js";
import { addWorkersCommand } from "./workers.js";

export interface CliDeps extends ServeDeps, ClientDeps, BenchDeps {}

const processSignals = {
  on: (signal: ShutdownSignal, handler: (s: ShutdownSignal) => void): void => {
    process.on(signal, handler);
  },
  off: (signal: ShutdownSignal, handler: (s: ShutdownSignal) => void): void => {
    process.off(signal, handler);
  },
};

/** Output streams for bench/demo, and Ctrl-C as an abort: the run stops dispatching and reports. */
function benchIo(): BenchIo & { done: () => void } {
  const controller = new AbortController();
  const onSigint = (): void => {
    process.stderr.write("stopping: finishing the requests in flight (Ctrl-C again to quit now)\n");
    controller.abort();
    process.once("SIGINT", () => process.exit(130));
  };
  process.once("SIGINT", onSigint);
  return {
    out: (t) => process.stdout.write(t),
    err: (t) => process.stderr.write(t),
    signal: controller.signal,
    done: () => process.off("SIGINT", onSigint),
  };
}

async function withBenchIo(run: (io: BenchIo) => Promise<number>): Promise<number> {
  const io = benchIo();
  try {
    return await run(io);
  } finally {
    io.done();
  }
}

export function defaultCliDeps(): CliDeps {
  return {
    runBench: (config) => withBenchIo((io) => runBenchMain(config, io)),
    runDemo: (config) => withBenchIo((io) => runDemoMain(config, io)),
    startDaemon: (config, logger) => startDaemon(config, logger),
    signals: processSignals,
    // stdout writes are synchronous for files and pipes on Linux, so exit() after a log line loses nothing.
    logDestination: process.stdout,
    exit: (code) => process.exit(code),
    fetch: (input, init) => fetch(input, init),
    writeOut: (text) => process.stdout.write(text),
    writeErr: (text) => process.stderr.write(text),
    readFile: (path) => readFile(path, "utf8"),
  };
}

/** The version in kvmesh's package.json, found from here in both cli/ (tsx) and dist/cli/ (built). */
function packageVersion(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 3; i++) {
    try {
      const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as { name?: unknown; version?: unknown };
      if (pkg.name === "kvmesh" && typeof pkg.version === "string") return pkg.version;
    } catch {
      // Not here: try the parent.
    }
    dir = dirname(dir);
  }
  return "0.0.0";
}

export function buildCli(overrides: Partial<CliDeps> = {}): Command {
  const deps: CliDeps = { ...defaultCliDeps(), ...overrides };
  const program = new Command("kvmesh")
    .description("KV-cache-aware worker selection for LLM serving fleets")
    .version(packageVersion())
    // A one-line hint rather than the whole help: serve's help is ~40 lines and would bury the error.
    .showHelpAfterError("(add --help for usage)")
    .configureOutput({ writeOut: deps.writeOut, writeErr: deps.writeErr });
  // Subcommands copy the output settings above when created (commander's copyInheritedSettings).
  addServeCommand(program, deps);
  addWorkersCommand(program, deps);
  addSelectCommand(program, deps);
  addPeersCommand(program, deps);
  addKeysCommand(program, deps);
  addBenchCommands(program, deps);
  refuseNegatablePairConflicts(program);
  return program;
}
