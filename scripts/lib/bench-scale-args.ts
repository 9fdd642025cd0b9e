/**
 * Command line of `npm run bench:scale` (commander; --help lists every flag with its default).
 * Pure: parsing only, so the unit test runs it without daemons.
 */
import { Command, InvalidArgumentError, Option } from "commander";

import { integerInRange, parseList, parseNonEmpty, parseNonNegativeNumber } from "../../cli/parsers.js";
import { LOAD_REPLICATION_MODES, type LoadReplication } from "../../src/core/index.js";

export const DEFAULT_RATES: readonly number[] = [100, 200];
export const DEFAULT_PEER_COUNTS: readonly number[] = [0, 1, 3];
export const DEFAULT_SECONDS = 10;
export const DEFAULT_WARMUP_SECONDS = 2;
/**
 * Seconds of no traffic measured before each point's warm-up (--stress: once before the steps):
 * every replica's idle CPU rate, taken out of the window's CPU for the marginal cost per request.
 */
export const DEFAULT_IDLE_SECONDS = 5;
export const DEFAULT_WORKERS = 1_024;
/** Session slots of the multi-turn workload; 200 sustain ~300 turns/s (bench-workload.ts timings). */
export const DEFAULT_SESSION_SLOTS = 200;
export const DEFAULT_JSON = "reports/bench-scale.json";
export const DEFAULT_STRESS_JSON = "reports/bench-scale-stress.json";
export const DEFAULT_SVG = "reports/bench-scale.svg";
/**
 * Stress steps, replicated requests/s: about x1.4 apart, so the highest rate kept is within 40% of
 * the true limit, and a design that keeps up with 10,000/s (the target) is seen to.
 */
export const DEFAULT_STRESS_RATES: readonly number[] = [500, 700, 1_000, 1_400, 2_000, 2_800, 4_000, 5_600, 8_000, 11_000, 16_000, 22_000, 32_000, 45_000];
/**
 * The same in aggregate load replication, on to 100,000/s: a peer's cost there follows the
 * aggregation interval (plus the booking ids it indexes), not the request rate.
 */
export const DEFAULT_AGGREGATE_STRESS_RATES: readonly number[] = [...DEFAULT_STRESS_RATES, 64_000, 100_000];
export const DEFAULT_STRESS_SECONDS = 5;
/**
 * Measured seconds of all stress steps together: each step's --stress-seconds is cut to fit (a run
 * of every default step then stays under ~2 minutes with start-up), never below MIN_STRESS_STEP_SECONDS.
 */
export const STRESS_BUDGET_SECONDS = 90;
/** What a step costs besides its measured seconds: the drain pause, catch-up poll and scrapes, s. */
export const STRESS_STEP_OVERHEAD_SECONDS = 1.2;
export const MIN_STRESS_STEP_SECONDS = 1;
export const DEFAULT_LOAD_REPLICATION: LoadReplication = "aggregate";
/** The daemon's --mesh-aggregate-interval-ms bound (cli/serve.ts). */
export const MAX_AGGREGATE_INTERVAL_MS = 1_000;
/**
 * A failed stress step is measured once more before the run ends: on a shared 2-core machine a
 * neighbour's burst can hold the peer off the CPU for 10-20 ms, which alone breaks a 20 ms p99.
 */
export const DEFAULT_STRESS_RETRIES = 1;
/** The keeping-up criterion: lag p99 at or under this, with 0 gaps and 0 shed. */
export const DEFAULT_LAG_TARGET_MS = 20;

/** One bench process on 2 cores: more replicas than this only measure contention. */
const MAX_PEERS = 15;
const MAX_WORKERS = 4_096;
const MAX_RATE = 1_000_000;
const MAX_SECONDS = 3_600;

export interface BenchScaleConfig {
  readonly rates: readonly number[];
  readonly peerCounts: readonly number[];
  readonly seconds: number;
  readonly warmupSeconds: number;
  /** Idle window before each point (stress: before the steps), s; 0 = none, no marginal figures. */
  readonly idleSeconds: number;
  readonly workers: number;
  readonly sessions: number;
  readonly seed: number;
  readonly json: string;
  readonly svg: string;
  readonly label: string;
  /** Previous runs' JSON files, printed and plotted before this run. */
  readonly compare: readonly string[];
  readonly stress: boolean;
  readonly stressRates: readonly number[];
  readonly stressSeconds: number;
  /** Measured seconds of each stress step: stressSeconds, cut so every step fits STRESS_BUDGET_SECONDS. */
  readonly stressStepSeconds: number;
  readonly stressRetries: number;
  readonly lagTargetMs: number;
  /** Passed to every `kvmesh serve` (--load-replication); --stress: what the fake origin speaks. */
  readonly loadReplication: LoadReplication;
  /** --mesh-aggregate-interval-ms for every serve and the fake origin; undefined = the daemon's default. */
  readonly meshAggregateIntervalMs: number | undefined;
  /** --serve-args: more `kvmesh serve` flags for every replica, after the bench's own (a design variant to measure). */
  readonly serveArgs: readonly string[];
  /** --curve: every replica (and the stress fake origin) meshes over CURVE, each with its own key, all listing all. */
  readonly curve: boolean;
}

/** Each stress step's measured seconds: `seconds`, or less so that `steps` steps fit the budget. */
export function stressStepSeconds(steps: number, seconds: number): number {
  const fit = Math.floor((STRESS_BUDGET_SECONDS / Math.max(1, steps) - STRESS_STEP_OVERHEAD_SECONDS) * 10) / 10;
  return Math.min(seconds, Math.max(MIN_STRESS_STEP_SECONDS, fit));
}

/** The `kvmesh serve` flags of every replica of a bench:scale run (origin and peers alike): `extra`, then the load replication ones. */
export function scaleServeArgs(o: Pick<BenchScaleConfig, "loadReplication" | "meshAggregateIntervalMs" | "serveArgs">, extra: readonly string[] = []): string[] {
  return [
    ...extra,
    "--load-replication",
    o.loadReplication,
    ...(o.meshAggregateIntervalMs === undefined ? [] : ["--mesh-aggregate-interval-ms", String(o.meshAggregateIntervalMs)]),
    ...o.serveArgs,
  ];
}

function intList(min: number, max: number): (value: string) => number[] {
  const one = integerInRange(min, max);
  return (value: string): number[] => {
    const list = [...new Set(parseList(value).map((v) => one(v)))];
    return list.sort((a, b) => a - b);
  };
}

function positiveSeconds(value: string): number {
  const n = parseNonNegativeNumber(value);
  if (n === 0 || n > MAX_SECONDS) throw new InvalidArgumentError(`must be > 0 and <= ${MAX_SECONDS}`);
  return n;
}

function nonNegativeSeconds(value: string): number {
  const n = parseNonNegativeNumber(value);
  if (n > MAX_SECONDS) throw new InvalidArgumentError(`must be <= ${MAX_SECONDS}`);
  return n;
}

function positiveNumber(value: string): number {
  const n = parseNonNegativeNumber(value);
  if (n === 0) throw new InvalidArgumentError("must be > 0");
  return n;
}

export function benchScaleCommand(): Command {
  return new Command("bench:scale")
    .description(
      "Scale-out: per routed request, the origin's and each passive peer's CPU (main thread, all threads), mesh bytes, lag and shed, and the modelled capacity of N replicas; --stress: the highest replicated rate a peer keeps up with",
    )
    .addOption(new Option("--rate <list>", "routed requests/s, comma-separated").argParser(intList(1, MAX_RATE)).default([...DEFAULT_RATES], DEFAULT_RATES.join(",")))
    .addOption(new Option("--peers <list>", "passive peer counts K, comma-separated (0 = the origin alone)").argParser(intList(0, MAX_PEERS)).default([...DEFAULT_PEER_COUNTS], DEFAULT_PEER_COUNTS.join(",")))
    .addOption(new Option("--seconds <s>", "measured seconds per point").argParser(positiveSeconds).default(DEFAULT_SECONDS))
    .addOption(new Option("--warmup <s>", "unmeasured seconds of the same traffic before each point").argParser(nonNegativeSeconds).default(DEFAULT_WARMUP_SECONDS))
    .addOption(
      new Option("--idle-seconds <s>", "seconds with no traffic before each point's warm-up (--stress: once before the steps): every replica's idle CPU rate, for the marginal cost per request (0: not measured)")
        .argParser(nonNegativeSeconds)
        .default(DEFAULT_IDLE_SECONDS),
    )
    .addOption(new Option("--workers <n>", "single-rank workers registered on every replica (block size 64, no KV events)").argParser(integerInRange(1, MAX_WORKERS)).default(DEFAULT_WORKERS))
    .addOption(new Option("--sessions <n>", "session slots of the multi-turn workload").argParser(integerInRange(1, 100_000)).default(DEFAULT_SESSION_SLOTS))
    .addOption(new Option("--seed <n>", "workload seed").argParser(integerInRange(1, 0x7fff_ffff)).default(1))
    .addOption(new Option("--json <file>", `results [default: ${DEFAULT_JSON}, with --stress ${DEFAULT_STRESS_JSON}]`).argParser(parseNonEmpty))
    .addOption(new Option("--svg <file>", "capacity against N, every measured point (and --compare's)").argParser(parseNonEmpty).default(DEFAULT_SVG))
    .addOption(new Option("--label <name>", "names the design measured, in the table, JSON and plot [default: git describe and the load replication mode]").argParser(parseNonEmpty))
    .addOption(new Option("--compare <files>", "previous runs' JSON (e.g. other builds'), comma-separated: printed beside this run and plotted with it").argParser((v) => parseList(v).map((f) => parseNonEmpty(f))))
    .addOption(new Option("--stress", "a fake origin in this process publishes synthetic bookings over the mesh sockets to one real peer, raising the rate until the peer falls behind").default(false))
    .addOption(new Option("--stress-rates <list>", "replicated requests/s, tried in order until one fails [default: 500,700,...,45000; aggregate: on to 64000,100000]").argParser(intList(1, MAX_RATE)))
    .addOption(new Option("--stress-seconds <s>", `measured seconds per stress step (cut so all steps take at most ${STRESS_BUDGET_SECONDS} s)`).argParser(positiveSeconds).default(DEFAULT_STRESS_SECONDS))
    .addOption(new Option("--stress-retries <n>", "a failed stress step is measured again this many times before the run ends").argParser(integerInRange(0, 10)).default(DEFAULT_STRESS_RETRIES))
    .addOption(new Option("--lag-target-ms <ms>", "keeping up: lag p99 at or under this, 0 gaps, 0 shed").argParser(positiveNumber).default(DEFAULT_LAG_TARGET_MS))
    .addOption(
      new Option("--load-replication <mode>", "every serve's --load-replication; --stress: what the fake origin speaks (aggregate: per-rank totals per interval; exact: every booking)")
        .choices(LOAD_REPLICATION_MODES)
        .default(DEFAULT_LOAD_REPLICATION),
    )
    .addOption(new Option("--mesh-aggregate-interval-ms <ms>", "every serve's --mesh-aggregate-interval-ms, and the fake origin's flush spacing in aggregate mode [default: the daemon's, 10]").argParser(integerInRange(0, MAX_AGGREGATE_INTERVAL_MS)))
    .addOption(new Option("--curve", "mesh over CURVE (as the Kubernetes base does): each replica gets its own key pair, and every replica lists every key").default(false))
    .addOption(new Option("--serve-args <flags>", 'more `kvmesh serve` flags for every replica, space-separated (e.g. "--no-mesh-receive-thread"); a bad flag fails the first serve with its usage error').default(""));
}

interface RawOptions {
  rate: number[];
  peers: number[];
  seconds: number;
  warmup: number;
  idleSeconds: number;
  workers: number;
  sessions: number;
  seed: number;
  json?: string;
  svg: string;
  label?: string;
  compare?: string[];
  stress: boolean;
  stressRates?: number[];
  stressSeconds: number;
  stressRetries: number;
  lagTargetMs: number;
  loadReplication: LoadReplication;
  meshAggregateIntervalMs?: number;
  serveArgs: string;
  curve: boolean;
}

/** `argv`: the user's arguments (no node, no script). Throws commander's error on bad input when `cmd` has exitOverride. */
export function parseBenchScaleArgs(argv: readonly string[], defaultLabel: string, cmd: Command = benchScaleCommand()): BenchScaleConfig {
  cmd.parse([...argv], { from: "user" });
  const o = cmd.opts<RawOptions>();
  const stressRates = o.stressRates ?? [...(o.loadReplication === "aggregate" ? DEFAULT_AGGREGATE_STRESS_RATES : DEFAULT_STRESS_RATES)];
  return {
    rates: o.rate,
    peerCounts: o.peers,
    seconds: o.seconds,
    warmupSeconds: o.warmup,
    idleSeconds: o.idleSeconds,
    workers: o.workers,
    sessions: o.sessions,
    seed: o.seed,
    json: o.json ?? (o.stress ? DEFAULT_STRESS_JSON : DEFAULT_JSON),
    svg: o.svg,
    label: o.label ?? `${defaultLabel} ${o.loadReplication}${o.curve ? " curve" : ""}`,
    compare: o.compare ?? [],
    stress: o.stress,
    stressRates,
    stressSeconds: o.stressSeconds,
    stressStepSeconds: stressStepSeconds(stressRates.length, o.stressSeconds),
    stressRetries: o.stressRetries,
    lagTargetMs: o.lagTargetMs,
    loadReplication: o.loadReplication,
    meshAggregateIntervalMs: o.meshAggregateIntervalMs,
    serveArgs: o.serveArgs.split(" ").filter((a) => a !== ""),
    curve: o.curve,
  };
}
