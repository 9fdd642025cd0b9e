/**
 * `npm run bench:engines -- [hosts] [engines] [speedup] [seconds] [trace]`: what mock engines cost.
 * RSS and CPU of `hosts` engine host processes (default 4 x 256 engines), idle and under a
 * Mooncake replay (random engine per request), with one KV-event subscriber per engine: the
 * evidence that 1,024 engines fit in a few processes on this machine.
 */
import { readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { seededRandom } from "../src/core/index.js";
import { KvIngest } from "../src/ingest/kv-ingest.js";
import { raiseZmqSocketLimit } from "../src/ingest/zmq-socket-limit.js";
import { EngineHostGroup, promptTokensFor, readTrace } from "../src/mock/index.js";
import { positiveInt, positiveNumber, scriptProgram } from "./lib/script-args.js";

const DEFAULT_TRACE = "../shared/traces/mooncake-synthetic.jsonl";
const program = scriptProgram("bench:engines", "What mock engines cost: RSS and CPU of engine host processes, idle and under a Mooncake replay.")
  .argument("[hosts]", "engine host processes", positiveInt, 4)
  .argument("[engines]", "engines in all", positiveInt, 1024)
  .argument("[speedup]", "trace time compression", positiveNumber, 10)
  .argument("[seconds]", "seconds of replay", positiveNumber, 60)
  .argument("[trace]", "Mooncake-format JSONL trace", DEFAULT_TRACE)
  .parse();
const [HOSTS, ENGINES, SPEEDUP, LOAD_SECONDS, TRACE] = program.processedArgs as [number, number, number, number, string];
const TICKS_PER_S = 100;

// The measuring process subscribes to every engine: more than libzmq's default 1,023 sockets.
raiseZmqSocketLimit();

function proc(pid: number): { rssMiB: number; cpuTicks: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const rss = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0) / 1024;
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return { rssMiB: rss, cpuTicks: Number(fields[11]) + Number(fields[12]) };
}

async function sample(pids: number[], seconds: number): Promise<{ rssMiB: number[]; cpuPct: number[] }> {
  const a = pids.map(proc);
  await sleep(seconds * 1000);
  const b = pids.map(proc);
  return {
    rssMiB: b.map((x) => Math.round(x.rssMiB)),
    cpuPct: b.map((x, i) => Math.round(((x.cpuTicks - (a[i]?.cpuTicks ?? 0)) / TICKS_PER_S / seconds) * 1000) / 10),
  };
}

const t0 = performance.now();
const group = await EngineHostGroup.spawn({ hosts: HOSTS, engines: ENGINES, speedup: SPEEDUP, expectedSubscribers: 1 });
console.log(`started ${ENGINES} engines in ${HOSTS} hosts in ${Math.round(performance.now() - t0)} ms; pids ${group.pids.join(",")}`);
let batches = 0;
const ingest = new KvIngest({ onBatch: () => batches++, onReset: () => undefined });
const t1 = performance.now();
for (const d of group.descriptors) await ingest.upsert(String(d.workerId), [{ rank: d.dpRank, endpoint: d.kvEndpoint, replayEndpoint: d.replayEndpoint }]);
await group.waitForSubscribers(1, 30_000);
console.log(`subscribed to all in ${Math.round(performance.now() - t1)} ms`);

await sleep(3_000);
const idle = await sample(group.pids, 10);
console.log(`idle: host RSS MiB ${idle.rssMiB.join(" ")}, host CPU % ${idle.cpuPct.join(" ")}, driver RSS ${Math.round(proc(process.pid).rssMiB)} MiB`);

const trace = await readTrace(TRACE);
const rng = seededRandom(1);
const start = performance.now();
const driverBefore = proc(process.pid);
const loadSample = sample(group.pids, LOAD_SECONDS);
const inflight: Promise<unknown>[] = [];
const ttft: number[] = [];
let sent = 0;
for (const r of trace) {
  const due = start + r.timestamp / SPEEDUP;
  if (due > start + LOAD_SECONDS * 1000) break;
  const wait = due - performance.now();
  if (wait > 0) await sleep(wait);
  const index = Math.floor(rng.next() * group.descriptors.length);
  sent++;
  inflight.push(
    group.submit(index, { requestId: `t${sent}`, tokens: promptTokensFor(r.hash_ids, r.input_length), outputTokens: r.output_length }).then((res) => {
      ttft.push(res.ttftMs);
    }),
  );
}
const load = await loadSample;
const driverAfter = proc(process.pid);
await Promise.all(inflight);
const stats = await group.stats();
ttft.sort((a, b) => a - b);
console.log(
  `load: ${sent} requests in ${LOAD_SECONDS} s wall (${(sent / LOAD_SECONDS).toFixed(1)} req/s, speedup ${SPEEDUP}); host RSS MiB ${load.rssMiB.join(" ")}, host CPU % ${load.cpuPct.join(" ")}; driver CPU ${(((driverAfter.cpuTicks - driverBefore.cpuTicks) / TICKS_PER_S / LOAD_SECONDS) * 100).toFixed(1)} %`,
);
console.log(
  `engines: requests ${stats.totals.requests}, hit ratio ${stats.totals.hitRatio.toFixed(3)} (random routing), evictions ${stats.totals.evictions}, KV batches ${stats.totals.batchesPublished} (received ${batches}), max host lag ${stats.totals.maxLagMs.toFixed(1)} ms, TTFT p50 ${ttft[Math.floor(ttft.length / 2)]?.toFixed(0)} ms p99 ${ttft[Math.floor(ttft.length * 0.99)]?.toFixed(0)} ms`,
);
const t2 = performance.now();
await ingest.close();
await group.close();
console.log(`closed in ${Math.round(performance.now() - t2)} ms`);
