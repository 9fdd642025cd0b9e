/**
 * bench:scale over HTTP: one origin `kvmesh serve` routes the traffic, K passive peers (real
 * serve processes in one mesh with it) only mirror. For each rate: a warm-up, then a window in
 * which the origin gets select_and_reserve (session id, 14,000-token prompt, block size 64),
 * prefill_complete and free at the rate, paced like bench:mesh (multi-turn sessions, think
 * times, 20-80 ms to prefill, 200-800 ms to free). The window runs from the first request to
 * the last free; CPU per thread, mesh TCP bytes and mesh metrics are read at its two ends.
 * Before each rate's warm-up (fleet up, workers registered, mesh live), an idle window of
 * --idle-seconds with no traffic gives every replica's fixed CPU rate (ms/s), which the marginal
 * cost per request takes out of the window's CPU.
 */
import { loadavg } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";

import { benchPrompt } from "./bench-prompts.js";
import { SessionWorkload, type TurnPlan } from "./bench-workload.js";
import { ReplicaFleet, type Replica } from "../../src/bench/replica-fleet.js";
import type { LoadReplication } from "../../src/core/index.js";
import { writeBenchCurveKeys } from "./bench-curve-keys.js";
import { scaleServeArgs } from "./bench-scale-args.js";
import { registerBenchWorkers } from "./bench-workers.js";
import { lagQuantiles, meshWindow, parseMeshMetrics, type MeshScrape } from "./mesh-scrape.js";
import { capacityCurve, idleCpu, meanMirrorRatio, mirrorRatio, MODEL_REPLICA_COUNTS, replicaCpu } from "./scale-model.js";
import type { IdleCpu, ReplicaCpu, ScalePoint } from "./scale-report.js";
import { bytesDelta, connectionBytes } from "./tcp-bytes.js";
import { threadCpu, threadCpuDelta, type ThreadCpu } from "./thread-cpu.js";
import { paceTurns } from "./turn-pacer.js";

/** Bindings outlive the run: turns of a session find their worker. */
const AFFINITY_TTL_SECS = 600;
const MAX_IN_FLIGHT = 256;
/** Prompt groups share a 10,000-token prefix (bench-prompts.ts); variants per group. */
const PROMPT_GROUPS = 64;
const PROMPT_VARIANTS = 4;
/** After warm-up, let the last frees replicate before the window opens, ms. */
const SETTLE_MS = 500;

export interface HttpRunOptions {
  readonly peers: number;
  readonly rates: readonly number[];
  readonly seconds: number;
  readonly warmupSeconds: number;
  /** No-traffic window before each rate's warm-up, s (0: none, no marginal figures). */
  readonly idleSeconds: number;
  readonly workers: number;
  readonly sessions: number;
  readonly seed: number;
  /** Every serve's --load-replication, and --mesh-aggregate-interval-ms when set. */
  readonly loadReplication: LoadReplication;
  readonly meshAggregateIntervalMs: number | undefined;
  /** bench:scale --serve-args: more serve flags for every replica. */
  readonly serveArgs: readonly string[];
  /** bench:scale --curve: every replica meshes over CURVE with its own key. */
  readonly curve: boolean;
  readonly log: (line: string) => void;
}


/** The 14,000-token prompts as JSON array bodies, built once (~90 KB each). */
let promptCsvs: string[] | undefined;
function promptCsv(plan: TurnPlan): string {
  promptCsvs ??= Array.from({ length: PROMPT_GROUPS * PROMPT_VARIANTS }, (_, i) => benchPrompt(Math.floor(i / PROMPT_VARIANTS), i % PROMPT_VARIANTS).join(","));
  return promptCsvs[((plan.sessionSerial % PROMPT_GROUPS) * PROMPT_VARIANTS + (plan.turn % PROMPT_VARIANTS)) % promptCsvs.length] as string;
}

interface Drive {
  routed: number;
  errors: number;
  errorSample: string;
  wallMs: number;
  dropped: number;
}

async function drive(origin: Replica, o: HttpRunOptions, rate: number, seconds: number, prefix: string, label: string): Promise<Drive> {
  const d: Drive = { routed: 0, errors: 0, errorSample: "", wallMs: 0, dropped: 0 };
  const fail = (what: string): void => {
    d.errors++;
    if (d.errorSample === "") d.errorSample = what;
  };
  const c = origin.client;
  const paced = await paceTurns({
    workload: new SessionWorkload({ seed: o.seed, slots: o.sessions, idPrefix: prefix }),
    ratePerS: rate,
    seconds,
    maxInFlight: MAX_IN_FLIGHT,
    onError: fail,
    runTurn: async (plan, k) => {
      const sel = `${prefix}${k}`;
      const rep = await c.send("POST", "/select_and_reserve", `{"token_ids":[${promptCsv(plan)}],"session_id":"${plan.sessionId}","selection_id":"${sel}"}`);
      if (rep.status !== 200) {
        fail(`select_and_reserve ${rep.status}: ${rep.text.slice(0, 200)}`);
        return;
      }
      d.routed++;
      await sleep(plan.prefillDelayMs);
      const p = await c.send("POST", `/reservations/${sel}/prefill_complete`, "{}");
      if (p.status !== 200) fail(`prefill_complete ${p.status}: ${p.text.slice(0, 200)}`);
      await sleep(plan.durationMs - plan.prefillDelayMs);
      const f = await c.send("DELETE", `/reservations/${sel}`);
      if (f.status !== 200) fail(`DELETE ${f.status}: ${f.text.slice(0, 200)}`);
    },
    onSecond: (s, st) => {
      o.log(`${label}: ${s}/${seconds} s, ${d.routed} routed, ${st.outstanding} in flight, ${d.errors} errors`);
    },
  });
  d.wallMs = paced.wallMs;
  d.dropped = paced.dropped;
  return d;
}

/** Every replica's CPU rate over `seconds` with no traffic (after a settle, so the last point's frees and GC are past). */
async function measureIdle(replicas: readonly Replica[], seconds: number): Promise<IdleCpu[]> {
  await sleep(SETTLE_MS);
  const c0 = replicas.map((r) => threadCpu(r.pid));
  const t0 = performance.now();
  await sleep(seconds * 1000);
  const c1 = replicas.map((r) => threadCpu(r.pid));
  const ms = performance.now() - t0;
  return c1.map((c, i) => idleCpu(threadCpuDelta(c0[i] as ThreadCpu, c), ms));
}

const CLAMP_FLAGS = (c: ReplicaCpu): string => (c.marginal === undefined ? "" : `${c.marginal.mainClamped ? " main clamped at 0" : ""}${c.marginal.allClamped ? " all clamped at 0" : ""}`);

const scrape = async (r: Replica): Promise<MeshScrape> => parseMeshMetrics(await r.client.ok("GET", "/metrics"));

/** Starts the origin and K peers, measures every rate, stops them. */
export async function runHttpPoints(o: HttpRunOptions): Promise<ScalePoint[]> {
  const label = `K=${o.peers}`;
  o.log(`${label}: starting the origin and ${o.peers} peer${o.peers === 1 ? "" : "s"}${o.curve ? " (CURVE)" : ""}`);
  const keys = o.curve ? writeBenchCurveKeys(1 + o.peers) : null;
  const fleet = await ReplicaFleet.start({
    replicas: 1 + o.peers,
    mesh: true,
    serveArgs: scaleServeArgs(o, ["--no-kv-events", "--session-affinity-ttl-secs", String(AFFINITY_TTL_SECS)]),
    ...(keys === null ? {} : { serveArgsOf: (i: number) => keys.serveArgsOf(i) }),
    onLog: (i, line) => {
      o.log(`[${i === 0 ? "origin" : `peer ${i}`}] ${line}`);
    },
  }).catch((err: unknown) => {
    keys?.remove();
    throw err;
  });
  try {
    const [origin, ...peers] = fleet.replicas as [Replica, ...Replica[]];
    o.log(`${label}: registering ${o.workers} workers on each replica`);
    await Promise.all(fleet.replicas.map((r) => registerBenchWorkers(r.client, o.workers)));
    const ports = fleet.replicas.flatMap((r) => (r.syncPort === null ? [] : [r.syncPort, r.syncPort + 1]));
    const points: ScalePoint[] = [];
    for (const rate of o.rates) {
      let idle: IdleCpu[] | null = null;
      if (o.idleSeconds > 0) {
        o.log(`${label} ${rate}/s: idle window, ${o.idleSeconds} s with no traffic`);
        idle = await measureIdle(fleet.replicas, o.idleSeconds);
        o.log(`${label} ${rate}/s idle ms/s main / all: ${idle.map((c, i) => `${i === 0 ? "origin" : `peer ${i}`} ${c.mainMsPerS.toFixed(1)} / ${c.allMsPerS.toFixed(1)}`).join(", ")}`);
      }
      if (o.warmupSeconds > 0) {
        const w = await drive(origin, o, rate, o.warmupSeconds, `w${rate}-`, `${label} ${rate}/s warm-up`);
        if (w.errors > 0) throw new Error(`${label} warm-up at ${rate}/s: ${w.errors} errors, first: ${w.errorSample}`);
        await sleep(SETTLE_MS);
      }
      const m0 = await Promise.all(fleet.replicas.map(scrape));
      const b0 = connectionBytes(ports);
      const c0 = fleet.replicas.map((r) => threadCpu(r.pid));
      const g0 = process.cpuUsage();
      const d = await drive(origin, o, rate, o.seconds, `t${rate}-`, `${label} ${rate}/s`);
      const c1 = fleet.replicas.map((r) => threadCpu(r.pid));
      const g1 = process.cpuUsage(g0);
      const b1 = connectionBytes(ports);
      const m1 = await Promise.all(fleet.replicas.map(scrape));
      const cpu = c1.map((c, i) => replicaCpu(threadCpuDelta(c0[i] as ThreadCpu, c), d.routed, d.wallMs, idle?.[i] ?? null));
      const [originCpu, ...peerCpu] = cpu as [ReplicaCpu, ...ReplicaCpu[]];
      const windows = m1.map((m, i) => meshWindow(m0[i] as MeshScrape, m));
      const [ow, ...pw] = windows as [ReturnType<typeof meshWindow>, ...ReturnType<typeof meshWindow>[]];
      const bytes = bytesDelta(b0, b1);
      let all = 0;
      for (const v of bytes.byPort.values()) all += v.sent + v.received;
      const originSent = origin.syncPort === null ? 0 : (bytes.byPort.get(origin.syncPort)?.sent ?? 0);
      const n = Math.max(1, d.routed);
      const ratio = peerCpu.length === 0 ? null : peerCpu.reduce((s, c) => s + mirrorRatio(c.mainUs, originCpu.mainUs), 0) / peerCpu.length;
      const marginalRatio = originCpu.marginal === undefined ? null : meanMirrorRatio(peerCpu.flatMap((c) => (c.marginal === undefined ? [] : [c.marginal.mainUs])), originCpu.marginal.mainUs);
      if (idle !== null) {
        o.log(
          `${label} ${rate}/s marginal us/req main / all: ${cpu.map((c, i) => `${i === 0 ? "origin" : `peer ${i}`} ${c.marginal?.mainUs.toFixed(0) ?? "-"} / ${c.marginal?.allUs.toFixed(0) ?? "-"}${CLAMP_FLAGS(c)}`).join(", ")}; marginal ratio ${marginalRatio?.toFixed(3) ?? "-"}`,
        );
      }
      points.push({
        rate,
        peers: o.peers,
        routed: d.routed,
        achievedRatePerS: d.routed / o.seconds,
        windowMs: d.wallMs,
        errors: d.errors,
        errorSample: d.errorSample,
        droppedTicks: d.dropped,
        origin: originCpu,
        peerCpu,
        ratio,
        capacity: ratio === null ? [] : capacityCurve(ratio, MODEL_REPLICA_COUNTS).slice(1).map(([nn, x]) => ({ n: nn, x })),
        marginalRatio,
        marginalCapacity: marginalRatio === null ? [] : capacityCurve(marginalRatio, MODEL_REPLICA_COUNTS).slice(1).map(([nn, x]) => ({ n: nn, x })),
        meshBytes: {
          originSentPerRequest: originSent / n,
          perPeerPerRequest: peers.length === 0 ? null : originSent / n / peers.length,
          allPerRequest: all / n,
          connectionsOpened: bytes.opened,
          connectionsClosed: bytes.closed,
        },
        lag: lagQuantiles(pw),
        shed: ow.counters.shed,
        shedTotal: m1[0]?.counters.shed ?? 0,
        gaps: pw.reduce((s, w) => s + w.counters.gaps, 0),
        snapshotsInstalled: pw.reduce((s, w) => s + w.counters.snapshotsInstalled, 0),
        divergenceResyncs: pw.reduce((s, w) => s + w.counters.divergenceResyncs, 0),
        batchesSent: ow.counters.batchesSent,
        eventsSent: ow.counters.eventsSent,
        loadGeneratorCpuMs: (g1.user + g1.system) / 1000,
        machineLoad1m: loadavg()[0] ?? Number.NaN,
      });
    }
    return points;
  } finally {
    await fleet.stop();
    keys?.remove();
  }
}
