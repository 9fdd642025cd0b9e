/**
 * npm run bench:ingest — how many KV-event block operations a second one replica keeps up with,
 * and what selects cost meanwhile (issue 26).
 *
 * Daemon mode (default): one `kvmesh serve` child with `--ranks` single-rank workers, each with a
 * KV-event endpoint; `--publishers` of them are fed by real ZeroMQ PUB sockets in
 * `--publisher-processes` child processes (kv-bench-publisher.ts), the rest point at a silent PUB.
 * Batches are vLLM's (kv-bench-batches.ts: map or array form, token_ids included). For each rate
 * of `--rates` (block ops/s, rising) the publishers send for `--seconds`, then the daemon gets
 * `--drain-ms` to apply what it received. A step is kept up with when every batch sent was applied
 * in that time (the lag) and none was lost (the daemon's kvmesh_kv_batches_applied_total / _lost_total; a
 * PUB drops what a lagging SUB cannot queue, and the daemon counts the gap as lost). Meanwhile a
 * prober sends `--select-rate` /select calls a second, one at a time, and the daemon's CPU is read
 * per thread from /proc. The ramp stops at the first step not kept up with.
 *
 * In-process mode (`--in-process`): the same payloads decoded (kv-event-decoder.ts) and applied
 * (SelectionService.applyKvEvents) in a loop on this thread: the decode + apply floor per core.
 *
 * Apply-only mode (`--apply-only`): the main thread's share alone. Every one of `--ranks` ranks'
 * batches is read into the prepared form first (as the ingest thread hands them over), then
 * applied (decodePreparedBatch + SelectionService.applyKvEvents, what KvIngestWorker does per
 * batch) round-robin over the ranks, every rank at its steady state (half its ring held), for
 * `--reps` runs of `--iters` batches: ns per block op (p50 and best), ops/s per core, GC time
 * and heap. Run under `node --cpu-prof` for where the time goes (scripts/cpuprofile-self.ts).
 */
import { once } from "node:events";
import { PerformanceObserver } from "node:perf_hooks";
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";

import { Publisher } from "zeromq";

import { SelectionService, seededRandom } from "../src/core/index.js";
import { decodeKvEventBatchCapped } from "../src/ingest/kv-event-decoder.js";
import { CacheSaltChain } from "../src/ingest/cache-salt-chain.js";
import { readPreparedKvBatch } from "../src/ingest/kv-batch-reader.js";
import { prepareKvBatch } from "../src/ingest/prepare-kv-batch.js";
import { decodePreparedBatch, encodePreparedBatch, type PreparedKvBatch } from "../src/ingest/prepared-batch-codec.js";
import { mapLimited } from "../src/bench/bounded.js";
import { RouterClient, metricSum } from "../src/bench/router-client.js";
import { killOnExit, spawnServe, stopServe, type ServeProcess } from "../src/bench/serve-process.js";
import { summarize } from "../src/bench/stats.js";
import { benchChainTokens, opsPerBatch, rankBatches, type KvBenchFormat, type KvBenchShape } from "./lib/kv-bench-batches.js";
import { REGISTER_CONCURRENCY } from "./lib/bench-workers.js";
import { listOf, positiveInt, positiveIntList, scriptProgram } from "./lib/script-args.js";
import { threadCpu, threadCpuDelta, type ThreadCpu } from "./lib/thread-cpu.js";
import { procStatusBytes } from "./lib/replica-cluster.js";

const FORMATS = ["map", "array"] as const;
/** ZeroMQ's I/O thread's name in /proc (libzmq names it "ZMQbg/IO/<n>"). */
const ZMQ_IO_PREFIX = "ZMQbg/IO";
/** How often the drain is checked, ms: each check scrapes /metrics (a large page at 1,024 ranks). */
const DRAIN_POLL_MS = 250;
/** A step the publishers could not offer within this share of its rate is reported as publisher-bound. */
const OFFERED_SHARE = 0.95;
/** Warm-up before the ramp: subscriptions reach the PUBs, the daemon's JIT warms. */
const WARMUP_OPS_PER_S = 100_000;
const WARMUP_SECONDS = 2;

const opts = scriptProgram("bench:ingest", "KV-event block operations per second one replica keeps up with, CPU per thread, select latency meanwhile")
  .option("--in-process", "decode + apply on this thread, no daemon (the floor per core)", false)
  .option("--apply-only", "the main thread's apply of prepared batches alone, every --ranks rank publishing (ns per block op)", false)
  .option("--reps <n>", "apply-only: runs of --iters batches (p50 and best reported)", positiveInt, 7)
  .option("--formats <list>", "vLLM encodings: map and/or array", listOf(FORMATS), ["map"])
  .option("--block-sizes <list>", "tokens per block, comma-separated", positiveIntList, [16])
  .option("--blocks-per-event <n>", "blocks per BlockStored / BlockRemoved", positiveInt, 32)
  .option("--events-per-batch <n>", "events per message (even: half stored, half removed)", positiveInt, 4)
  .option("--chains <n>", "requests in each rank's ring (it holds half)", positiveInt, 64)
  .option("--ranks <n>", "worker ranks registered", positiveInt, 1024)
  .option("--publishers <n>", "ranks whose engines publish", positiveInt, 16)
  .option("--publisher-processes <n>", "processes the publishing ranks are spread over", positiveInt, 2)
  .option("--rates <list>", "block ops/s, rising, comma-separated", positiveIntList, [250_000, 500_000, 1_000_000, 2_000_000, 4_000_000])
  .option("--seconds <n>", "publishing seconds per rate", positiveInt, 4)
  .option("--drain-ms <n>", "ms after a step for the daemon to apply what it received", positiveInt, 1_000)
  .option("--select-rate <n>", "/select calls a second, one at a time, during each step", positiveInt, 100)
  .option("--prompt-tokens <n>", "tokens of each probed prompt", positiveInt, 2_048)
  .option("--iters <n>", "in-process: batches decoded and applied per case", positiveInt, 20_000)
  .option("--kv-ingest-window-batches <n>", "the daemon's hand-over window, batches (its flag; unset: the daemon's default)", positiveInt)
  .option("--kv-ingest-window-bytes <n>", "the same window, bytes (its flag; unset: the daemon's default)", positiveInt)
  .parse()
  .opts<{
    inProcess: boolean;
    applyOnly: boolean;
    reps: number;
    formats: KvBenchFormat[];
    blockSizes: number[];
    blocksPerEvent: number;
    eventsPerBatch: number;
    chains: number;
    ranks: number;
    publishers: number;
    publisherProcesses: number;
    rates: number[];
    seconds: number;
    drainMs: number;
    selectRate: number;
    promptTokens: number;
    iters: number;
    kvIngestWindowBatches?: number;
    kvIngestWindowBytes?: number;
  }>();

const shapeOf = (format: KvBenchFormat, blockSize: number): KvBenchShape => ({ format, blockSize, blocksPerEvent: opts.blocksPerEvent, eventsPerBatch: opts.eventsPerBatch, chains: opts.chains });
const label = (s: KvBenchShape): string => `${s.format}, block ${s.blockSize}, ${s.eventsPerBatch} x ${s.blocksPerEvent}-block events/batch`;
const fmtM = (opsPerS: number): string => `${(opsPerS / 1e6).toFixed(2)}M`;
const mb = (bytes: number): string => (bytes / (1024 * 1024)).toFixed(0);
const us = (ms: number): string => (Number.isFinite(ms) ? (ms * 1000).toFixed(0) : "n/a");

// ---------------------------------------------------------------- in process

function inProcess(shape: KvBenchShape): void {
  const ranks = Math.min(opts.ranks, opts.publishers);
  const svc = new SelectionService({ random: seededRandom(1), replicaId: 1n });
  for (let w = 0; w < ranks; w++) svc.upsertWorker({ worker_id: BigInt(w + 1), endpoint: `http://w${w}`, block_size: shape.blockSize });
  const cycles = Array.from({ length: ranks }, (_, r) => rankBatches(shape, r));
  const salts = Array.from({ length: ranks }, () => new CacheSaltChain());
  const run = (iters: number, apply: boolean): number => {
    const t0 = performance.now();
    for (let i = 0; i < iters; i++) {
      const r = i % ranks;
      const cycle = cycles[r] as Buffer[];
      const batch = decodeKvEventBatchCapped(cycle[Math.floor(i / ranks) % cycle.length] as Buffer).batch;
      (salts[r] as CacheSaltChain).process(batch);
      if (apply) svc.applyKvEvents(BigInt(r + 1), 0, batch);
    }
    return performance.now() - t0;
  };
  // The ingest thread's two paths to the prepared form: the general one (decode, prepare, encode)
  // and the fast reader (kv-batch-reader.ts); then the main thread's share (apply a prepared batch).
  const prepare = (iters: number, fast: boolean): number => {
    const t0 = performance.now();
    for (let i = 0; i < iters; i++) {
      const r = i % ranks;
      const payload = (cycles[r] as Buffer[])[Math.floor(i / ranks) % (cycles[r] as Buffer[]).length] as Buffer;
      if (fast) {
        if (readPreparedKvBatch(payload) === null) throw new Error("bench batch not taken by the fast reader");
      } else {
        const batch = decodeKvEventBatchCapped(payload).batch;
        prepareKvBatch(batch);
        encodePreparedBatch(batch);
      }
    }
    return performance.now() - t0;
  };
  const applyPrepared = (iters: number): number => {
    const prepared = cycles.map((c) => c.map((b) => readPreparedKvBatch(b) as PreparedKvBatch));
    const t0 = performance.now();
    for (let i = 0; i < iters; i++) {
      const r = i % ranks;
      const cycle = prepared[r] as PreparedKvBatch[];
      const p = cycle[Math.floor(i / ranks) % cycle.length] as PreparedKvBatch;
      svc.applyKvEvents(BigInt(r + 1), 0, decodePreparedBatch(p.ts, p.dpRank, p.words, p.strings));
    }
    return performance.now() - t0;
  };
  run(Math.min(opts.iters, 2_000), true); // warm: JIT, and every rank at its steady state
  prepare(Math.min(opts.iters, 2_000), false);
  prepare(Math.min(opts.iters, 2_000), true);
  const decodeMs = run(opts.iters, false);
  const totalMs = run(opts.iters, true);
  const generalMs = prepare(opts.iters, false);
  const fastMs = prepare(opts.iters, true);
  const applyMs = applyPrepared(opts.iters);
  const ops = opts.iters * opsPerBatch(shape);
  const rate = (ms: number): string => `${fmtM((ops / ms) * 1000)} ops/s (${((ms * 1e6) / ops).toFixed(0)} ns/op)`;
  console.log(
    `${label(shape)}: decode ${fmtM((ops / decodeMs) * 1000)} ops/s, decode + apply ${fmtM((ops / totalMs) * 1000)} ops/s per core ` +
      `(${((totalMs * 1e6) / ops).toFixed(0)} ns/op, decode ${((100 * decodeMs) / totalMs).toFixed(0)}%)`,
  );
  console.log(`  ingest thread, to the prepared form: general (decode + prepare + encode) ${rate(generalMs)}, fast reader ${rate(fastMs)}`);
  console.log(`  main thread, applying prepared batches: ${rate(applyMs)}`);
}

// ---------------------------------------------------------------- apply only

/** GC pauses (ms) observed since `gcMs.reset()`: V8's `gc` performance entries. */
const gcMs = (() => {
  let total = 0;
  let count = 0;
  const obs = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      total += e.duration;
      count++;
    }
  });
  obs.observe({ entryTypes: ["gc"] });
  return {
    reset: (): void => {
      total = 0;
      count = 0;
    },
    read: (): { ms: number; count: number } => ({ ms: total, count }),
    stop: (): void => { obs.disconnect(); },
  };
})();

async function applyOnly(shape: KvBenchShape): Promise<void> {
  const ranks = opts.ranks;
  const svc = new SelectionService({ random: seededRandom(1), replicaId: 1n });
  for (let w = 0; w < ranks; w++) svc.upsertWorker({ worker_id: BigInt(w + 1), endpoint: `http://w${w}`, block_size: shape.blockSize });
  // Every rank's cycle, read once into the prepared form as the ingest thread hands it over.
  const t0 = performance.now();
  const prepared = Array.from({ length: ranks }, (_, r) =>
    rankBatches(shape, r).map((b) => {
      const p = readPreparedKvBatch(b);
      if (p === null) throw new Error("bench batch not taken by the fast reader");
      return p;
    }),
  );
  const cycleLen = (prepared[0] as PreparedKvBatch[]).length;
  process.stderr.write(`apply-only: ${ranks} ranks x ${cycleLen} prepared batches in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
  let next = 0; // batches applied so far: batch i goes to rank i % ranks, the rank's stream in order
  const run = (iters: number): number => {
    const start = performance.now();
    for (let k = 0; k < iters; k++, next++) {
      const r = next % ranks;
      const p = (prepared[r] as PreparedKvBatch[])[Math.floor(next / ranks) % cycleLen] as PreparedKvBatch;
      svc.applyKvEvents(BigInt(r + 1), 0, decodePreparedBatch(p.ts, p.dpRank, p.words, p.strings));
    }
    return performance.now() - start;
  };
  // Warm: a whole cycle of every rank (each then holds half its ring, as in steady state), and the JIT.
  run(ranks * cycleLen);
  const ops = opts.iters * opsPerBatch(shape);
  const nsPerOp: number[] = [];
  const gcShare: number[] = [];
  for (let rep = 0; rep < opts.reps; rep++) {
    gcMs.reset();
    const ms = run(opts.iters);
    // The observer reports asynchronously: let this rep's entries arrive.
    await sleep(0);
    nsPerOp.push((ms * 1e6) / ops);
    gcShare.push(gcMs.read().ms / ms);
  }
  gcMs.stop();
  const sorted = [...nsPerOp].sort((a, b) => a - b);
  const p50 = sorted[Math.floor(sorted.length / 2)] as number;
  const best = sorted[0] as number;
  const gcP50 = [...gcShare].sort((a, b) => a - b)[Math.floor(gcShare.length / 2)] as number;
  const heap = process.memoryUsage();
  console.log(
    `${label(shape)}; ${ranks} ranks publishing, ${opts.reps} runs of ${opts.iters} batches (${ops} block ops): main thread applying prepared batches ` +
      `p50 ${p50.toFixed(0)} ns/op (${fmtM(1e9 / p50)} ops/s per core), best ${best.toFixed(0)} ns/op (${fmtM(1e9 / best)}), runs ${nsPerOp.map((v) => v.toFixed(0)).join(" ")}; ` +
      `GC ${(100 * gcP50).toFixed(1)}% of a run (p50); heap used ${mb(heap.heapUsed)} MB, total ${mb(heap.heapTotal)} MB, RSS ${mb(heap.rss)} MB; events applied ${svc.stats.kvEventsApplied}, dropped ${svc.stats.kvEventsDropped}`,
  );
}

// ---------------------------------------------------------------- daemon

interface PublisherProc {
  readonly child: ChildProcess;
  readonly endpoints: string[];
  readonly lines: AsyncIterator<string>;
}

async function nextJson<T>(p: PublisherProc): Promise<T> {
  const r = await p.lines.next();
  if (r.done === true) throw new Error("a publisher process exited");
  return JSON.parse(r.value) as T;
}

async function startPublisher(shape: KvBenchShape, ranks: number[]): Promise<PublisherProc> {
  const script = new URL("./lib/kv-bench-publisher.ts", import.meta.url).pathname;
  const child = spawn(process.execPath, ["--import", "tsx", script, JSON.stringify({ shape, ranks })], { stdio: ["pipe", "pipe", "inherit"] });
  killOnExit(child);
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream })[Symbol.asyncIterator]();
  const p: PublisherProc = { child, endpoints: [], lines };
  p.endpoints.push(...(await nextJson<{ endpoints: string[] }>(p)).endpoints);
  return p;
}

/** Every publisher sends its share of `opsPerS` for `seconds`; resolves with the batches sent. */
async function publishAll(pubs: readonly PublisherProc[], shape: KvBenchShape, opsPerS: number, seconds: number): Promise<number> {
  const rate = opsPerS / opsPerBatch(shape) / pubs.length;
  for (const p of pubs) p.child.stdin?.write(`${JSON.stringify({ rate, seconds })}\n`);
  let sent = 0;
  for (const p of pubs) sent += (await nextJson<{ sent: number }>(p)).sent;
  return sent;
}

interface IngestCounters {
  readonly applied: number;
  readonly lost: number;
  readonly malformed: number;
  /** Shed by the ingest thread while its hand-over window was full (0 before the window existed). */
  readonly shed: number;
  /** The most batches pending between the ingest thread and the main thread at once, since the start. */
  readonly peakPending: number;
}

async function counters(client: RouterClient): Promise<IngestCounters> {
  const text = await client.ok("GET", "/metrics");
  return {
    applied: metricSum(text, "kvmesh_kv_batches_applied_total"),
    lost: metricSum(text, "kvmesh_kv_batches_lost_total"),
    malformed: metricSum(text, "kvmesh_kv_batches_malformed_total"),
    shed: metricSum(text, "kvmesh_kv_batches_shed_total"),
    peakPending: metricSum(text, "kvmesh_kv_ingest_pending_batches_peak"),
  };
}

/** /select latencies (ms), one call at a time at `rate` a second, until `stop` resolves. */
async function probeSelects(client: RouterClient, body: string, rate: number, stop: Promise<unknown>): Promise<number[]> {
  let done = false;
  void stop.then(() => (done = true));
  const out: number[] = [];
  const interval = 1_000 / rate;
  let next = performance.now();
  while (!done) {
    const t0 = performance.now();
    await client.ok("POST", "/select", body);
    out.push(performance.now() - t0);
    next += interval;
    const wait = next - performance.now();
    if (wait > 0) await sleep(wait);
    else next = performance.now();
  }
  return out;
}

interface Step {
  readonly target: number;
  readonly offered: number;
  readonly keptUp: boolean;
  readonly why: string;
  readonly drainMs: number;
  readonly cpu: ThreadCpu;
  readonly seconds: number;
  readonly select: ReturnType<typeof summarize>;
  /** The daemon's resident set at the end of publishing, and its peak so far (VmHWM), bytes. */
  readonly rss: number;
  readonly hwm: number;
  readonly shed: number;
  readonly peakPending: number;
}

const zmqMs = (c: ThreadCpu): number => Object.entries(c.byName).reduce((a, [n, v]) => a + (n.startsWith(ZMQ_IO_PREFIX) ? v : 0), 0);
const pct = (ms: number, s: number): string => `${((ms / (s * 1000)) * 100).toFixed(0)}%`;

async function measureStep(daemon: ServeProcess, client: RouterClient, pubs: readonly PublisherProc[], shape: KvBenchShape, opsPerS: number, body: string): Promise<Step> {
  const before = await counters(client);
  const c0 = threadCpu(daemon.pid);
  const t0 = performance.now();
  const publishing = opsPerS > 0 ? publishAll(pubs, shape, opsPerS, opts.seconds) : sleep(opts.seconds * 1_000).then(() => 0);
  const latencies = probeSelects(client, body, opts.selectRate, publishing);
  const sent = await publishing;
  const cpu = threadCpuDelta(c0, threadCpu(daemon.pid));
  // At the end of publishing: where a backlog is largest.
  const rss = procStatusBytes(daemon.pid, "VmRSS");
  const seconds = (performance.now() - t0) / 1_000;
  const select = summarize(await latencies);
  const d0 = performance.now();
  let after = await counters(client);
  while (after.applied - before.applied < sent && performance.now() - d0 < opts.drainMs && after.lost === before.lost) {
    await sleep(DRAIN_POLL_MS);
    after = await counters(client);
  }
  const drainMs = performance.now() - d0;
  const applied = after.applied - before.applied;
  const lost = after.lost - before.lost;
  const offered = (sent * opsPerBatch(shape)) / opts.seconds;
  let why = "";
  if (lost > 0) why = `${lost} batches lost`;
  else if (after.malformed > before.malformed) why = `${after.malformed - before.malformed} malformed`;
  else if (applied < sent) why = `${sent - applied} of ${sent} batches not applied ${opts.drainMs} ms after`;
  else if (drainMs > opts.drainMs) why = `lag: applied ${drainMs.toFixed(0)} ms after`;
  else if (offered < OFFERED_SHARE * opsPerS) why = "publisher-bound";
  const hwm = procStatusBytes(daemon.pid, "VmHWM");
  return { target: opsPerS, offered, keptUp: why === "" || why === "publisher-bound", why, drainMs, cpu, seconds, select, rss, hwm, shed: after.shed - before.shed, peakPending: after.peakPending };
}

async function daemonRun(shape: KvBenchShape): Promise<void> {
  const silent = new Publisher();
  await silent.bind("tcp://127.0.0.1:*");
  const procs = Math.min(opts.publisherProcesses, opts.publishers);
  const groups = Array.from({ length: procs }, (_, i) => Array.from({ length: opts.publishers }, (_, r) => r).filter((r) => r % procs === i));
  const pubs = await Promise.all(groups.map((g) => startPublisher(shape, g)));
  const endpointOf = (rank: number): string => {
    if (rank >= opts.publishers) return silent.lastEndpoint as string;
    return (pubs[rank % procs] as PublisherProc).endpoints[Math.floor(rank / procs)] as string;
  };
  const window = [
    ...(opts.kvIngestWindowBatches === undefined ? [] : ["--kv-ingest-window-batches", String(opts.kvIngestWindowBatches)]),
    ...(opts.kvIngestWindowBytes === undefined ? [] : ["--kv-ingest-window-bytes", String(opts.kvIngestWindowBytes)]),
  ];
  const daemon = await spawnServe({ label: "bench:ingest daemon", args: window });
  const client = new RouterClient(daemon.port);
  try {
    const ids = Array.from({ length: opts.ranks }, (_, r) => r);
    await mapLimited(ids, REGISTER_CONCURRENCY, async (r) => {
      await client.ok("POST", "/workers", JSON.stringify({ worker_id: r + 1, endpoint: `http://w${r}`, block_size: shape.blockSize, kv_events_endpoint: endpointOf(r) }));
    });
    // A prompt whose first blocks rank 0 stores (so the match walk has work), then a unique tail.
    const stored = benchChainTokens(0, 0, opts.blocksPerEvent * shape.blockSize);
    const prompt = Array.from({ length: opts.promptTokens }, (_, i) => (i < stored.length ? (stored[i] as number) : (i * 13 + 7) % 150_000));
    const body = JSON.stringify({ token_ids: prompt });
    await publishAll(pubs, shape, WARMUP_OPS_PER_S, WARMUP_SECONDS);
    await sleep(opts.drainMs);
    const steps: Step[] = [await measureStep(daemon, client, pubs, shape, 0, body)];
    for (const rate of opts.rates) {
      const s = await measureStep(daemon, client, pubs, shape, rate, body);
      steps.push(s);
      process.stderr.write(`${label(shape)}: ${fmtM(rate)} ops/s ${s.keptUp ? "kept up" : `fell behind (${s.why})`}\n`);
      if (!s.keptUp) break;
    }
    report(shape, steps);
  } finally {
    client.close();
    await stopServe(daemon);
    for (const p of pubs) p.child.stdin?.end();
    await Promise.all(pubs.map((p) => (p.child.exitCode === null ? once(p.child, "exit") : Promise.resolve())));
    silent.close();
  }
}

function report(shape: KvBenchShape, steps: readonly Step[]): void {
  console.log(`\n${label(shape)}; ${opts.ranks} ranks, ${opts.publishers} publishing over ${opts.publisherProcesses} processes; ${opts.seconds} s a step`);
  const head = ["target ops/s", "offered ops/s", "kept up", "drain ms", "main CPU", "ZMQ I/O", "other threads", "select p50 us", "select p99 us", "shed", "peak pending", "RSS MB", "peak RSS MB"];
  console.log(head.map((h, i) => h.padStart(i === 2 ? 36 : 15)).join(""));
  for (const s of steps) {
    const other = s.cpu.allMs - s.cpu.mainMs - zmqMs(s.cpu);
    const cells = [
      s.target === 0 ? "no ingest" : fmtM(s.target),
      fmtM(s.offered),
      s.target === 0 ? "-" : s.keptUp ? (s.why === "" ? "yes" : s.why) : `no: ${s.why}`,
      s.target === 0 ? "-" : s.drainMs.toFixed(0),
      pct(s.cpu.mainMs, s.seconds),
      pct(zmqMs(s.cpu), s.seconds),
      pct(other, s.seconds),
      us(s.select.p50),
      us(s.select.p99),
      String(s.shed),
      String(s.peakPending),
      mb(s.rss),
      mb(s.hwm),
    ];
    console.log(cells.map((c, i) => c.padStart(i === 2 ? 36 : 15)).join(""));
  }
  const best = steps.filter((s) => s.target > 0 && s.keptUp).reduce((a, s) => Math.max(a, s.offered), 0);
  console.log(`highest kept up with: ${fmtM(best)} block ops/s (${label(shape)})`);
  console.log("- kept up: every batch sent was applied within --drain-ms of the step's end and none lost (the daemon's kvmesh_kv_batches_* counters)");
  console.log("- CPU: the daemon's utime+stime per thread from /proc/<pid>/task over the step, as a share of one core");
  console.log("- shed: batches the ingest thread shed in the step, its hand-over window full (kvmesh_kv_batches_shed_total; the bench's publishers replay nothing, so they are also lost); peak pending: the most batches between the ingest thread and the main thread at once so far (kvmesh_kv_ingest_pending_batches_peak); RSS: the daemon's at the end of the step's publishing, and its peak so far (VmHWM)");
}

for (const format of opts.formats) {
  for (const blockSize of opts.blockSizes) {
    const shape = shapeOf(format, blockSize);
    if (opts.applyOnly) await applyOnly(shape);
    else if (opts.inProcess) inProcess(shape);
    else await daemonRun(shape);
  }
}
