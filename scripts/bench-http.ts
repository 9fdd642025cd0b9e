/**
 * npm run bench:http — the daemon's HTTP throughput against the ceiling of node:http here.
 *
 * Starts the daemon (1,024 worker ranks, prefix index warmed) in a child process and drives
 * flows of select_and_reserve (14,000-token prompt) + prefill_complete + free from this process
 * over keep-alive connections; then does the same request sequence against a bare node:http
 * server answering a fixed JSON body. Prints requests/s, latency p50/p99 per request kind, the
 * ratio of select_and_reserve throughput to the ceiling, and writes a latency CDF plot.
 * Flags: --seconds N --concurrency N --workers N --out DIR.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { Agent, request } from "node:http";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { benchPrompt } from "./bench-prompts.js";
import { fmtMs, summarize } from "./bench-stats.js";
import { cdf, lineChart } from "./svg-plot.js";

const { values: args } = parseArgs({
  options: {
    seconds: { type: "string", default: "10" },
    concurrency: { type: "string", default: "16" },
    workers: { type: "string", default: "1024" },
    out: { type: "string", default: "reports" },
  },
});
const SECONDS = Number(args.seconds);
const CONCURRENCY = Number(args.concurrency);

interface Run {
  flows: number;
  wallMs: number;
  lat: Record<"reserve" | "prefill" | "free", number[]>;
  errors: number;
}

async function startServer(mode: "daemon" | "ceiling"): Promise<{ child: ChildProcess; port: number }> {
  // KVMESH_BENCH_NODE_ARGS (e.g. "--cpu-prof") lets a profile be taken of the server alone.
  const extra = (process.env.KVMESH_BENCH_NODE_ARGS ?? "").split(" ").filter((a) => a !== "");
  const child = spawn(process.execPath, [...extra, "--import", "tsx", "scripts/bench-http-server.ts", mode, args.workers], { stdio: ["ignore", "pipe", "inherit"] });
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

async function drive(port: number, bodies: string[], label: string): Promise<Run> {
  const agent = new Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  const run: Run = { flows: 0, wallMs: 0, lat: { reserve: [], prefill: [], free: [] }, errors: 0 };
  const warmUntil = performance.now() + 2_000;
  const start = { t: 0 };
  let seq = 0;
  const worker = async (): Promise<void> => {
    for (;;) {
      const now = performance.now();
      if (start.t !== 0 && now - start.t > SECONDS * 1000) return;
      if (start.t === 0 && now >= warmUntil) start.t = now;
      const id = `${label}-${seq++}`;
      const body = (bodies[seq % bodies.length] as string).replace('"selection_id":"X"', `"selection_id":"${id}"`);
      const t0 = performance.now();
      const r1 = await send(agent, port, "POST", "/select_and_reserve", body);
      const t1 = performance.now();
      const r2 = await send(agent, port, "POST", `/reservations/${id}/prefill_complete`, "{}");
      const t2 = performance.now();
      const r3 = await send(agent, port, "DELETE", `/reservations/${id}`, undefined);
      const t3 = performance.now();
      if (r1.status !== 200 || r2.status !== 200 || r3.status !== 200) {
        run.errors++;
        if (run.errors === 1) console.error(`${label}: unexpected status ${r1.status}/${r2.status}/${r3.status}: ${r1.text.slice(0, 200)}`);
      }
      if (start.t !== 0) {
        run.flows++;
        run.lat.reserve.push(t1 - t0);
        run.lat.prefill.push(t2 - t1);
        run.lat.free.push(t3 - t2);
      }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, () => worker()));
  run.wallMs = performance.now() - start.t;
  agent.destroy();
  return run;
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
console.error(`bench:http: ${args.workers} worker ranks, ${CONCURRENCY} connections, ${SECONDS} s per server, 14,000-token prompts (${(bodies[0]?.length ?? 0) / 1024 | 0} KiB bodies)`);

const results: Record<string, Run> = {};
for (const mode of ["daemon", "ceiling"] as const) {
  console.error(`${mode}: starting`);
  const { child, port } = await startServer(mode);
  console.error(`${mode}: driving for ${SECONDS} s`);
  results[mode] = await drive(port, bodies, mode);
  await stop(child);
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
console.log(`${"errors".padEnd(28)} ${String(d.errors).padStart(22)} ${String(c.errors).padStart(22)}`);
console.log(`select_and_reserve throughput = ${((100 * rate(d)) / rate(c)).toFixed(1)}% of the node:http ceiling (target >= 50%)`);

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
