import { EventEmitter } from "node:events";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CommanderError, type Command } from "commander";
import type { Logger } from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import { buildCli, type CliDeps } from "../../../cli/program.js";
import { FORCED_EXIT_CODE, fieldNamer, logBaseFields, usageMessage, type RunningDaemon, type ShutdownSignal, type SignalSource } from "../../../cli/serve.js";
import { envNameFor } from "../../../cli/parsers.js";
import { negatablePairs } from "../../../cli/negatable-pairs.js";
import { configError } from "../../../src/app/config.js";
import { DEFAULT_DAEMON_CONFIG, type DaemonConfig } from "../../../src/app/daemon.js";
import { waitFor } from "../../helpers/wait.js";

class FakeSignals implements SignalSource {
  readonly #emitter = new EventEmitter();
  on(signal: ShutdownSignal, handler: (s: ShutdownSignal) => void): void {
    this.#emitter.on(signal, handler);
  }
  off(signal: ShutdownSignal, handler: (s: ShutdownSignal) => void): void {
    this.#emitter.off(signal, handler);
  }
  send(signal: ShutdownSignal): void {
    this.#emitter.emit(signal, signal);
  }
  listeners(): number {
    return this.#emitter.listenerCount("SIGINT") + this.#emitter.listenerCount("SIGTERM");
  }
}

interface FakeDaemon extends RunningDaemon {
  closeCalls: number;
}

/** A daemon double whose close() settles when the test says so (or at once). */
function fakeDaemon(closeImpl: () => Promise<void> = () => Promise.resolve()): FakeDaemon {
  const d: FakeDaemon = {
    host: "127.0.0.1",
    port: 43_210,
    closeCalls: 0,
    close: () => {
      d.closeCalls++;
      return closeImpl();
    },
  };
  return d;
}

interface Harness {
  readonly configs: DaemonConfig[];
  readonly loggers: Logger[];
  readonly logs: Record<string, unknown>[];
  readonly exits: number[];
  readonly signals: FakeSignals;
  readonly err: () => string;
  /** Resolves with commander's exit code for usage errors, or undefined once the action returned. */
  readonly run: (...args: string[]) => Promise<number | undefined>;
  readonly program: Command;
}

function harness(daemon: FakeDaemon | Error = fakeDaemon(), overrides: Partial<CliDeps> = {}): Harness {
  const h = {
    configs: [] as DaemonConfig[],
    loggers: [] as Logger[],
    logs: [] as Record<string, unknown>[],
    exits: [] as number[],
    signals: new FakeSignals(),
    errText: [] as string[],
  };
  const program = buildCli({
    startDaemon: (config, logger) => {
      h.configs.push(config);
      h.loggers.push(logger);
      return daemon instanceof Error ? Promise.reject(daemon) : Promise.resolve(daemon);
    },
    signals: h.signals,
    logDestination: { write: (line: string) => h.logs.push(JSON.parse(line) as Record<string, unknown>) },
    exit: (code) => h.exits.push(code),
    writeOut: () => undefined,
    writeErr: (s) => h.errText.push(s),
    fetch: () => Promise.reject(new Error("no network in serve tests")),
    ...overrides,
  });
  const all = (c: Command): Command[] => [c, ...c.commands.flatMap(all)];
  for (const c of all(program)) c.exitOverride();
  return {
    ...h,
    program,
    err: () => h.errText.join(""),
    run: async (...args) => {
      try {
        await program.parseAsync(args, { from: "user" });
        return undefined;
      } catch (e) {
        if (e instanceof CommanderError) return e.exitCode;
        throw e;
      }
    },
  };
}

/** Runs `serve args`, waits for the daemon to start, stops it with SIGTERM and returns its config. */
async function serveConfig(...args: string[]): Promise<DaemonConfig> {
  const h = harness();
  const done = h.run("serve", ...args);
  await waitFor(() => h.signals.listeners() === 2 || h.exits.length > 0 || h.err() !== "", 5_000, "serve to start");
  expect(h.err()).toBe("");
  h.signals.send("SIGTERM");
  await done;
  expect(h.exits).toEqual([0]);
  expect(h.configs).toHaveLength(1);
  return h.configs[0] as DaemonConfig;
}

// The ext_proc TLS files must be readable (the config checks); their content is read at start only.
const TLS_DIR = mkdtempSync(join(tmpdir(), "kvmesh-serve-tls-"));
const TLS_CERT = join(TLS_DIR, "tls.crt");
const TLS_KEY = join(TLS_DIR, "tls.key");
writeFileSync(TLS_CERT, "cert");
writeFileSync(TLS_KEY, "key");

const ALL_FLAGS: readonly [string, string][] = [
  ["--host", "0.0.0.0"],
  ["--port", "0"],
  ["--log-level", "debug"],
  ["--session-affinity-ttl-secs", "600"],
  ["--session-affinity-mode", "soft"],
  ["--binding-refresh-coalesce-ms", "250"],
  ["--overlap-score-credit", "0.5"],
  ["--overlap-score-credit-decay", "0.1"],
  ["--prefill-load-scale", "2"],
  ["--router-temperature", "0.25"],
  ["--decode-active-request-weight", "3"],
  ["--host-cache-hit-weight", "0.6"],
  ["--disk-cache-hit-weight", "0.2"],
  ["--router-track-prefill-tokens", "false"],
  ["--router-assume-kv-reuse", "false"],
  ["--cost-model", "ttft"],
  ["--ttft-keep-weight", "0.5"],
  ["--ttft-prefill-ms-per-token", "0.005"],
  ["--ttft-prefill-ms-per-token-pair", "1.3e-7"],
  ["--ttft-decode-step-ms", "1"],
  ["--ttft-decode-ms-per-sequence", "0.005"],
  ["--ttft-decode-ms-per-context-token", "4e-6"],
  ["--ttft-batch-tokens", "4096"],
  ["--active-request-expiry-secs", "60"],
  ["--max-reservations", "5000"],
  ["--kv-events", "false"],
  ["--replica-tie-spread", "false"],
  ["--kv-ingest-window-batches", "1024"],
  ["--kv-ingest-window-bytes", "8388608"],
  ["--replay-timeout-ms", "500"],
  ["--selection-cache-ttl-secs", "30"],
  ["--selection-cache-max-entries", "100"],
  ["--selection-cache-max-bytes", "65536"],
  ["--decode-busy-threshold", "0.9"],
  ["--prefill-busy-threshold", "0.5"],
  ["--max-reservation-bytes", "1048576"],
  ["--max-partitions", "12"],
  ["--max-ranks", "2048"],
  ["--body-limit-bytes", "1048576"],
  ["--replica-sync-port", "7100"],
  ["--peers", "tcp://b.example:7100,tcp://c.example:7100,dns:kvmesh-mesh.default.svc.cluster.local:7100"],
  ["--replica-sync-advertise-host", "a.example"],
  ["--mesh-receive-thread", "false"],
  ["--mesh-insecure", "true"],
  ["--mesh-apply-interval-ms", "5"],
  ["--mesh-apply-max-delay-ms", "250"],
  ["--peer-dns-interval-secs", "9"],
  ["--mesh-startup-sync-secs", "4"],
  ["--drain-secs", "2"],
  ["--workers-file", "/etc/kvmesh/workers.yaml"],
  ["--otlp-traces-endpoint", "http://collector.example:4318/v1/traces"],
  ["--ext-proc-port", "9002"],
  ["--ext-proc-tls-cert-file", TLS_CERT],
  ["--ext-proc-tls-key-file", TLS_KEY],
  ["--ext-proc-health-port", "9003"],
  ["--ext-proc-max-body-bytes", "1048576"],
  ["--ext-proc-stream-window-bytes", "524288"],
  ["--ext-proc-connection-window-bytes", "2097152"],
  ["--session-header", "X-Conversation-Id"],
  ["--routing-group-header", "x-group"],
  ["--tokenizer-failure", "reject"],
  ["--dp-rank-port-stride", "2"],
  ["--tokenizer", "file"],
  ["--tokenizer-file", TLS_CERT],
  ["--tokenizer-timeout-ms", "1500"],
  ["--tokenizer-concurrency", "8"],
  ["--tokenizer-max-queued", "100"],
  ["--tokenizer-attempts", "3"],
  ["--tokenizer-cache-entries", "1000"],
  ["--tokenizer-cache-tokens", "100000"],
];

// Fields no flag sets (the mesh's flush and heartbeat intervals) keep their defaults.
const ALL_FLAGS_CONFIG: DaemonConfig = {
  ...DEFAULT_DAEMON_CONFIG,
  host: "0.0.0.0",
  port: 0,
  logLevel: "debug",
  sessionAffinityTtlSecs: 600,
  sessionAffinityMode: "soft",
  bindingRefreshCoalesceMs: 250,
  selector: {
    overlapScoreCredit: 0.5,
    overlapScoreCreditDecay: 0.1,
    prefillLoadScale: 2,
    temperature: 0.25,
    decodeActiveRequestWeight: 3,
    hostCacheHitWeight: 0.6,
    diskCacheHitWeight: 0.2,
    costModel: "ttft",
    ttftKeepWeight: 0.5,
    ttftPrefillMsPerToken: 0.005,
    ttftPrefillMsPerTokenPair: 1.3e-7,
    ttftDecodeStepMs: 1,
    ttftDecodeMsPerSequence: 0.005,
    ttftDecodeMsPerContextToken: 4e-6,
    ttftBatchTokens: 4096,
    trackPrefillTokens: false,
    assumeKvReuse: false,
  },
  activeRequestExpirySecs: 60,
  maxReservations: 5_000,
  kvEvents: false,
  replicaTieSpread: false,
  kvIngestWindowBatches: 1024,
  kvIngestWindowBytes: 8388608,
  replayTimeoutMs: 500,
  selectionCacheTtlSecs: 30,
  selectionCacheMaxEntries: 100,
  selectionCacheMaxBytes: 65_536,
  decodeBusyThreshold: 0.9,
  prefillBusyThreshold: 0.5,
  maxReservationBytes: 1_048_576,
  maxPartitions: 12,
  maxRanks: 2048,
  bodyLimitBytes: 1_048_576,
  replicaSyncPort: 7100,
  peers: ["tcp://b.example:7100", "tcp://c.example:7100", "dns:kvmesh-mesh.default.svc.cluster.local:7100"],
  replicaSyncAdvertiseHost: "a.example",
  meshReceiveThread: false,
  meshInsecure: true,
  meshApplyIntervalMs: 5,
  meshApplyMaxDelayMs: 250,
  peerDnsIntervalSecs: 9,
  meshStartupSyncSecs: 4,
  drainSecs: 2,
  workersFile: "/etc/kvmesh/workers.yaml",
  otlpTracesEndpoint: "http://collector.example:4318/v1/traces",
  extProcPort: 9002,
  extProcTlsCertFile: TLS_CERT,
  extProcTlsKeyFile: TLS_KEY,
  extProcHealthPort: 9003,
  extProcMaxBodyBytes: 1_048_576,
  extProcStreamWindowBytes: 524_288,
  extProcConnectionWindowBytes: 2_097_152,
  sessionHeader: "x-conversation-id",
  routingGroupHeader: "x-group",
  tokenizerFailure: "reject",
  dpRankPortStride: 2,
  tokenizer: "file",
  tokenizerFile: TLS_CERT,
  tokenizerTimeoutMs: 1_500,
  tokenizerConcurrency: 8,
  tokenizerMaxQueued: 100,
  tokenizerAttempts: 3,
  tokenizerCacheEntries: 1_000,
  tokenizerCacheTokens: 100_000,
};

afterEach(() => {
  vi.unstubAllEnvs();
});

describe("kvmesh serve: flags -> DaemonConfig", () => {
  it("uses the daemon defaults when nothing is given", async () => {
    expect(await serveConfig()).toEqual(DEFAULT_DAEMON_CONFIG);
  });

  it("maps every flag", async () => {
    expect(await serveConfig(...ALL_FLAGS.flat())).toEqual(ALL_FLAGS_CONFIG);
  });

  it("reads every flag from KVMESH_* when the flag is absent", async () => {
    for (const [flag, value] of ALL_FLAGS) vi.stubEnv(envNameFor(flag), value);
    expect(envNameFor("--session-affinity-ttl-secs")).toBe("KVMESH_SESSION_AFFINITY_TTL_SECS");
    expect(await serveConfig()).toEqual(ALL_FLAGS_CONFIG);
  });

  it("lets a flag beat its environment variable", async () => {
    vi.stubEnv("KVMESH_PORT", "9000");
    vi.stubEnv("KVMESH_ROUTER_ASSUME_KV_REUSE", "true");
    vi.stubEnv("KVMESH_KV_EVENTS", "false");
    vi.stubEnv("KVMESH_ROUTER_TEMPERATURE", "1");
    const c = await serveConfig("--port", "9001", "--no-router-assume-kv-reuse", "--kv-events", "--router-temperature", "0.5");
    expect(c.port).toBe(9001);
    expect(c.selector.assumeKvReuse).toBe(false);
    expect(c.kvEvents).toBe(true);
    expect(c.selector.temperature).toBe(0.5);
  });

  it("handles the negatable switches in both spellings", async () => {
    const c = await serveConfig("--no-kv-events", "--router-track-prefill-tokens", "--no-router-assume-kv-reuse");
    expect(c.kvEvents).toBe(false);
    expect(c.selector).toEqual({ trackPrefillTokens: true, assumeKvReuse: false });
    expect((await serveConfig()).selector).toEqual({});
  });

  it("gives every serve flag an environment variable named after it", () => {
    const program = buildCli();
    const serve = program.commands.find((c) => c.name() === "serve");
    const options = serve?.options ?? [];
    expect(options.length).toBeGreaterThanOrEqual(20);
    for (const o of options) {
      if (o.negate) continue;
      expect(o.envVar, o.flags).toBe(envNameFor(o.long ?? ""));
    }
  });
});

describe("kvmesh serve: usage errors", () => {
  const cases: readonly [string[], string][] = [
    [["--port", "70000"], "error: option '--port <port>' argument '70000' is invalid. must be an integer in [0, 65535]"],
    [["--port", "80.5"], "error: option '--port <port>' argument '80.5' is invalid."],
    [["--port", ""], "error: option '--port <port>' argument '' is invalid."],
    [["--session-affinity-mode", "medium"], "error: option '--session-affinity-mode <mode>' argument 'medium' is invalid. Allowed choices are hard, soft."],
    [["--session-affinity-ttl-secs", "0"], "error: option '--session-affinity-ttl-secs <secs>' argument '0' is invalid. must be an integer in [1, 31536000]"],
    [["--binding-refresh-coalesce-ms", "-1"], "error: option '--binding-refresh-coalesce-ms <ms>' argument '-1' is invalid. must be an integer in [0, 31536000000]"],
    [["--router-temperature", "-1"], "error: option '--router-temperature <n>' argument '-1' is invalid. must be a finite number >= 0"],
    [["--overlap-score-credit", "Infinity"], "error: option '--overlap-score-credit <n>' argument 'Infinity' is invalid."],
    [["--log-level", "verbose"], "error: option '--log-level <level>' argument 'verbose' is invalid."],
    [["--cost-model", "fast"], "error: option '--cost-model <model>' argument 'fast' is invalid. Allowed choices are reference, ttft."],
    [["--kv-events", "maybe"], "error: option '--kv-events [bool]' argument 'maybe' is invalid. must be true or false"],
    [["--bogus"], "error: unknown option '--bogus'"],
    [["--selection-cache-max-bytes", "0"], "error: option '--selection-cache-max-bytes <bytes>' argument '0' is invalid. must be an integer in [1, 9007199254740991]"],
    [["--kv-ingest-window-batches", "0"], "error: option '--kv-ingest-window-batches <n>' argument '0' is invalid. must be an integer in [1, 1048576]"],
    [["--kv-ingest-window-bytes", "1073741825"], "error: option '--kv-ingest-window-bytes <bytes>' argument '1073741825' is invalid. must be an integer in [1, 1073741824]"],
    [["--otlp-traces-endpoint", "collector:4318"], "error: option '--otlp-traces-endpoint <url>' argument 'collector:4318' is invalid. \"collector:4318\" is not an http(s) URL"],
    [["--ext-proc-port", "9002", "--ext-proc-tls-cert-file", TLS_CERT], "error: --ext-proc-tls-cert-file requires --ext-proc-tls-key-file"],
    [["--ext-proc-health-port", "9003"], "error: --ext-proc-health-port requires --ext-proc-port"],
    [["--ext-proc-port", "9002", "--ext-proc-tls-cert-file", "/nonexistent/c", "--ext-proc-tls-key-file", TLS_KEY], "error: --ext-proc-tls-cert-file: cannot read /nonexistent/c (ENOENT)"],
    [["--port", "9002", "--ext-proc-port", "9002"], "error: --ext-proc-port 9002 collides with --port"],
    [["--ext-proc-port", "9002", "--ext-proc-health-port", "9002"], "error: --ext-proc-health-port 9002 is the same as --ext-proc-port"],
    [["--session-header", "x session"], "error: option '--session-header <name>' argument 'x session' is invalid. must be an HTTP header name"],
    [["--routing-group-header", "x-session-id"], "error: --routing-group-header must differ from --session-header"],
    [["--tokenizer-failure", "retry"], "error: option '--tokenizer-failure <mode>' argument 'retry' is invalid. Allowed choices are route, reject."],
    [["--ext-proc-max-body-bytes", "0"], "error: option '--ext-proc-max-body-bytes <bytes>' argument '0' is invalid."],
    [["--ext-proc-stream-window-bytes", "65534"], "error: option '--ext-proc-stream-window-bytes <bytes>' argument '65534' is invalid. must be an integer in [65535, 2147483647]"],
    [["--ext-proc-connection-window-bytes", "2147483648"], "error: option '--ext-proc-connection-window-bytes <bytes>' argument '2147483648' is invalid. must be an integer in [65535, 2147483647]"],
    [["--tokenizer-file", TLS_CERT], "error: --tokenizer-file requires --ext-proc-port (tokenization serves the endpoint picker)"],
    [["--ext-proc-port", "9002", "--tokenizer", "file"], "error: --tokenizer-file: is required with --tokenizer file"],
    [["--ext-proc-port", "9002", "--tokenizer", "engine", "--tokenizer-file", TLS_CERT], "error: --tokenizer-file: is only read with --tokenizer file (drop one of the two)"],
    [["--ext-proc-port", "9002", "--tokenizer-file", "/nonexistent/tokenizer.json"], "error: --tokenizer-file: cannot read /nonexistent/tokenizer.json (ENOENT)"],
    [["--ext-proc-port", "9002", "--tokenizer", "remote"], "error: option '--tokenizer <mode>' argument 'remote' is invalid. Allowed choices are engine, file."],
    [["--ext-proc-port", "9002", "--tokenizer-timeout-ms", "0"], "error: option '--tokenizer-timeout-ms <ms>' argument '0' is invalid."],
  ];
  for (const [args, message] of cases) {
    it(`rejects ${args.join(" ")}`, async () => {
      const h = harness();
      expect(await h.run("serve", ...args)).toBe(1);
      expect(h.err()).toContain(message);
      expect(h.configs).toEqual([]);
    });
  }

  // The reference's CLI declares --router-assume-kv-reuse / --no-router-assume-kv-reuse mutually
  // exclusive (python -m dynamo.select_service); kvmesh refuses every such pair (cli/negatable-pairs.ts).
  it("refuses every --x / --no-x pair given together, in either order, naming both flags", async () => {
    const serve = harness().program.commands.find((c) => c.name() === "serve");
    const pairs = serve === undefined ? [] : negatablePairs(serve);
    expect(pairs.map(([p]) => p.long)).toEqual(expect.arrayContaining(["--router-assume-kv-reuse", "--router-track-prefill-tokens", "--kv-events", "--mesh-insecure"]));
    for (const [positive, negative] of pairs) {
      const pos = positive.long ?? "";
      const neg = negative.long ?? "";
      for (const args of [[pos, neg], [neg, pos], [`${pos}=false`, neg], [neg, pos, "true"]]) {
        const h = harness();
        expect(await h.run("serve", ...args), args.join(" ")).toBe(1);
        const [first, second] = args[0]?.startsWith(neg) === true ? [neg, pos] : [pos, neg];
        expect(h.err()).toContain(`error: ${first} and ${second} conflict: give one of them`);
        expect(h.configs).toEqual([]);
      }
    }
  });

  it("judges each parse alone, and does not count the environment variable as a conflict", async () => {
    const h = harness();
    expect(await h.run("serve", "--no-kv-events", "--kv-events")).toBe(1);
    // The same command tree again: the first parse's --no-kv-events is forgotten, and the
    // environment's KVMESH_KV_EVENTS=true loses to the flag as usual.
    vi.stubEnv("KVMESH_KV_EVENTS", "true");
    const done = h.run("serve", "--kv-events", "false");
    await waitFor(() => h.signals.listeners() === 2 || h.exits.length > 0, 5_000, "serve to start");
    h.signals.send("SIGTERM");
    await done;
    expect(h.configs.map((c) => c.kvEvents)).toEqual([false]);
  });

  it("names the environment variable when the bad value came from it", async () => {
    vi.stubEnv("KVMESH_PORT", "http");
    const h = harness();
    expect(await h.run("serve")).toBe(1);
    expect(h.err()).toContain("error: option '--port <port>' value 'http' from env 'KVMESH_PORT' is invalid. must be an integer in [0, 65535]");
    expect(h.configs).toEqual([]);
  });

  it("refuses the --no-* spelling as an env name instead of guessing what it means", async () => {
    vi.stubEnv("KVMESH_NO_KV_EVENTS", "false");
    const h = harness();
    expect(await h.run("serve")).toBe(1);
    expect(h.err()).toContain("KVMESH_NO_KV_EVENTS is not read; set KVMESH_KV_EVENTS=false instead");
    expect(h.configs).toEqual([]);
  });
});

describe("kvmesh serve: tracing from the standard OTEL_* variables", () => {
  it("is off without them", async () => {
    expect((await serveConfig()).otlpTracesEndpoint).toBeUndefined();
  });

  it("takes OTEL_EXPORTER_OTLP_ENDPOINT (+ /v1/traces), OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, and OTEL_SERVICE_NAME", async () => {
    vi.stubEnv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
    vi.stubEnv("OTEL_SERVICE_NAME", "router-a");
    expect(await serveConfig()).toMatchObject({ otlpTracesEndpoint: "http://collector:4318/v1/traces", otlpServiceName: "router-a" });
    vi.stubEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/otlp/v1/traces");
    expect((await serveConfig()).otlpTracesEndpoint).toBe("http://traces:4318/otlp/v1/traces");
  });

  it("lets the flag and KVMESH_OTLP_TRACES_ENDPOINT beat them, and OTEL_SDK_DISABLED=true keep them off", async () => {
    vi.stubEnv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
    vi.stubEnv("KVMESH_OTLP_TRACES_ENDPOINT", "http://kvmesh-env:4318/v1/traces");
    expect((await serveConfig()).otlpTracesEndpoint).toBe("http://kvmesh-env:4318/v1/traces");
    expect((await serveConfig("--otlp-traces-endpoint", "http://flag:4318")).otlpTracesEndpoint).toBe("http://flag:4318");
    vi.stubEnv("KVMESH_OTLP_TRACES_ENDPOINT", undefined);
    vi.stubEnv("OTEL_SDK_DISABLED", "true");
    expect((await serveConfig()).otlpTracesEndpoint).toBeUndefined();
  });

  it("names the variable when its URL is bad", async () => {
    vi.stubEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4318");
    const h = harness();
    expect(await h.run("serve")).toBe(1);
    expect(h.err()).toContain('error: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "collector:4318" is not an http(s) URL');
    expect(h.configs).toEqual([]);
  });
});

// The reference's environment names, read as aliases of ours. Sources (ai-dynamo/dynamo):
// DYN_ROUTER_* scheduling knobs and DYN_USE_KV_EVENTS: `kv_router_config_from_lookup`,
// lib/kv-router/src/scheduling/config.rs (read by dynamo.select_service through
// try_kv_router_config_from_dynamo_env, lib/bindings/python/rust/llm/kv.rs);
// DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS: lib/kv-router/src/sequences/multi_worker.rs;
// DYN_ROUTER_SESSION_AFFINITY_TTL_SECS / _MODE: components/src/dynamo/common/configuration/groups/router_args.py.
// Precedence (ours over the alias, a flag over both) and the usage error are kvmesh's rules.
const REFERENCE_ENV: readonly [string, string][] = [
  ["DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "0.5"],
  ["DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY", "0.1"],
  ["DYN_ROUTER_PREFILL_LOAD_SCALE", "2"],
  ["DYN_ROUTER_TEMPERATURE", "0.25"],
  ["DYN_ROUTER_DECODE_ACTIVE_REQUEST_WEIGHT", "3"],
  ["DYN_ROUTER_HOST_CACHE_HIT_WEIGHT", "0.6"],
  ["DYN_ROUTER_DISK_CACHE_HIT_WEIGHT", "0.2"],
  ["DYN_ROUTER_TRACK_PREFILL_TOKENS", "false"],
  ["DYN_ROUTER_ASSUME_KV_REUSE", "false"],
  ["DYN_ROUTER_USE_KV_EVENTS", "false"],
  ["DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS", "60"],
  ["DYN_ROUTER_SESSION_AFFINITY_TTL_SECS", "600"],
  ["DYN_ROUTER_SESSION_AFFINITY_MODE", "soft"],
  ["DYN_ROUTER_CONDITIONAL_DISAGG_DECODE_BUSY_THRESHOLD", "0.9"],
  ["DYN_ROUTER_CONDITIONAL_DISAGG_PREFILL_BUSY_THRESHOLD", "0.5"],
];

describe("kvmesh serve: the reference's environment names", () => {
  it("reads each reference variable as an alias of its KVMESH_* one", async () => {
    for (const [name, value] of REFERENCE_ENV) vi.stubEnv(name, value);
    const c = await serveConfig();
    // Every selector knob but --cost-model and the --ttft-* ones, kvmesh's own (the reference has no variable for them).
    const referenceKnobs: Record<string, unknown> = Object.fromEntries(
      Object.entries(ALL_FLAGS_CONFIG.selector).filter(([key]) => key !== "costModel" && !key.startsWith("ttft")),
    );
    expect(c.selector).toEqual(referenceKnobs);
    expect(c.kvEvents).toBe(false);
    expect(c.activeRequestExpirySecs).toBe(60);
    expect(c.sessionAffinityTtlSecs).toBe(600);
    expect(c.sessionAffinityMode).toBe("soft");
    expect([c.decodeBusyThreshold, c.prefillBusyThreshold]).toEqual([0.9, 0.5]);
  });

  it("reads DYN_USE_KV_EVENTS, the reference's older name, after DYN_ROUTER_USE_KV_EVENTS", async () => {
    vi.stubEnv("DYN_USE_KV_EVENTS", "false");
    expect((await serveConfig()).kvEvents).toBe(false);
    vi.stubEnv("DYN_ROUTER_USE_KV_EVENTS", "true");
    expect((await serveConfig()).kvEvents).toBe(true);
  });

  it("lets KVMESH_* win over the alias, with one warning, and a flag win over both", async () => {
    vi.stubEnv("DYN_ROUTER_TEMPERATURE", "1");
    vi.stubEnv("KVMESH_ROUTER_TEMPERATURE", "0.5");
    vi.stubEnv("DYN_ROUTER_SESSION_AFFINITY_MODE", "soft");
    const h = harness();
    const done = h.run("serve");
    await waitFor(() => h.signals.listeners() === 2 || h.err() !== "", 5_000, "serve to start");
    h.signals.send("SIGTERM");
    await done;
    expect(h.configs[0]?.selector.temperature).toBe(0.5);
    expect(h.configs[0]?.sessionAffinityMode).toBe("soft");
    const warnings = h.logs.filter((l) => l.level === 40 && l.subsystem === "config").map((l) => l.msg);
    expect(warnings).toEqual(["KVMESH_ROUTER_TEMPERATURE and DYN_ROUTER_TEMPERATURE are set; KVMESH_ROUTER_TEMPERATURE wins"]);

    vi.stubEnv("DYN_ROUTER_ASSUME_KV_REUSE", "true");
    const c = await serveConfig("--router-temperature", "2", "--session-affinity-mode", "hard", "--no-router-assume-kv-reuse");
    expect(c.selector.temperature).toBe(2);
    expect(c.selector.assumeKvReuse).toBe(false);
    expect(c.sessionAffinityMode).toBe("hard");
  });

  it("rejects a bad alias value naming the alias variable", async () => {
    const cases: readonly [string, string, string][] = [
      ["DYN_ROUTER_TEMPERATURE", "hot", "error: option '--router-temperature <n>' value 'hot' from env 'DYN_ROUTER_TEMPERATURE' is invalid. must be a finite number >= 0"],
      ["DYN_ROUTER_SESSION_AFFINITY_MODE", "medium", "error: option '--session-affinity-mode <mode>' value 'medium' from env 'DYN_ROUTER_SESSION_AFFINITY_MODE' is invalid. Allowed choices are hard, soft."],
      ["DYN_ROUTER_ASSUME_KV_REUSE", "maybe", "error: option '--router-assume-kv-reuse [bool]' value 'maybe' from env 'DYN_ROUTER_ASSUME_KV_REUSE' is invalid. must be true or false"],
      ["DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS", "0", "error: option '--active-request-expiry-secs <secs>' value '0' from env 'DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS' is invalid."],
    ];
    for (const [name, value, message] of cases) {
      vi.unstubAllEnvs();
      vi.stubEnv(name, value);
      const h = harness();
      expect(await h.run("serve"), name).toBe(1);
      expect(h.err()).toContain(message);
      expect(h.configs).toEqual([]);
    }
  });

  it("names the alias when a config error points at a value that came from it", async () => {
    vi.stubEnv("DYN_ROUTER_SESSION_AFFINITY_TTL_SECS", "60");
    vi.stubEnv("KVMESH_ACTIVE_REQUEST_EXPIRY_SECS", "60");
    const h = harness(new Error("no daemon in this test"));
    await h.run("serve", "--router-temperature", "1");
    const serve = h.program.commands.find((c) => c.name() === "serve");
    if (serve === undefined) throw new Error("no serve command");
    const name = fieldNamer(serve);
    expect(name("sessionAffinityTtlSecs")).toBe("--session-affinity-ttl-secs (from DYN_ROUTER_SESSION_AFFINITY_TTL_SECS)");
    expect(name("activeRequestExpirySecs")).toBe("--active-request-expiry-secs (from KVMESH_ACTIVE_REQUEST_EXPIRY_SECS)");
    expect(name("selector.temperature")).toBe("--router-temperature");
  });

  it("lists each alias beside its KVMESH_* variable in serve --help", () => {
    const serve = buildCli().commands.find((c) => c.name() === "serve");
    const help = (serve?.helpInformation() ?? "").replace(/\s+/g, " ");
    expect(help).toContain("(env: KVMESH_ROUTER_TEMPERATURE, or Dynamo's DYN_ROUTER_TEMPERATURE)");
    expect(help).toContain("env: KVMESH_KV_EVENTS, or Dynamo's DYN_ROUTER_USE_KV_EVENTS or DYN_USE_KV_EVENTS)");
    for (const [name] of REFERENCE_ENV) expect(help).toContain(name);
  });
});

describe("kvmesh serve: replica mesh flags", () => {
  it("leaves the mesh off by default", async () => {
    const c = await serveConfig();
    expect(c.replicaSyncPort).toBeUndefined();
    expect(c.peers).toEqual([]);
    expect(c.replicaSyncAdvertiseHost).toBeUndefined();
  });

  it("canonicalises peers, drops duplicates and adds up repeated --peers", async () => {
    const c = await serveConfig(
      "--replica-sync-port", "7100",
      "--peers", "tcp://B.Example:07100, tcp://b.example:7100,tcp://[0:0::1]:7200",
      "--peers", "tcp://c:1,tcp://[::1]:7200",
    );
    expect(c.peers).toEqual(["tcp://b.example:7100", "tcp://[::1]:7200", "tcp://c:1"]);
  });

  it("brackets a bare IPv6 advertise host and lowercases names", async () => {
    expect((await serveConfig("--replica-sync-port", "7100", "--replica-sync-advertise-host", "::1")).replicaSyncAdvertiseHost).toBe("[::1]");
    expect((await serveConfig("--replica-sync-port", "7100", "--replica-sync-advertise-host", "Node-1.Example")).replicaSyncAdvertiseHost).toBe("node-1.example");
  });

  it("reads the mesh flags from KVMESH_* and lets the flags win", async () => {
    vi.stubEnv("KVMESH_REPLICA_SYNC_PORT", "7300");
    vi.stubEnv("KVMESH_PEERS", "tcp://a:1,tcp://A:01");
    vi.stubEnv("KVMESH_REPLICA_SYNC_ADVERTISE_HOST", "10.0.0.5");
    const fromEnv = await serveConfig();
    expect([fromEnv.replicaSyncPort, fromEnv.peers, fromEnv.replicaSyncAdvertiseHost]).toEqual([7300, ["tcp://a:1"], "10.0.0.5"]);
    const flags = await serveConfig("--replica-sync-port", "7400", "--peers", "tcp://b:2");
    // The flag replaces the env list rather than adding to it.
    expect([flags.replicaSyncPort, flags.peers]).toEqual([7400, ["tcp://b:2"]]);
  });

  it("treats an empty KVMESH_PEERS as no peers (no port needed)", async () => {
    vi.stubEnv("KVMESH_PEERS", " ");
    expect((await serveConfig()).peers).toEqual([]);
  });

  it("allows the replica-sync ports right next to the HTTP port, just not on it", async () => {
    expect((await serveConfig("--port", "7000", "--replica-sync-port", "7001")).replicaSyncPort).toBe(7001);
    expect((await serveConfig("--port", "7002", "--replica-sync-port", "7000")).replicaSyncPort).toBe(7000);
    expect((await serveConfig("--port", "0", "--replica-sync-port", "65534")).replicaSyncPort).toBe(65_534);
  });

  const cases: readonly [string[], string][] = [
    [["--peers", "tcp://b:7100"], "error: --peers requires --replica-sync-port"],
    [["--replica-sync-advertise-host", "a.example"], "error: --replica-sync-advertise-host requires --replica-sync-port"],
    [["--replica-sync-port", "0"], "error: option '--replica-sync-port <port>' argument '0' is invalid. must be an integer in [1, 65535]"],
    [["--replica-sync-port", "65536"], "error: option '--replica-sync-port <port>' argument '65536' is invalid. must be an integer in [1, 65535]"],
    [["--replica-sync-port", "x"], "error: option '--replica-sync-port <port>' argument 'x' is invalid."],
    [["--replica-sync-port", "65535"], "error: --replica-sync-port 65535 leaves no room for the control port (65535 + 1 > 65535)"],
    [["--port", "7100", "--replica-sync-port", "7100"], "error: --replica-sync-port 7100 is the same as --port 7100 (the HTTP port)"],
    [["--port", "7101", "--replica-sync-port", "7100"], "error: --replica-sync-port 7100 puts its control port (7101) on --port 7101 (the HTTP port)"],
    // The default HTTP port (8092) counts too.
    [["--replica-sync-port", "8091"], "error: --replica-sync-port 8091 puts its control port (8092) on --port 8092"],
    [["--replica-sync-port", "7100", "--peers", "tcp://b"], `error: option '--peers <list>' argument 'tcp://b' is invalid. endpoint "tcp://b": missing port`],
    [["--replica-sync-port", "7100", "--peers", "tcp://b:1,,tcp://c:1"], "argument 'tcp://b:1,,tcp://c:1' is invalid. peer #2 is empty (stray comma?)"],
    [["--replica-sync-port", "7100", "--peers", "tcp://b:1,"], "peer #2 is empty"],
    [["--replica-sync-port", "7100", "--peers", "http://b:1"], `endpoint "http://b:1": unsupported transport "http"`],
    [["--replica-sync-port", "7100", "--peers", "tcp://b:0"], "port must be in 1-65535"],
    [["--replica-sync-port", "7100", "--peers", "tcp://*:7100"], "wildcard host is only valid for a bind"],
    [["--replica-sync-port", "7100", "--peers", "dns:kvmesh-mesh"], `argument 'dns:kvmesh-mesh' is invalid. "dns:kvmesh-mesh": expected dns:NAME:PORT`],
    [["--replica-sync-port", "7100", "--peers", "dns:kvmesh-mesh:0"], "port must be 1 ... 65535"],
    [["--replica-sync-port", "7100", "--peer-dns-interval-secs", "0"], "error: option '--peer-dns-interval-secs <s>' argument '0' is invalid."],
    [["--replica-sync-port", "7100", "--replica-sync-advertise-host", "0.0.0.0"], "error: option '--replica-sync-advertise-host <host>' argument '0.0.0.0' is invalid. must be an address peers can connect to, not a wildcard"],
    [["--replica-sync-port", "7100", "--replica-sync-advertise-host", "::"], "not a wildcard"],
    [["--replica-sync-port", "7100", "--replica-sync-advertise-host", "node:7100"], "must be a hostname or an IP address (no scheme, no port)"],
    [["--replica-sync-port", "7100", "--replica-sync-advertise-host", "tcp://node"], "must be a hostname or an IP address"],
    [["--replica-sync-port", "7100", "--replica-sync-advertise-host", ""], "must be a hostname or an IP address"],
  ];
  for (const [args, message] of cases) {
    it(`rejects ${args.join(" ")}`, async () => {
      const h = harness();
      expect(await h.run("serve", ...args)).toBe(1);
      expect(h.err()).toContain(message);
      expect(h.configs).toEqual([]);
    });
  }

  it("names the env variables when the clash came from them", async () => {
    vi.stubEnv("KVMESH_PEERS", "tcp://b:7100");
    const h = harness();
    expect(await h.run("serve")).toBe(1);
    expect(h.err()).toContain("error: --peers (from KVMESH_PEERS) requires --replica-sync-port");
    vi.stubEnv("KVMESH_REPLICA_SYNC_PORT", "9000");
    const h2 = harness();
    expect(await h2.run("serve", "--port", "9000")).toBe(1);
    expect(h2.err()).toContain("error: --replica-sync-port (from KVMESH_REPLICA_SYNC_PORT) 9000 is the same as --port 9000");
    expect([...h.configs, ...h2.configs]).toEqual([]);
  });

  it("rejects a bad KVMESH_PEERS naming the variable", async () => {
    vi.stubEnv("KVMESH_REPLICA_SYNC_PORT", "7100");
    vi.stubEnv("KVMESH_PEERS", "tcp://a:1,b:2");
    const h = harness();
    expect(await h.run("serve")).toBe(1);
    expect(h.err()).toContain(`error: option '--peers <list>' value 'tcp://a:1,b:2' from env 'KVMESH_PEERS' is invalid. endpoint "b:2"`);
    expect(h.configs).toEqual([]);
  });

  it("documents each mesh flag and its env variable in serve --help", () => {
    const serve = buildCli().commands.find((c) => c.name() === "serve");
    const help = (serve?.helpInformation() ?? "").replace(/\s+/g, " ");
    for (const text of [
      "--replica-sync-port <port>",
      "(env: KVMESH_REPLICA_SYNC_PORT)",
      "--peers <list>",
      "(env: KVMESH_PEERS)",
      "--replica-sync-advertise-host <host>",
      "(env: KVMESH_REPLICA_SYNC_ADVERTISE_HOST)",
    ]) {
      expect(help).toContain(text);
    }
  });
});

describe("kvmesh serve: config errors name the flag", () => {
  const serveCommand = (): Command => {
    const serve = buildCli().commands.find((c) => c.name() === "serve");
    if (serve === undefined) throw new Error("no serve command");
    return serve;
  };

  it("maps each config field to the flag that sets it (fields no flag sets keep their name)", () => {
    const name = fieldNamer(serveCommand());
    expect(name("maxReservations")).toBe("--max-reservations");
    expect(name("sessionReplicationWriterId")).toBe("--session-replication-writer-id");
    expect(name("selector.temperature")).toBe("--router-temperature");
    expect(name("selector.trackPrefillTokens")).toBe("--router-track-prefill-tokens");
    expect(name("meshKeyFile")).toBe("--mesh-key");
    expect(name("meshAllowFiles")).toBe("--mesh-allow");
    expect(name("apiTokenFile")).toBe("--api-token-file");
    expect(name("meshFlushIntervalMs")).toBe("--mesh-flush-interval-ms");
    expect(name("meshHeartbeatIntervalMs")).toBe("meshHeartbeatIntervalMs");
  });

  it("turns a config error into a usage error naming the flag, even when its message does not", () => {
    const name = fieldNamer(serveCommand());
    expect(usageMessage(configError("maxReservations", "must be a positive integer"), name)).toBe("--max-reservations: must be a positive integer");
    expect(usageMessage(configError("peers", "--peers requires --replica-sync-port"), name)).toBe("--peers requires --replica-sync-port");
  });

  it("reports a rule the core checks (host replication vs the mesh) as a usage error naming both flags", async () => {
    vi.stubEnv("KVMESH_SESSION_REPLICATION_WRITER_ID", "3");
    const h = harness();
    expect(await h.run("serve", "--session-affinity-ttl-secs", "60", "--replica-sync-port", "7100")).toBe(1);
    expect(h.err()).toContain(
      "error: --session-replication-writer-id (from KVMESH_SESSION_REPLICATION_WRITER_ID) (host replication) and --replica-sync-port (the built-in mesh) exclude each other",
    );
    expect(h.configs).toEqual([]);
  });
});

describe("kvmesh serve: lifecycle", () => {
  it("logs the listening address as JSON and passes the log level to the logger", async () => {
    const h = harness();
    const done = h.run("serve", "--log-level", "debug");
    await waitFor(() => h.signals.listeners() === 2);
    expect(h.loggers[0]?.level).toBe("debug");
    const listening = h.logs.find((l) => l["msg"] === "listening");
    expect(listening).toMatchObject({ msg: "listening", host: "127.0.0.1", port: 43_210, level: 30 });
    h.signals.send("SIGINT");
    await done;
  });

  it("closes the daemon once on SIGTERM, exits 0 and detaches its handlers", async () => {
    const d = fakeDaemon();
    const h = harness(d);
    const done = h.run("serve");
    await waitFor(() => h.signals.listeners() === 2);
    h.signals.send("SIGTERM");
    expect(await done).toBeUndefined();
    expect(d.closeCalls).toBe(1);
    expect(h.exits).toEqual([0]);
    expect(h.signals.listeners()).toBe(0);
    expect(h.logs.map((l) => l["msg"])).toEqual(["listening", "shutting down", "stopped"]);
  });

  it("exits 130 at once on a second signal while closing, without closing twice", async () => {
    let release = (): void => undefined;
    const d = fakeDaemon(() => new Promise<void>((resolve) => (release = resolve)));
    const h = harness(d);
    const done = h.run("serve");
    await waitFor(() => h.signals.listeners() === 2);
    h.signals.send("SIGINT");
    expect(h.exits).toEqual([]);
    h.signals.send("SIGTERM");
    expect(h.exits).toEqual([FORCED_EXIT_CODE]);
    await done;
    release();
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(d.closeCalls).toBe(1);
    expect(h.exits).toEqual([130]);
  });

  it("drains first on SIGTERM, then closes; a second signal while draining ends the wait", async () => {
    const events: string[] = [];
    let endDrain = (): void => undefined;
    const d: FakeDaemon = {
      ...fakeDaemon(),
      drain: () => {
        events.push("drain");
        return new Promise<void>((resolve) => (endDrain = resolve));
      },
    };
    d.close = () => {
      d.closeCalls++;
      events.push("close");
      // As the real daemon's close does: it ends a drain still waiting.
      endDrain();
      return Promise.resolve();
    };
    const h = harness(d);
    const done = h.run("serve");
    await waitFor(() => h.signals.listeners() === 2);
    h.signals.send("SIGTERM");
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(events).toEqual(["drain"]);
    expect(h.exits).toEqual([]);
    // The second signal does not force an exit while draining: it closes now.
    h.signals.send("SIGTERM");
    expect(await done).toBeUndefined();
    expect(events).toEqual(["drain", "close"]);
    expect(d.closeCalls).toBe(1);
    expect(h.exits).toEqual([0]);
    expect(h.logs.map((l) => l["msg"])).toEqual(["listening", "shutting down: draining first", "shutting down", "stopped"]);
  });

  it("closes by itself when the drain window ends", async () => {
    const d: FakeDaemon = { ...fakeDaemon(), drain: () => Promise.resolve() };
    d.close = () => {
      d.closeCalls++;
      return Promise.resolve();
    };
    const h = harness(d);
    const done = h.run("serve");
    await waitFor(() => h.signals.listeners() === 2);
    h.signals.send("SIGINT");
    await done;
    expect(d.closeCalls).toBe(1);
    expect(h.exits).toEqual([0]);
  });

  it("exits 1 when close fails", async () => {
    const h = harness(fakeDaemon(() => Promise.reject(new Error("socket wedged"))));
    const done = h.run("serve");
    await waitFor(() => h.signals.listeners() === 2);
    h.signals.send("SIGTERM");
    await done;
    expect(h.exits).toEqual([1]);
    expect(h.logs.find((l) => l["msg"] === "shutdown failed")).toMatchObject({ err: { message: "socket wedged" } });
  });

  it("exits 1 with a fatal log when the daemon cannot start", async () => {
    const h = harness(new Error("listen EADDRINUSE: address already in use 127.0.0.1:8092"));
    expect(await h.run("serve")).toBeUndefined();
    expect(h.exits).toEqual([1]);
    expect(h.signals.listeners()).toBe(0);
    expect(h.logs[0]).toMatchObject({ level: 60, msg: "failed to start", err: { message: expect.stringContaining("EADDRINUSE") as unknown } });
  });
});

describe("log base fields", () => {
  it("name the service, process and host, and the pod when the deployment passes it", () => {
    const plain = logBaseFields({});
    expect(plain).toMatchObject({ svc: "kvmesh", pid: process.pid });
    expect(typeof plain.host).toBe("string");
    expect(plain).not.toHaveProperty("pod");
    expect(logBaseFields({ POD_NAME: "kvmesh-1" }).pod).toBe("kvmesh-1");
    expect(logBaseFields({ POD_NAME: "kvmesh-1", KVMESH_POD_NAME: "router-a" }).pod).toBe("router-a");
    expect(logBaseFields({ POD_NAME: "" })).not.toHaveProperty("pod");
  });
});
