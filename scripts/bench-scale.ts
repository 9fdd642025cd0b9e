/**
 * npm run bench:scale — does a mesh of N replicas route N times the traffic of one?
 *
 * One origin replica (`kvmesh serve`, mesh on) routes --rate requests/s over HTTP:
 * select_and_reserve (session id, 14,000-token prompt, block size 64) + prefill_complete + free,
 * on --workers single-rank workers registered without KV events; --peers K passive peers (real
 * serve processes meshed with it) only mirror. Per routed request, over a window after a warm-up,
 * it prints the origin's and every peer's CPU on the main thread (the event loop: tid == pid in
 * /proc/<pid>/task) and on all threads, the mesh's TCP payload bytes (ss -tin on the replicas'
 * mesh ports, counted on the listening side), replication lag p50/p99 from the peers' lag
 * histograms, events shed by the origin, and the modelled capacity
 * N / (1 + (N-1) x peer_main / origin_main) for N = 2, 4, 8, 16 (scripts/lib/scale-model.ts).
 * Before each point's warm-up, --idle-seconds (5) with no traffic give every replica's idle CPU
 * rate (ms/s: GC, timers, heartbeats); the marginal cost per request is the window's CPU less that
 * rate x the window, over the requests, and the marginal capacity is the same model on marginal
 * main-thread costs (right for replicas at saturation, where a fixed rate per replica cancels).
 * K = 0 is the origin alone: its main-thread time should not grow with K.
 *
 * --stress: a fake origin in this process publishes synthetic bookings over the real mesh
 * sockets to one peer, raising the rate until the peer falls behind (scripts/lib/scale-stress-run.ts),
 * and reports the highest rate kept up with (lag p99 <= --lag-target-ms, 0 gaps, 0 shed) and the
 * peer's CPU there.
 *
 * --load-replication aggregate|exact (default aggregate) and --mesh-aggregate-interval-ms go to
 * every serve; with --stress they set what the fake origin speaks (aggregate: per-rank totals at
 * most once per interval, scripts/lib/aggregate-bookings.ts; exact: every booking's events). The
 * default label is `git describe` and the mode; the JSON records the mode and interval.
 *
 * --curve meshes every replica over CURVE, as the Kubernetes base does (deploy/k8s): each gets its
 * own key pair and every one lists all keys (scripts/lib/bench-curve-keys.ts); with --stress the
 * fake origin holds a listed key too.
 *
 * --label names the build measured; --compare FILE prints and plots another run's JSON beside
 * this one (measure the base build with --label before --json reports/bench-scale-before.json,
 * then the new one with --compare reports/bench-scale-before.json). --help lists every flag.
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";

import { DEFAULT_MESH_AGGREGATE_FLUSH_INTERVAL_MS } from "../mesh/publisher.js";
import { CLK_TCK } from "../src/bench/process-usage.js";
import { parseBenchScaleArgs } from "./lib/bench-scale-args.js";
import { runHttpPoints } from "./lib/scale-http-run.js";
import { capacitySvg, parseReport, pointsTable, stressTable, type ScaleReport, type ScalePoint, type StressResult } from "./lib/scale-report.js";
import { runStress } from "./lib/scale-stress-run.js";

const METHOD: readonly string[] = [
  "CPU: utime+stime from /proc/<pid>/task/<pid>/stat (main thread) and /proc/<pid>/stat (all threads, exited ones included), over the window, divided by the requests routed in it (stress: requests published); peers' figures are per replicated request",
  "mesh bytes: TCP payload (bytes_acked sent, bytes_received) of established connections on every replica's mesh XPUB and control ports, from `ss -tin`, counted on the listening side; 'origin out' is what the origin's XPUB sent to all its peers",
  "lag: kvmesh_mesh_replication_lag_seconds (publish-to-receive of batches and heartbeats) delta over the window, all peers, interpolated within buckets (1, 2, 5, 10, 20, 25 ms ...)",
  "capacity: N / (1 + (N-1) x r), r = mean over peers of peer main-thread us / origin main-thread us per request",
  "idle: every replica's CPU over --idle-seconds with no traffic, before each point's warm-up (stress: the peer's, once before the steps), as ms of CPU per second; the fixed part (GC, timers, heartbeats) that per-request figures include",
  "marginal: (CPU over the window - idle rate x window length) / requests, per replica and thread set, clamped at 0 (marked *); marginal capacity: the same model with r = mean over peers of peer marginal main / origin marginal main, which holds for replicas at saturation (an equal fixed rate per replica cancels out)",
];

function gitLabel(): string {
  try {
    return execFileSync("git", ["describe", "--always", "--dirty"], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim();
  } catch {
    return "current";
  }
}

const log = (line: string): void => {
  process.stderr.write(`${line}\n`);
};

const config = parseBenchScaleArgs(process.argv.slice(2), gitLabel());
const aggregateIntervalMs = config.meshAggregateIntervalMs ?? DEFAULT_MESH_AGGREGATE_FLUSH_INTERVAL_MS;
const modeText = config.loadReplication === "aggregate" ? `aggregate load replication every ${aggregateIntervalMs} ms` : "exact load replication";
log(`bench:scale (${config.label}): ${modeText}${config.curve ? ", CURVE mesh" : ""}, ${config.stress ? `stress, rates ${config.stressRates.join(",")}/s, ${config.stressStepSeconds} s each` : `rates ${config.rates.join(",")}/s, peers ${config.peerCounts.join(",")}, ${config.seconds} s per point after ${config.idleSeconds} s idle and ${config.warmupSeconds} s warm-up`}, ${config.workers} workers, CLK_TCK ${CLK_TCK}`);

const points: ScalePoint[] = [];
let stress: StressResult | null = null;
if (config.stress) {
  stress = await runStress({
    rates: config.stressRates,
    seconds: config.stressStepSeconds,
    warmupSeconds: config.warmupSeconds,
    idleSeconds: config.idleSeconds,
    workers: config.workers,
    lagTargetMs: config.lagTargetMs,
    retries: config.stressRetries,
    loadReplication: config.loadReplication,
    meshAggregateIntervalMs: config.meshAggregateIntervalMs,
    serveArgs: config.serveArgs,
    curve: config.curve,
    aggregateIntervalMs,
    log,
  });
} else {
  for (const peers of config.peerCounts) {
    points.push(
      ...(await runHttpPoints({
        peers,
        rates: config.rates,
        seconds: config.seconds,
        warmupSeconds: config.warmupSeconds,
        idleSeconds: config.idleSeconds,
        workers: config.workers,
        sessions: config.sessions,
        seed: config.seed,
        loadReplication: config.loadReplication,
        meshAggregateIntervalMs: config.meshAggregateIntervalMs,
        serveArgs: config.serveArgs,
        curve: config.curve,
        log,
      })),
    );
  }
}

const report: ScaleReport = {
  tool: "bench:scale",
  label: config.label,
  measuredAt: new Date().toISOString(),
  loadReplication: config.loadReplication,
  aggregateIntervalMs: config.loadReplication === "aggregate" ? aggregateIntervalMs : null,
  config: { ...config, meshAggregateIntervalMs: config.meshAggregateIntervalMs ?? null, clkTck: CLK_TCK },
  method: METHOD,
  points,
  stress,
};
const reports = [report];
reports.unshift(...config.compare.map((file) => parseReport(readFileSync(file, "utf8"), file)));

if (reports.some((r) => r.points.length > 0)) console.log(pointsTable(reports.filter((r) => r.points.length > 0)));
for (const r of reports) for (const p of r.points) if (p.errorSample !== "") console.log(`${r.label} ${p.rate}/s K=${p.peers}: first error: ${p.errorSample}`);
if (reports.some((r) => r.stress !== null)) console.log(stressTable(reports));
for (const m of METHOD) console.log(`- ${m}`);

mkdirSync(dirname(config.json), { recursive: true });
writeFileSync(config.json, `${JSON.stringify(report, (_, v: unknown) => (typeof v === "number" && !Number.isFinite(v) ? null : v), 2)}\n`);
console.log(`json: ${config.json}`);
if (reports.some((r) => r.points.some((p) => p.ratio !== null))) {
  mkdirSync(dirname(config.svg), { recursive: true });
  writeFileSync(config.svg, capacitySvg(reports));
  console.log(`plot: ${config.svg}`);
}
