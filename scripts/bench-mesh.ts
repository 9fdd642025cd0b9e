/**
 * npm run bench:mesh — what replicating routing state across a mesh of kvmesh replicas costs,
 * and whether the replicas agree.
 *
 * For each replica count (--replicas, default 1,2,4) starts that many `kvmesh serve` processes
 * as a full mesh (each lists the ones already started in --peers; peering is symmetric),
 * registers the same --workers ranks on each (block size 64, no KV events), then drives
 * multi-turn chat sessions (scripts/lib/bench-workload.ts) at a fixed --rate, request k going to
 * replica k mod N: select_and_reserve with the session id and its whole history, prefill_complete
 * 20-80 ms later, DELETE 200-800 ms after the reserve. Per replica count it reports:
 *  - replication lag p50/p99: from the kvmesh_mesh_replication_lag_seconds histogram of every
 *    replica, the delta over the measured window summed across replicas (interpolated within
 *    buckets like histogram_quantile; it includes heartbeats), plus the largest per-peer
 *    lag_p50_ms/lag_p99_ms from /replica_sync/status as a cross-check;
 *  - events shed (kvmesh_mesh_events_shed_total summed; target 0), gaps, snapshots, resyncs;
 *  - binding divergence: 1 s after traffic stops, every session probed with /select on every
 *    replica, counting sessions whose replicas name different workers (target 0), and GET /loads
 *    compared across replicas (all zero after every free);
 *  - stickiness: share of a session's turns served by its first worker;
 *  - the select-to-book race: first turns of new sessions placed by two different replicas on the
 *    same worker within 50 ms while the client's own ledger shows a less loaded worker; and its
 *    proxy, the load spread (max - min active requests per worker) sampled from /loads every
 *    500 ms (one replica per sample, in turn, so the probing cost does not grow with N);
 *  - CPU per routed request: utime+stime of all replica processes (/proc/<pid>/stat) over the
 *    window / requests, and its ratio to the 1-replica figure (target <= 1.1x at 4);
 *  - client-side select_and_reserve latency p50/p99.
 * Every replica count first runs --warmup-seconds (default 2) of the same kind of traffic on other
 * sessions, unmeasured; the window is the --seconds of issuing plus the drain to the last free.
 * Flags: see --help. The fleet, the paced load, the probes and the report are shared with
 * bench:host (scripts/lib/session-*.ts, bench-report.ts); this file keeps what bench:mesh adds:
 * the lag and mesh counters, the race, the load spread and the CPU ratio.
 * Env: KVMESH_BENCH_NODE_ARGS="--cpu-prof --cpu-prof-dir=DIR" passes node flags to the replicas and
 * logs the window (CLOCK_MONOTONIC us) so a profile can be cut down to it.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { writeFileSync, mkdirSync } from "node:fs";
import { dirname } from "node:path";
import { Option } from "commander";
import { CLK_TCK } from "../src/bench/process-usage.js";
import { metricSum, type RouterClient } from "../src/bench/router-client.js";
import { histogramGrowth, histogramQuantile, scrapeHistogram, summarize, type Histogram } from "../src/bench/stats.js";
import { fixed, renderTable, writeJsonReport, type TableRow } from "./lib/bench-report.js";
import { SessionWorkload } from "./lib/bench-workload.js";
import { nonNegativeNumber, positiveInt, positiveIntList, positiveNumber, scriptProgram } from "./lib/script-args.js";
import { driveSessions, warmUp, type DriveOptions, type TurnRecord } from "./lib/session-drive.js";
import { cpuSpentMs, exitOnSignals, fleetCpuMs, startSessionFleet } from "./lib/session-fleet.js";
import { probeDivergence, stickiness, type Divergence, type Stickiness } from "./lib/session-figures.js";
import { lineChart } from "./lib/svg-plot.js";

interface Args {
  replicas: number[];
  workers: number;
  rate: number;
  seconds: number;
  warmupSeconds: number;
  sessions: number;
  seed: number;
  maxInFlight: number;
  json: string;
  svg: string;
  mesh: boolean;
  tieSpread: boolean;
}

const args = scriptProgram("bench:mesh", "What replicating routing state across a mesh of kvmesh replicas costs, and whether the replicas agree.")
  .addOption(new Option("--replicas <list>", "replica counts to run, comma-separated").argParser(positiveIntList).default([1, 2, 4], "1,2,4"))
  .option("--workers <n>", "worker ranks registered on every replica", positiveInt, 1024)
  .option("--rate <n>", "turns issued per second", positiveInt, 200)
  .option("--seconds <s>", "seconds of issuing per replica count", positiveNumber, 15)
  .option("--warmup-seconds <s>", "unmeasured warm-up per replica count", nonNegativeNumber, 2)
  .option("--sessions <n>", "session slots (concurrent sessions)", positiveInt, 200)
  .option("--seed <n>", "workload seed", positiveInt, 1)
  .option("--max-in-flight <n>", "turns in flight at most", positiveInt, 256)
  .option("--json <file>", "JSON report", "reports/bench-mesh.json")
  .option("--svg <file>", "SVG plot", "reports/bench-mesh.svg")
  .option("--no-mesh", "same processes, no peering: the contention baseline (lag and divergence are then meaningless)")
  .option("--no-tie-spread", "replicas run with --no-replica-tie-spread: the race without its fix")
  .addHelpText("after", '\nEnv: KVMESH_BENCH_NODE_ARGS="--cpu-prof --cpu-prof-dir=DIR" passes node flags to the replicas and logs\nthe window (CLOCK_MONOTONIC us) so a profile can be cut down to it.')
  .parse()
  .opts<Args>();

const REPLICA_COUNTS = args.replicas;
const WORKERS = args.workers;
const RATE_PER_S = args.rate;
const SECONDS = args.seconds;
const WARMUP_SECONDS = args.warmupSeconds;
const SESSIONS = args.sessions;
const SEED = args.seed;
const MAX_IN_FLIGHT = args.maxInFlight;
/**
 * --no-mesh: the same N processes and traffic, but no peering (each replica only sees its own
 * bookings). It isolates what N processes contending for the cores cost from what mirroring costs;
 * divergence and lag figures are meaningless then.
 */
const NO_MESH = !args.mesh;
const NODE_ARGS = (process.env.KVMESH_BENCH_NODE_ARGS ?? "").split(" ").filter((a) => a !== "");

const BLOCK_SIZE = 64;
const SETTLE_MS = 1_000;
const LOAD_SAMPLE_INTERVAL_MS = 500;
const RACE_WINDOW_MS = 50;
/** Connections per replica; in flight are at most a few dozen requests per replica at 200/s. */
const SOCKETS_PER_REPLICA = 32;
/** The table's columns are at least this wide. */
const MIN_COLUMN_WIDTH = 22;

exitOnSignals("bench:mesh");

// ------------------------------------------------------------------ metrics scraping

interface MeshScrape {
  shed: number;
  gaps: number;
  snapshotsInstalled: number;
  resyncs: number;
  batchesSent: number;
  eventsSent: number;
  lag: Histogram;
}

async function scrape(c: RouterClient): Promise<MeshScrape> {
  const text = await c.ok("GET", "/metrics");
  return {
    shed: metricSum(text, "kvmesh_mesh_events_shed_total"),
    gaps: metricSum(text, "kvmesh_mesh_gaps_total"),
    snapshotsInstalled: metricSum(text, "kvmesh_mesh_snapshots_installed_total"),
    resyncs: metricSum(text, "kvmesh_mesh_divergence_resyncs_total"),
    batchesSent: metricSum(text, "kvmesh_mesh_batches_sent_total"),
    eventsSent: metricSum(text, "kvmesh_mesh_events_sent_total"),
    lag: scrapeHistogram(text, "kvmesh_mesh_replication_lag_seconds"),
  };
}

interface LoadRow {
  worker_id: number;
  dp_rank: number;
  potential_prefill_tokens: number;
  potential_decode_blocks: number;
  active_requests: number;
}

async function loads(c: RouterClient): Promise<LoadRow[]> {
  const body = JSON.parse(await c.ok("GET", "/loads")) as { loads: LoadRow[] }[];
  return body.flatMap((p) => p.loads).sort((a, b) => a.worker_id - b.worker_id || a.dp_rank - b.dp_rank);
}

interface PeerRow {
  state: string;
  sync: string | null;
  lag_p50_ms: number | null;
  lag_p99_ms: number | null;
}

const peersOf = async (c: RouterClient): Promise<PeerRow[]> => JSON.parse(await c.ok("GET", "/replica_sync/status")) as PeerRow[];

// ------------------------------------------------------------------ the workload

/** What bench:mesh watches while a drive runs. */
interface MeshWatch {
  /** First turns placed where the client's ledger showed a worker with fewer active requests. */
  readonly lowerLoadedExisted: ReadonlySet<TurnRecord>;
  /** max - min active requests per worker, from /loads samples. */
  readonly loadSpreads: readonly number[];
}

/**
 * Hooks for the shared session drive: a client-side ledger of active requests per worker as
 * this client booked and freed them (the ground truth the replicas' ledgers converge to), and
 * the load spread sampled from /loads every LOAD_SAMPLE_INTERVAL_MS (one replica per sample, in
 * turn, so the probing cost does not grow with N). `settled` waits for the last sample.
 */
function watchMesh(clients: readonly RouterClient[]): Pick<DriveOptions, "onBooked" | "onTick"> & { settled: () => Promise<MeshWatch> } {
  const n = clients.length;
  const ledger = new Int32Array(WORKERS + 1);
  const lowerLoadedExisted = new Set<TurnRecord>();
  const loadSpreads: number[] = [];
  const minLoad = (): number => {
    let m = Infinity;
    for (let w = 1; w <= WORKERS; w++) if ((ledger[w] as number) < m) m = ledger[w] as number;
    return m;
  };
  let sampleIdx = 0;
  let nextSampleAt = performance.now() + LOAD_SAMPLE_INTERVAL_MS;
  const samples: Promise<void>[] = [];
  return {
    onBooked: (rec) => {
      if (rec.turn === 0 && (ledger[rec.worker] as number) > minLoad()) lowerLoadedExisted.add(rec);
      ledger[rec.worker] = (ledger[rec.worker] ?? 0) + 1;
      return () => {
        ledger[rec.worker] = (ledger[rec.worker] ?? 0) - 1;
      };
    },
    onTick: (now, fail) => {
      if (now < nextSampleAt) return;
      nextSampleAt += LOAD_SAMPLE_INTERVAL_MS;
      const c = clients[sampleIdx++ % n] as RouterClient;
      samples.push(
        loads(c).then(
          (rows) => {
            const a = rows.map((x) => x.active_requests);
            loadSpreads.push(Math.max(...a) - Math.min(...a));
          },
          (err: unknown) => {
            fail(`GET /loads: ${err instanceof Error ? err.message : String(err)}`);
          },
        ),
      );
    },
    settled: async () => {
      await Promise.all(samples);
      return { lowerLoadedExisted, loadSpreads };
    },
  };
}

// ------------------------------------------------------------------ one replica count

interface RunResult {
  replicas: number;
  routed: number;
  achievedRatePerS: number;
  droppedTicks: number;
  errors: number;
  errorSample: string;
  selectLatencyMs: { p50: number; p99: number; mean: number };
  lag: { source: string; samples: number; p50Ms: number; p99Ms: number; peersMaxP50Ms: number | null; peersMaxP99Ms: number | null };
  /** Since the replicas started (registration included). */
  eventsShed: number;
  eventsShedInWindow: number;
  /** gaps, snapshots and resyncs: over the measured window only. */
  gaps: number;
  snapshotsInstalled: number;
  divergenceResyncs: number;
  /** Over the window, all replicas: the per-message costs (send, receive, decode) scale with batches. */
  batchesSent: number;
  eventsSent: number;
  divergence: Divergence;
  loadsAfter: { workersDiffering: number; activeRequestsPerReplica: number[] };
  stickiness: Stickiness;
  race: { firstTurns: number; sameWorkerWithin50msOnOtherReplica: number; withLowerLoadedWorker: number };
  loadSpread: { samples: number; mean: number; max: number };
  cpu: { windowMs: number; totalCpuMs: number; perRequestUs: number; ratioTo1Replica: number | null; idleMsPerSecondPerReplica: number; loadGeneratorCpuMs: number };
}

/**
 * The select-to-book race: first turns of new sessions placed by two different replicas on the
 * same worker within RACE_WINDOW_MS, and how many of those had a less loaded worker to go to.
 */
function race(records: readonly TurnRecord[], lowerLoadedExisted: ReadonlySet<TurnRecord>): RunResult["race"] {
  const firsts = records.filter((x) => x.turn === 0).sort((a, b) => a.answeredAt - b.answeredAt);
  let sameWorker = 0;
  let withLower = 0;
  for (let i = 0; i < firsts.length; i++) {
    const b = firsts[i] as TurnRecord;
    for (let j = i - 1; j >= 0; j--) {
      const a = firsts[j] as TurnRecord;
      if (b.answeredAt - a.answeredAt > RACE_WINDOW_MS) break;
      if (a.replica !== b.replica && a.worker === b.worker) {
        sameWorker++;
        if (lowerLoadedExisted.has(b)) withLower++;
        break;
      }
    }
  }
  return { firstTurns: firsts.length, sameWorkerWithin50msOnOtherReplica: sameWorker, withLowerLoadedWorker: withLower };
}

async function runOne(n: number): Promise<RunResult> {
  const label = `${String(n)} replica${n === 1 ? "" : "s"}`;
  process.stderr.write(`${label}: starting\n`);
  // --no-mesh keeps each replica's mesh ports (it still publishes, to nobody) but peers none.
  const fleet = await startSessionFleet({
    name: "replica",
    replicas: n,
    mesh: true,
    peer: !NO_MESH,
    workers: WORKERS,
    blockSize: BLOCK_SIZE,
    sockets: SOCKETS_PER_REPLICA,
    serveArgs: args.tieSpread ? [] : ["--no-replica-tie-spread"],
    nodeArgs: NODE_ARGS,
  });
  try {
    process.stderr.write(`${label}: mesh up; ${String(WORKERS)} workers registered on each\n`);
    const clients = fleet.clients();
    const pace = { clients, ratePerS: RATE_PER_S, maxInFlight: MAX_IN_FLIGHT };
    const warmWatch = watchMesh(clients);
    await warmUp({ ...pace, ...warmWatch, label, seconds: WARMUP_SECONDS, seed: SEED, slots: SESSIONS });
    await warmWatch.settled();

    const wl = new SessionWorkload({ seed: SEED, slots: SESSIONS });
    const before = await Promise.all(clients.map(scrape));
    const cpu0 = fleetCpuMs(fleet);
    const client0 = process.cpuUsage();
    // CLOCK_MONOTONIC in us, the time base of V8's .cpuprofile startTime: lets a profile be cut
    // down to the measured window.
    const windowStartUs = process.hrtime.bigint() / 1000n;
    process.stderr.write(`${label}: driving ${String(RATE_PER_S)} req/s for ${String(SECONDS)} s over ${String(SESSIONS)} session slots\n`);
    const watch = watchMesh(clients);
    const d = await driveSessions({ ...pace, ...watch, workload: wl, label, seconds: SECONDS, selectionPrefix: "t" });
    const w = await watch.settled();
    const cpu1 = fleetCpuMs(fleet);
    const client = process.cpuUsage(client0);
    if (NODE_ARGS.length > 0) process.stderr.write(`${label}: window monotonic us ${String(windowStartUs)} ${String(process.hrtime.bigint() / 1000n)}\n`);
    const after = await Promise.all(clients.map(scrape));
    const peerViews = await Promise.all(clients.map(peersOf));

    process.stderr.write(`${label}: settling ${String(SETTLE_MS)} ms, then probing ${String(wl.sessionIds().length)} sessions on every replica\n`);
    // The settle second doubles as an idle measurement: heartbeats, timers and GC cost this much
    // per replica whether or not it routes anything, a fixed cost the per-request figure includes.
    const idle0 = fleetCpuMs(fleet);
    await sleep(SETTLE_MS);
    const idleCpuMs = cpuSpentMs(idle0, fleetCpuMs(fleet));
    const div = await probeDivergence(clients, wl.sessionIds(), (sid) => wl.probeTokens(sid));
    const loadViews = await Promise.all(clients.map(loads));
    const base = loadViews[0] ?? [];
    const key = (x: LoadRow | undefined): string => (x === undefined ? "missing" : `${String(x.active_requests)}/${String(x.potential_prefill_tokens)}/${String(x.potential_decode_blocks)}`);
    let workersDiffering = 0;
    for (let i = 0; i < base.length; i++) if (loadViews.some((v) => key(v[i]) !== key(base[i]) || v.length !== base.length)) workersDiffering++;

    // Lag: the window's growth of every replica's histogram, summed (all buckets share bounds).
    const lagHist = histogramGrowth(
      before.map((b) => b.lag),
      after.map((a) => a.lag),
    );
    const peerRows = peerViews.flat();
    const maxOf = (xs: (number | null)[]): number | null => {
      const v = xs.filter((x): x is number => x !== null);
      return v.length === 0 ? null : Math.max(...v);
    };

    const delta = (k: "shed" | "gaps" | "snapshotsInstalled" | "resyncs" | "batchesSent" | "eventsSent"): number => after.reduce((s, a, i) => s + a[k] - (before[i]?.[k] ?? 0), 0);
    const totalCpuMs = cpuSpentMs(cpu0, cpu1);
    const lat = summarize(d.latencyMs);
    const spread = w.loadSpreads;
    return {
      replicas: n,
      routed: d.records.length,
      achievedRatePerS: d.records.length / SECONDS,
      droppedTicks: d.dropped,
      errors: d.errors,
      errorSample: d.errorSample,
      selectLatencyMs: { p50: lat.p50, p99: lat.p99, mean: lat.mean },
      lag: {
        source: "kvmesh_mesh_replication_lag_seconds histogram delta over the window, all replicas (batches + heartbeats)",
        samples: lagHist.cum[lagHist.cum.length - 1] ?? 0,
        p50Ms: histogramQuantile(lagHist.leMs, lagHist.cum, 0.5),
        p99Ms: histogramQuantile(lagHist.leMs, lagHist.cum, 0.99),
        peersMaxP50Ms: maxOf(peerRows.map((p) => p.lag_p50_ms)),
        peersMaxP99Ms: maxOf(peerRows.map((p) => p.lag_p99_ms)),
      },
      eventsShed: after.reduce((s, a) => s + a.shed, 0),
      eventsShedInWindow: delta("shed"),
      gaps: delta("gaps"),
      snapshotsInstalled: delta("snapshotsInstalled"),
      divergenceResyncs: delta("resyncs"),
      batchesSent: delta("batchesSent"),
      eventsSent: delta("eventsSent"),
      divergence: div,
      loadsAfter: { workersDiffering, activeRequestsPerReplica: loadViews.map((v) => v.reduce((s, x) => s + x.active_requests, 0)) },
      stickiness: stickiness(d.records),
      race: race(d.records, w.lowerLoadedExisted),
      loadSpread: { samples: spread.length, mean: spread.reduce((s, x) => s + x, 0) / Math.max(1, spread.length), max: spread.length === 0 ? Number.NaN : Math.max(...spread) },
      cpu: {
        windowMs: d.wallMs,
        totalCpuMs,
        perRequestUs: (totalCpuMs * 1000) / Math.max(1, d.records.length),
        ratioTo1Replica: null,
        idleMsPerSecondPerReplica: idleCpuMs / n / (SETTLE_MS / 1000),
        loadGeneratorCpuMs: (client.user + client.system) / 1000,
      },
    };
  } finally {
    await fleet.stop();
  }
}

// ------------------------------------------------------------------ main

function table(results: readonly RunResult[]): string {
  const f = fixed;
  const rows: TableRow<RunResult>[] = [
    ["routed requests", (r) => String(r.routed)],
    ["achieved rate (req/s)", (r) => f(r.achievedRatePerS, 1)],
    ["errors / dropped ticks", (r) => `${r.errors} / ${r.droppedTicks}`],
    ["select_and_reserve p50 / p99 ms", (r) => `${f(r.selectLatencyMs.p50)} / ${f(r.selectLatencyMs.p99)}`],
    ["lag p50 / p99 ms (histogram)", (r) => (r.replicas === 1 ? "-" : `${f(r.lag.p50Ms)} / ${f(r.lag.p99Ms)}`)],
    ["lag max peer p50 / p99 ms", (r) => (r.replicas === 1 ? "-" : `${f(r.lag.peersMaxP50Ms ?? Number.NaN)} / ${f(r.lag.peersMaxP99Ms ?? Number.NaN)}`)],
    ["events shed, whole run (target 0)", (r) => String(r.eventsShed)],
    ["window gaps / snapshots / resyncs", (r) => `${r.gaps} / ${r.snapshotsInstalled} / ${r.divergenceResyncs}`],
    ["mesh batches sent / events per batch", (r) => (r.batchesSent === 0 ? "-" : `${r.batchesSent} / ${f(r.eventsSent / r.batchesSent)}`)],
    ["sessions disagreeing (target 0)", (r) => `${r.divergence.sessionsDisagreeing} of ${r.divergence.sessionsProbed}`],
    ["probe errors", (r) => String(r.divergence.probeErrors)],
    ["/loads: workers differing", (r) => String(r.loadsAfter.workersDiffering)],
    ["/loads: active after frees", (r) => r.loadsAfter.activeRequestsPerReplica.join(",")],
    ["stickiness (turn share)", (r) => `${f(r.stickiness.turnShareOnFirstWorker, 4)} (${r.stickiness.sessionsThatMoved} moved)`],
    ["race: same worker <=50 ms", (r) => `${r.race.sameWorkerWithin50msOnOtherReplica} of ${r.race.firstTurns} (${r.race.withLowerLoadedWorker} w/ lower)`],
    ["load spread mean / max", (r) => `${f(r.loadSpread.mean)} / ${r.loadSpread.max}`],
    ["CPU per request (us)", (r) => f(r.cpu.perRequestUs, 0)],
    ["CPU ratio to 1 replica", (r) => (r.cpu.ratioTo1Replica === null ? "n/a" : `${f(r.cpu.ratioTo1Replica)}x`)],
    ["replica CPU in window (cores)", (r) => f(r.cpu.totalCpuMs / r.cpu.windowMs)],
    ["load generator CPU (cores)", (r) => f(r.cpu.loadGeneratorCpuMs / r.cpu.windowMs)],
    ["idle CPU per replica (ms/s)", (r) => f(r.cpu.idleMsPerSecondPerReplica, 1)],
  ];
  return renderTable("replicas", results, (r) => String(r.replicas), rows, MIN_COLUMN_WIDTH);
}

function plot(results: readonly RunResult[]): string {
  const W = 720;
  const cpu = lineChart({
    title: "CPU per routed request, all replicas",
    xLabel: "replicas",
    yLabel: "CPU us / request",
    width: W,
    series: [{ name: "CPU per request", points: results.map((r) => [r.replicas, r.cpu.perRequestUs] as const) }],
  });
  const meshed = results.filter((r) => r.replicas > 1);
  const lag = lineChart({
    title: "Replication lag and select_and_reserve latency",
    xLabel: "replicas",
    yLabel: "ms",
    width: W,
    series: [
      { name: "lag p50", points: meshed.map((r) => [r.replicas, r.lag.p50Ms] as const) },
      { name: "lag p99", points: meshed.map((r) => [r.replicas, r.lag.p99Ms] as const) },
      { name: "select p99 (client)", points: results.map((r) => [r.replicas, r.selectLatencyMs.p99] as const) },
    ],
  });
  // Two charts side by side: nested <svg> elements positioned by x.
  return [`<svg xmlns="http://www.w3.org/2000/svg" width="${2 * W}" height="420">`, cpu, lag.replace("<svg ", `<svg x="${W}" `), "</svg>"].join("\n");
}

async function main(): Promise<void> {
  process.stderr.write(
    `bench:mesh: replicas ${REPLICA_COUNTS.join(",")}${NO_MESH ? " (mesh off)" : ""}, ${String(WORKERS)} workers, ${String(RATE_PER_S)} req/s for ${String(SECONDS)} s, ${String(SESSIONS)} session slots, seed ${String(SEED)}, CLK_TCK ${String(CLK_TCK)}\n`,
  );
  const results: RunResult[] = [];
  for (const n of REPLICA_COUNTS) results.push(await runOne(n));
  const one = results.find((r) => r.replicas === 1);
  if (one !== undefined) for (const r of results) r.cpu.ratioTo1Replica = r.cpu.perRequestUs / one.cpu.perRequestUs;

  console.log(table(results));
  for (const r of results) {
    if (r.errorSample !== "") console.log(`${String(r.replicas)} replicas: first error: ${r.errorSample}`);
    if (r.divergence.example !== "") console.log(`${String(r.replicas)} replicas: first disagreement: ${r.divergence.example}`);
  }
  console.log("lag: kvmesh_mesh_replication_lag_seconds delta over the window, summed over replicas, interpolated within buckets (1,2,5,10,20,25 ms ...); includes heartbeats");

  const config = { replicas: REPLICA_COUNTS, workers: WORKERS, ratePerS: RATE_PER_S, seconds: SECONDS, warmupSeconds: WARMUP_SECONDS, sessions: SESSIONS, seed: SEED, maxInFlight: MAX_IN_FLIGHT, blockSize: BLOCK_SIZE, clkTck: CLK_TCK };
  writeJsonReport(args.json, { config, results });
  mkdirSync(dirname(args.svg), { recursive: true });
  writeFileSync(args.svg, plot(results));
  console.log(`json: ${args.json}\nplot: ${args.svg}`);
}

await main();
