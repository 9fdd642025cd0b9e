/**
 * npm run bench:host — host replication (an embedding host relays session bindings itself)
 * beside the built-in mesh, on the same multi-turn session workload.
 *
 * host: four `kvmesh serve --session-replication-writer-id i` processes (no mesh). This process
 *   is the "host": it holds one GET /session_bindings/updates stream per service and relays the
 *   bindings of every line it reads to the three other services' POST /session_bindings
 *   (keep-alive HTTP, one POST in flight per peer carrying everything read meanwhile; no
 *   ordering needed: the version merge does not care). Only bindings travel; each service sees
 *   only the load it booked itself.
 * mesh: four `kvmesh serve --replica-sync-port` processes in a full mesh (bindings and load).
 *
 * Both are driven by scripts/lib/bench-workload.ts sessions (prompts capped at --prompt-tokens:
 * without KV events the prompt only sizes the booking, and short prompts let two cores reach
 * the rate), turn k to service k mod 4: select_and_reserve with the session id, prefill_complete
 * 20-80 ms later, DELETE 200-800 ms after the reserve. Every turn publishes two bindings (the
 * bind or refresh at commit, the refresh when its request is freed): --rate R turns/s publishes
 * R/2 bindings/s per service, and a 4,096-binding channel (the reference frontend's, which
 * dropped 41-46% of bindings at such rates) with a stalled consumer is full after 8,192/R s; the
 * table prints that figure. The default 200 turns/s is what two shared cores sustain with four
 * services; --rate 800 fills it in about 10 s on a bigger box. Reported per mode:
 *  - bindings published (kvmesh_session_bindings_published_total, all services) and per service
 *    per second; the largest batch the host relay drained (host);
 *  - bindings shed: kvmesh_session_bindings_dropped_total (host) / kvmesh_mesh_events_shed_total
 *    (mesh; load and bindings share its queue). Target 0;
 *  - apply lag p50/p99: host: from `sent_at_ms` (the line entering the origin's replay ring,
 *    one event-loop turn after the commit) to the peer's POST answer, per binding and peer;
 *    mesh: kvmesh_mesh_replication_lag_seconds (publish to receive, per batch, heartbeats
 *    included), as bench:mesh reports it;
 *  - stickiness: share of a multi-turn session's turns served by its first worker;
 *  - divergence: 1 s after the last free, every session probed with /select on every service,
 *    counting sessions the services place on different workers (target 0);
 *  - CPU per routed turn: the four services, and (host) the relay, which runs in a process of
 *    its own so that the load generator's event loop does not skew the lag it measures.
 * Flags: see --help. The fleet, the paced load, the probes and the report are shared with
 * bench:mesh (scripts/lib/session-*.ts, bench-report.ts); this file keeps what bench:host adds:
 * the host relay, the binding counters and both modes' lag.
 */
import { fork, type ChildProcess } from "node:child_process";
import { Agent, request, type ClientRequest } from "node:http";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";
import { Option } from "commander";
import { cpuMs } from "../src/bench/process-usage.js";
import { onLines } from "../src/util/lines.js";
import { metricSum, RouterClient } from "../src/bench/router-client.js";
import { killOnExit, stopAll } from "../src/bench/serve-process.js";
import { histogramGrowth, histogramQuantile, scrapeHistogram, summarize, type Histogram } from "../src/bench/stats.js";
import { fixed, renderTable, writeJsonReport, type TableRow } from "./lib/bench-report.js";
import { SessionWorkload } from "./lib/bench-workload.js";
import { listOf, numberIn, positiveInt, scriptProgram } from "./lib/script-args.js";
import { driveSessions, warmUp } from "./lib/session-drive.js";
import { cpuSpentMs, exitOnSignals, FLEET_START_TIMEOUT_MS, FLEET_STOP_GRACE_MS, fleetCpuMs, REQUEST_TIMEOUT_MS, startSessionFleet } from "./lib/session-fleet.js";
import { probeDivergence, stickiness, type Divergence, type Stickiness } from "./lib/session-figures.js";

type Mode = "host" | "mesh";

interface Args {
  mode: Mode[];
  seconds: number;
  rate: number;
  sessions: number;
  workers: number;
  promptTokens: number;
  warmupSeconds: number;
  seed: number;
  maxInFlight: number;
  json: string;
  relayPorts?: string;
}

/** Longest run and warm-up the flags accept, s. */
const MAX_SECONDS = 600;
const MAX_WARMUP_SECONDS = 60;

const args = scriptProgram("bench:host", "Host replication (an embedding host relays session bindings) beside the built-in mesh, on one session workload.")
  .addOption(new Option("--mode <list>", "modes to run, comma-separated: host and/or mesh").argParser(listOf<Mode>(["host", "mesh"])).default(["host", "mesh"], "host,mesh"))
  .option("--seconds <s>", `seconds of issuing per mode, in (0, ${String(MAX_SECONDS)}]`, numberIn(0, MAX_SECONDS, true), 10)
  .option("--rate <n>", "turns issued per second", positiveInt, 200)
  .option("--sessions <n>", "session slots (concurrent sessions)", positiveInt, 400)
  .option("--workers <n>", "worker ranks registered on every service", positiveInt, 64)
  .option("--prompt-tokens <n>", "prompts are cut to this many tokens", positiveInt, 128)
  .option("--warmup-seconds <s>", `unmeasured warm-up per mode, in [0, ${String(MAX_WARMUP_SECONDS)}]`, numberIn(0, MAX_WARMUP_SECONDS), 1)
  .option("--seed <n>", "workload seed", positiveInt, 1)
  .option("--max-in-flight <n>", "turns in flight at most", positiveInt, 1024)
  .option("--json <file>", "JSON report", "reports/bench-host.json")
  // Internal: run as the host relay process for services on these HTTP ports.
  .addOption(new Option("--relay-ports <ports>").hideHelp())
  .parse()
  .opts<Args>();

const MODES = args.mode;
const SECONDS = args.seconds;
const RATE_PER_S = args.rate;
const SESSIONS = args.sessions;
const WORKERS = args.workers;
const PROMPT_TOKENS = args.promptTokens;
const WARMUP_SECONDS = args.warmupSeconds;
const SEED = args.seed;
const MAX_IN_FLIGHT = args.maxInFlight;

const SERVICES = 4;
const BLOCK_SIZE = 16;
/** The reference frontend's binding channel (AFFINITY_EVENT_CHANNEL_CAPACITY), for the comparison line. */
const REFERENCE_CHANNEL_BINDINGS = 4_096;
const STREAMS_READY_TIMEOUT_MS = 10_000;
const SETTLE_MS = 1_000;
const SOCKETS_PER_SERVICE = 64;
/** The relay process's connections per service: a POST of bindings at a time is all it sends. */
const RELAY_SOCKETS_PER_SERVICE = 4;
/** Divergence probes per run at most (each is one /select per service). */
const MAX_PROBED_SESSIONS = 1_000;
/** The table's columns are at least this wide. */
const MIN_COLUMN_WIDTH = 24;

// (The relay process handles SIGTERM itself: it has no children.)
if (args.relayPorts === undefined) exitOnSignals("bench:host");

/** Where a service's HTTP API is, and the keep-alive sockets to it. */
interface Endpoint {
  readonly index: number;
  readonly port: number;
  readonly client: RouterClient;
}

// ------------------------------------------------------------------ metrics scraping

interface Scrape {
  published: number;
  dropped: number;
  meshShed: number;
  lag: Histogram;
  /** The service's own select_and_reserve latency histogram (parse to answer). */
  select: Histogram;
}

async function scrape(c: RouterClient): Promise<Scrape> {
  const text = await c.ok("GET", "/metrics");
  return {
    published: metricSum(text, "kvmesh_session_bindings_published_total"),
    dropped: metricSum(text, "kvmesh_session_bindings_dropped_total"),
    meshShed: metricSum(text, "kvmesh_mesh_events_shed_total"),
    lag: scrapeHistogram(text, "kvmesh_mesh_replication_lag_seconds"),
    select: scrapeHistogram(text, "kvmesh_http_request_duration_seconds", { route: "/select_and_reserve" }),
  };
}

// ------------------------------------------------------------------ the host's relay

interface RelayStats {
  linesRelayed: number;
  bindingsRelayed: number;
  posts: number;
  postErrors: number;
  postErrorSample: string;
  maxBatch: number;
  outcomes: Record<string, number>;
  /** Per binding and peer: sent_at_ms to the peer's POST answer, ms. */
  lagMs: number[];
  /** Streams that ended before the relay was stopped. */
  streamsLost: number;
}

/** A line's bindings waiting to go to one peer: the array's text and when its line was sent. */
interface PendingLine {
  readonly bindingsText: string;
  readonly count: number;
  readonly sentAtMs: number;
}

/**
 * The host's transport: reads each service's NDJSON stream and relays the bindings to the other
 * services. Like the stream itself, it drains whole: at most one POST per peer is in flight, and
 * everything that arrives meanwhile goes out together in the next one (lines are merged as text,
 * so 64-bit fields stay exact). At a low rate that is one POST per line; under load, few.
 */
class HostRelay {
  readonly stats: RelayStats = { linesRelayed: 0, bindingsRelayed: 0, posts: 0, postErrors: 0, postErrorSample: "", maxBatch: 0, outcomes: {}, lagMs: [], streamsLost: 0 };
  readonly #services: readonly Endpoint[];
  readonly #requests: ClientRequest[] = [];
  readonly #connected = new Set<number>();
  readonly #pending = new Map<number, PendingLine[]>();
  readonly #posting = new Set<number>();
  #stopped = false;

  constructor(services: readonly Endpoint[]) {
    this.#services = services;
    for (const s of services) this.#pending.set(s.index, []);
  }

  async start(): Promise<void> {
    for (const s of this.#services) this.#open(s);
    const deadline = performance.now() + STREAMS_READY_TIMEOUT_MS;
    while (this.#connected.size < this.#services.length) {
      if (performance.now() > deadline) throw new Error(`binding streams not all open after ${STREAMS_READY_TIMEOUT_MS} ms`);
      await sleep(10);
    }
  }

  /** Resolves once everything read so far has been posted and answered. */
  async idle(): Promise<void> {
    while (this.#posting.size > 0 || [...this.#pending.values()].some((l) => l.length > 0)) await sleep(5);
  }

  stop(): void {
    this.#stopped = true;
    for (const r of this.#requests) r.destroy();
  }

  #open(from: Endpoint): void {
    // Its own agent: the stream holds its socket for the whole run.
    const req = request({ host: "127.0.0.1", port: from.port, path: "/session_bindings/updates", agent: new Agent({ keepAlive: false }) }, (res) => {
      if (res.statusCode !== 200) {
        process.stderr.write(`bench:host: stream of service ${from.index} answered ${res.statusCode}\n`);
        return;
      }
      onLines(res, (line) => {
        this.#onLine(from, line);
      });
      res.on("close", () => {
        if (!this.#stopped) this.stats.streamsLost++;
      });
    });
    req.on("error", (err) => {
      if (!this.#stopped) process.stderr.write(`bench:host: stream of service ${from.index}: ${err.message}\n`);
    });
    req.end();
    this.#requests.push(req);
  }

  #onLine(from: Endpoint, line: string): void {
    this.#connected.add(from.index);
    // JSON.parse rounds the u64 fields, but only sent_at_ms and the count are read from it.
    const parsed = JSON.parse(line) as { sent_at_ms: number; bindings: unknown[]; error?: string };
    if (parsed.error !== undefined) {
      process.stderr.write(`bench:host: stream of service ${from.index} ended: ${parsed.error}\n`);
      return;
    }
    const count = parsed.bindings.length;
    if (count === 0) return;
    this.stats.linesRelayed++;
    this.stats.bindingsRelayed += count;
    if (count > this.stats.maxBatch) this.stats.maxBatch = count;
    // The line is {"cursor":..,"sent_at_ms":..,"dropped":..,"bindings":[...]} (+ "resync" after).
    const open = line.indexOf('"bindings":[') + '"bindings":['.length;
    const bindingsText = line.slice(open, line.lastIndexOf("]"));
    for (const to of this.#services) {
      if (to === from) continue;
      this.#pending.get(to.index)?.push({ bindingsText, count, sentAtMs: parsed.sent_at_ms });
      this.#post(to);
    }
  }

  #post(to: Endpoint): void {
    const lines = this.#pending.get(to.index) ?? [];
    if (this.#posting.has(to.index) || lines.length === 0 || this.#stopped) return;
    this.#pending.set(to.index, []);
    this.#posting.add(to.index);
    this.stats.posts++;
    const body = `{"bindings":[${lines.map((l) => l.bindingsText).join(",")}]}`;
    to.client
      .send("POST", "/session_bindings", body)
      .then((r) => {
        const now = Date.now();
        if (r.status !== 200) {
          this.#postError(`POST /session_bindings on service ${to.index}: ${r.status} ${r.text.slice(0, 200)}`);
          return;
        }
        for (const o of (JSON.parse(r.text) as { outcomes: { outcome: string }[] }).outcomes) this.stats.outcomes[o.outcome] = (this.stats.outcomes[o.outcome] ?? 0) + 1;
        for (const l of lines) for (let i = 0; i < l.count; i++) this.stats.lagMs.push(now - l.sentAtMs);
      })
      .catch((err: unknown) => {
        this.#postError(err instanceof Error ? err.message : String(err));
      })
      .finally(() => {
        this.#posting.delete(to.index);
        this.#post(to);
      });
  }

  #postError(what: string): void {
    this.stats.postErrors++;
    if (this.stats.postErrorSample === "") this.stats.postErrorSample = what;
  }
}

/** Messages between the benchmark and its relay process (IPC). */
type RelayRequest = { readonly id: number; readonly type: "stats" | "idle" };
type RelayReply = { readonly id: number; readonly stats: RelayStats } | { readonly type: "ready" };

/** The relay in a process of its own: the host is not the load generator (its event loop would skew the lag). */
class RelayProcess {
  readonly #child: ChildProcess;
  readonly #waiting = new Map<number, (stats: RelayStats) => void>();
  readonly #ready: Promise<void>;
  #nextId = 1;

  constructor(services: readonly Endpoint[]) {
    const ports = services.map((s) => s.port).join(",");
    this.#child = fork(fileURLToPath(import.meta.url), ["--relay-ports", ports], { execArgv: ["--import", "tsx"], stdio: ["ignore", "inherit", "inherit", "ipc"] });
    killOnExit(this.#child);
    this.#ready = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new Error(`relay process not ready within ${FLEET_START_TIMEOUT_MS} ms`));
      }, FLEET_START_TIMEOUT_MS);
      this.#child.on("message", (m: RelayReply) => {
        if ("type" in m) {
          clearTimeout(timer);
          resolve();
          return;
        }
        this.#waiting.get(m.id)?.(m.stats);
        this.#waiting.delete(m.id);
      });
      this.#child.on("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`relay process exited (${code})`));
      });
    });
    this.#ready.catch(() => undefined);
  }

  get pid(): number {
    return this.#child.pid ?? 0;
  }

  ready(): Promise<void> {
    return this.#ready;
  }

  /** Its counters; "idle" first waits until everything read has been posted and answered. */
  ask(type: RelayRequest["type"]): Promise<RelayStats> {
    const id = this.#nextId++;
    return new Promise<RelayStats>((resolve) => {
      this.#waiting.set(id, resolve);
      this.#child.send({ id, type } satisfies RelayRequest);
    });
  }

  async stop(): Promise<void> {
    await stopAll([this.#child], FLEET_STOP_GRACE_MS);
  }
}

/** `--relay-ports p1,p2,...`: this process is the host relay; the benchmark asks it over IPC. */
async function runRelayChild(portsArg: string): Promise<void> {
  const endpoints: Endpoint[] = portsArg.split(",").map((p, index) => {
    const port = positiveInt(p);
    return { index, port, client: new RouterClient(port, { sockets: RELAY_SOCKETS_PER_SERVICE, timeoutMs: REQUEST_TIMEOUT_MS }) };
  });
  const relay = new HostRelay(endpoints);
  await relay.start();
  process.on("message", (m: RelayRequest) => {
    void (m.type === "idle" ? relay.idle() : Promise.resolve()).then(() => process.send?.({ id: m.id, stats: relay.stats } satisfies RelayReply));
  });
  process.once("SIGTERM", () => {
    relay.stop();
    process.exit(0);
  });
  process.send?.({ type: "ready" } satisfies RelayReply);
}


// ------------------------------------------------------------------ the workload

/** The first `n` token ids of a comma-separated list. */
function headCsv(csv: string, n: number): string {
  let at = -1;
  for (let i = 0; i < n; i++) {
    at = csv.indexOf(",", at + 1);
    if (at < 0) return csv;
  }
  return csv.slice(0, at);
}


// ------------------------------------------------------------------ one mode

interface RunResult {
  mode: Mode;
  routed: number;
  achievedRatePerS: number;
  droppedTicks: number;
  errors: number;
  errorSample: string;
  selectLatencyMs: { p50: number; p99: number };
  /** The same calls as the services measured them (HTTP histogram delta): the rest of the client's figure is queueing. */
  serviceSelectLatencyMs: { p50: number; p99: number };
  bindingsPublished: number;
  bindingsPublishedPerServicePerS: number;
  /** Seconds a 4,096-binding channel with no consumer lasts at this rate (per service). */
  referenceChannelFillS: number;
  shed: number;
  shedSource: string;
  lag: { source: string; samples: number; p50Ms: number; p99Ms: number };
  relay: Omit<RelayStats, "lagMs"> | null;
  stickiness: Stickiness;
  divergence: Divergence;
  cpu: { windowMs: number; serviceCpuMs: number; perRequestUs: number; relayPerRequestUs: number };
}

async function runMode(mode: Mode): Promise<RunResult> {
  process.stderr.write(`${mode}: starting ${String(SERVICES)} services\n`);
  // host: each service on its own, with a writer id for its bindings; mesh: a full mesh.
  const fleet = await startSessionFleet({
    name: "service",
    replicas: SERVICES,
    mesh: mode === "mesh",
    workers: WORKERS,
    blockSize: BLOCK_SIZE,
    sockets: SOCKETS_PER_SERVICE,
    ...(mode === "host" ? { serveArgsOf: (i: number) => ["--session-replication-writer-id", String(i + 1)] } : {}),
  });
  let relay: RelayProcess | undefined;
  try {
    if (mode === "host") {
      relay = new RelayProcess(fleet.replicas);
      await relay.ready();
    }
    const clients = fleet.clients();
    const pace = { clients, ratePerS: RATE_PER_S, maxInFlight: MAX_IN_FLIGHT, tokenIdsCsv: (plan: { tokenIdsCsv: string }) => headCsv(plan.tokenIdsCsv, PROMPT_TOKENS) };
    await warmUp({ ...pace, label: mode, seconds: WARMUP_SECONDS, seed: SEED, slots: SESSIONS });
    const relayBefore = await relay?.ask("idle");
    const before = await Promise.all(clients.map(scrape));
    const cpu0 = fleetCpuMs(fleet);
    const relayCpu0 = relay === undefined ? 0 : cpuMs(relay.pid);
    const wl = new SessionWorkload({ seed: SEED, slots: SESSIONS });
    process.stderr.write(`${mode}: driving ${String(RATE_PER_S)} turns/s for ${String(SECONDS)} s over ${String(SESSIONS)} session slots\n`);
    const d = await driveSessions({ ...pace, workload: wl, label: mode, seconds: SECONDS, selectionPrefix: "t" });
    const cpu1 = fleetCpuMs(fleet);
    const relayCpuMs = relay === undefined ? 0 : cpuMs(relay.pid) - relayCpu0;
    await sleep(SETTLE_MS);
    const relayAfter = await relay?.ask("idle");
    const after = await Promise.all(clients.map(scrape));

    process.stderr.write(`${mode}: probing sessions on every service\n`);
    const div = await probeDivergence(clients, wl.sessionIds().slice(0, MAX_PROBED_SESSIONS), (sid) => wl.probeTokens(sid).slice(0, PROMPT_TOKENS));

    const delta = (k: "published" | "dropped" | "meshShed"): number => after.reduce((s, a, i) => s + a[k] - (before[i]?.[k] ?? 0), 0);
    const published = delta("published");
    const perServicePerS = published / SERVICES / (d.wallMs / 1000);
    let lag: RunResult["lag"];
    if (relayAfter !== undefined) {
      const samples = relayAfter.lagMs.slice(relayBefore?.lagMs.length ?? 0);
      const s = summarize(samples);
      lag = { source: "host relay: sent_at_ms (origin's ring) to the peer's POST answer, per binding and peer", samples: s.n, p50Ms: s.p50, p99Ms: s.p99 };
    } else {
      const h = histogramGrowth(
        before.map((b) => b.lag),
        after.map((a) => a.lag),
      );
      lag = { source: "kvmesh_mesh_replication_lag_seconds delta (publish to receive per batch, heartbeats included)", samples: h.cum[h.cum.length - 1] ?? 0, p50Ms: histogramQuantile(h.leMs, h.cum, 0.5), p99Ms: histogramQuantile(h.leMs, h.cum, 0.99) };
    }
    let relayOut: RunResult["relay"] = null;
    if (relayAfter !== undefined && relayBefore !== undefined) {
      const r = relayAfter;
      const outcomes: Record<string, number> = {};
      for (const [k, v] of Object.entries(r.outcomes)) outcomes[k] = v - (relayBefore.outcomes[k] ?? 0);
      relayOut = {
        linesRelayed: r.linesRelayed - relayBefore.linesRelayed,
        bindingsRelayed: r.bindingsRelayed - relayBefore.bindingsRelayed,
        posts: r.posts - relayBefore.posts,
        postErrors: r.postErrors,
        postErrorSample: r.postErrorSample,
        maxBatch: r.maxBatch,
        outcomes,
        streamsLost: r.streamsLost,
      };
    }
    const sel = histogramGrowth(
      before.map((b) => b.select),
      after.map((a) => a.select),
    );
    const serviceSelect = { p50: histogramQuantile(sel.leMs, sel.cum, 0.5), p99: histogramQuantile(sel.leMs, sel.cum, 0.99) };
    const serviceCpuMs = cpuSpentMs(cpu0, cpu1);
    const lat = summarize(d.latencyMs);
    return {
      mode,
      routed: d.records.length,
      achievedRatePerS: d.records.length / SECONDS,
      droppedTicks: d.dropped,
      errors: d.errors,
      errorSample: d.errorSample,
      selectLatencyMs: { p50: lat.p50, p99: lat.p99 },
      serviceSelectLatencyMs: serviceSelect,
      bindingsPublished: published,
      bindingsPublishedPerServicePerS: perServicePerS,
      referenceChannelFillS: REFERENCE_CHANNEL_BINDINGS / perServicePerS,
      shed: mode === "host" ? delta("dropped") : delta("meshShed"),
      shedSource: mode === "host" ? "kvmesh_session_bindings_dropped_total" : "kvmesh_mesh_events_shed_total (load + bindings)",
      lag,
      relay: relayOut,
      stickiness: stickiness(d.records),
      divergence: div,
      cpu: { windowMs: d.wallMs, serviceCpuMs, perRequestUs: (serviceCpuMs * 1000) / Math.max(1, d.records.length), relayPerRequestUs: (relayCpuMs * 1000) / Math.max(1, d.records.length) },
    };
  } finally {
    await relay?.stop();
    await fleet.stop();
  }
}

// ------------------------------------------------------------------ main

function table(results: readonly RunResult[]): string {
  const f = fixed;
  const rows: TableRow<RunResult>[] = [
    ["routed turns", (r) => String(r.routed)],
    ["achieved rate (turns/s)", (r) => f(r.achievedRatePerS, 1)],
    ["errors / dropped ticks", (r) => `${r.errors} / ${r.droppedTicks}`],
    ["select_and_reserve p50 / p99 ms (client)", (r) => `${f(r.selectLatencyMs.p50)} / ${f(r.selectLatencyMs.p99)}`],
    ["select_and_reserve p50 / p99 ms (service)", (r) => `${f(r.serviceSelectLatencyMs.p50, 3)} / ${f(r.serviceSelectLatencyMs.p99, 3)}`],
    ["bindings published (all services)", (r) => String(r.bindingsPublished)],
    ["bindings/s per service", (r) => f(r.bindingsPublishedPerServicePerS, 0)],
    ["4,096 channel full after (s, no consumer)", (r) => f(r.referenceChannelFillS, 1)],
    ["shed (target 0)", (r) => String(r.shed)],
    ["apply lag p50 / p99 ms", (r) => `${f(r.lag.p50Ms)} / ${f(r.lag.p99Ms)}`],
    ["lag samples", (r) => String(r.lag.samples)],
    ["relay: lines / bindings / largest batch", (r) => (r.relay === null ? "-" : `${r.relay.linesRelayed} / ${r.relay.bindingsRelayed} / ${r.relay.maxBatch}`)],
    ["relay: POSTs / errors / streams lost", (r) => (r.relay === null ? "-" : `${r.relay.posts} / ${r.relay.postErrors} / ${r.relay.streamsLost}`)],
    ["stickiness (turn share)", (r) => `${f(r.stickiness.turnShareOnFirstWorker, 4)} (${r.stickiness.sessionsThatMoved} of ${r.stickiness.multiTurnSessions} moved)`],
    ["sessions disagreeing (target 0)", (r) => `${r.divergence.sessionsDisagreeing} of ${r.divergence.sessionsProbed}`],
    ["service CPU per turn (us)", (r) => f(r.cpu.perRequestUs, 0)],
    ["host relay CPU per turn (us)", (r) => (r.relay === null ? "-" : f(r.cpu.relayPerRequestUs, 0))],
  ];
  return renderTable("", results, (r) => r.mode, rows, MIN_COLUMN_WIDTH);
}

async function main(): Promise<void> {
  process.stderr.write(`bench:host: modes ${MODES.join(",")}, ${String(SERVICES)} services, ${String(WORKERS)} workers, ${String(RATE_PER_S)} turns/s for ${String(SECONDS)} s, ${String(SESSIONS)} session slots, prompts <= ${String(PROMPT_TOKENS)} tokens, seed ${String(SEED)}\n`);
  const results: RunResult[] = [];
  for (const mode of MODES) results.push(await runMode(mode));
  console.log(table(results));
  for (const r of results) {
    if (r.errorSample !== "") console.log(`${r.mode}: first error: ${r.errorSample}`);
    if (r.divergence.example !== "") console.log(`${r.mode}: first disagreement: ${r.divergence.example}`);
    if (r.relay !== null) {
      console.log(`${r.mode}: apply outcomes ${JSON.stringify(r.relay.outcomes)}`);
      if (r.relay.postErrorSample !== "") console.log(`${r.mode}: first relay error: ${r.relay.postErrorSample}`);
    }
    console.log(`${r.mode}: lag = ${r.lag.source}; shed = ${r.shedSource}`);
  }
  const config = { modes: MODES, services: SERVICES, workers: WORKERS, ratePerS: RATE_PER_S, seconds: SECONDS, warmupSeconds: WARMUP_SECONDS, sessions: SESSIONS, promptTokens: PROMPT_TOKENS, seed: SEED, maxInFlight: MAX_IN_FLIGHT };
  writeJsonReport(args.json, { config, results });
  console.log(`json: ${args.json}`);
}

await (args.relayPorts === undefined ? main() : runRelayChild(args.relayPorts));
