/**
 * npm run bench:http — the daemon's HTTP throughput against the ceiling of node:http here.
 *
 * Starts the daemon (1,024 worker ranks, prefix index warmed) and a bare node:http server
 * answering a fixed JSON body (the ceiling) in child processes, and drives flows of
 * select_and_reserve (14,000-token prompt) + prefill_complete + free from this process over
 * keep-alive connections. The two servers are driven in alternating slices (--slices per server,
 * --seconds in all per server, after a 2 s warm-up each), so drift of this shared 2-core machine
 * hits both alike; throughput is pooled over each server's slices. Prints requests/s, latency
 * p50/p99 per request kind, the ratio of select_and_reserve throughput to the ceiling (pooled, and
 * the range of the per-slice-pair ratios), and writes a latency CDF plot.
 * Flags: see --help.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { Agent, createServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { cpuMs } from "../src/bench/process-usage.js";
import { benchPrompt } from "./lib/bench-prompts.js";
import { fmtMs } from "./lib/console-report.js";
import { summarize } from "../src/bench/stats.js";
import { positiveInt, positiveNumber, scriptProgram } from "./lib/script-args.js";
import { cdf, lineChart } from "./lib/svg-plot.js";

const args = scriptProgram("bench:http", "The daemon's HTTP throughput against the ceiling of node:http here.")
  .option("--seconds <s>", "seconds driven per server, in all slices", positiveNumber, 10)
  .option("--slices <n>", "alternating slices per server", positiveInt, 5)
  .option("--concurrency <n>", "keep-alive connections (flows in flight)", positiveInt, 16)
  .option("--workers <n>", "worker ranks in the daemon", positiveInt, 1024)
  .option("--out <dir>", "directory for the latency CDF plot", "reports")
  .option("--traces", "turn the daemon's tracing on, exporting to a dummy OTLP/HTTP receiver in this process that counts spans")
  .addHelpText("after", '\nEnv: KVMESH_BENCH_NODE_ARGS="--cpu-prof" passes node flags to the server process.')
  .parse()
  .opts<{ seconds: number; slices: number; concurrency: number; workers: number; out: string; traces?: true }>();
const SECONDS = args.seconds;
const CONCURRENCY = args.concurrency;
const SLICES = args.slices;
const WARMUP_MS = 2_000;
/** The server side, beside this file (the run no longer depends on the working directory). */
const BENCH_HTTP_SERVER = fileURLToPath(new URL("./bench-http-server.ts", import.meta.url));

interface Run {
  flows: number;
  wallMs: number;
  /** The server process's CPU time (all threads) over the measured slices, ms. */
  serverCpuMs: number;
  lat: Record<"reserve" | "prefill" | "free", number[]>;
  errors: number;
}

/** --traces: a dummy OTLP/HTTP receiver that answers 200 and counts what arrives (spans by their "spanId" keys). */
const otlp = { requests: 0, bytes: 0, spans: 0 };
async function startOtlpReceiver(): Promise<{ url: string; close: () => Promise<void> }> {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      otlp.requests++;
      otlp.bytes += body.length;
      otlp.spans += body.split('"spanId"').length - 1;
      res.writeHead(200, { "content-type": "application/json" });
      res.end("{}");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${String((server.address() as AddressInfo).port)}/v1/traces`;
  return {
    url,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => {
          resolve();
        });
      }),
  };
}
const receiver = args.traces === true ? await startOtlpReceiver() : undefined;
/** Every flow driven on each server, warm-up included (what the daemon traced). */
const flowsDriven: Record<string, number> = { daemon: 0, ceiling: 0 };

async function startServer(mode: "daemon" | "ceiling"): Promise<{ child: ChildProcess; port: number }> {
  // KVMESH_BENCH_NODE_ARGS (e.g. "--cpu-prof") lets a profile be taken of the server alone.
  const extra = (process.env.KVMESH_BENCH_NODE_ARGS ?? "").split(" ").filter((a) => a !== "");
  const tracing = mode === "daemon" && receiver !== undefined ? ["--otlp-traces-endpoint", receiver.url] : [];
  const child = spawn(process.execPath, [...extra, "--import", "tsx", BENCH_HTTP_SERVER, mode, String(args.workers), ...tracing], { stdio: ["ignore", "pipe", "inherit"] });
  const port = await new Promise<number>((resolve, reject) => {
    let buf = "";
    child.stdout?.on("data", (d: Buffer) => {
      buf += d.toString();
      const m = /READY (\d+)/.exec(buf);
      if (m?.[1] !== undefined) resolve(Number(m[1]));
    });
    child.on("exit", (code) => {
      reject(new Error(`${mode} server exited early with code ${code}`));
    });
  });
  return { child, port };
}

function send(agent: Agent, port: number, method: string, path: string, body: string | undefined): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, method, path, agent, headers: body === undefined ? {} : { "content-type": "application/json", "content-length": Buffer.byteLength(body) } }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString() });
      });
    });
    req.on("error", reject);
    req.end(body);
  });
}

/** Numbers selection ids across all slices and both servers (ids are never reused). */
let seq = 0;

/**
 * Drives flows for `ms` on `port`, adding measured flows, wall time and latencies to `run`
 * (nothing is recorded when `run` is undefined: the warm-up).
 */
async function drive(port: number, agent: Agent, bodies: string[], label: string, ms: number, run: Run | undefined): Promise<void> {
  const start = performance.now();
  const worker = async (): Promise<void> => {
    while (performance.now() - start < ms) {
      const id = `${label}-${seq++}`;
      const body = (bodies[seq % bodies.length] as string).replace('"selection_id":"X"', `"selection_id":"${id}"`);
      const t0 = performance.now();
      const r1 = await send(agent, port, "POST", "/select_and_reserve", body);
      const t1 = performance.now();
      const r2 = await send(agent, port, "POST", `/reservations/${id}/prefill_complete`, "{}");
      const t2 = performance.now();
      const r3 = await send(agent, port, "DELETE", `/reservations/${id}`, undefined);
      const t3 = performance.now();
      flowsDriven[label] = (flowsDriven[label] ?? 0) + 1;
      if (run === undefined) continue;
      if (r1.status !== 200 || r2.status !== 200 || r3.status !== 200) {
        run.errors++;
        if (run.errors === 1) console.error(`${label}: unexpected status ${r1.status}/${r2.status}/${r3.status}: ${r1.text.slice(0, 200)}`);
      }
      run.flows++;
      run.lat.reserve.push(t1 - t0);
      run.lat.prefill.push(t2 - t1);
      run.lat.free.push(t3 - t2);
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, () => worker()));
  if (run !== undefined) run.wallMs += performance.now() - start;
}

function stop(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    child.on("exit", () => {
      resolve();
    });
    child.kill("SIGTERM");
  });
}

const bodies = Array.from({ length: 256 }, (_, i) => JSON.stringify({ token_ids: benchPrompt(i % 64, 10_000 + i), selection_id: "X" }));
console.error(`bench:http: ${args.workers} worker ranks, ${CONCURRENCY} connections, ${SECONDS} s per server in ${SLICES} alternating slices, 14,000-token prompts (${(bodies[0]?.length ?? 0) / 1024 | 0} KiB bodies)`);

const modes = ["daemon", "ceiling"] as const;
const servers = new Map<(typeof modes)[number], { child: ChildProcess; port: number; agent: Agent }>();
const results: Record<string, Run> = {};
const sliceRates: Record<string, number[]> = { daemon: [], ceiling: [] };
try {
  for (const mode of modes) {
    console.error(`${mode}: starting`);
    const { child, port } = await startServer(mode);
    servers.set(mode, { child, port, agent: new Agent({ keepAlive: true, maxSockets: CONCURRENCY }) });
    results[mode] = { flows: 0, wallMs: 0, serverCpuMs: 0, lat: { reserve: [], prefill: [], free: [] }, errors: 0 };
  }
  for (const mode of modes) {
    const srv = servers.get(mode) as { port: number; agent: Agent };
    console.error(`${mode}: warming up for ${WARMUP_MS} ms`);
    await drive(srv.port, srv.agent, bodies, mode, WARMUP_MS, undefined);
  }
  const sliceMs = (SECONDS * 1000) / SLICES;
  for (let k = 0; k < SLICES; k++) {
    for (const mode of modes) {
      const srv = servers.get(mode) as { child: ChildProcess; port: number; agent: Agent };
      const run = results[mode] as Run;
      const [f0, w0] = [run.flows, run.wallMs];
      const pid = srv.child.pid as number;
      const cpu0 = cpuMs(pid);
      await drive(srv.port, srv.agent, bodies, mode, sliceMs, run);
      run.serverCpuMs += cpuMs(pid) - cpu0;
      sliceRates[mode]?.push(((run.flows - f0) / (run.wallMs - w0)) * 1000);
    }
    console.error(`slice ${k + 1}/${SLICES}: daemon ${sliceRates.daemon?.at(-1)?.toFixed(0)} / ceiling ${sliceRates.ceiling?.at(-1)?.toFixed(0)} select_and_reserve/s`);
  }
} finally {
  for (const srv of servers.values()) srv.agent.destroy();
  // The daemon flushes its queued spans on SIGTERM, so the receiver stays up until it has exited.
  await Promise.all([...servers.values()].map((srv) => stop(srv.child)));
  await receiver?.close();
}

const d = results.daemon as Run;
const c = results.ceiling as Run;
const rate = (r: Run): number => (r.flows / r.wallMs) * 1000;
console.log(`${"".padEnd(28)} ${"daemon".padStart(22)} ${"node:http ceiling".padStart(22)}`);
console.log(`${"select_and_reserve/s".padEnd(28)} ${rate(d).toFixed(0).padStart(22)} ${rate(c).toFixed(0).padStart(22)}`);
console.log(`${"HTTP requests/s (3 per flow)".padEnd(28)} ${(3 * rate(d)).toFixed(0).padStart(22)} ${(3 * rate(c)).toFixed(0).padStart(22)}`);
for (const k of ["reserve", "prefill", "free"] as const) {
  const sd = summarize(d.lat[k]);
  const sc = summarize(c.lat[k]);
  console.log(`${`${k} p50 / p99`.padEnd(28)} ${`${fmtMs(sd.p50)} / ${fmtMs(sd.p99)}`.padStart(22)} ${`${fmtMs(sc.p50)} / ${fmtMs(sc.p99)}`.padStart(22)}`);
}
const cpuPerFlow = (r: Run): string => `${((1000 * r.serverCpuMs) / r.flows).toFixed(0)} us`;
console.log(`${"server CPU per flow".padEnd(28)} ${cpuPerFlow(d).padStart(22)} ${cpuPerFlow(c).padStart(22)}`);
console.log(`${"errors".padEnd(28)} ${String(d.errors).padStart(22)} ${String(c.errors).padStart(22)}`);
if (receiver !== undefined) {
  const flows = flowsDriven.daemon ?? 0;
  console.log(
    `traces: ${otlp.spans} spans in ${otlp.requests} OTLP exports (${(otlp.bytes / 1024 / 1024).toFixed(1)} MiB) for ${flows} daemon flows (warm-up included): ${(otlp.spans / Math.max(1, flows)).toFixed(2)} spans per flow of 7 made`,
  );
}
const pairRatios = (sliceRates.daemon ?? []).map((r, i) => (100 * r) / (sliceRates.ceiling?.[i] ?? Number.NaN)).sort((a, b) => a - b);
console.log(`select_and_reserve throughput = ${((100 * rate(d)) / rate(c)).toFixed(1)}% of the node:http ceiling (target >= 50%); per slice pair ${pairRatios.map((r) => r.toFixed(1)).join(" / ")}%`);

mkdirSync(args.out, { recursive: true });
const svg = lineChart({
  title: "select_and_reserve latency (14,000-token prompts, 1,024 ranks)",
  xLabel: "latency (ms, log scale)",
  yLabel: "fraction of requests",
  logX: true,
  series: [
    { name: "kvmesh daemon", points: cdf(d.lat.reserve) },
    { name: "node:http ceiling", points: cdf(c.lat.reserve) },
  ],
});
const file = join(args.out, "bench-http-latency.svg");
writeFileSync(file, svg);
console.log(`plot: ${file}`);
