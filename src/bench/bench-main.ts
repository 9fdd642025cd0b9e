/** The work behind `kvmesh bench` and `kvmesh demo`: load the workload, run, print and draw. */
import { mkdir, writeFile } from "node:fs/promises";
import { dirname } from "node:path";
import type { EngineFleetHandle } from "../mock/engine-fleet.js";
import { EngineHostGroup } from "../mock/engine-host-client.js";
import { generateSessions } from "../mock/session-workload.js";
import { promptTokensFor } from "../mock/token-blocks.js";
import { readTrace, type TraceRecord } from "../mock/trace.js";
import type { BenchCliConfig, DemoCliConfig, EngineFleetConfig } from "./bench-config.js";
import { defaultPlan, registerEngines, runBench, sampleFigures, scrapeMesh, BENCH_AFFINITY_TTL_SECS, type BenchRow } from "./fleet-bench.js";
import { KvmeshPolicy, workerKey } from "./routing-policy.js";
import { ReplicaFleet } from "./replica-fleet.js";
import { replay, type ReplayProgress } from "./replay-run.js";
import { benchSvg, benchTable, benchVerdict, withCeilings } from "./report.js";
import { ttftTimingArgs } from "./ttft-timing-args.js";
import { ceilingRequestsOf, simulateCeiling, type CeilingCurve, type CeilingFigures } from "./ceiling.js";

export interface BenchIo {
  readonly out: (text: string) => void;
  readonly err: (text: string) => void;
  /** Set when the user asks to stop (Ctrl-C): dispatching ends and the run reports what it has. */
  readonly signal?: AbortSignal;
}

/**
 * Engines run in host processes (one per 256 by default), not in the driver: the driver's event
 * loop then only builds requests and talks HTTP, so its own stalls do not show up as engine TTFT.
 */
export function startEngines(cfg: EngineFleetConfig, subscribers: number): Promise<EngineFleetHandle> {
  return EngineHostGroup.spawn({
    hosts: Math.min(cfg.engineHosts, cfg.workers),
    engines: cfg.workers,
    blockSize: cfg.blockSize,
    kvBlocks: cfg.kvBlocks,
    speedup: cfg.speedup,
    expectedSubscribers: Math.max(1, subscribers),
  });
}

const tokensOf = (rec: TraceRecord): Uint32Array => promptTokensFor(rec.hash_ids, rec.input_length);

async function loadWorkload(cfg: BenchCliConfig): Promise<TraceRecord[]> {
  const rate = cfg.rate ?? 1;
  if (cfg.workload.kind === "trace") {
    const records = await readTrace(cfg.workload.path, cfg.workload.limit === undefined ? {} : { limit: cfg.workload.limit });
    return rate === 1 ? records : records.map((r) => ({ ...r, timestamp: r.timestamp / rate }));
  }
  // Sessions start `rate` times closer together (a session's turns still wait for its answers).
  const gap = arrivalGapMs(cfg.workload.sessions, cfg);
  const records = generateSessions({ seed: cfg.seed, sessions: cfg.workload.sessions, ...(gap === undefined ? {} : { sessionArrivalMs: gap }) });
  return rate === 1 ? records : records.map((r) => ({ ...r, timestamp: r.timestamp / rate }));
}

/**
 * Sessions start over the first half of a run's trace time (duration x speedup), so a run sees
 * sessions starting, conversing and ending at a steady rate instead of all arriving in a burst.
 * With no duration (a demo until Ctrl-C) they arrive at the generator's default pace.
 */
export const SESSION_ARRIVAL_SHARE = 0.5;
function arrivalGapMs(sessions: number, cfg: EngineFleetConfig): number | undefined {
  if (cfg.durationSecs === 0) return undefined;
  return (cfg.durationSecs * 1000 * cfg.speedup * SESSION_ARRIVAL_SHARE) / sessions;
}

function progressLine(label: string, p: ReplayProgress): string {
  const hit = Number.isNaN(p.hitRatio) ? "-" : `${(100 * p.hitRatio).toFixed(1)}%`;
  const sticky = Number.isNaN(p.stickiness) ? "-" : p.stickiness.toFixed(3);
  return `[${label}] ${(p.elapsedMs / 1000).toFixed(0)}s  sent ${String(p.dispatched)}  done ${String(p.completed)}  in flight ${String(p.inFlight)}  failed ${String(p.failed)}  hit ${hit}  stickiness ${sticky}`;
}

export async function runBenchMain(cfg: BenchCliConfig, io: BenchIo): Promise<number> {
  const records = await loadWorkload(cfg);
  if (records.length === 0) {
    io.err("kvmesh bench: the workload is empty\n");
    return 1;
  }
  const plan = defaultPlan(cfg.replicas, cfg.policies);
  const traceSecs = ((records[records.length - 1] as TraceRecord).timestamp - (records[0] as TraceRecord).timestamp) / 1000;
  const extras = `${cfg.rate === undefined || cfg.rate === 1 ? "" : `, arrivals x${String(cfg.rate)}`}${cfg.costModel === undefined ? "" : `, cost model ${cfg.costModel}`}${cfg.clientDelayMs ? `, client delay ${String(cfg.clientDelayMs)} ms a call` : ""}`;
  io.err(`kvmesh bench: ${String(records.length)} requests${extras}, ${traceSecs.toFixed(0)} s of trace time at speedup ${String(cfg.speedup)} (at most ${String(cfg.durationSecs)} s per run), ${String(cfg.workers)} engines, ${String(plan.length)} runs\n`);
  const maxReplicas = Math.max(1, ...cfg.replicas);
  const rows: BenchRow[] = await runBench({
    records,
    plan,
    blockSize: cfg.blockSize,
    speedup: cfg.speedup,
    durationMs: cfg.durationSecs * 1000,
    seed: cfg.seed,
    startEngines: () => startEngines(cfg, maxReplicas),
    tokensOf,
    ...(cfg.sessionIds === undefined ? {} : { routeSessionIds: cfg.sessionIds }),
    ...(cfg.costModel === undefined ? {} : { serveArgs: ["--cost-model", cfg.costModel, ...(cfg.costModel === "ttft" ? ttftTimingArgs(cfg.speedup) : [])] }),
    ...(cfg.clientDelayMs === undefined ? {} : { clientDelayMs: cfg.clientDelayMs }),
    ...(cfg.kvEvents === false ? { kvEvents: false } : {}),
    onProgress: (label, p) => {
      io.err(progressLine(label, p) + "\n");
    },
    onLog: (line) => {
      io.err(line + "\n");
    },
    ...(io.signal === undefined ? {} : { signal: io.signal }),
  });
  const ceiling = ceilingOf(cfg, records, rows);
  const shown = ceiling === undefined ? rows : withCeilings(rows, (n) => ceiling.at(n));
  io.out(benchTable(shown) + "\n");
  if (ceiling !== undefined) io.out(ceilingLine(ceiling.at()) + "\n");
  for (const line of benchVerdict(shown)) io.out(line + "\n");
  const title = `kvmesh bench: ${cfg.workload.kind === "trace" ? cfg.workload.path.split("/").pop() ?? "trace" : `${String(cfg.workload.sessions)} sessions`}, ${String(cfg.workers)} engines, speedup ${String(cfg.speedup)}`;
  await writeOut(cfg.svgPath, benchSvg(shown, title));
  io.err(`chart: ${cfg.svgPath}\n`);
  if (cfg.jsonPath !== undefined) {
    await writeOut(cfg.jsonPath, JSON.stringify({ config: { ...cfg }, rows: shown }, null, 2) + "\n");
    io.err(`rows: ${cfg.jsonPath}\n`);
  }
  return rows.every((r) => r.requests > 0) ? 0 : 1;
}

/**
 * The workload's ceilings over the longest prefix any run dispatched (each row then reads its own
 * prefix): offline, deterministic, with the engines' block size and capacity.
 */
function ceilingOf(cfg: BenchCliConfig, records: readonly TraceRecord[], rows: readonly BenchRow[]): CeilingCurve | undefined {
  const n = Math.max(0, ...rows.map((r) => r.dispatched));
  if (n === 0) return undefined;
  return simulateCeiling(ceilingRequestsOf(records.slice(0, n), cfg.blockSize, tokensOf), { workers: cfg.workers, blockSize: cfg.blockSize, kvBlocks: cfg.kvBlocks });
}

function ceilingLine(c: CeilingFigures): string {
  const skipped = c.skipped === 0 ? "" : ` (${String(c.skipped)} left out: larger than one engine's cache)`;
  return `ceiling over the first ${String(c.requests + c.skipped)} requests${skipped}: one cache of the fleet's capacity ${(100 * c.oneCache).toFixed(2)}%, oracle router over per-worker caches ${(100 * c.oracle).toFixed(2)}% (simulated, deterministic)`;
}

async function writeOut(path: string, text: string): Promise<void> {
  await mkdir(dirname(path), { recursive: true });
  await writeFile(path, text);
}

/** Live figures the demo prints every DEMO_SUMMARY_INTERVAL_MS. */
export const DEMO_SUMMARY_INTERVAL_MS = 2_000;

export async function runDemoMain(cfg: DemoCliConfig, io: BenchIo): Promise<number> {
  const gap = arrivalGapMs(cfg.sessions, cfg);
  const records = generateSessions({ seed: cfg.seed, sessions: cfg.sessions, ...(gap === undefined ? {} : { sessionArrivalMs: gap }) });
  const traceSecs = ((records[records.length - 1]?.timestamp ?? 0) - (records[0]?.timestamp ?? 0)) / 1000;
  io.err(`kvmesh demo: ${String(cfg.replicas)} meshed replicas, ${String(cfg.workers)} mock engines, ${String(cfg.sessions)} sessions (${String(records.length)} turns, ${(traceSecs / cfg.speedup).toFixed(0)} s at speedup ${String(cfg.speedup)})\n`);
  const engines = await startEngines(cfg, cfg.replicas);
  let fleet: ReplicaFleet | undefined;
  try {
    fleet = await ReplicaFleet.start({
      replicas: cfg.replicas,
      mesh: cfg.replicas > 1,
      serveArgs: ["--session-affinity-ttl-secs", String(BENCH_AFFINITY_TTL_SECS)],
      onLog: (r, line) => {
        io.err(`[replica ${String(r)}] ${line}\n`);
      },
    });
    for (const r of fleet.replicas) io.err(`replica ${String(r.index)}: http://127.0.0.1:${String(r.port)}${r.syncPort === null ? "" : `  mesh tcp://127.0.0.1:${String(r.syncPort)}`}\n`);
    await registerEngines(fleet, engines, cfg.blockSize);
    const index = new Map(engines.descriptors.map((d, k) => [workerKey(d.workerId, d.dpRank), k]));
    const policy = new KvmeshPolicy(
      fleet.replicas.map((r) => r.client),
      index,
    );
    const live = fleet;
    let lagP99 = Number.NaN;
    let shed = 0;
    let last = 0;
    const result = await replay({
      records,
      policy,
      engines,
      speedup: cfg.speedup,
      durationMs: cfg.durationSecs === 0 ? Number.POSITIVE_INFINITY : cfg.durationSecs * 1000,
      idPrefix: "demo-",
      tokensOf,
      ...(io.signal === undefined ? {} : { signal: io.signal }),
      onProgress: (p) => {
        if (p.elapsedMs - last < DEMO_SUMMARY_INTERVAL_MS) return;
        last = p.elapsedMs;
        void scrapeMesh(live).then(
          (m) => {
            lagP99 = m.lagP99Ms;
            shed = m.shed;
          },
          () => undefined,
        );
        const lag = Number.isNaN(lagP99) ? "-" : `${lagP99.toFixed(1)} ms`;
        io.out(`${progressLine(`${String(cfg.replicas)} replicas`, p)}  lag p99 ${lag}  shed ${String(shed)}\n`);
      },
    });
    const final = await scrapeMesh(fleet);
    const { hitRatio, stickiness } = sampleFigures(result.samples);
    io.out(
      `done: ${String(result.samples.length)} requests, ${String(result.failed)} failed, engine-measured hit ratio ${(100 * hitRatio).toFixed(2)}%, stickiness ${stickiness === null ? "-" : stickiness.toFixed(4)}, lag p99 ${Number.isNaN(final.lagP99Ms) ? "-" : `${final.lagP99Ms.toFixed(1)} ms`}, shed ${String(final.shed)}\n`,
    );
    if (result.failureSample !== "") io.err(`first failure: ${result.failureSample}\n`);
    return result.failed === 0 ? 0 : 1;
  } finally {
    await fleet?.stop();
    await engines.close();
  }
}
