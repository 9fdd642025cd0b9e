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
 * Flags: --mode host,mesh --seconds 10 --rate 200 --sessions 400 --workers 64 --prompt-tokens 128
 *        --warmup-seconds 1 --seed 1 --max-in-flight 1024 --json reports/bench-host.json.
 */
import { fork, spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { Agent, request, type ClientRequest } from "node:http";
import { dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { freePortPair } from "../src/bench/ports.js";
import { summarize } from "../src/bench/stats.js";
import { SessionWorkload, type TurnPlan } from "./lib/bench-workload.js";
import { stopAll } from "../src/bench/serve-process.js";
import { mapLimited } from "../src/bench/bounded.js";
import { waitForListening } from "../src/bench/listening.js";
import { paceTurns } from "./lib/turn-pacer.js";
import { cpuMs } from "../src/bench/process-usage.js";
import { metricSum, RouterClient, type RouterReply } from "../src/bench/router-client.js";
import { histogramQuantile } from "../src/bench/stats.js";

const { values: args } = parseArgs({
  options: {
    mode: { type: "string", default: "host,mesh" },
    seconds: { type: "string", default: "10" },
    rate: { type: "string", default: "200" },
    sessions: { type: "string", default: "400" },
    workers: { type: "string", default: "64" },
    "prompt-tokens": { type: "string", default: "128" },
    "warmup-seconds": { type: "string", default: "1" },
    seed: { type: "string", default: "1" },
    "max-in-flight": { type: "string", default: "1024" },
    json: { type: "string", default: "reports/bench-host.json" },
    /** Internal: run as the host relay process for services on these HTTP ports. */
    "relay-ports": { type: "string" },
  },
});

function positiveInt(name: string, raw: string): number {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} must be a positive integer, got ${JSON.stringify(raw)}`);
  return n;
}
type Mode = "host" | "mesh";
const MODES = args.mode.split(",").map((m) => {
  const t = m.trim();
  if (t !== "host" && t !== "mesh") throw new Error(`--mode takes host and/or mesh, got ${JSON.stringify(m)}`);
  return t;
});
const SECONDS = Number(args.seconds);
if (!(SECONDS > 0 && SECONDS <= 600)) throw new Error(`--seconds must be in (0, 600], got ${args.seconds}`);
const RATE_PER_S = positiveInt("rate", args.rate);
const SESSIONS = positiveInt("sessions", args.sessions);
const WORKERS = positiveInt("workers", args.workers);
const PROMPT_TOKENS = positiveInt("prompt-tokens", args["prompt-tokens"]);
const WARMUP_SECONDS = Number(args["warmup-seconds"]);
if (!(WARMUP_SECONDS >= 0 && WARMUP_SECONDS <= 60)) throw new Error(`--warmup-seconds must be in [0, 60], got ${args["warmup-seconds"]}`);
const SEED = positiveInt("seed", args.seed);
const MAX_IN_FLIGHT = positiveInt("max-in-flight", args["max-in-flight"]);

const SERVICES = 4;
const BLOCK_SIZE = 16;
const AFFINITY_TTL_SECS = 600;
/** The reference frontend's binding channel (AFFINITY_EVENT_CHANNEL_CAPACITY), for the comparison line. */
const REFERENCE_CHANNEL_BINDINGS = 4_096;
const STARTUP_TIMEOUT_MS = 30_000;
const MESH_READY_TIMEOUT_MS = 20_000;
const STREAMS_READY_TIMEOUT_MS = 10_000;
const STOP_GRACE_MS = 2_000;
const REQUEST_TIMEOUT_MS = 30_000;
const SETTLE_MS = 1_000;
const SOCKETS_PER_SERVICE = 64;
/** The relay process's connections per service: a POST of bindings at a time is all it sends. */
const RELAY_SOCKETS_PER_SERVICE = 4;
const ADMIN_CONCURRENCY = 16;
/** Divergence probes per run at most (each is one /select per service). */
const MAX_PROBED_SESSIONS = 1_000;

// ------------------------------------------------------------------ processes

/** Where a service's HTTP API is, and the keep-alive sockets to it. */
interface Endpoint {
  readonly index: number;
  readonly port: number;
  readonly client: RouterClient;
}

interface Service extends Endpoint {
  readonly child: ChildProcess;
  readonly pid: number;
  readonly syncPort: number | undefined;
}

const children = new Set<ChildProcess>();

function startService(index: number, extraArgs: readonly string[], syncPort: number | undefined): Promise<Service> {
  const argv = ["--import", "tsx", "cli/main.ts", "serve", "--port", "0", "--no-kv-events", "--session-affinity-ttl-secs", String(AFFINITY_TTL_SECS), "--log-level", "info", ...extraArgs];
  const child = spawn(process.execPath, argv, { stdio: ["ignore", "pipe", "pipe"] });
  children.add(child);
  child.on("exit", () => children.delete(child));
  child.stderr?.on("data", (d: Buffer) => {
    process.stderr.write(`[service ${index}] ${d.toString()}`);
  });
  return waitForListening(child, { label: `service ${index}`, timeoutMs: STARTUP_TIMEOUT_MS, onLine: (line) => process.stderr.write(`[service ${index}] ${line}\n`) }).then((port) => {
    const pid = child.pid;
    if (pid === undefined) throw new Error(`service ${index} has no pid`);
    return { index, child, pid, port, syncPort, client: new RouterClient(port, { sockets: SOCKETS_PER_SERVICE, timeoutMs: REQUEST_TIMEOUT_MS }) };
  });
}

const stopChildren = (list: readonly ChildProcess[]): Promise<void> => stopAll(list, STOP_GRACE_MS);

// A crash or Ctrl-C of the benchmark must not leave daemons holding ports.
process.on("exit", () => {
  for (const c of children) c.kill("SIGKILL");
});
// (The relay process handles SIGTERM itself: it has no children.)
for (const sig of args["relay-ports"] === undefined ? (["SIGINT", "SIGTERM"] as const) : []) {
  process.once(sig, () => {
    process.stderr.write(`bench:host: ${sig}, stopping services\n`);
    void stopChildren([...children]).then(() => process.exit(130));
  });
}

// ------------------------------------------------------------------ HTTP

const send = (r: Endpoint, method: string, path: string, body?: string): Promise<RouterReply> => r.client.send(method, path, body);
const sendOk = (r: Endpoint, method: string, path: string, body?: string): Promise<string> => r.client.ok(method, path, body);

interface Scrape {
  published: number;
  dropped: number;
  meshShed: number;
  lagLeMs: number[];
  lagCum: number[];
  /** The service's own select_and_reserve latency histogram (parse to answer), cumulative. */
  selLeMs: number[];
  selCum: number[];
}

async function scrape(s: Service): Promise<Scrape> {
  const text = await sendOk(s, "GET", "/metrics");
  const lagLeMs: number[] = [];
  const lagCum: number[] = [];
  for (const m of text.matchAll(/^kvmesh_mesh_replication_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$/gm)) {
    lagLeMs.push(m[1] === "+Inf" ? Infinity : Number(m[1]) * 1000);
    lagCum.push(Number(m[2]));
  }
  const selLeMs: number[] = [];
  const selCum: number[] = [];
  for (const m of text.matchAll(/^kvmesh_http_request_duration_seconds_bucket\{route="\/select_and_reserve",le="([^"]+)"\} (\S+)$/gm)) {
    selLeMs.push(m[1] === "+Inf" ? Infinity : Number(m[1]) * 1000);
    selCum.push(Number(m[2]));
  }
  return {
    selLeMs,
    selCum,
    published: metricSum(text, "kvmesh_session_bindings_published_total"),
    dropped: metricSum(text, "kvmesh_session_bindings_dropped_total"),
    meshShed: metricSum(text, "kvmesh_mesh_events_shed_total"),
    lagLeMs,
    lagCum,
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
      let buf = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => {
        buf += chunk;
        let nl: number;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          this.#onLine(from, line);
        }
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
    send(to, "POST", "/session_bindings", body)
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

  constructor(services: readonly Service[]) {
    const ports = services.map((s) => s.port).join(",");
    this.#child = fork(fileURLToPath(import.meta.url), ["--relay-ports", ports], { execArgv: ["--import", "tsx"], stdio: ["ignore", "inherit", "inherit", "ipc"] });
    children.add(this.#child);
    this.#child.on("exit", () => children.delete(this.#child));
    this.#ready = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new Error(`relay process not ready within ${STARTUP_TIMEOUT_MS} ms`));
      }, STARTUP_TIMEOUT_MS);
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
    await stopChildren([this.#child]);
  }
}

/** `--relay-ports p1,p2,...`: this process is the host relay; the benchmark asks it over IPC. */
async function runRelayChild(portsArg: string): Promise<void> {
  const endpoints: Endpoint[] = portsArg.split(",").map((p, index) => {
    const port = positiveInt("relay-ports", p);
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

interface TurnRecord {
  readonly sessionSerial: number;
  readonly turn: number;
  readonly worker: number;
}

interface DriveResult {
  wallMs: number;
  ticks: number;
  dropped: number;
  records: TurnRecord[];
  latencyMs: number[];
  errors: number;
  errorSample: string;
}

/** The first `n` token ids of a comma-separated list. */
function headCsv(csv: string, n: number): string {
  let at = -1;
  for (let i = 0; i < n; i++) {
    at = csv.indexOf(",", at + 1);
    if (at < 0) return csv;
  }
  return csv.slice(0, at);
}

async function drive(services: readonly Service[], wl: SessionWorkload, label: string, seconds: number, selPrefix: string): Promise<DriveResult> {
  const n = services.length;
  const res: DriveResult = { wallMs: 0, ticks: 0, dropped: 0, records: [], latencyMs: [], errors: 0, errorSample: "" };
  const fail = (what: string): void => {
    res.errors++;
    if (res.errorSample === "") res.errorSample = what;
  };
  const runTurn = async (plan: TurnPlan, k: number): Promise<void> => {
    const s = services[k % n] as Service;
    const sel = `${selPrefix}${k}`;
    const body = `{"token_ids":[${headCsv(plan.tokenIdsCsv, PROMPT_TOKENS)}],"session_id":"${plan.sessionId}","selection_id":"${sel}"}`;
    const t0 = performance.now();
    const rep = await send(s, "POST", "/select_and_reserve", body);
    const t1 = performance.now();
    const m = /"worker_id":(\d+)/.exec(rep.text);
    if (rep.status !== 200 || m?.[1] === undefined) {
      fail(`select_and_reserve ${rep.status}: ${rep.text.slice(0, 200)}`);
      return;
    }
    res.latencyMs.push(t1 - t0);
    res.records.push({ sessionSerial: plan.sessionSerial, turn: plan.turn, worker: Number(m[1]) });
    await sleep(plan.prefillDelayMs);
    const p = await send(s, "POST", `/reservations/${sel}/prefill_complete`, "{}");
    if (p.status !== 200) fail(`prefill_complete ${p.status}: ${p.text.slice(0, 200)}`);
    await sleep(plan.durationMs - plan.prefillDelayMs);
    const d = await send(s, "DELETE", `/reservations/${sel}`);
    if (d.status !== 200) fail(`DELETE ${d.status}: ${d.text.slice(0, 200)}`);
  };

  const paced = await paceTurns({
    workload: wl,
    ratePerS: RATE_PER_S,
    seconds,
    maxInFlight: MAX_IN_FLIGHT,
    runTurn,
    onError: fail,
    onSecond: (elapsedS, st) => {
      process.stderr.write(`${label}: ${elapsedS}/${seconds} s, ${res.records.length} routed, ${st.outstanding} in flight, ${res.errors} errors, ${st.dropped} ticks dropped\n`);
    },
  });
  Object.assign(res, paced);
  return res;
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
  stickiness: { multiTurnSessions: number; turnShareOnFirstWorker: number; sessionsThatMoved: number };
  divergence: { sessionsProbed: number; sessionsDisagreeing: number; probeErrors: number; example: string };
  cpu: { windowMs: number; serviceCpuMs: number; perRequestUs: number; relayPerRequestUs: number };
}

async function runMode(mode: Mode): Promise<RunResult> {
  const services: Service[] = [];
  let relay: RelayProcess | undefined;
  try {
    process.stderr.write(`${mode}: starting ${SERVICES} services\n`);
    if (mode === "host") {
      services.push(...(await Promise.all(Array.from({ length: SERVICES }, (_, i) => startService(i, ["--session-replication-writer-id", String(i + 1)], undefined)))));
    } else {
      for (let i = 0; i < SERVICES; i++) {
        const syncPort = await freePortPair();
        const peers = services.map((s) => `tcp://127.0.0.1:${s.syncPort}`);
        services.push(await startService(i, ["--replica-sync-port", String(syncPort), ...(peers.length > 0 ? ["--peers", peers.join(",")] : [])], syncPort));
      }
      await waitForMesh(services);
    }
    const ids = Array.from({ length: WORKERS }, (_, i) => i + 1);
    await Promise.all(services.map((s) => mapLimited(ids, ADMIN_CONCURRENCY, async (w) => {
          await sendOk(s, "POST", "/workers", JSON.stringify({ worker_id: w, endpoint: `http://w${w}`, block_size: BLOCK_SIZE }));
        })));
    if (mode === "host") {
      relay = new RelayProcess(services);
      await relay.ready();
    }
    if (WARMUP_SECONDS > 0) {
      process.stderr.write(`${mode}: warming up for ${WARMUP_SECONDS} s\n`);
      const warm = await drive(services, new SessionWorkload({ seed: SEED + 1, slots: SESSIONS, idPrefix: "warm-" }), `${mode} warm-up`, WARMUP_SECONDS, "w");
      if (warm.errors > 0) throw new Error(`warm-up: ${warm.errors} errors, first: ${warm.errorSample}`);
    }
    const relayBefore = await relay?.ask("idle");
    const before = await Promise.all(services.map(scrape));
    const cpu0 = services.map((s) => cpuMs(s.pid));
    const relayCpu0 = relay === undefined ? 0 : cpuMs(relay.pid);
    const wl = new SessionWorkload({ seed: SEED, slots: SESSIONS });
    process.stderr.write(`${mode}: driving ${RATE_PER_S} turns/s for ${SECONDS} s over ${SESSIONS} session slots\n`);
    const d = await drive(services, wl, mode, SECONDS, "t");
    const cpu1 = services.map((s) => cpuMs(s.pid));
    const relayCpuMs = relay === undefined ? 0 : cpuMs(relay.pid) - relayCpu0;
    await sleep(SETTLE_MS);
    const relayAfter = await relay?.ask("idle");
    const after = await Promise.all(services.map(scrape));

    process.stderr.write(`${mode}: probing sessions on every service\n`);
    const div = { sessionsProbed: 0, sessionsDisagreeing: 0, probeErrors: 0, example: "" };
    await mapLimited(wl.sessionIds().slice(0, MAX_PROBED_SESSIONS), ADMIN_CONCURRENCY, async (sid) => {
      const body = JSON.stringify({ token_ids: wl.probeTokens(sid).slice(0, PROMPT_TOKENS), session_id: sid });
      const answers = await Promise.all(
        services.map(async (s) => {
          const rep = await send(s, "POST", "/select", body);
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

    const bySession = new Map<number, TurnRecord[]>();
    for (const rec of d.records) {
      let l = bySession.get(rec.sessionSerial);
      if (l === undefined) bySession.set(rec.sessionSerial, (l = []));
      l.push(rec);
    }
    let multi = 0;
    let turns = 0;
    let sticky = 0;
    let moved = 0;
    for (const l of bySession.values()) {
      if (l.length < 2) continue;
      l.sort((a, b) => a.turn - b.turn);
      const first = l[0]?.worker;
      const same = l.filter((x) => x.worker === first).length;
      multi++;
      turns += l.length;
      sticky += same;
      if (same !== l.length) moved++;
    }

    const delta = (k: "published" | "dropped" | "meshShed"): number => after.reduce((s, a, i) => s + a[k] - (before[i]?.[k] ?? 0), 0);
    const published = delta("published");
    const perServicePerS = published / SERVICES / (d.wallMs / 1000);
    let lag: RunResult["lag"];
    if (relayAfter !== undefined) {
      const samples = relayAfter.lagMs.slice(relayBefore?.lagMs.length ?? 0);
      const s = summarize(samples);
      lag = { source: "host relay: sent_at_ms (origin's ring) to the peer's POST answer, per binding and peer", samples: s.n, p50Ms: s.p50, p99Ms: s.p99 };
    } else {
      const leMs = after[0]?.lagLeMs ?? [];
      const cum = leMs.map((_, i) => after.reduce((s, a, j) => s + (a.lagCum[i] ?? 0) - (before[j]?.lagCum[i] ?? 0), 0));
      lag = { source: "kvmesh_mesh_replication_lag_seconds delta (publish to receive per batch, heartbeats included)", samples: cum[cum.length - 1] ?? 0, p50Ms: histogramQuantile(leMs, cum, 0.5), p99Ms: histogramQuantile(leMs, cum, 0.99) };
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
    const selLe = after[0]?.selLeMs ?? [];
    const selCum = selLe.map((_, i) => after.reduce((s, a, j) => s + (a.selCum[i] ?? 0) - (before[j]?.selCum[i] ?? 0), 0));
    const serviceSelect = { p50: histogramQuantile(selLe, selCum, 0.5), p99: histogramQuantile(selLe, selCum, 0.99) };
    const serviceCpuMs = cpu1.reduce((s, c, i) => s + c - (cpu0[i] ?? 0), 0);
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
      stickiness: { multiTurnSessions: multi, turnShareOnFirstWorker: turns === 0 ? Number.NaN : sticky / turns, sessionsThatMoved: moved },
      divergence: div,
      cpu: { windowMs: d.wallMs, serviceCpuMs, perRequestUs: (serviceCpuMs * 1000) / Math.max(1, d.records.length), relayPerRequestUs: (relayCpuMs * 1000) / Math.max(1, d.records.length) },
    };
  } finally {
    await relay?.stop();
    for (const s of services) s.client.close();
    await stopChildren(services.map((s) => s.child));
  }
}

async function waitForMesh(services: readonly Service[]): Promise<void> {
  const deadline = performance.now() + MESH_READY_TIMEOUT_MS;
  for (;;) {
    const views = await Promise.all(services.map(async (s) => JSON.parse(await sendOk(s, "GET", "/replica_sync/peers")) as { state: string; sync: string | null }[]));
    if (views.every((v) => v.length === services.length - 1 && v.every((p) => p.state === "alive" && p.sync === "live"))) return;
    if (performance.now() > deadline) throw new Error(`mesh not fully connected after ${MESH_READY_TIMEOUT_MS} ms: ${JSON.stringify(views)}`);
    await sleep(100);
  }
}

// ------------------------------------------------------------------ main

function table(results: readonly RunResult[]): string {
  const f = (v: number, digits = 2): string => (Number.isFinite(v) ? v.toFixed(digits) : "n/a");
  const rows: [string, (r: RunResult) => string][] = [
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
  const w0 = Math.max(...rows.map(([name]) => name.length));
  const cols = results.map((r) => Math.max(24, ...rows.map(([, g]) => g(r).length)));
  const out = [`${"".padEnd(w0)}  ${results.map((r, i) => r.mode.padStart(cols[i] ?? 0)).join("  ")}`];
  for (const [name, get] of rows) out.push(`${name.padEnd(w0)}  ${results.map((r, i) => get(r).padStart(cols[i] ?? 0)).join("  ")}`);
  return out.join("\n");
}

async function main(): Promise<void> {
  process.stderr.write(`bench:host: modes ${MODES.join(",")}, ${SERVICES} services, ${WORKERS} workers, ${RATE_PER_S} turns/s for ${SECONDS} s, ${SESSIONS} session slots, prompts <= ${PROMPT_TOKENS} tokens, seed ${SEED}\n`);
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
  mkdirSync(dirname(args.json), { recursive: true });
  const config = { modes: MODES, services: SERVICES, workers: WORKERS, ratePerS: RATE_PER_S, seconds: SECONDS, warmupSeconds: WARMUP_SECONDS, sessions: SESSIONS, promptTokens: PROMPT_TOKENS, seed: SEED, maxInFlight: MAX_IN_FLIGHT };
  writeFileSync(args.json, `${JSON.stringify({ config, results }, (_, v: unknown) => (typeof v === "number" && !Number.isFinite(v) ? null : v), 2)}\n`);
  console.log(`json: ${args.json}`);
}

if (args["relay-ports"] !== undefined) {
  await runRelayChild(args["relay-ports"]);
} else {
  try {
    await main();
  } finally {
    await stopChildren([...children]);
  }
}
