/**
 * `npm run bench:workers-file`: how long a `--workers-file` reload stalls the daemon's main thread
 * (#29 G12), seen from outside: one `kvmesh serve` child reads a file of N workers, this script
 * asks `/health` back to back (one request at a time, keep-alive) while the file is rewritten,
 * and reports the longest answer during each reload (the longest stall a heartbeat, a request
 * or a peer would meet), with the median and p99, and how long the reload took to apply.
 *
 * Two edits per fleet size: one entry changed (the usual ConfigMap edit) and every entry changed.
 * `--cli` runs another tree's CLI (e.g. `--cli /work/main/cli/main.ts` for the code before).
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { request, Agent } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { onLines } from "../src/util/lines.js";
import { killOnExit, stopServe } from "../src/bench/serve-process.js";
import { positiveInt, positiveIntList, scriptProgram } from "./lib/script-args.js";

const args = scriptProgram("bench:workers-file", "The longest /health answer while a --workers-file of N workers is reloaded (one entry changed, then every entry).")
  .option("--workers <list>", "fleet sizes, comma-separated", positiveIntList, [16_000, 60_000])
  .option("--settle-ms <n>", "how long to keep probing after a reload applied", positiveInt, 1_000)
  .option("--cli <path>", "the CLI entry to run (cli/main.ts of a tree)", fileURLToPath(new URL("../cli/main.ts", import.meta.url)))
  .parse()
  .opts<{ workers: number[]; settleMs: number; cli: string }>();

/** The longest a reload may take before the script gives up on it, ms (60,000 workers took 14 s before). */
const APPLY_TIMEOUT_MS = 120_000;

const fileText = (n: number, tag: (i: number) => string): string =>
  JSON.stringify(Array.from({ length: n }, (_, k) => ({ worker_id: k + 1, endpoint: `http://10.${String((k >> 16) & 255)}.${String((k >> 8) & 255)}.${String(k & 255)}:8000/${tag(k + 1)}`, block_size: 16, model_name: "m" })));

interface Window {
  readonly samples: number[];
  applied: number;
}

function quantile(sorted: readonly number[], q: number): number {
  return sorted.length === 0 ? Number.NaN : (sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] as number);
}

async function run(n: number): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), "kvmesh-bench-wf-"));
  const file = join(dir, "workers.json");
  writeFileSync(file, fileText(n, () => "a"));
  const started = performance.now();
  const child = spawn(process.execPath, ["--import", "tsx", args.cli, "serve", "--port", "0", "--log-level", "info", "--no-kv-events", "--max-ranks", "1048576", "--drain-secs", "0", "--workers-file", file], { stdio: ["ignore", "pipe", "pipe"] });
  killOnExit(child);
  const exited = new Promise<number | string>((resolve) => child.once("exit", (code, signal) => { resolve(code ?? signal ?? "unknown"); }));
  let port = 0;
  let applied = 0;
  const appliedAt: number[] = [];
  onLines(child.stdout, (line) => {
    if (!line.startsWith("{")) return;
    const rec = JSON.parse(line) as { msg?: string; port?: number };
    if (rec.msg === "listening" && typeof rec.port === "number") port = rec.port;
    if (rec.msg === "workers file applied") {
      applied++;
      appliedAt.push(performance.now());
    }
  });
  onLines(child.stderr, (line) => process.stderr.write(`[serve] ${line}\n`));
  const until = async (what: string, ok: () => boolean): Promise<void> => {
    const deadline = performance.now() + APPLY_TIMEOUT_MS;
    while (!ok()) {
      if (performance.now() > deadline) throw new Error(`${what}: not within ${APPLY_TIMEOUT_MS} ms`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  };
  await until("listening and the file applied", () => port !== 0 && applied >= 1);
  console.log(`workers ${n}: up and applied in ${((performance.now() - started) / 1000).toFixed(1)} s`);
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  const health = (): Promise<number> =>
    new Promise((resolve, reject) => {
      const t0 = performance.now();
      const req = request({ host: "127.0.0.1", port, path: "/health", agent }, (res) => {
        res.resume();
        res.on("end", () => { resolve(performance.now() - t0); });
      });
      req.on("error", reject);
      req.end();
    });
  for (const [label, tag] of [["one entry changed", (i: number) => (i === 7 ? "b" : "a")], ["every entry changed", () => "c"]] as const) {
    const w: Window = { samples: [], applied: 0 };
    const before = applied;
    let probing = true;
    const prober = (async () => {
      while (probing) w.samples.push(await health());
    })();
    await new Promise((resolve) => setTimeout(resolve, 200));
    const t0 = performance.now();
    writeFileSync(file, fileText(n, tag));
    await until(`the reload (${label})`, () => applied > before);
    const tookMs = (appliedAt.at(-1) as number) - t0;
    await new Promise((resolve) => setTimeout(resolve, args.settleMs));
    probing = false;
    await prober;
    const sorted = [...w.samples].sort((a, b) => a - b);
    console.log(
      `workers ${n}, ${label}: /health max ${quantile(sorted, 1).toFixed(1)} ms, p99 ${quantile(sorted, 0.99).toFixed(1)} ms, p50 ${quantile(sorted, 0.5).toFixed(2)} ms over ${sorted.length} probes; applied ${(tookMs / 1000).toFixed(2)} s after the write (the stat poll is every 2 s)`,
    );
  }
  agent.destroy();
  await stopServe({ child, exited });
  rmSync(dir, { recursive: true, force: true });
}

for (const n of args.workers) await run(n);
