/**
 * `kvmesh serve`: flags (each also from a KVMESH_* environment variable) -> the config input ->
 * resolveDaemonConfig (src/app/config.ts checks it) -> startDaemon, with JSON logs on stdout and a
 * clean shutdown on SIGINT/SIGTERM. This file adds only flag names, env variables and help text.
 */
import { hostname } from "node:os";

import { Command, Help, InvalidArgumentError, Option } from "commander";
import { pino, type DestinationStream, type Logger } from "pino";
import {
  DEFAULT_DAEMON_CONFIG,
  configErrorField,
  isConfigError,
  resolveDaemonConfig,
  type ConfigField,
  type DaemonConfigInput,
  type LogLevel,
  type ResolvedDaemonConfig,
} from "../src/app/config.js";
import type { KvmeshError } from "../src/core/index.js";
import type { Daemon } from "../src/app/daemon.js";
import { MAX_AFFINITY_TTL_SECS, MAX_RANK_KEYS, MIN_AFFINITY_TTL_SECS } from "../src/core/index.js";
import { COST_MODELS, DEFAULT_SELECTOR_CONFIG, type SelectorConfig } from "../src/core/index.js";
import { LOAD_REPLICATION_MODES } from "../src/core/index.js";
import { CONTROL_PORT_OFFSET, MAX_TCP_PORT } from "../mesh/endpoints.js";
import { otelEnvTracing, tracesEndpointProblem } from "../src/http/tracing.js";
import { MAX_INGEST_WINDOW_BATCHES, MAX_INGEST_WINDOW_BYTES } from "../src/ingest/kv-ingest-window.js";
import { addServeGatewayOptions } from "./serve-gateway.js";
import { addServeSecurityOptions, LOG_REDACT_PATHS, SECURITY_FLAG_FIELDS } from "./serve-security.js";
import {
  envNameFor,
  integerInRange,
  parseAdvertiseHost,
  parseBoolean,
  parseNonEmpty,
  parseNonNegativeNumber,
  parseNonZeroPort,
  parsePeerList,
  parsePort,
  parseU64,
} from "./parsers.js";

export const LOG_LEVELS: readonly LogLevel[] = ["trace", "debug", "info", "warn", "error", "fatal", "silent"];
export const SHUTDOWN_SIGNALS = ["SIGINT", "SIGTERM"] as const;
export type ShutdownSignal = (typeof SHUTDOWN_SIGNALS)[number];
/** Shell convention for "terminated by SIGINT" (128 + 2): the operator insisted on stopping now. */
export const FORCED_EXIT_CODE = 130;

const SECS_PER_YEAR = 31_536_000;
/** --max-reservations ceiling: 16M bookings would be ~15 GiB of heap, past any sane node heap. */
const MAX_RESERVATIONS_FLAG = 16_777_216;
/** Beyond these the value is a typo, not a setting: replay that slow means the worker is gone. */
const MAX_REPLAY_TIMEOUT_MS = 600_000;
/** Each cached selection holds a prompt's hashes (KBs); 10 M of them would not fit in memory anyway. */
const MAX_SELECTION_CACHE_ENTRIES = 10_000_000;
const MAX_PARTITIONS_FLAG = 1_000_000;
/** Node cannot hold a string much larger than 512 MiB. */
const MAX_BODY_LIMIT_BYTES = 512 * 1024 * 1024;
/** Mesh flush spacing ceiling, ms: a second between batches is already past any useful lag. */
const MAX_MESH_INTERVAL_MS = 1_000;

/** The part of a running daemon the CLI uses (a test double needs nothing more). */
/** What serve drives: drain is optional (test doubles close at once). */
export type RunningDaemon = Pick<Daemon, "host" | "port" | "close"> & Partial<Pick<Daemon, "drain">>;
export type StartDaemonFn = (config: ResolvedDaemonConfig, logger: Logger) => Promise<RunningDaemon>;

/** process.on/off, narrowed to the signals serve handles (injectable for tests). */
export interface SignalSource {
  on(signal: ShutdownSignal, handler: (signal: ShutdownSignal) => void): void;
  off(signal: ShutdownSignal, handler: (signal: ShutdownSignal) => void): void;
}

export interface ServeDeps {
  readonly startDaemon: StartDaemonFn;
  readonly signals: SignalSource;
  readonly logDestination: DestinationStream;
  readonly exit: (code: number) => void;
}

/** Selector flags -> SelectorConfig fields. Only flags actually given go into the partial config. */
const SELECTOR_NUMBER_FLAGS = [
  ["--overlap-score-credit", "overlapScoreCredit", "weight of device-cached blocks as prefill credit"],
  ["--overlap-score-credit-decay", "overlapScoreCreditDecay", "shrinks the credit on ranks with more queued prefill than the least-loaded one"],
  ["--prefill-load-scale", "prefillLoadScale", "weight of the prefill term"],
  ["--router-temperature", "temperature", "0 = argmin (random tie-break); > 0 = softmax sampling over normalized costs"],
  ["--decode-active-request-weight", "decodeActiveRequestWeight", "cost per in-flight request"],
  ["--host-cache-hit-weight", "hostCacheHitWeight", "credit per host-memory cached block"],
  ["--disk-cache-hit-weight", "diskCacheHitWeight", "credit per disk cached block"],
  ["--ttft-keep-weight", "ttftKeepWeight", "--cost-model ttft: recomputes of the best cached prefix charged to a worker that lacks it"],
  ["--ttft-prefill-ms-per-token", "ttftPrefillMsPerToken", "--cost-model ttft: the engines' prefill time per prompt token, wall ms (> 0)"],
  ["--ttft-prefill-ms-per-token-pair", "ttftPrefillMsPerTokenPair", "--cost-model ttft: the engines' prefill attention time per causal (query, key) pair, wall ms"],
  ["--ttft-decode-step-ms", "ttftDecodeStepMs", "--cost-model ttft: the engines' fixed time of a step that decodes, wall ms"],
  ["--ttft-decode-ms-per-sequence", "ttftDecodeMsPerSequence", "--cost-model ttft: the engines' time per decoding request per step, wall ms"],
  ["--ttft-decode-ms-per-context-token", "ttftDecodeMsPerContextToken", "--cost-model ttft: the engines' time per decoding context token per step, wall ms"],
  ["--ttft-batch-tokens", "ttftBatchTokens", "--cost-model ttft: the engines' token budget a step (max_num_batched_tokens, >= 1)"],
] as const satisfies readonly (readonly [string, keyof SelectorConfig, string])[];

/** Negatable pairs: `--x [bool]` (env KVMESH_X=true|false) and `--no-x`. */
const SELECTOR_BOOLEAN_FLAGS = [
  ["--router-track-prefill-tokens", "trackPrefillTokens", "count queued prefill tokens in the cost"],
  ["--router-assume-kv-reuse", "assumeKvReuse", "deduplicate a prompt's blocks against blocks already active on the rank"],
] as const satisfies readonly (readonly [string, keyof SelectorConfig, string])[];

/** Env names a user might guess from the `--no-x` spelling; the positive `KVMESH_X=false` is the one read. */
const NEGATED_ENV_HINTS = ["--kv-events", "--kv-ingest-thread", "--replica-tie-spread", "--mesh-receive-thread", ...SELECTOR_BOOLEAN_FLAGS.map(([flag]) => flag)];

/**
 * The reference's own environment names, read as aliases of ours (`KVMESH_*` wins when both are
 * set; a flag beats both). Only names the reference actually reads:
 * - the scheduling knobs: `kv_router_config_from_lookup` in `lib/kv-router/src/scheduling/config.rs`
 *   (ai-dynamo/dynamo), which `python -m dynamo.select_service` and the Python `SelectionService`
 *   call through `try_kv_router_config_from_dynamo_env` (`lib/bindings/python/rust/llm/kv.rs`).
 *   `DYN_USE_KV_EVENTS` is its older spelling, read after `DYN_ROUTER_USE_KV_EVENTS`.
 * - the expiry guard: `active_request_expiry_duration` in `lib/kv-router/src/sequences/multi_worker.rs`.
 * - session affinity: `--router-session-affinity-ttl-secs` / `--router-session-affinity-mode` in
 *   `components/src/dynamo/common/configuration/groups/router_args.py` (the KV router frontend).
 * The select service's port and replica-sync settings are flags only there, so they have no alias.
 */
export const REFERENCE_ENV_ALIASES: ReadonlyMap<string, readonly string[]> = new Map<string, readonly string[]>([
  ["--overlap-score-credit", ["DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT"]],
  ["--overlap-score-credit-decay", ["DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY"]],
  ["--prefill-load-scale", ["DYN_ROUTER_PREFILL_LOAD_SCALE"]],
  ["--router-temperature", ["DYN_ROUTER_TEMPERATURE"]],
  ["--decode-active-request-weight", ["DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT"]],
  ["--host-cache-hit-weight", ["DYN_ROUTER_HOST_CACHE_HIT_WEIGHT"]],
  ["--disk-cache-hit-weight", ["DYN_ROUTER_DISK_CACHE_HIT_WEIGHT"]],
  ["--router-track-prefill-tokens", ["DYN_ROUTER_TRACK_PREFILL_TOKENS"]],
  ["--router-assume-kv-reuse", ["DYN_ROUTER_ASSUME_KV_REUSE"]],
  ["--kv-events", ["DYN_ROUTER_USE_KV_EVENTS", "DYN_USE_KV_EVENTS"]],
  ["--active-request-expiry-secs", ["DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS"]],
  ["--session-affinity-ttl-secs", ["DYN_ROUTER_SESSION_AFFINITY_TTL_SECS"]],
  ["--session-affinity-mode", ["DYN_ROUTER_SESSION_AFFINITY_MODE"]],
  ["--decode-busy-threshold", ["DYN_ROUTER_CONDITIONAL_DISAGG_DECODE_BUSY_THRESHOLD"]],
  ["--prefill-busy-threshold", ["DYN_ROUTER_CONDITIONAL_DISAGG_PREFILL_BUSY_THRESHOLD"]],
]);

/** Per parsed `serve` command: option attribute -> the alias its value came from. */
const aliasSources = new WeakMap<Command, Map<string, string>>();

/**
 * After commander has read flags and `KVMESH_*`: an option still unset (or at its default) takes
 * the first reference alias present, through the option's own parser, so a bad value is a usage
 * error naming the alias. Returns one warning per option with more than one of its variables set.
 */
function applyEnvAliases(cmd: Command): string[] {
  const used = new Map<string, string>();
  aliasSources.set(cmd, used);
  const warnings: string[] = [];
  for (const option of cmd.options) {
    const aliases = option.long === undefined || option.negate ? undefined : REFERENCE_ENV_ALIASES.get(option.long);
    if (aliases === undefined || option.envVar === undefined) continue;
    const attribute = option.attributeName();
    const source = cmd.getOptionValueSource(attribute);
    if (source === "cli") continue;
    const set = [option.envVar, ...aliases].filter((name) => process.env[name] !== undefined);
    if (set.length > 1) warnings.push(`${set.join(" and ")} are set; ${set[0] ?? ""} wins`);
    const alias = set[0];
    if (alias === undefined || alias === option.envVar) continue;
    const raw = process.env[alias] ?? "";
    let value: unknown = raw;
    if (option.parseArg !== undefined) {
      try {
        value = option.parseArg(raw, cmd.getOptionValue(attribute) as unknown);
      } catch (err) {
        if (!(err instanceof InvalidArgumentError)) throw err;
        cmd.error(`error: option '${option.flags}' value '${raw}' from env '${alias}' is invalid. ${err.message}`, { exitCode: 1, code: "commander.invalidArgument" });
      }
    }
    cmd.setOptionValueWithSource(attribute, value, "env");
    used.set(attribute, alias);
  }
  return warnings;
}

/** `(env: KVMESH_X)` in `serve --help` also names the reference's variables for X. */
function optionDescriptionWithAliases(this: Help, option: Option): string {
  const text = Help.prototype.optionDescription.call(this, option);
  const aliases = option.long === undefined || option.negate ? undefined : REFERENCE_ENV_ALIASES.get(option.long);
  if (aliases === undefined || option.envVar === undefined) return text;
  return text.replace(`env: ${option.envVar}`, `env: ${option.envVar}, or Dynamo's ${aliases.join(" or ")}`);
}

function attributeOf(flag: string): string {
  return flag.replace(/^--/, "").replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());
}

function withEnv(option: Option): Option {
  return option.env(envNameFor(option.long ?? ""));
}

function valueOption(flags: string, description: string, parse: (v: string) => unknown, defaultValue?: unknown): Option {
  const o = new Option(flags, description).argParser(parse);
  if (defaultValue !== undefined) o.default(defaultValue);
  return withEnv(o);
}

/** Repeated `--peers` flags add up (commander passes the value so far as `previous`). */
function accumulatePeers(value: string, previous: unknown): string[] {
  const before = Array.isArray(previous) ? (previous as string[]) : [];
  return [...new Set([...before, ...parsePeerList(value)])];
}

/** Adds the `--x [bool]` / `--no-x` pair; the positive one carries the env variable. */
function addBooleanPair(cmd: Command, flag: string, description: string, defaultValue: boolean | undefined): void {
  const positive = new Option(`${flag} [bool]`, `${description} (true|false)`).argParser(parseBoolean);
  if (defaultValue !== undefined) positive.default(defaultValue);
  cmd.addOption(withEnv(positive));
  cmd.addOption(new Option(`--no-${flag.slice(2)}`, `same as ${flag} false`));
}

export function addServeCommand(program: Command, deps: ServeDeps): Command {
  const d = DEFAULT_DAEMON_CONFIG;
  const cmd = program.command("serve").description("run the kvmesh selection daemon");
  cmd
    .addOption(valueOption("--host <host>", "address to listen on", parseNonEmpty, d.host))
    .addOption(valueOption("--port <port>", "HTTP port (0 = ephemeral)", parsePort, d.port))
    .addOption(withEnv(new Option("--log-level <level>", "log level").choices(LOG_LEVELS).default(d.logLevel)))
    .addOption(
      valueOption(
        "--session-affinity-ttl-secs <secs>",
        "keep a session on its worker for this long after its last request (unset = affinity off)",
        integerInRange(MIN_AFFINITY_TTL_SECS, MAX_AFFINITY_TTL_SECS),
      ),
    )
    .addOption(
      withEnv(new Option("--session-affinity-mode <mode>", "hard: reject a session's request to another worker; soft: prefer its worker").choices(["hard", "soft"]).default(d.sessionAffinityMode)),
    )
    .addOption(
      valueOption(
        "--binding-refresh-coalesce-ms <ms>",
        "do not publish a session binding's refresh within this long of its last publication (0 = publish every refresh; capped at the affinity TTL / 8)",
        integerInRange(0, MAX_AFFINITY_TTL_SECS * 1000),
        d.bindingRefreshCoalesceMs,
      ),
    );
  // No commander defaults for the selector: the partial config holds only what the operator set
  // and the daemon fills in the rest; the help text still shows the effective default.
  const selectorDefaults: SelectorConfig = { ...DEFAULT_SELECTOR_CONFIG, ...d.selector };
  for (const [flag, key, description] of SELECTOR_NUMBER_FLAGS) {
    cmd.addOption(valueOption(`${flag} <n>`, `${description} [default: ${selectorDefaults[key]}]`, parseNonNegativeNumber));
  }
  for (const [flag, key, description] of SELECTOR_BOOLEAN_FLAGS) {
    addBooleanPair(cmd, flag, `${description} [default: ${String(selectorDefaults[key])}]`, undefined);
  }
  cmd.addOption(
    withEnv(
      new Option(
        "--cost-model <model>",
        `reference: the reference's cost formula, exactly; ttft: each worker's estimated time to first token plus the value of keeping a prompt's cache together (docs/cost-models.md) [default: ${selectorDefaults.costModel}]`,
      ).choices(COST_MODELS),
    ),
  );
  cmd
    .addOption(valueOption("--active-request-expiry-secs <secs>", "force-free a booking older than this", integerInRange(1, SECS_PER_YEAR), d.activeRequestExpirySecs))
    .addOption(valueOption("--max-reservations <n>", "most live bookings this replica makes (429 beyond)", integerInRange(1, MAX_RESERVATIONS_FLAG), d.maxReservations))
    .addOption(
      valueOption("--kv-ingest-window-batches <n>", "KV batches the ingest thread hands over and the main thread has not applied yet, at most: past it the thread sheds what it reads (counted) and the gap is replayed", integerInRange(1, MAX_INGEST_WINDOW_BATCHES), d.kvIngestWindowBatches),
    )
    .addOption(valueOption("--kv-ingest-window-bytes <bytes>", "the same window in bytes of prepared batches", integerInRange(1, MAX_INGEST_WINDOW_BYTES), d.kvIngestWindowBytes))
    .addOption(valueOption("--replay-timeout-ms <ms>", "how long to wait for a worker's KV-event replay", integerInRange(1, MAX_REPLAY_TIMEOUT_MS), d.replayTimeoutMs))
    .addOption(valueOption("--selection-cache-ttl-secs <secs>", "how long a /select answer can be reserved", integerInRange(1, SECS_PER_YEAR), d.selectionCacheTtlSecs))
    .addOption(valueOption("--selection-cache-max-entries <n>", "most cached selections", integerInRange(1, MAX_SELECTION_CACHE_ENTRIES), d.selectionCacheMaxEntries))
    .addOption(
      valueOption("--selection-cache-max-bytes <bytes>", "byte budget of the cached selections (8 bytes per hash plus ids); the oldest are evicted past it", integerInRange(1, Number.MAX_SAFE_INTEGER), d.selectionCacheMaxBytes),
    )
    .addOption(
      valueOption(
        "--decode-busy-threshold <fraction>",
        "report decode_busy on selections: true when the chosen rank's potential decode blocks exceed this fraction of its worker's total_kv_blocks (omitted for a worker without them) [default: not reported]",
        parseNonNegativeNumber,
      ),
    )
    .addOption(
      valueOption(
        "--prefill-busy-threshold <fraction>",
        "report worker_load.prefill_busy on advisory selections: true when the rank's active prefill tokens exceed this fraction of its prefill_token_capacity [default: not reported]",
        parseNonNegativeNumber,
      ),
    )
    .addOption(valueOption("--max-reservation-bytes <bytes>", "byte budget of this replica's live bookings, ~192 bytes per booked block (429 beyond)", integerInRange(1, Number.MAX_SAFE_INTEGER), d.maxReservationBytes))
    .addOption(valueOption("--max-partitions <n>", "most partitions (model_name, routing_group) at once: a registration past it gets 409", integerInRange(1, MAX_PARTITIONS_FLAG), d.maxPartitions))
    .addOption(valueOption("--max-ranks <n>", "most worker ranks (sum of data_parallel_size) at once: a registration past it gets 409", integerInRange(1, MAX_RANK_KEYS), d.maxRanks))
    .addOption(valueOption("--body-limit-bytes <bytes>", "largest HTTP request body", integerInRange(1, MAX_BODY_LIMIT_BYTES), d.bodyLimitBytes))
    .addOption(
      valueOption(
        "--max-connections <n>",
        "most HTTP connections at once; more are closed on arrival [default: an eighth of the process's fd limit (ulimit -n), 4096 where unknown]",
        integerInRange(1, Number.MAX_SAFE_INTEGER),
      ),
    )
    .addOption(valueOption("--max-connections-per-client <n>", "most HTTP connections at once from one address [default: half of --max-connections]", integerInRange(1, Number.MAX_SAFE_INTEGER)));
  addBooleanPair(cmd, "--kv-events", "subscribe to workers' KV events (off: workers need no kv_events_endpoint)", d.kvEvents);
  cmd
    .addOption(
      valueOption(
        "--predicted-ttl-secs <s>",
        "in-flight prefixes: a routed prompt's blocks count as cached on its worker until the engine's BlockStored is seen, at most this long; peers see them too (0 = off)",
        integerInRange(0, 86_400),
        d.predictedTtlSecs,
      ),
    )
    .addOption(
      valueOption(
        "--approx-ttl-secs <s>",
        "with --no-kv-events: the router's own decisions are the workers' approximate cache for this long, replicated to peers (0 = no cache awareness)",
        integerInRange(0, 86_400),
        d.approxTtlSecs,
      ),
    )
    .addOption(valueOption("--predicted-max-blocks-per-rank <n>", "predicted (worker rank, block) checkpoints held per rank; past it the oldest bookings' are shed (counted)", integerInRange(1, 1 << 24), d.predictedMaxBlocksPerRank));
  addBooleanPair(cmd, "--kv-ingest-thread", "read, decode and hash workers' KV events on a worker thread, so the main thread only indexes them", d.kvIngestThread);
  cmd
    .addOption(
      valueOption(
        "--replica-sync-port <port>",
        `enable the replica mesh: publish on this port of --host, snapshots/control on the next one (1-${MAX_TCP_PORT - CONTROL_PORT_OFFSET}) [default: mesh off]`,
        parseNonZeroPort,
      ),
    )
    .addOption(
      withEnv(
        new Option(
          "--peers <list>",
          "peers' replica-sync endpoints, comma-separated tcp://host:port, or dns:NAME:PORT re-resolved every --peer-dns-interval-secs (needs --replica-sync-port; more via `kvmesh peers add`)",
        ).argParser(accumulatePeers),
      ),
    )
    .addOption(withEnv(new Option("--workers-file <path>", "a JSON or YAML list of workers (the POST /workers shape), registered at start and reconciled when it changes (a ConfigMap, say)").argParser(parseNonEmpty)))
    .addOption(valueOption("--drain-secs <s>", "on SIGTERM/SIGINT: seconds /ready answers 503 while everything else is served, before shutting down (0 = at once; a second signal ends the wait)", integerInRange(0, 3_600), d.drainSecs))
    .addOption(
      valueOption(
        "--mesh-startup-sync-secs <s>",
        "after a start, /ready answers 503 (mesh_syncing) until every reachable peer's first snapshot is in, at most this long (0 = do not wait)",
        integerInRange(0, 3_600),
        d.meshStartupSyncSecs,
      ),
    )
    .addOption(
      valueOption(
        "--index-sync-secs <s>",
        "after a start, /ready answers 503 (index_syncing) until a peer's prefix index is installed, at most this long (0 = no warm join: the index starts from the engines' replays alone)",
        integerInRange(0, 3_600),
        d.indexSyncSecs,
      ),
    )
    .addOption(valueOption("--peer-dns-interval-secs <s>", "how often dns:NAME:PORT peers are re-resolved (added and removed as the answer changes)", integerInRange(1, 3_600), d.peerDnsIntervalSecs))
    .addOption(
      valueOption("--replica-sync-advertise-host <host>", "host peers use to reach this replica when --host is a wildcard [default: --host, or 127.0.0.1]", parseAdvertiseHost),
    )
    .addOption(
      valueOption(
        "--session-replication-writer-id <id>",
        "host replication: the writer id (non-zero u64, unique per replica) of this replica's session bindings, relayed by the host through GET /session_bindings/updates and POST /session_bindings (needs --session-affinity-ttl-secs; excludes --replica-sync-port) [default: off]",
        parseWriterId,
      ),
    );

  addBooleanPair(cmd, "--replica-tie-spread", "spread argmin ties across mesh replicas by slot, against the select-to-book race (off only to measure the race)", d.replicaTieSpread);
  cmd
    .addOption(
      withEnv(
        new Option(
          "--load-replication <mode>",
          "how replicas share their load: aggregate (per-rank totals; a peer's cost does not grow with the request rate) or exact (every booking, with its sequence hashes); the same on every replica",
        )
          .choices(LOAD_REPLICATION_MODES)
          .default(d.loadReplication),
      ),
    )
    .addOption(valueOption("--mesh-flush-interval-ms <ms>", "exact load replication: minimum spacing of the mesh's outbound batches", integerInRange(0, MAX_MESH_INTERVAL_MS), d.meshFlushIntervalMs))
    .addOption(
      valueOption("--mesh-aggregate-interval-ms <ms>", "aggregate load replication: minimum spacing of the mesh's outbound batches (each carries the totals that changed)", integerInRange(0, MAX_MESH_INTERVAL_MS), d.meshAggregateIntervalMs),
    )
    .addOption(
      valueOption(
        "--mesh-apply-interval-ms <ms>",
        "with the receive thread: how often it hands peers' updates (decoded, merged) to the main thread; 0 = after each message",
        integerInRange(0, MAX_MESH_INTERVAL_MS),
        d.meshApplyIntervalMs,
      ),
    )
    .addOption(
      valueOption(
        "--mesh-apply-max-delay-ms <ms>",
        "with the receive thread: the longest its hand-overs wait before the main thread applies them when no HTTP request (which applies them first) comes",
        integerInRange(1, MAX_MESH_INTERVAL_MS),
        d.meshApplyMaxDelayMs,
      ),
    );
  addBooleanPair(
    cmd,
    "--mesh-insecure",
    "allow a plain (no CURVE) mesh on a non-loopback --host: anyone who reaches its ports can join, read and cut it (refused without this flag; docs/security.md)",
    d.meshInsecure,
  );
  addBooleanPair(cmd, "--mesh-receive-thread", "read peers' updates on a worker thread that decodes and merges them, so the main thread pays per apply interval, not per peer message (CURVE meshes too)", d.meshReceiveThread);
  cmd.addOption(
    valueOption(
      "--otlp-traces-endpoint <url>",
      "trace requests with OpenTelemetry, exporting OTLP/HTTP spans to this URL (no path: /v1/traces is appended); also from OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT [default: off]",
      parseTracesEndpoint,
    ),
  );
  addServeSecurityOptions(cmd);
  addServeGatewayOptions(cmd);

  cmd.configureHelp({ ...cmd.configureHelp(), optionDescription: optionDescriptionWithAliases });

  let envWarnings: string[] = [];
  cmd.hook("preAction", (thisCommand) => {
    for (const flag of NEGATED_ENV_HINTS) {
      const wrong = envNameFor(`--no-${flag.slice(2)}`);
      if (wrong in process.env) thisCommand.error(`error: ${wrong} is not read; set ${envNameFor(flag)}=false instead`);
    }
    envWarnings = applyEnvAliases(thisCommand);
  });
  cmd.action(async function (this: Command) {
    const name = fieldNamer(this);
    let input = serveInputFromOptions(this.opts());
    const otel = otelEnvTracing(process.env);
    if (otel.serviceName !== undefined) input = { ...input, otlpServiceName: otel.serviceName };
    // The flag (or KVMESH_OTLP_TRACES_ENDPOINT) beats the standard variables.
    if (input.otlpTracesEndpoint === undefined && otel.endpoint !== undefined) {
      const bad = tracesEndpointProblem(otel.endpoint.url);
      if (bad !== undefined) this.error(`error: ${otel.endpoint.variable}: ${bad}`);
      input = { ...input, otlpTracesEndpoint: otel.endpoint.url };
    }
    if (envWarnings.length > 0) {
      const logger = createLogger(input.logLevel ?? DEFAULT_DAEMON_CONFIG.logLevel, deps.logDestination);
      for (const warning of envWarnings) logger.warn({ subsystem: "config" }, warning);
    }
    let config: ResolvedDaemonConfig;
    try {
      config = resolveDaemonConfig(input, {
        name,
        warn: (warning) => {
          createLogger(input.logLevel ?? DEFAULT_DAEMON_CONFIG.logLevel, deps.logDestination).warn({ subsystem: "security" }, warning);
        },
      });
    } catch (err) {
      if (!isConfigError(err)) throw err;
      this.error(`error: ${usageMessage(err, name)}`);
    }
    await runServe(config, deps);
  });
  return cmd;
}

/**
 * How `serve`'s messages name a config field: by the flag that sets it, with the environment
 * variable when the value came from there (`--peers (from KVMESH_PEERS)`, or the reference's name
 * when it came from an alias); a field no flag sets
 * keeps its own name.
 */
export function fieldNamer(serve: Command): (field: ConfigField) => string {
  const flags = new Map<ConfigField, string>();
  for (const o of serve.options) if (!o.negate && o.long !== undefined) flags.set(fieldOf(o.attributeName()), o.long);
  return (field) => {
    const flag = flags.get(field);
    if (flag === undefined) return field;
    const attribute = attributeOf(flag);
    if (serve.getOptionValueSource(attribute) !== "env") return flag;
    return `${flag} (from ${aliasSources.get(serve)?.get(attribute) ?? envNameFor(flag)})`;
  };
}

/** A config error as a usage error: it names the flag that set the field, whatever the message says. */
export function usageMessage(err: KvmeshError, name: (field: ConfigField) => string): string {
  const field = configErrorField(err);
  const flag = field === undefined ? undefined : name(field);
  return flag === undefined || err.message.includes(flag) ? err.message : `${flag}: ${err.message}`;
}

/** Option attributes whose config field is not the attribute itself. */
const ATTRIBUTE_FIELDS: ReadonlyMap<string, ConfigField> = new Map<string, ConfigField>([
  ...[...SELECTOR_NUMBER_FLAGS, ...SELECTOR_BOOLEAN_FLAGS].map(([flag, key]): [string, ConfigField] => [attributeOf(flag), `selector.${key}`]),
  ...Object.entries(SECURITY_FLAG_FIELDS),
  ["costModel", "selector.costModel"],
]);

const fieldOf = (attribute: string): ConfigField => ATTRIBUTE_FIELDS.get(attribute) ?? (attribute as ConfigField);

/** commander's parsed options for `serve` -> the config input (pure; exported for tests). Unset options stay unset. */
export function serveInputFromOptions(opts: Readonly<Record<string, unknown>>): DaemonConfigInput {
  const input: Record<string, unknown> = {};
  const selector: Record<string, unknown> = {};
  for (const [attribute, value] of Object.entries(opts)) {
    if (value === undefined) continue;
    const field = fieldOf(attribute);
    if (field.startsWith("selector.")) selector[field.slice("selector.".length)] = value;
    else input[field] = value;
  }
  // Each value went through its flag's parser (or choices), which gives the field's type.
  const out: DaemonConfigInput = { ...input, selector };
  return out;
}

/** --otlp-traces-endpoint: an http(s) URL (src/http/tracing.ts says what else is refused). */
function parseTracesEndpoint(value: string): string {
  const bad = tracesEndpointProblem(value);
  if (bad !== undefined) throw new InvalidArgumentError(bad);
  return value;
}

/** A writer id: a u64 other than 0 (the service refuses 0, so the CLI says so up front). */
function parseWriterId(value: string): bigint {
  const id = parseU64(value);
  if (id === 0n) throw new InvalidArgumentError("must be a non-zero unsigned 64-bit decimal integer");
  return id;
}

/**
 * Fields on every log line: the service, the process, the host, and the Kubernetes pod when the
 * deployment passes it (`POD_NAME` from the downward API, or `KVMESH_POD_NAME`), so lines from
 * several replicas in one log store say which replica wrote them.
 */
export function logBaseFields(env: NodeJS.ProcessEnv = process.env): Record<string, string | number> {
  const pod = env.KVMESH_POD_NAME ?? env.POD_NAME;
  return { svc: "kvmesh", pid: process.pid, host: hostname(), ...(pod === undefined || pod === "" ? {} : { pod }) };
}

export function createLogger(level: LogLevel, destination: DestinationStream): Logger {
  return pino(
    { level, base: logBaseFields(), timestamp: pino.stdTimeFunctions.isoTime, redact: { paths: [...LOG_REDACT_PATHS], censor: "[redacted]" } },
    destination,
  );
}

/**
 * Starts the daemon and resolves once it has shut down. First SIGINT/SIGTERM: drain (`/ready`
 * 503 for --drain-secs, still serving), then close, exit 0 (1 if close failed). A second signal
 * while draining ends the wait and closes now; one while closing exits 130 at once, because a
 * close stuck on a wedged socket must not leave the operator without a way out.
 */
export async function runServe(config: ResolvedDaemonConfig, deps: ServeDeps): Promise<void> {
  const logger = createLogger(config.logLevel, deps.logDestination);
  let daemon: RunningDaemon;
  try {
    daemon = await deps.startDaemon(config, logger);
  } catch (err) {
    logger.fatal({ err }, "failed to start");
    deps.exit(1);
    return;
  }
  logger.info({ host: daemon.host, port: daemon.port }, "listening");

  await new Promise<void>((resolve) => {
    let state: "running" | "draining" | "closing" | "done" = "running";
    const finish = (code: number): void => {
      if (state === "done") return;
      state = "done";
      for (const s of SHUTDOWN_SIGNALS) deps.signals.off(s, onSignal);
      deps.exit(code);
      resolve();
    };
    function onSignal(signal: ShutdownSignal): void {
      if (state === "closing") {
        logger.warn({ signal }, "second signal during shutdown: exiting now");
        finish(FORCED_EXIT_CODE);
        return;
      }
      if (state === "done") return;
      if (state === "running" && daemon.drain !== undefined) {
        state = "draining";
        logger.info({ signal }, "shutting down: draining first");
        void daemon.drain().then(() => {
          close(signal);
        });
        return;
      }
      close(signal);
    }
    function close(signal: ShutdownSignal): void {
      if (state === "closing" || state === "done") return;
      state = "closing";
      logger.info({ signal }, "shutting down");
      daemon.close().then(
        () => {
          if (state === "done") return;
          logger.info("stopped");
          finish(0);
        },
        (err: unknown) => {
          if (state === "done") return;
          logger.error({ err }, "shutdown failed");
          finish(1);
        },
      );
    }
    for (const s of SHUTDOWN_SIGNALS) deps.signals.on(s, onSignal);
  });
}
