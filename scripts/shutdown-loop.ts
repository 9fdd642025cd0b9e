/**
 * Issue 29's shutdown loop (scripts/lib/shutdown-abort-scenario.ts): SIGTERM a busy replica
 * (KV events flowing, mesh on, selects running) `--rounds` times and report each exit: its code
 * and any native-abort line on its stderr. Exits 1 if any round failed. Run it under the shared
 * lock: `flock /tmp/kvmesh-heavy.lock npx tsx scripts/shutdown-loop.ts --rounds 30`.
 */
import { positiveInt, scriptProgram } from "./lib/script-args.js";
import { runShutdownAbort, SHUTDOWN_ABORT_LONG } from "./lib/shutdown-abort-scenario.js";

const program = scriptProgram("shutdown-loop", "SIGTERM a busy replica N times; report exit codes and native aborts")
  .option("--rounds <n>", "rounds (one SIGTERM each)", positiveInt, SHUTDOWN_ABORT_LONG.rounds)
  .option("--workers <n>", "workers registered", positiveInt, SHUTDOWN_ABORT_LONG.workers)
  .option("--ranks <n>", "KV publishers (dp ranks) per worker", positiveInt, SHUTDOWN_ABORT_LONG.ranks)
  .option("--busy-ms <n>", "traffic before each SIGTERM, ms", positiveInt, SHUTDOWN_ABORT_LONG.busyMs)
  .parse();
const o = program.opts<{ rounds: number; workers: number; ranks: number; busyMs: number }>();

const report = await runShutdownAbort(o, (r) => {
  console.log(`round ${String(r.round)}: exit ${String(r.exitCode)}, ${String(r.published)} KV batches published${r.abortLines.length > 0 ? `, ABORT: ${r.abortLines.join(" | ")}` : ""}${r.terminatedLines.length > 0 ? `, TERMINATED: ${r.terminatedLines.join(" | ")}` : ""}`);
});
console.log(`${String(report.rounds.length)} rounds, ${String(report.failures)} failed`);
process.exitCode = report.failures > 0 ? 1 : 0;
