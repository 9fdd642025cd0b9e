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
 *    lag_p50_ms/lag_p99_ms from /replica_sync/peers as a cross-check;
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
 * Flags: --replicas 1,2,4 --workers N --rate N --seconds N --warmup-seconds N --sessions N
 *        --seed N --max-in-flight N --json FILE --svg FILE.
 *        --no-mesh (same processes, no peering: the contention baseline).
 *        --no-tie-spread (replicas run with --no-replica-tie-spread: the race without its fix).
 * Env: KVMESH_BENCH_NODE_ARGS="--cpu-prof --cpu-prof-dir=DIR" passes node flags to the replicas and
 * logs the window (CLOCK_MONOTONIC us) so a profile can be cut down to it.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { freePortPair } from "../src/bench/ports.js";
import { summarize } from "../src/bench/stats.js";
import { lineChart } from "./lib/svg-plot.js";
import { SessionWorkload, type TurnPlan } from "./lib/bench-workload.js";
import { stopAll } from "../src/bench/serve-process.js";
import { mapLimited } from "../src/bench/bounded.js";
import { waitForListening } from "../src/bench/listening.js";
import { paceTurns } from "./lib/turn-pacer.js";
import { CLK_TCK, cpuMs } from "../src/bench/process-usage.js";
import { metricSum, RouterClient, type RouterReply } from "../src/bench/router-client.js";
import { histogramQuantile } from "../src/bench/stats.js";

const { values: args } = parseArgs({
  options: {
    replicas: { type: "string", default: "1,2,4" },
    workers: { type: "string", default: "1024" },
    rate: { type: "string", default: "200" },
    seconds: { type: "string", default: "15" },
    "warmup-seconds": { type: "string", default: "2" },
    sessions: { type: "string", default: "200" },
    seed: { type: "string", default: "1" },
    "max-in-flight": { type: "string", default: "256" },
    json: { type: "string", default: "reports/bench-mesh.json" },
    svg: { type: "string", default: "reports/bench-mesh.svg" },
    "no-mesh": { type: "boolean", default: false },
    "no-tie-spread": { type: "boolean", default: false },
  },
});

function positiveInt(name: string, raw: string): number {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} must be a positive integer, got ${JSON.stringify(raw)}`);
  return n;
}
const REPLICA_COUNTS = args.replicas.split(",").map((s) => positiveInt("replicas", s.trim()));
const WORKERS = positiveInt("workers", args.workers);
const RATE_PER_S = positiveInt("rate", args.rate);
const SECONDS = Number(args.seconds);
if (!(SECONDS > 0)) throw new Error(`--seconds must be > 0, got ${args.seconds}`);
const WARMUP_SECONDS = Number(args["warmup-seconds"]);
if (!(WARMUP_SECONDS >= 0)) throw new Error(`--warmup-seconds must be >= 0, got ${args["warmup-seconds"]}`);
const SESSIONS = positiveInt("sessions", args.sessions);
const SEED = positiveInt("seed", args.seed);
const MAX_IN_FLIGHT = positiveInt("max-in-flight", args["max-in-flight"]);
/**
 * --no-mesh: the same N processes and traffic, but no peering (each replica only sees its own
 * bookings). It isolates what N processes contending for the cores cost from what mirroring costs;
 * divergence and lag figures are meaningless then.
 */
const NO_MESH = args["no-mesh"];
const NODE_ARGS = (process.env.KVMESH_BENCH_NODE_ARGS ?? "").split(" ").filter((a) => a !== "");

const BLOCK_SIZE = 64;
const AFFINITY_TTL_SECS = 600;
const STARTUP_TIMEOUT_MS = 30_000;
const MESH_READY_TIMEOUT_MS = 20_000;
const STOP_GRACE_MS = 2_000;
const REQUEST_TIMEOUT_MS = 30_000;
const SETTLE_MS = 1_000;
const LOAD_SAMPLE_INTERVAL_MS = 500;
const RACE_WINDOW_MS = 50;
/** Connections per replica; in flight are at most a few dozen requests per replica at 200/s. */
const SOCKETS_PER_REPLICA = 32;
const ADMIN_CONCURRENCY = 16;

// ------------------------------------------------------------------ processes

interface Replica {
  readonly index: number;
  readonly child: ChildProcess;
  readonly pid: number;
  readonly port: number;
  readonly syncPort: number;
  readonly client: RouterClient;
}

const children = new Set<ChildProcess>();

function startReplica(index: number, syncPort: number, peers: readonly number[]): Promise<Replica> {
  const argv = ["--import", "tsx", "cli/main.ts", "serve", "--port", "0", "--replica-sync-port", String(syncPort), "--no-kv-events", "--session-affinity-ttl-secs", String(AFFINITY_TTL_SECS)];
  if (peers.length > 0) argv.push("--peers", peers.map((p) => `tcp://127.0.0.1:${p}`).join(","));
  if (args["no-tie-spread"]) argv.push("--no-replica-tie-spread");
  // Info level: "listening" (with the port) is logged at info; the mesh logs little else there.
  argv.push("--log-level", "info");
  // KVMESH_BENCH_NODE_ARGS (e.g. "--cpu-prof --cpu-prof-dir=/tmp/meshprof") profiles the replicas.
  const child = spawn(process.execPath, [...NODE_ARGS, ...argv], { stdio: ["ignore", "pipe", "pipe"] });
  children.add(child);
  child.on("exit", () => children.delete(child));
  child.stderr?.on("data", (d: Buffer) => {
    process.stderr.write(prefixLines(`[replica ${index}] `, d.toString()));
  });
  return waitForListening(child, { label: `replica ${index}`, timeoutMs: STARTUP_TIMEOUT_MS, onLine: (line) => process.stderr.write(`[replica ${index}] ${line}\n`) }).then((port) => {
    const pid = child.pid;
    if (pid === undefined) throw new Error(`replica ${index} has no pid`);
    return { index, child, pid, port, syncPort, client: new RouterClient(port, { sockets: SOCKETS_PER_REPLICA, timeoutMs: REQUEST_TIMEOUT_MS }) };
  });
}

function prefixLines(prefix: string, text: string): string {
  return text
    .split("\n")
    .map((l, i, a) => (i === a.length - 1 && l === "" ? "" : `${prefix}${l}\n`))
    .join("");
}

const stopChildren = (list: readonly ChildProcess[]): Promise<void> => stopAll(list, STOP_GRACE_MS);

// A crash or Ctrl-C of the benchmark must not leave daemons holding ports.
process.on("exit", () => {
  for (const c of children) c.kill("SIGKILL");
});
for (const sig of ["SIGINT", "SIGTERM"] as const) {
  process.once(sig, () => {
    process.stderr.write(`bench:mesh: ${sig}, stopping replicas\n`);
    void stopChildren([...children]).then(() => process.exit(130));
  });
}

// ------------------------------------------------------------------ HTTP

const send = (r: Replica, method: string, path: string, body?: string): Promise<RouterReply> => r.client.send(method, path, body);
const sendOk = (r: Replica, method: string, path: string, body?: string): Promise<string> => r.client.ok(method, path, body);

// ------------------------------------------------------------------ metrics scraping

interface MeshScrape {
  shed: number;
  gaps: number;
  snapshotsInstalled: number;
  resyncs: number;
  batchesSent: number;
  eventsSent: number;
  /** Upper bounds (ms) and cumulative counts of the lag histogram, +Inf last. */
  lagLeMs: number[];
  lagCum: number[];
}

async function scrape(r: Replica): Promise<MeshScrape> {
  const text = await sendOk(r, "GET", "/metrics");
  const lagLeMs: number[] = [];
  const lagCum: number[] = [];
  for (const m of text.matchAll(/^kvmesh_mesh_replication_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$/gm)) {
    lagLeMs.push(m[1] === "+Inf" ? Infinity : Number(m[1]) * 1000);
    lagCum.push(Number(m[2]));
  }
  return {
    shed: metricSum(text, "kvmesh_mesh_events_shed_total"),
    gaps: metricSum(text, "kvmesh_mesh_gaps_total"),
    snapshotsInstalled: metricSum(text, "kvmesh_mesh_snapshots_installed_total"),
    resyncs: metricSum(text, "kvmesh_mesh_divergence_resyncs_total"),
    batchesSent: metricSum(text, "kvmesh_mesh_batches_sent_total"),
    eventsSent: metricSum(text, "kvmesh_mesh_events_sent_total"),
    lagLeMs,
    lagCum,
  };
}

interface LoadRow {
  worker_id: number;
  dp_rank: number;
  potential_prefill_tokens: number;
  potential_decode_blocks: number;
  active_requests: number;
}

async function loads(r: Replica): Promise<LoadRow[]> {
  const body = JSON.parse(await sendOk(r, "GET", "/loads")) as { loads: LoadRow[] }[];
  return body.flatMap((p) => p.loads).sort((a, b) => a.worker_id - b.worker_id || a.dp_rank - b.dp_rank);
}

interface PeerRow {
  state: string;
  sync: string | null;
  lag_p50_ms: number | null;
  lag_p99_ms: number | null;
}

const peersOf = async (r: Replica): Promise<PeerRow[]> => JSON.parse(await sendOk(r, "GET", "/replica_sync/peers")) as PeerRow[];

async function waitForMesh(replicas: readonly Replica[]): Promise<void> {
  const deadline = performance.now() + MESH_READY_TIMEOUT_MS;
  for (;;) {
    const views = await Promise.all(replicas.map(peersOf));
    if (views.every((v) => v.length === replicas.length - 1 && v.every((p) => p.state === "alive" && p.sync === "live"))) return;
    if (performance.now() > deadline) throw new Error(`mesh not fully connected after ${MESH_READY_TIMEOUT_MS} ms: ${JSON.stringify(views)}`);
    await sleep(100);
  }
}

// ------------------------------------------------------------------ the workload

interface TurnRecord {
  readonly sessionSerial: number;
  readonly turn: number;
  readonly replica: number;
  readonly worker: number;
  readonly answeredAt: number;
  /** The client's ledger showed a worker with fewer active requests than this one had. */
  readonly lowerLoadedExisted: boolean;
}

interface DriveResult {
  wallMs: number;
  ticks: number;
  dropped: number;
  records: TurnRecord[];
  latencyMs: number[];
  errors: number;
  errorSample: string;
  loadSpreads: number[];
}

async function drive(replicas: readonly Replica[], wl: SessionWorkload, label: string, seconds: number, selPrefix: string): Promise<DriveResult> {
  const n = replicas.length;
  const res: DriveResult = { wallMs: 0, ticks: 0, dropped: 0, records: [], latencyMs: [], errors: 0, errorSample: "", loadSpreads: [] };
  // Active requests per worker id as this client booked and freed them: the ground truth the
  // replicas' ledgers converge to.
  const ledger = new Int32Array(WORKERS + 1);
  const fail = (what: string): void => {
    res.errors++;
    if (res.errorSample === "") res.errorSample = what;
  };
  const minLoad = (): number => {
    let m = Infinity;
    for (let w = 1; w <= WORKERS; w++) if ((ledger[w] as number) < m) m = ledger[w] as number;
    return m;
  };

  const runTurn = async (plan: TurnPlan, k: number): Promise<void> => {
    const r = replicas[k % n] as Replica;
    const sel = `${selPrefix}${k}`;
    const body = `{"token_ids":[${plan.tokenIdsCsv}],"session_id":"${plan.sessionId}","selection_id":"${sel}"}`;
    const t0 = performance.now();
    const rep = await send(r, "POST", "/select_and_reserve", body);
    const t1 = performance.now();
    const m = /"worker_id":(\d+)/.exec(rep.text);
    if (rep.status !== 200 || m?.[1] === undefined) {
      fail(`select_and_reserve ${rep.status}: ${rep.text.slice(0, 200)}`);
      return;
    }
    const worker = Number(m[1]);
    res.latencyMs.push(t1 - t0);
    res.records.push({ sessionSerial: plan.sessionSerial, turn: plan.turn, replica: r.index, worker, answeredAt: t1, lowerLoadedExisted: plan.turn === 0 && (ledger[worker] as number) > minLoad() });
    ledger[worker] = (ledger[worker] ?? 0) + 1;
    try {
      await sleep(plan.prefillDelayMs);
      const p = await send(r, "POST", `/reservations/${sel}/prefill_complete`, "{}");
      if (p.status !== 200) fail(`prefill_complete ${p.status}: ${p.text.slice(0, 200)}`);
      await sleep(plan.durationMs - plan.prefillDelayMs);
      const d = await send(r, "DELETE", `/reservations/${sel}`);
      if (d.status !== 200) fail(`DELETE ${d.status}: ${d.text.slice(0, 200)}`);
    } finally {
      ledger[worker] = (ledger[worker] ?? 0) - 1;
    }
  };

  let sampleIdx = 0;
  let nextSampleAt = performance.now() + LOAD_SAMPLE_INTERVAL_MS;
  const samples: Promise<void>[] = [];
  const paced = await paceTurns({
    workload: wl,
    ratePerS: RATE_PER_S,
    seconds,
    maxInFlight: MAX_IN_FLIGHT,
    runTurn,
    onError: fail,
    onTick: (now) => {
      if (now < nextSampleAt) return;
      nextSampleAt += LOAD_SAMPLE_INTERVAL_MS;
      const r = replicas[sampleIdx++ % n] as Replica;
      samples.push(
        loads(r).then(
          (rows) => {
            const a = rows.map((x) => x.active_requests);
            res.loadSpreads.push(Math.max(...a) - Math.min(...a));
          },
          (err: unknown) => {
            fail(`GET /loads: ${err instanceof Error ? err.message : String(err)}`);
          },
        ),
      );
    },
    onSecond: (elapsedS, st) => {
      process.stderr.write(`${label}: ${elapsedS}/${seconds} s, ${res.records.length} routed, ${st.outstanding} in flight, ${res.errors} errors, ${st.dropped} dropped\n`);
    },
  });
  Object.assign(res, paced);
  await Promise.all(samples);
  return res;
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
  divergence: { sessionsProbed: number; sessionsDisagreeing: number; probeErrors: number; example: string };
  loadsAfter: { workersDiffering: number; activeRequestsPerReplica: number[] };
  stickiness: { multiTurnSessions: number; turnShareOnFirstWorker: number; sessionsThatMoved: number };
  race: { firstTurns: number; sameWorkerWithin50msOnOtherReplica: number; withLowerLoadedWorker: number };
  loadSpread: { samples: number; mean: number; max: number };
  cpu: { windowMs: number; totalCpuMs: number; perRequestUs: number; ratioTo1Replica: number | null; idleMsPerSecondPerReplica: number; loadGeneratorCpuMs: number };
}

async function runOne(n: number): Promise<RunResult> {
  const label = `${n} replica${n === 1 ? "" : "s"}`;
  const replicas: Replica[] = [];
  try {
    process.stderr.write(`${label}: starting\n`);
    for (let i = 0; i < n; i++) {
      const syncPort = await freePortPair();
      replicas.push(
        await startReplica(
          i,
          syncPort,
          NO_MESH ? [] : replicas.map((r) => r.syncPort),
        ),
      );
    }
    if (!NO_MESH) await waitForMesh(replicas);
    process.stderr.write(`${label}: mesh up; registering ${WORKERS} workers on each\n`);
    const ids = Array.from({ length: WORKERS }, (_, i) => i + 1);
    await Promise.all(replicas.map((r) => mapLimited(ids, ADMIN_CONCURRENCY, async (w) => {
          await sendOk(r, "POST", "/workers", JSON.stringify({ worker_id: w, endpoint: `http://w${w}`, block_size: BLOCK_SIZE }));
        })));

    if (WARMUP_SECONDS > 0) {
      // A fresh process runs its first few hundred requests cold (JIT, pools): that would charge
      // the 1-replica baseline, and only it, for compilation rather than routing.
      process.stderr.write(`${label}: warming up for ${WARMUP_SECONDS} s\n`);
      const warm = await drive(replicas, new SessionWorkload({ seed: SEED + 1, slots: SESSIONS, idPrefix: "warm-" }), `${label} warm-up`, WARMUP_SECONDS, "w");
      if (warm.errors > 0) throw new Error(`warm-up: ${warm.errors} errors, first: ${warm.errorSample}`);
    }
    const wl = new SessionWorkload({ seed: SEED, slots: SESSIONS });
    const before = await Promise.all(replicas.map(scrape));
    const cpu0 = replicas.map((r) => cpuMs(r.pid));
    const client0 = process.cpuUsage();
    // CLOCK_MONOTONIC in us, the time base of V8's .cpuprofile startTime: lets a profile be cut
    // down to the measured window.
    const windowStartUs = process.hrtime.bigint() / 1000n;
    process.stderr.write(`${label}: driving ${RATE_PER_S} req/s for ${SECONDS} s over ${SESSIONS} session slots\n`);
    const d = await drive(replicas, wl, label, SECONDS, "t");
    const cpu1 = replicas.map((r) => cpuMs(r.pid));
    const client = process.cpuUsage(client0);
    if (NODE_ARGS.length > 0) process.stderr.write(`${label}: window monotonic us ${windowStartUs} ${process.hrtime.bigint() / 1000n}\n`);
    const after = await Promise.all(replicas.map(scrape));
    const peerViews = await Promise.all(replicas.map(peersOf));

    process.stderr.write(`${label}: settling ${SETTLE_MS} ms, then probing ${wl.sessionIds().length} sessions on every replica\n`);
    // The settle second doubles as an idle measurement: heartbeats, timers and GC cost this much
    // per replica whether or not it routes anything, a fixed cost the per-request figure includes.
    const idle0 = replicas.map((r) => cpuMs(r.pid));
    await sleep(SETTLE_MS);
    const idleCpuMs = replicas.reduce((s, r, i) => s + cpuMs(r.pid) - (idle0[i] ?? 0), 0);
    const div = { sessionsProbed: 0, sessionsDisagreeing: 0, probeErrors: 0, example: "" };
    await mapLimited(wl.sessionIds(), ADMIN_CONCURRENCY, async (sid) => {
      const body = JSON.stringify({ token_ids: wl.probeTokens(sid), session_id: sid });
      const answers = await Promise.all(
        replicas.map(async (r) => {
          const rep = await send(r, "POST", "/select", body);
          return rep.status === 200 ? (/"worker_id":(\d+)/.exec(rep.text)?.[1] ?? "?") : `HTTP ${rep.status}`;
        }),
      );
      div.sessionsProbed++;
      if (answers.some((a) => a.startsWith("HTTP") || a === "?")) div.probeErrors++;
      if (new Set(answers).size > 1) {
        div.sessionsDisagreeing++;
        if (div.example === "") div.example = `${sid}: ${answers.join(" / ")}`;
      }
    });
    const loadViews = await Promise.all(replicas.map(loads));
    const base = loadViews[0] ?? [];
    const key = (x: LoadRow | undefined): string => (x === undefined ? "missing" : `${x.active_requests}/${x.potential_prefill_tokens}/${x.potential_decode_blocks}`);
    let workersDiffering = 0;
    for (let i = 0; i < base.length; i++) if (loadViews.some((v) => key(v[i]) !== key(base[i]) || v.length !== base.length)) workersDiffering++;

    // Lag: the window's delta of every replica's histogram, summed (all buckets share bounds).
    const leMs = after[0]?.lagLeMs ?? [];
    const cum = leMs.map((_, i) => after.reduce((s, a, j) => s + (a.lagCum[i] ?? 0) - (before[j]?.lagCum[i] ?? 0), 0));
    const peerRows = peerViews.flat();
    const maxOf = (xs: (number | null)[]): number | null => {
      const v = xs.filter((x): x is number => x !== null);
      return v.length === 0 ? null : Math.max(...v);
    };

    // Stickiness and the race, from the client's records.
    const bySession = new Map<number, TurnRecord[]>();
    for (const rec of d.records) {
      let l = bySession.get(rec.sessionSerial);
      if (l === undefined) bySession.set(rec.sessionSerial, (l = []));
      l.push(rec);
    }
    let multi = 0;
    let turnsMulti = 0;
    let sticky = 0;
    let moved = 0;
    for (const l of bySession.values()) {
      l.sort((a, b) => a.turn - b.turn);
      if (l.length < 2) continue;
      const first = l[0]?.worker;
      const same = l.filter((x) => x.worker === first).length;
      multi++;
      turnsMulti += l.length;
      sticky += same;
      if (same !== l.length) moved++;
    }
    const firsts = d.records.filter((x) => x.turn === 0).sort((a, b) => a.answeredAt - b.answeredAt);
    let sameWorker = 0;
    let withLower = 0;
    for (let i = 0; i < firsts.length; i++) {
      const b = firsts[i] as TurnRecord;
      for (let j = i - 1; j >= 0; j--) {
        const a = firsts[j] as TurnRecord;
        if (b.answeredAt - a.answeredAt > RACE_WINDOW_MS) break;
        if (a.replica !== b.replica && a.worker === b.worker) {
          sameWorker++;
          if (b.lowerLoadedExisted) withLower++;
          break;
        }
      }
    }

    const delta = (k: "shed" | "gaps" | "snapshotsInstalled" | "resyncs" | "batchesSent" | "eventsSent"): number => after.reduce((s, a, i) => s + a[k] - (before[i]?.[k] ?? 0), 0);
    const totalCpuMs = cpu1.reduce((s, c, i) => s + c - (cpu0[i] ?? 0), 0);
    const lat = summarize(d.latencyMs);
    const spread = d.loadSpreads;
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
        samples: cum[cum.length - 1] ?? 0,
        p50Ms: histogramQuantile(leMs, cum, 0.5),
        p99Ms: histogramQuantile(leMs, cum, 0.99),
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
      stickiness: { multiTurnSessions: multi, turnShareOnFirstWorker: turnsMulti === 0 ? Number.NaN : sticky / turnsMulti, sessionsThatMoved: moved },
      race: { firstTurns: firsts.length, sameWorkerWithin50msOnOtherReplica: sameWorker, withLowerLoadedWorker: withLower },
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
    for (const r of replicas) r.client.close();
    await stopChildren(replicas.map((r) => r.child));
  }
}

// ------------------------------------------------------------------ main

function table(results: readonly RunResult[]): string {
  const f = (v: number, digits = 2): string => (Number.isFinite(v) ? v.toFixed(digits) : "n/a");
  const rows: [string, (r: RunResult) => string][] = [
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
  const w0 = Math.max(...rows.map(([name]) => name.length));
  const cols = results.map((r) => Math.max(22, ...rows.map(([, g]) => g(r).length)));
  const out = [`${"replicas".padEnd(w0)}  ${results.map((r, i) => String(r.replicas).padStart(cols[i] ?? 0)).join("  ")}`];
  for (const [name, get] of rows) out.push(`${name.padEnd(w0)}  ${results.map((r, i) => get(r).padStart(cols[i] ?? 0)).join("  ")}`);
  return out.join("\n");
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
    `bench:mesh: replicas ${REPLICA_COUNTS.join(",")}${NO_MESH ? " (mesh off)" : ""}, ${WORKERS} workers, ${RATE_PER_S} req/s for ${SECONDS} s, ${SESSIONS} session slots, seed ${SEED}, CLK_TCK ${CLK_TCK}\n`,
  );
  const results: RunResult[] = [];
  for (const n of REPLICA_COUNTS) results.push(await runOne(n));
  const one = results.find((r) => r.replicas === 1);
  if (one !== undefined) for (const r of results) r.cpu.ratioTo1Replica = r.cpu.perRequestUs / one.cpu.perRequestUs;

  console.log(table(results));
  for (const r of results) {
    if (r.errorSample !== "") console.log(`${r.replicas} replicas: first error: ${r.errorSample}`);
    if (r.divergence.example !== "") console.log(`${r.replicas} replicas: first disagreement: ${r.divergence.example}`);
  }
  console.log("lag: kvmesh_mesh_replication_lag_seconds delta over the window, summed over replicas, interpolated within buckets (1,2,5,10,25 ms ...); includes heartbeats");

  mkdirSync(dirname(args.json), { recursive: true });
  const config = { replicas: REPLICA_COUNTS, workers: WORKERS, ratePerS: RATE_PER_S, seconds: SECONDS, warmupSeconds: WARMUP_SECONDS, sessions: SESSIONS, seed: SEED, maxInFlight: MAX_IN_FLIGHT, blockSize: BLOCK_SIZE, clkTck: CLK_TCK };
  writeFileSync(args.json, `${JSON.stringify({ config, results }, (_, v: unknown) => (typeof v === "number" && !Number.isFinite(v) ? null : v), 2)}\n`);
  mkdirSync(dirname(args.svg), { recursive: true });
  writeFileSync(args.svg, plot(results));
  console.log(`json: ${args.json}\nplot: ${args.svg}`);
}

try {
  await main();
} finally {
  await stopChildren([...children]);
}
