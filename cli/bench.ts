/**
 * `kvmesh bench`: replay a trace (or generated sessions) through kvmesh with 1..N meshed replicas,
 * N unmeshed replicas, round-robin and random, against mock engines, and report what the engines
 * measured. `kvmesh demo`: a small meshed fleet with a live summary (the README's first command).
 */
import { InvalidArgumentError, Option, type Command } from "commander";
import { POLICY_NAMES, type PolicyName } from "../src/bench/routing-policy.js";
import { DEFAULT_BENCH_CONFIG, DEFAULT_DEMO_CONFIG, type BenchCliConfig, type DemoCliConfig } from "../src/bench/bench-config.js";
import { COST_MODELS, type CostModel } from "../src/core/index.js";
import { integerInRange, parseList, parseNonEmpty, parseNonNegativeNumber } from "./parsers.js";

export interface BenchDeps {
  readonly runBench: (config: BenchCliConfig) => Promise<number>;
  readonly runDemo: (config: DemoCliConfig) => Promise<number>;
  readonly exit: (code: number) => void;
}

/** Most replicas or engines a one-machine bench sensibly runs (each replica is a process). */
const MAX_REPLICAS = 16;
const MAX_WORKERS = 4_096;
const MAX_SESSIONS = 1_000_000;
const MAX_DURATION_SECS = 86_400;
/** A client delay beyond a minute a call would only time the bench out (DEFAULT_ROUTER_TIMEOUT_MS is 30 s). */
const MAX_CLIENT_DELAY_MS = 10_000;

function parseReplicaList(value: string): number[] {
  const parse = integerInRange(1, MAX_REPLICAS);
  const list = parseList(value).map((v) => parse(v));
  if (list.length === 0) throw new InvalidArgumentError("must list at least one replica count");
  return [...new Set(list)].sort((a, b) => a - b);
}

function parsePolicyList(value: string): PolicyName[] {
  const list = parseList(value);
  for (const p of list) if (!(POLICY_NAMES as readonly string[]).includes(p)) throw new InvalidArgumentError(`unknown policy "${p}" (one of ${POLICY_NAMES.join(", ")})`);
  if (list.length === 0) throw new InvalidArgumentError("must list at least one policy");
  return [...new Set(list)] as PolicyName[];
}

function parsePositiveNumber(value: string): number {
  const n = parseNonNegativeNumber(value);
  if (n === 0) throw new InvalidArgumentError("must be > 0");
  return n;
}

interface CommonOptions {
  workers: number;
  speedup: number;
  duration: number;
  blockSize: number;
  kvBlocks: number;
  seed: number;
  engineHosts?: number;
}

function addCommonOptions(cmd: Command, d: typeof DEFAULT_BENCH_CONFIG | typeof DEFAULT_DEMO_CONFIG): Command {
  return cmd
    .addOption(new Option("--workers <n>", "mock engines (one worker, one rank each)").argParser(integerInRange(1, MAX_WORKERS)).default(d.workers))
    .addOption(new Option("--speedup <x>", "trace time runs this many times faster (engine timings scale too)").argParser(parsePositiveNumber).default(d.speedup))
    .addOption(new Option("--duration <secs>", `wall-clock seconds per run${d === DEFAULT_DEMO_CONFIG ? " (0 = until Ctrl-C)" : ""}`).argParser(integerInRange(d === DEFAULT_DEMO_CONFIG ? 0 : 1, MAX_DURATION_SECS)).default(d.durationSecs))
    .addOption(new Option("--block-size <tokens>", "KV block size of the engines and the router").argParser(integerInRange(2, 4_096)).default(d.blockSize))
    .addOption(new Option("--kv-blocks <n>", "KV cache capacity of each engine, blocks").argParser(integerInRange(1, 10_000_000)).default(d.kvBlocks))
    .addOption(new Option("--engine-hosts <n>", "processes the engines run in [default: one per 256 engines]").argParser(integerInRange(1, 64)))
    .addOption(new Option("--seed <n>", "seed of the generated sessions and the random policy").argParser(integerInRange(0, 0xffff_ffff)).default(d.seed));
}

export function addBenchCommands(program: Command, deps: BenchDeps): void {
  const b = DEFAULT_BENCH_CONFIG;
  const bench = program
    .command("bench")
    .description("replay a workload through kvmesh (1..N replicas, meshed and not), round-robin and random, against mock engines; report engine-measured KV hit ratio, stickiness, TTFT, selection latency and lag")
    .addOption(new Option("--trace <file>", "Mooncake-format JSONL trace (timestamp, input_length, output_length, hash_ids[, session_id])").argParser(parseNonEmpty).conflicts("sessions"))
    .addOption(new Option("--sessions <n>", "generate this many multi-turn agentic sessions instead").argParser(integerInRange(1, MAX_SESSIONS)))
    .addOption(new Option("--limit <n>", "use at most this many trace records").argParser(integerInRange(1, 100_000_000)))
    .addOption(new Option("--replicas <list>", "replica counts, comma-separated").argParser(parseReplicaList).default(b.replicas, b.replicas.join(",")))
    .addOption(new Option("--policies <list>", `policies to compare: ${POLICY_NAMES.join(", ")}`).argParser(parsePolicyList).default(b.policies, b.policies.join(",")))
    .addOption(new Option("--no-session-ids", "do not send session ids to the router (turns still wait for the previous answer; stickiness is still measured)"))
    .addOption(new Option("--rate <x>", "arrivals come x times faster in trace time (engine speed unchanged): the load times x").argParser(parsePositiveNumber).default(1))
    .addOption(new Option("--client-delay-ms <ms>", "wall ms the client adds to every router call (select, prefill_complete, free), as a slow network").argParser(integerInRange(0, MAX_CLIENT_DELAY_MS)).default(0))
    .addOption(new Option("--cost-model <model>", "the replicas' --cost-model [default: the daemon's]").choices(COST_MODELS))
    .addOption(new Option("--no-kv-events", "routers do not subscribe to the engines' KV events (serve --no-kv-events; engines registered without KV endpoints): their approximate cache is their own decisions"))
    .addOption(new Option("--json <file>", "also write the rows as JSON").argParser(parseNonEmpty))
    .addOption(new Option("--svg <file>", "where to draw the chart").argParser(parseNonEmpty).default(b.svgPath));
  addCommonOptions(bench, b).action(async function (this: Command) {
    const o = this.opts<CommonOptions & { trace?: string; sessions?: number; limit?: number; replicas: number[]; policies: PolicyName[]; sessionIds: boolean; kvEvents: boolean; json?: string; svg: string; rate: number; clientDelayMs: number; costModel?: CostModel }>();
    if (o.trace === undefined && o.sessions === undefined) this.error("error: one of --trace <file> or --sessions <n> is required");
    const config: BenchCliConfig = {
      ...common(o),
      workload: o.trace !== undefined ? { kind: "trace", path: o.trace, limit: o.limit } : { kind: "sessions", sessions: o.sessions ?? 0 },
      replicas: o.replicas,
      policies: o.policies,
      sessionIds: o.sessionIds,
      rate: o.rate,
      clientDelayMs: o.clientDelayMs,
      costModel: o.costModel,
      kvEvents: o.kvEvents,
      jsonPath: o.json,
      svgPath: o.svg,
    };
    deps.exit(await deps.runBench(config));
  });

  const d = DEFAULT_DEMO_CONFIG;
  const demo = program
    .command("demo")
    .description("run a small local fleet: meshed replicas, mock engines and generated sessions, with a live summary")
    .addOption(new Option("--replicas <n>", "meshed replicas").argParser(integerInRange(1, MAX_REPLICAS)).default(d.replicas))
    .addOption(new Option("--sessions <n>", "generated multi-turn sessions").argParser(integerInRange(1, MAX_SESSIONS)).default(d.sessions));
  addCommonOptions(demo, d).action(async function (this: Command) {
    const o = this.opts<CommonOptions & { replicas: number; sessions: number }>();
    deps.exit(await deps.runDemo({ ...common(o), replicas: o.replicas, sessions: o.sessions }));
  });
}

function common(o: CommonOptions): Omit<BenchCliConfig, "workload" | "replicas" | "policies" | "jsonPath" | "svgPath"> {
  return { workers: o.workers, speedup: o.speedup, durationSecs: o.duration, blockSize: o.blockSize, kvBlocks: o.kvBlocks, seed: o.seed, engineHosts: o.engineHosts ?? Math.ceil(o.workers / 256) };
}
