/**
 * `kvmesh bench`: the same workload through several routing policies and replica counts, each run
 * against a fresh (cold) fleet of mock engines, reporting what the *engines* measured.
 */
import { seededRandom } from "../core/index.js";
import { descriptorsToWorkerRequests, type EngineFleetHandle } from "../mock/engine-fleet.js";
import type { TraceRecord } from "../mock/trace.js";
import { stringifyJson } from "../http/json.js";
import { mapLimited } from "./bounded.js";
import { DEFAULT_REGISTER_CONCURRENCY, ReplicaFleet } from "./replica-fleet.js";
import { replay, StickinessCounter, type ReplayProgress, type ReplayResult, type RequestSample } from "./replay-run.js";
import { metricSum } from "./router-client.js";
import { KvmeshPolicy, RandomPolicy, RoundRobinPolicy, workerKey, type PolicyName, type RoutingPolicy } from "./routing-policy.js";
import { histogramQuantile, mergeHistograms, scrapeHistogram, summarize } from "./stats.js";

/** Long enough that no session's binding expires inside a run (a run is minutes of wall time). */
export const BENCH_AFFINITY_TTL_SECS = 600;
/** Registered workers are schedulable, and their KV streams subscribed, within this long. */
export const WORKERS_READY_TIMEOUT_MS = 20_000;
/** Every replica subscribed to every engine's KV events within this long (ZeroMQ's slow joiner). */
export const SUBSCRIBE_TIMEOUT_MS = 20_000;

export interface BenchPlanEntry {
  readonly policy: PolicyName;
  readonly replicas: number;
}

export interface BenchOptions {
  readonly records: readonly TraceRecord[];
  readonly plan: readonly BenchPlanEntry[];
  readonly blockSize: number;
  readonly speedup: number;
  readonly durationMs: number;
  readonly seed: number;
  /** A fresh fleet per run: every policy starts from cold caches. */
  readonly startEngines: () => Promise<EngineFleetHandle>;
  readonly tokensOf: (rec: TraceRecord) => Uint32Array;
  /** false: routers are not told session ids (BenchCliConfig.sessionIds). */
  readonly routeSessionIds?: boolean;
  /** false: routers run --no-kv-events and engines register without KV endpoints (BenchCliConfig.kvEvents). */
  readonly kvEvents?: boolean;
  readonly serveArgs?: readonly string[];
  /** Wall ms added to each router call by the client (KvmeshPolicy delayMs): a slow network's round trip. */
  readonly clientDelayMs?: number;
  readonly onProgress?: (label: string, p: ReplayProgress) => void;
  readonly onLog?: (line: string) => void;
  /** Stops the current run's dispatching and skips the runs after it. */
  readonly signal?: AbortSignal;
}

/** One row of the report (`--json`): snake_case, as the issue and the HTTP API spell fields. */
export interface BenchRow {
  readonly policy: PolicyName;
  readonly replicas: number;
  /** Requests the run dispatched: the first `dispatched` records of the workload. */
  readonly dispatched: number;
  readonly requests: number;
  readonly failed: number;
  readonly hit_ratio: number;
  /**
   * The workload's ceilings over the same first `dispatched` requests (ceiling.ts): one cache of
   * the fleet's capacity, and an oracle router over per-worker caches; then hit_ratio as a share
   * of each. Absent when no ceiling was computed.
   */
  readonly ceiling_one_cache?: number;
  readonly ceiling_oracle?: number;
  readonly share_of_ceiling?: number;
  readonly share_of_oracle?: number;
  readonly stickiness: number | null;
  readonly ttft_p50_ms: number;
  readonly ttft_p99_ms: number;
  readonly select_p50_ms: number | null;
  readonly select_p99_ms: number | null;
  readonly lag_p50_ms: number | null;
  readonly lag_p99_ms: number | null;
  readonly shed: number;
  readonly wall_s: number;
  readonly failure_sample?: string;
}

/** --replicas 1,2,4 -> kvmesh x1, x2, x4; unmeshed x2, x4; round-robin; random. */
export function defaultPlan(replicaCounts: readonly number[], policies: readonly PolicyName[]): BenchPlanEntry[] {
  const plan: BenchPlanEntry[] = [];
  for (const policy of policies) {
    if (policy === "kvmesh") {
      for (const n of replicaCounts) plan.push({ policy, replicas: n });
    } else if (policy === "unmeshed") {
      // One unmeshed replica is the same router as one meshed replica: nothing to compare.
      for (const n of replicaCounts) if (n > 1) plan.push({ policy, replicas: n });
    } else {
      plan.push({ policy, replicas: 0 });
    }
  }
  return plan;
}

/** A worker registration as an engine that publishes no KV events makes it. */
function withoutKvEndpoints<T extends object>(w: T): Omit<T, "kv_events_endpoint" | "kv_events_endpoints" | "replay_endpoint"> {
  const out = { ...w } as Record<string, unknown>;
  delete out.kv_events_endpoint;
  delete out.kv_events_endpoints;
  delete out.replay_endpoint;
  return out as Omit<T, "kv_events_endpoint" | "kv_events_endpoints" | "replay_endpoint">;
}

/** Registers every engine on every replica and waits until each replica schedules them all. */
export async function registerEngines(fleet: ReplicaFleet, engines: EngineFleetHandle, blockSize: number, kvEvents = true): Promise<void> {
  const requests = descriptorsToWorkerRequests(engines.descriptors, { blockSize });
  // Without KV events the engines are registered as ones that publish none.
  const bodies = requests.map((w) => stringifyJson(kvEvents ? w : withoutKvEndpoints(w)));
  for (const r of fleet.replicas) {
    await mapLimited(bodies, DEFAULT_REGISTER_CONCURRENCY, async (body) => {
      await r.client.ok("POST", "/workers", body);
    });
  }
  const deadline = performance.now() + WORKERS_READY_TIMEOUT_MS;
  for (const r of fleet.replicas) {
    for (;;) {
      const res = await r.client.send("GET", "/ready");
      const body = JSON.parse(res.text) as { schedulable_workers?: number };
      if (res.status === 200 && body.schedulable_workers === bodies.length) break;
      if (performance.now() > deadline) throw new Error(`replica ${String(r.index)} not ready with ${String(bodies.length)} workers: ${res.text}`);
      await sleep(50);
    }
  }
  // Events published before a replica's SUB joins would only be repaired through replay, whose
  // history is bounded: start the traffic once every replica listens to every engine.
  if (!kvEvents) return;
  await engines.waitForSubscribers(fleet.replicas.length, SUBSCRIBE_TIMEOUT_MS);
}

export async function runBench(opts: BenchOptions): Promise<BenchRow[]> {
  const rows: BenchRow[] = [];
  for (const [i, entry] of opts.plan.entries()) {
    if (opts.signal?.aborted === true) break;
    rows.push(await runOne(opts, entry, i));
  }
  return rows;
}

export function labelOf(entry: BenchPlanEntry): string {
  return entry.policy === "kvmesh" || entry.policy === "unmeshed" ? `${entry.policy} x${String(entry.replicas)}` : entry.policy;
}

async function runOne(opts: BenchOptions, entry: BenchPlanEntry, runIndex: number): Promise<BenchRow> {
  const engines = await opts.startEngines();
  let fleet: ReplicaFleet | undefined;
  try {
    let policy: RoutingPolicy;
    if (entry.policy === "kvmesh" || entry.policy === "unmeshed") {
      fleet = await ReplicaFleet.start({
        replicas: entry.replicas,
        mesh: entry.policy === "kvmesh" && entry.replicas > 1,
        serveArgs: ["--session-affinity-ttl-secs", String(BENCH_AFFINITY_TTL_SECS), ...(opts.kvEvents === false ? ["--no-kv-events"] : []), ...(opts.serveArgs ?? [])],
        onLog: (r, line) => opts.onLog?.(`[replica ${String(r)}] ${line}`),
      });
      await registerEngines(fleet, engines, opts.blockSize, opts.kvEvents !== false);
      const index = new Map(engines.descriptors.map((d, k) => [workerKey(d.workerId, d.dpRank), k]));
      policy = new KvmeshPolicy(
        fleet.replicas.map((r) => r.client),
        index,
        undefined,
        opts.clientDelayMs ?? 0,
      );
    } else if (entry.policy === "round-robin") {
      policy = new RoundRobinPolicy(engines.descriptors.length);
    } else {
      policy = new RandomPolicy(engines.descriptors.length, seededRandom(opts.seed));
    }
    const label = labelOf(entry);
    const result = await replay({
      records: opts.records,
      policy,
      engines,
      speedup: opts.speedup,
      durationMs: opts.durationMs,
      idPrefix: `r${String(runIndex)}-`,
      tokensOf: opts.tokensOf,
      ...(opts.routeSessionIds === undefined ? {} : { routeSessionIds: opts.routeSessionIds }),
      onProgress: (p) => opts.onProgress?.(label, p),
      ...(opts.signal === undefined ? {} : { signal: opts.signal }),
    });
    const mesh = fleet === undefined ? undefined : await scrapeMesh(fleet);
    return toRow(entry, result, mesh);
  } finally {
    await fleet?.stop();
    await engines.close();
  }
}

export interface MeshFigures {
  lagP50Ms: number;
  lagP99Ms: number;
  shed: number;
}

/** Replication lag over every replica's histogram, and events shed by their bounded queues. */
export async function scrapeMesh(fleet: ReplicaFleet): Promise<MeshFigures> {
  let lag = { leMs: [] as number[], cum: [] as number[] };
  let shed = 0;
  for (const r of fleet.replicas) {
    const text = await r.client.ok("GET", "/metrics");
    lag = mergeHistograms(lag, scrapeHistogram(text, "kvmesh_mesh_replication_lag_seconds"));
    shed += metricSum(text, "kvmesh_mesh_events_shed_total") + metricSum(text, "kvmesh_parked_bindings_shed_total");
  }
  return { lagP50Ms: histogramQuantile(lag.leMs, lag.cum, 0.5), lagP99Ms: histogramQuantile(lag.leMs, lag.cum, 0.99), shed };
}

/** Engine-measured hit ratio (cached / prompt tokens) and session stickiness of a run's requests. */
export function sampleFigures(samples: readonly RequestSample[]): { hitRatio: number; stickiness: number | null } {
  let prompt = 0;
  let cached = 0;
  const sticky = new StickinessCounter();
  for (const s of samples) {
    prompt += s.promptTokens;
    cached += s.cachedTokens;
    sticky.observe(s.sessionId, s.worker);
  }
  return { hitRatio: prompt === 0 ? 0 : cached / prompt, stickiness: Number.isNaN(sticky.value) ? null : sticky.value };
}

function toRow(entry: BenchPlanEntry, r: ReplayResult, mesh: MeshFigures | undefined): BenchRow {
  const t = summarize(r.samples.map((s) => s.ttftMs));
  const select = r.samples.filter((s) => s.replica >= 0).map((s) => s.selectMs);
  const sel = select.length === 0 ? undefined : summarize(select);
  const { hitRatio, stickiness } = sampleFigures(r.samples);
  const finite = (v: number | undefined): number | null => (v === undefined || !Number.isFinite(v) ? null : v);
  const row: BenchRow = {
    policy: entry.policy,
    replicas: entry.replicas,
    dispatched: r.dispatched,
    requests: r.samples.length,
    failed: r.failed,
    hit_ratio: hitRatio,
    stickiness,
    ttft_p50_ms: t.p50,
    ttft_p99_ms: t.p99,
    select_p50_ms: finite(sel?.p50),
    select_p99_ms: finite(sel?.p99),
    lag_p50_ms: finite(mesh?.lagP50Ms),
    lag_p99_ms: finite(mesh?.lagP99Ms),
    shed: mesh?.shed ?? 0,
    wall_s: r.wallMs / 1000,
  };
  return r.failureSample === "" ? row : { ...row, failure_sample: r.failureSample };
}


const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
