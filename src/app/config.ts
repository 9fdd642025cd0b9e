/**
 * The daemon's whole configuration: one typed object whose defaults come from the modules that
 * own them, and one function, resolveDaemonConfig, that checks the rules spanning several fields
 * and returns the config the daemon runs with. `kvmesh serve` only adds flag names, environment
 * variables and help text; startDaemon resolves a config it was not handed resolved.
 *
 * Rules the selection core owns (host replication vs the mesh, the affinity TTL bounds, the
 * booking cap, selector weights) are not repeated here: the core checks the very options this
 * config maps to, and its error comes back as a config error naming this config's field.
 */
import { accessSync, constants as fsConstants } from "node:fs";

import { loadMeshCurveConfig, type MeshCurveConfig } from "../../mesh/curve.js";
import { CONTROL_PORT_OFFSET, MAX_TCP_PORT } from "../../mesh/endpoints.js";
import { DEFAULT_PEER_DNS_INTERVAL_SECS } from "../../mesh/dns-peers.js";
import { DEFAULT_MESH_STARTUP_SYNC_SECS } from "../../mesh/startup-sync.js";
import { DEFAULT_INDEX_SYNC_SECS } from "./warm-join.js";
import { DEFAULT_MESH_AGGREGATE_FLUSH_INTERVAL_MS, DEFAULT_MESH_APPLY_INTERVAL_MS, DEFAULT_MESH_APPLY_MAX_DELAY_MS, DEFAULT_MESH_FLUSH_INTERVAL_MS, DEFAULT_MESH_HEARTBEAT_INTERVAL_MS } from "../../mesh/replica-mesh.js";
import type { LoadReplication } from "../core/index.js";
import { isKvmeshError, KvmeshError } from "../core/index.js";
import { DEFAULT_PENDING_MAX_BYTES, DEFAULT_PENDING_MAX_ENTRIES, DEFAULT_PENDING_TTL_MS } from "../core/index.js";
import { DEFAULT_ACTIVE_REQUEST_EXPIRY_MS, DEFAULT_MAX_LOCAL_RESERVATIONS, DEFAULT_MAX_PARTITIONS, DEFAULT_MAX_RANKS, DEFAULT_MAX_RESERVATION_BYTES, type SelectionServiceOptions } from "../core/index.js";
import { resolveServiceOptions } from "../core/index.js";
import { DEFAULT_APPROX_TTL_SECS, DEFAULT_MAX_PREDICTED_BLOCKS_PER_RANK, DEFAULT_PREDICTED_TTL_SECS } from "../core/index.js";
import { DEFAULT_SELECTOR_CONFIG, type SelectorConfig } from "../core/index.js";
import { loadApiTokenFile, type ApiToken } from "../http/auth.js";
import type { ConnectionLimits } from "../http/connection-limits.js";
import { DEFAULT_BODY_LIMIT_BYTES } from "../http/server.js";
import { defaultMaxConnections, processFdLimit } from "../util/fd-budget.js";
import { DEFAULT_TRACES_SERVICE_NAME, tracesEndpointProblem } from "../http/tracing.js";
import { DEFAULT_REPLAY_TIMEOUT_MS } from "../ingest/kv-event-listener.js";
import { DEFAULT_INGEST_WINDOW_BATCHES, DEFAULT_INGEST_WINDOW_BYTES } from "../ingest/kv-ingest-window.js";
import { DEFAULT_DP_RANK_PORT_STRIDE, DEFAULT_EXT_PROC_CONNECTION_WINDOW_BYTES, DEFAULT_EXT_PROC_MAX_BODY_BYTES, DEFAULT_EXT_PROC_STREAM_WINDOW_BYTES, DEFAULT_ROUTING_GROUP_HEADER, DEFAULT_SESSION_HEADER, type TokenizerFailure } from "../extproc/defaults.js";
import { DEFAULT_TOKENIZER_OPTIONS, resolveTokenizerOptions, TOKENIZER_OPTION_DEFINITIONS, type TokenizerOptions } from "../tokenize/tokenizer-options.js";

export type LogLevel = "trace" | "debug" | "info" | "warn" | "error" | "fatal" | "silent";

/** Loopback: the API is reachable from this machine only until the operator opens it. */
export const DEFAULT_HOST = "127.0.0.1";
/** The reference's HTTP port, so its clients find kvmesh where they found it. */
export const DEFAULT_HTTP_PORT = 8092;
const MS_PER_SEC = 1_000;
/**
 * The daemon's binding-refresh coalescing window, ms. A continuing session's request refreshes its
 * binding at commit and again at release, and a refresh only extends peers' idle deadline: in the
 * mesh these were most of the events per batch (issue 13; `npm run bench:mesh`). One second drops
 * them to about one per session per second, while a peer's copy of a binding idles out at most
 * 1 s (and at most TTL / 8) before ours (affinity-table.ts refreshCoalesceWindowMs).
 */
export const DEFAULT_DAEMON_BINDING_REFRESH_COALESCE_MS = 1_000;

/**
 * Default drain window, s: long enough for a load balancer or a Kubernetes endpoints controller to
 * see `/ready` fail (a 1-2 s probe period, then propagation) and stop sending, short against the
 * pod's default 30 s termination grace.
 */
export const DEFAULT_DRAIN_SECS = 5;

/**
 * The endpoint picker's tokenizer (src/tokenize/tokenizer-options.ts defines each field, its flag
 * and its default): `tokenizer` engine (a ready worker renders and tokenizes) or file (with
 * `tokenizerFile`, in process). Given --tokenizer-file alone, the mode is file. Needs extProcPort.
 */
export interface DaemonConfig extends TokenizerOptions {
  readonly host: string;
  readonly port: number;
  readonly logLevel: LogLevel;
  readonly sessionAffinityTtlSecs?: number | undefined;
  readonly sessionAffinityMode: "hard" | "soft";
  /** Session-binding refreshes within this many ms of the binding's last publication are not published (0 = all are); capped at the TTL / 8. */
  readonly bindingRefreshCoalesceMs: number;
  readonly selector: Partial<SelectorConfig>;
  readonly activeRequestExpirySecs: number;
  /** Most live bookings this replica makes itself (429 beyond). */
  readonly maxReservations: number;
  /** Spread argmin ties across mesh replicas by slot (on by default; off to measure the race). */
  readonly replicaTieSpread: boolean;
  /** With KV events on (the default) a worker rank needs a kv_events_endpoint to be schedulable. */
  readonly kvEvents: boolean;
  /** In-flight prefixes: a routed prompt counts as cached on its rank this long before its engine reports it, s (0: off; src/core/predicted-cache.ts). */
  readonly predictedTtlSecs: number;
  /** Without KV events (--no-kv-events): how long a routing decision counts as the rank's cache, s (0: no cache awareness). */
  readonly approxTtlSecs: number;
  /** Predicted (rank, block) checkpoint pairs per rank, at most (oldest bookings shed first, counted). */
  readonly predictedMaxBlocksPerRank: number;
  /** KV sockets, decoding and block hashing on a worker thread; the main thread only indexes (docs/ingest-thread.md). */
  readonly kvIngestThread: boolean;
  /** The ingest thread's hand-over window: batches and bytes posted and not applied yet, at most (src/ingest/kv-ingest-window.ts). */
  readonly kvIngestWindowBatches: number;
  readonly kvIngestWindowBytes: number;
  readonly replayTimeoutMs: number;
  readonly selectionCacheTtlSecs: number;
  readonly selectionCacheMaxEntries: number;
  /** Byte budget of the cached selections (their hashes and ids); the oldest are evicted past it. */
  readonly selectionCacheMaxBytes: number;
  /** decode_busy is reported above this fraction of the worker's total_kv_blocks (unset: not reported). */
  readonly decodeBusyThreshold?: number | undefined;
  /** An advisory answer's worker_load.prefill_busy is reported above this fraction of its prefill capacity (unset: not reported). */
  readonly prefillBusyThreshold?: number | undefined;
  /** Byte budget of this replica's live bookings; a booking past it gets 429 KVMESH_OVERLOADED. */
  readonly maxReservationBytes: number;
  /** Most partitions (model_name, routing_group) at once; a registration past it gets 409 KVMESH_FLEET_LIMIT. */
  readonly maxPartitions: number;
  /** Most worker ranks (sum of data_parallel_size) at once; a registration past it gets 409 KVMESH_FLEET_LIMIT. */
  readonly maxRanks: number;
  readonly bodyLimitBytes: number;
  /** HTTP connections at once; unset: half the fd reserve (src/util/fd-budget.ts defaultMaxConnections). */
  readonly maxConnections?: number | undefined;
  /** HTTP connections at once from one remote address; unset: half of maxConnections (a load balancer's few addresses still get most). */
  readonly maxConnectionsPerClient?: number | undefined;
  /** A JSON or YAML list of workers (the POST /workers shape) reconciled into the catalogue and watched (src/app/workers-file.ts). */
  readonly workersFile?: string | undefined;
  /** On SIGTERM: seconds `/ready` answers 503 while everything else is served, before shutting down (0: at once). */
  readonly drainSecs: number;
  /** Enables the replica mesh: the PUB binds here on `host` (the control ROUTER on the next port). */
  readonly replicaSyncPort?: number | undefined;
  /** Peers' replica-sync endpoints (`tcp://host:port`), or `dns:NAME:PORT` entries re-resolved (mesh/dns-peers.ts); needs replicaSyncPort. */
  readonly peers: readonly string[];
  /** How often `dns:` peers are re-resolved, s. */
  readonly peerDnsIntervalSecs: number;
  /** Longest `/ready` answers 503 after a start while the mesh pulls its peers' first snapshots, s (0: not at all). */
  readonly meshStartupSyncSecs: number;
  /** Longest `/ready` answers 503 (index_syncing) after a start while a peer's prefix index is installed, s (0: no warm join; src/app/warm-join.ts). */
  readonly indexSyncSecs: number;
  /** Host peers use to reach this replica, when `host` is a wildcard (default: `host`, or 127.0.0.1). */
  readonly replicaSyncAdvertiseHost?: string | undefined;
  /**
   * How the mesh shares each replica's load (src/core/replica-events.ts LoadReplication): per-rank
   * totals ("aggregate", the default: a peer's cost no longer grows with the request rate) or every
   * booking ("exact"). Every replica of one mesh must use the same.
   */
  readonly loadReplication: LoadReplication;
  /** Minimum spacing between the mesh's outbound flushes in exact load replication, ms (mesh/publisher.ts says why 2). */
  readonly meshFlushIntervalMs: number;
  /** The same in aggregate load replication, ms: at most one batch per interval reaches each peer. */
  readonly meshAggregateIntervalMs: number;
  /** How often the mesh heartbeats its peers, ms. */
  readonly meshHeartbeatIntervalMs: number;
  /** Read peers' updates on a receive thread (mesh/thread-reader.ts) instead of the main thread, with or without CURVE. */
  readonly meshReceiveThread: boolean;
  /** With the receive thread: how often it hands what arrived to the main thread, ms. */
  readonly meshApplyIntervalMs: number;
  /** With the receive thread: the longest its hand-overs wait for the main thread when no HTTP request pulls them, ms. */
  readonly meshApplyMaxDelayMs: number;
  /** CURVE for the mesh (`--mesh-key`, `--mesh-allow`): this replica's key pair and the keys it accepts. Needs replicaSyncPort. */
  readonly meshCurve?: MeshCurveConfig | undefined;
  /**
   * Run a plain (no CURVE) mesh on a non-loopback --host anyway: refused without it, since anyone
   * who reaches the mesh ports can then join, read and cut the mesh (docs/security.md).
   */
  readonly meshInsecure: boolean;
  /** Bearer token the state-changing HTTP routes require (`--api-token-file`, src/http/auth.ts); unset: no authentication. */
  readonly apiToken?: ApiToken | undefined;
  /**
   * Host replication: the writer id of this replica's session bindings, which a host relays
   * through GET /session_bindings/updates and POST /session_bindings. Needs session affinity;
   * excludes replicaSyncPort.
   */
  readonly sessionReplicationWriterId?: bigint | undefined;
  /**
   * Turns request tracing on: OTLP/HTTP spans are POSTed here (a URL without a path gets
   * /v1/traces). Unset: off, and OpenTelemetry is not loaded. `kvmesh serve` also takes it from
   * the standard OTEL_EXPORTER_OTLP_* variables; startDaemon reads no environment.
   */
  readonly otlpTracesEndpoint?: string | undefined;
  /** The traces' service.name (`kvmesh serve`: OTEL_SERVICE_NAME). */
  readonly otlpServiceName: string;
  /** Serve the endpoint picker (Envoy ext_proc, GIE's protocol) on this port of `host` (docs/gateway.md); unset: off. */
  readonly extProcPort?: number | undefined;
  /** TLS for ext_proc: PEM certificate chain and private key files (both or neither; neither: cleartext HTTP/2). */
  readonly extProcTlsCertFile?: string | undefined;
  readonly extProcTlsKeyFile?: string | undefined;
  /** Also serve gRPC Health alone, cleartext, on this port (GIE's EPPs use 9003); needs extProcPort. */
  readonly extProcHealthPort?: number | undefined;
  /** Largest request body the picker buffers, bytes (413 beyond). */
  readonly extProcMaxBodyBytes: number;
  /** The ext_proc port's HTTP/2 receive window per stream, bytes (Node's default: 64 KiB). */
  readonly extProcStreamWindowBytes: number;
  /** The ext_proc port's HTTP/2 receive window per connection, shared by its streams, bytes. */
  readonly extProcConnectionWindowBytes: number;
  /** The request header carrying the session id (absent: routed by cache and load alone). */
  readonly sessionHeader: string;
  /** The request header carrying the routing group (absent: the default group). */
  readonly routingGroupHeader: string;
  /** When tokenization fails: route by session and load alone ("route"), or answer 503 ("reject"). */
  readonly tokenizerFailure: TokenizerFailure;
  /** Data-parallel rank r of a worker listens on its endpoint's port + (r - start rank) x this. */
  readonly dpRankPortStride: number;
}

export const DEFAULT_DAEMON_CONFIG: DaemonConfig = Object.freeze({
  host: DEFAULT_HOST,
  port: DEFAULT_HTTP_PORT,
  logLevel: "info",
  sessionAffinityTtlSecs: undefined,
  sessionAffinityMode: "hard",
  bindingRefreshCoalesceMs: DEFAULT_DAEMON_BINDING_REFRESH_COALESCE_MS,
  // Only what the operator set; the core fills in DEFAULT_SELECTOR_CONFIG.
  selector: {},
  activeRequestExpirySecs: DEFAULT_ACTIVE_REQUEST_EXPIRY_MS / MS_PER_SEC,
  maxReservations: DEFAULT_MAX_LOCAL_RESERVATIONS,
  replicaTieSpread: true,
  kvEvents: true,
  predictedTtlSecs: DEFAULT_PREDICTED_TTL_SECS,
  approxTtlSecs: DEFAULT_APPROX_TTL_SECS,
  predictedMaxBlocksPerRank: DEFAULT_MAX_PREDICTED_BLOCKS_PER_RANK,
  kvIngestThread: true,
  kvIngestWindowBatches: DEFAULT_INGEST_WINDOW_BATCHES,
  kvIngestWindowBytes: DEFAULT_INGEST_WINDOW_BYTES,
  replayTimeoutMs: DEFAULT_REPLAY_TIMEOUT_MS,
  selectionCacheTtlSecs: DEFAULT_PENDING_TTL_MS / MS_PER_SEC,
  selectionCacheMaxEntries: DEFAULT_PENDING_MAX_ENTRIES,
  selectionCacheMaxBytes: DEFAULT_PENDING_MAX_BYTES,
  maxReservationBytes: DEFAULT_MAX_RESERVATION_BYTES,
  maxPartitions: DEFAULT_MAX_PARTITIONS,
  maxRanks: DEFAULT_MAX_RANKS,
  bodyLimitBytes: DEFAULT_BODY_LIMIT_BYTES,
  maxConnections: undefined,
  maxConnectionsPerClient: undefined,
  workersFile: undefined,
  drainSecs: DEFAULT_DRAIN_SECS,
  replicaSyncPort: undefined,
  peers: [],
  peerDnsIntervalSecs: DEFAULT_PEER_DNS_INTERVAL_SECS,
  meshStartupSyncSecs: DEFAULT_MESH_STARTUP_SYNC_SECS,
  indexSyncSecs: DEFAULT_INDEX_SYNC_SECS,
  replicaSyncAdvertiseHost: undefined,
  loadReplication: "aggregate",
  meshFlushIntervalMs: DEFAULT_MESH_FLUSH_INTERVAL_MS,
  meshAggregateIntervalMs: DEFAULT_MESH_AGGREGATE_FLUSH_INTERVAL_MS,
  meshHeartbeatIntervalMs: DEFAULT_MESH_HEARTBEAT_INTERVAL_MS,
  meshReceiveThread: true,
  meshApplyIntervalMs: DEFAULT_MESH_APPLY_INTERVAL_MS,
  meshApplyMaxDelayMs: DEFAULT_MESH_APPLY_MAX_DELAY_MS,
  meshInsecure: false,
  meshCurve: undefined,
  apiToken: undefined,
  sessionReplicationWriterId: undefined,
  otlpTracesEndpoint: undefined,
  otlpServiceName: DEFAULT_TRACES_SERVICE_NAME,
  extProcPort: undefined,
  extProcTlsCertFile: undefined,
  extProcTlsKeyFile: undefined,
  extProcHealthPort: undefined,
  extProcMaxBodyBytes: DEFAULT_EXT_PROC_MAX_BODY_BYTES,
  extProcStreamWindowBytes: DEFAULT_EXT_PROC_STREAM_WINDOW_BYTES,
  extProcConnectionWindowBytes: DEFAULT_EXT_PROC_CONNECTION_WINDOW_BYTES,
  sessionHeader: DEFAULT_SESSION_HEADER,
  routingGroupHeader: DEFAULT_ROUTING_GROUP_HEADER,
  tokenizerFailure: "route",
  dpRankPortStride: DEFAULT_DP_RANK_PORT_STRIDE,
  ...DEFAULT_TOKENIZER_OPTIONS,
});

/**
 * Where the secrets come from. Files only, never values: argv shows in `ps` and shell history.
 * resolveDaemonConfig reads them, once the fields make sense, into meshCurve and apiToken.
 */
export interface SecretFiles {
  /** This replica's CURVE secret key file (`kvmesh keys generate`); needs meshAllowFiles and replicaSyncPort. */
  readonly meshKeyFile?: string | undefined;
  /** Public key files of the replicas this one accepts and dials; needs meshKeyFile. */
  readonly meshAllowFiles?: readonly string[] | undefined;
  readonly apiTokenFile?: string | undefined;
}

/** What a caller gives: any subset of the config (unset or undefined: from DEFAULT_DAEMON_CONFIG) and secret files. */
export type DaemonConfigInput = { readonly [K in keyof DaemonConfig]?: DaemonConfig[K] | undefined } & SecretFiles;

/** A field a config error can name: the daemon's own, a secret file, or one selector weight. */
export type ConfigField = keyof DaemonConfig | keyof SecretFiles | `selector.${keyof SelectorConfig}`;

/** How a message names a field: the field itself by default; the CLI passes its flag (and env variable). */
export type FieldNamer = (field: ConfigField) => string;

declare const resolvedBrand: unique symbol;
/** A config that resolveDaemonConfig returned: defaults filled in, every rule checked, secrets read. */
export type ResolvedDaemonConfig = DaemonConfig & { readonly [resolvedBrand]: true };

export interface ResolveOptions {
  readonly name?: FieldNamer;
  /** Non-fatal findings (a group-readable secret file), for the log. */
  readonly warn?: (message: string) => void;
}

/** A config error: KVMESH_INVALID_OPTION naming the field in `details.field`. */
export function configError(field: ConfigField, message: string, cause?: unknown): KvmeshError {
  return new KvmeshError("KVMESH_INVALID_OPTION", message, { details: { field }, ...(cause === undefined ? {} : { cause }) });
}

export const isConfigError = (e: unknown): e is KvmeshError => isKvmeshError(e) && e.code === "KVMESH_INVALID_OPTION";

/** The field a config error names (undefined for any other error). */
export function configErrorField(e: unknown): ConfigField | undefined {
  const field = isConfigError(e) ? e.details?.["field"] : undefined;
  // configError is the only maker of KVMESH_INVALID_OPTION, and it takes a ConfigField.
  return typeof field === "string" ? (field as ConfigField) : undefined;
}

const resolvedConfigs = new WeakSet<object>();

/**
 * Fills in the defaults, checks every rule spanning several fields (the daemon's here, the
 * core's by the core), reads the secret files and returns the config to run with. Throws a
 * KVMESH_INVALID_OPTION error naming the first field at fault. A config it returned comes back
 * as it is, so the CLI's check is not repeated by startDaemon.
 */
export function resolveDaemonConfig(input: DaemonConfigInput = {}, options: ResolveOptions = {}): ResolvedDaemonConfig {
  if (resolvedConfigs.has(input)) return input as ResolvedDaemonConfig;
  const name: FieldNamer = options.name ?? ((field) => field);
  const { meshKeyFile, meshAllowFiles, apiTokenFile, ...given } = input;
  const set = Object.fromEntries(Object.entries(given).filter(([, v]) => v !== undefined)) as Partial<DaemonConfig>;
  // --tokenizer-file alone means file mode (the default mode is engine).
  const tokenizer = set.tokenizer ?? (set.tokenizerFile === undefined ? DEFAULT_DAEMON_CONFIG.tokenizer : "file");
  const config: DaemonConfig = { ...DEFAULT_DAEMON_CONFIG, ...set, tokenizer, selector: { ...DEFAULT_DAEMON_CONFIG.selector, ...set.selector } };
  const files: SecretFiles = { meshKeyFile, meshAllowFiles, apiTokenFile };
  const problem = replicaSyncProblem(config, name) ?? hostReplicationProblem(config, name) ?? meshSecurityProblem(config, files, name) ?? tracingProblem(config, name) ?? extProcProblem(config, name) ?? connectionProblem(config, name) ?? tokenizerProblem(config, set, name);
  if (problem !== undefined) throw configError(problem.field, problem.message);
  checkCoreOptions(serviceOptionsOf(config), name);
  const resolved = Object.freeze(withSecrets(config, files, name, options.warn ?? (() => undefined)));
  resolvedConfigs.add(resolved);
  return resolved as ResolvedDaemonConfig;
}

/** The HTTP connection caps: positive integers, the per-client one not above the total. */
export function connectionProblem(config: DaemonConfig, name: FieldNamer = (f) => f): ConfigProblem | undefined {
  for (const field of ["maxConnections", "maxConnectionsPerClient"] as const) {
    const v = config[field];
    if (v !== undefined && !(Number.isSafeInteger(v) && v > 0)) return { field, message: `${name(field)} must be a positive integer, got ${String(v)}` };
  }
  const { maxConnections: max, maxConnectionsPerClient: perClient } = config;
  if (max !== undefined && perClient !== undefined && perClient > max) {
    return { field: "maxConnectionsPerClient", message: `${name("maxConnectionsPerClient")} ${String(perClient)} is above ${name("maxConnections")} ${String(max)}` };
  }
  return undefined;
}

/** The caps the HTTP server applies: the configured ones, else derived from the process's fd limit. */
export function connectionLimitsOf(config: DaemonConfig, fdLimit: number | null = processFdLimit()): ConnectionLimits {
  const max = config.maxConnections ?? defaultMaxConnections(fdLimit);
  return { max, perClient: config.maxConnectionsPerClient ?? Math.max(1, Math.min(max, Math.ceil(max / 2))) };
}

export interface ConfigProblem {
  readonly field: ConfigField;
  readonly message: string;
}

/**
 * The replica-sync fields; undefined when fine. The mesh binds the publish port and the next one
 * (control) on `host`, so either on the HTTP port would fail at startup with a bare EADDRINUSE;
 * here the message names the field.
 */
export function replicaSyncProblem(config: DaemonConfig, name: FieldNamer = (f) => f): ConfigProblem | undefined {
  const port = config.replicaSyncPort;
  if (port === undefined) {
    // The reference refuses initial peers without a port too (replica_sync_requires_port_for_initial_peers).
    if (config.peers.length > 0) return { field: "peers", message: `${name("peers")} requires ${name("replicaSyncPort")}` };
    if (config.replicaSyncAdvertiseHost !== undefined) {
      return { field: "replicaSyncAdvertiseHost", message: `${name("replicaSyncAdvertiseHost")} requires ${name("replicaSyncPort")}` };
    }
    return undefined;
  }
  const controlPort = port + CONTROL_PORT_OFFSET;
  const field = "replicaSyncPort";
  const sync = name(field);
  if (controlPort > MAX_TCP_PORT) return { field, message: `${sync} ${port} leaves no room for the control port (${port} + ${CONTROL_PORT_OFFSET} > ${MAX_TCP_PORT})` };
  if (port === config.port) return { field, message: `${sync} ${port} is the same as ${name("port")} ${config.port} (the HTTP port)` };
  if (controlPort === config.port) return { field, message: `${sync} ${port} puts its control port (${controlPort}) on ${name("port")} ${config.port} (the HTTP port)` };
  return undefined;
}

/**
 * Host replication carries session bindings, so it needs affinity. The core refuses this too
 * (sessionAffinity); the daemon states it as the flag to add, like --peers needing a port. That
 * it excludes the mesh is left to the core.
 */
export function hostReplicationProblem(config: DaemonConfig, name: FieldNamer = (f) => f): ConfigProblem | undefined {
  if (config.sessionReplicationWriterId === undefined || config.sessionAffinityTtlSecs !== undefined) return undefined;
  const field = "sessionReplicationWriterId";
  return { field, message: `${name(field)} requires ${name("sessionAffinityTtlSecs")} (without session affinity there are no bindings to replicate)` };
}

/** CURVE needs a key pair, the keys to accept, and a mesh to secure; checked before any file is read. */
export function meshSecurityProblem(config: DaemonConfig, files: SecretFiles, name: FieldNamer = (f) => f): ConfigProblem | undefined {
  const key = files.meshKeyFile !== undefined;
  const allow = files.meshAllowFiles !== undefined && files.meshAllowFiles.length > 0;
  if (allow && !key) return { field: "meshAllowFiles", message: `${name("meshAllowFiles")} requires ${name("meshKeyFile")} (this replica's own key pair)` };
  if (key && !allow) {
    return {
      field: "meshKeyFile",
      message: `${name("meshKeyFile")} requires ${name("meshAllowFiles")} (the .pub files of the replicas to accept; list this replica's own .pub if the fleet shares one key pair)`,
    };
  }
  const field = key ? "meshKeyFile" : "meshCurve";
  if ((key || config.meshCurve !== undefined) && config.replicaSyncPort === undefined) {
    return { field, message: `${name(field)} requires ${name("replicaSyncPort")} (CURVE secures the replica mesh)` };
  }
  if (config.replicaSyncPort !== undefined && !key && config.meshCurve === undefined && !isLoopbackHost(config.host) && !config.meshInsecure) {
    return {
      field: "meshInsecure",
      message:
        `${name("replicaSyncPort")} on ${name("host")} ${config.host} without CURVE lets anyone who reaches ports ${config.replicaSyncPort} and ${config.replicaSyncPort + CONTROL_PORT_OFFSET} ` +
        `join the mesh, read every booking and binding, and inject or cut peers: give ${name("meshKeyFile")} and ${name("meshAllowFiles")}, ` +
        `or ${name("meshInsecure")} on a network where only replicas can reach them`,
    };
  }
  return undefined;
}

/** The traces endpoint must be an http(s) URL; the service name must not be empty. */
export function tracingProblem(config: DaemonConfig, name: FieldNamer = (f) => f): ConfigProblem | undefined {
  const endpoint = config.otlpTracesEndpoint;
  const bad = endpoint === undefined ? undefined : tracesEndpointProblem(endpoint);
  if (bad !== undefined) return { field: "otlpTracesEndpoint", message: `${name("otlpTracesEndpoint")}: ${bad}` };
  if (config.otlpServiceName.trim() === "") return { field: "otlpServiceName", message: `${name("otlpServiceName")} must not be empty` };
  return undefined;
}

/** An HTTP header name as Envoy hands it to ext_proc: a lower-case token (RFC 9110). */
const HEADER_NAME = /^[a-z0-9!#$%&'*+.^_`|~-]+$/;

/**
 * The endpoint picker's fields: TLS needs both files (readable), the health port needs the
 * ext_proc port, no port collides with another of this replica's, header names are header names.
 */
export function extProcProblem(config: DaemonConfig, name: FieldNamer = (f) => f): ConfigProblem | undefined {
  const { extProcPort: port, extProcTlsCertFile: cert, extProcTlsKeyFile: key, extProcHealthPort: health } = config;
  if ((cert === undefined) !== (key === undefined)) {
    const field = cert === undefined ? "extProcTlsKeyFile" : "extProcTlsCertFile";
    const other = cert === undefined ? "extProcTlsCertFile" : "extProcTlsKeyFile";
    return { field, message: `${name(field)} requires ${name(other)} (TLS needs the certificate chain and its private key)` };
  }
  for (const field of ["extProcTlsCertFile", "extProcTlsKeyFile", "extProcHealthPort"] as const) {
    if (config[field] !== undefined && port === undefined) return { field, message: `${name(field)} requires ${name("extProcPort")}` };
  }
  for (const field of ["extProcTlsCertFile", "extProcTlsKeyFile"] as const) {
    const file = config[field];
    if (file === undefined) continue;
    try {
      accessSync(file, fsConstants.R_OK);
    } catch (err) {
      return { field, message: `${name(field)}: cannot read ${file} (${(err as NodeJS.ErrnoException).code ?? String(err)})` };
    }
  }
  if (port !== undefined && port !== 0) {
    const taken: [ConfigField, number | undefined][] = [
      ["port", config.port],
      ["replicaSyncPort", config.replicaSyncPort],
      ["replicaSyncPort", config.replicaSyncPort === undefined ? undefined : config.replicaSyncPort + CONTROL_PORT_OFFSET],
    ];
    for (const [other, p] of taken) if (p === port) return { field: "extProcPort", message: `${name("extProcPort")} ${port} collides with ${name(other)} (port ${p} is taken)` };
    if (health === port) return { field: "extProcHealthPort", message: `${name("extProcHealthPort")} ${health} is the same as ${name("extProcPort")}` };
  }
  for (const field of ["sessionHeader", "routingGroupHeader"] as const) {
    if (!HEADER_NAME.test(config[field])) return { field, message: `${name(field)}: ${JSON.stringify(config[field])} is not a lower-case HTTP header name` };
  }
  if (config.sessionHeader === config.routingGroupHeader) return { field: "routingGroupHeader", message: `${name("routingGroupHeader")} must differ from ${name("sessionHeader")}` };
  return undefined;
}

const TOKENIZER_FIELDS: readonly (keyof TokenizerOptions)[] = TOKENIZER_OPTION_DEFINITIONS.map((d) => d.field);

/**
 * The tokenizer's fields: given only with the endpoint picker (it is their one user), checked by
 * the tokenizer's own resolve function (its field, this config's name for it), and the file
 * readable. `given` holds what the caller set (the defaults cannot need --ext-proc-port).
 */
export function tokenizerProblem(config: DaemonConfig, given: Partial<DaemonConfig>, name: FieldNamer = (f) => f): ConfigProblem | undefined {
  if (config.extProcPort === undefined) {
    // A value equal to its default is not a request for tokenization (a library caller spreads
    // DEFAULT_DAEMON_CONFIG, which carries the default mode).
    const field = TOKENIZER_FIELDS.find((f) => given[f] !== undefined && given[f] !== DEFAULT_DAEMON_CONFIG[f]);
    if (field !== undefined) return { field, message: `${name(field)} requires ${name("extProcPort")} (tokenization serves the endpoint picker)` };
  }
  try {
    resolveTokenizerOptions(Object.fromEntries(TOKENIZER_FIELDS.map((f) => [f, config[f]])));
  } catch (err) {
    const field = isKvmeshError(err) ? err.details?.["field"] : undefined;
    if (typeof field !== "string" || !(TOKENIZER_FIELDS as readonly string[]).includes(field)) throw err;
    const f = field as keyof TokenizerOptions;
    const problem = (err as KvmeshError).message.replace(`${f}: `, "").replace("--tokenizer file", `${name("tokenizer")} file`);
    return { field: f, message: `${name(f)}: ${problem}` };
  }
  const file = config.tokenizerFile;
  if (file !== undefined) {
    try {
      accessSync(file, fsConstants.R_OK);
    } catch (err) {
      return { field: "tokenizerFile", message: `${name("tokenizerFile")}: cannot read ${file} (${(err as NodeJS.ErrnoException).code ?? String(err)})` };
    }
  }
  return undefined;
}

const LOOPBACK_HOSTS: ReadonlySet<string> = new Set(["localhost", "::1", "[::1]"]);

/** 127.0.0.0/8, ::1 and localhost: reachable from this machine only. */
export function isLoopbackHost(host: string): boolean {
  return LOOPBACK_HOSTS.has(host.toLowerCase()) || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

const WILDCARD_HOSTS: ReadonlySet<string> = new Set(["0.0.0.0", "::", "*"]);

/** The replica-sync endpoints: where the PUB binds, and how peers reach it. */
export function replicaSyncEndpoints(config: DaemonConfig): { bind: string; advertise: string } | undefined {
  if (config.replicaSyncPort === undefined) return undefined;
  const wild = WILDCARD_HOSTS.has(config.host);
  const bracket = (h: string): string => (h.includes(":") ? `[${h}]` : h);
  const bindHost = wild ? "*" : bracket(config.host);
  const adv = config.replicaSyncAdvertiseHost ?? (wild ? "127.0.0.1" : config.host);
  return { bind: `tcp://${bindHost}:${config.replicaSyncPort}`, advertise: `tcp://${bracket(adv)}:${config.replicaSyncPort}` };
}

/** The selection core's options for this config (what startDaemon constructs the service with). */
export function serviceOptionsOf(config: DaemonConfig): SelectionServiceOptions {
  const sync = replicaSyncEndpoints(config);
  return {
    ...(sync === undefined ? {} : { replicaSync: { publishBind: sync.bind, advertiseEndpoint: sync.advertise, peers: config.peers } }),
    ...(config.sessionReplicationWriterId === undefined ? {} : { sessionReplicationWriterId: config.sessionReplicationWriterId }),
    selector: config.selector,
    activeRequestExpiryMs: config.activeRequestExpirySecs * MS_PER_SEC,
    maxLocalReservations: config.maxReservations,
    maxReservationBytes: config.maxReservationBytes,
    maxPartitions: config.maxPartitions,
    maxRanks: config.maxRanks,
    bindingRefreshCoalesceMs: config.bindingRefreshCoalesceMs,
    // Without a mesh nothing is replicated, and exact mode keeps no per-rank change record.
    loadReplication: sync === undefined ? "exact" : config.loadReplication,
    requireKvEventsEndpoint: config.kvEvents,
    // With KV events the prediction bridges the engine's report; without, it is the only cache.
    predictedCache: { ttlMs: (config.kvEvents ? config.predictedTtlSecs : config.approxTtlSecs) * MS_PER_SEC, maxBlocksPerRank: config.predictedMaxBlocksPerRank },
    selectionCache: { ttlMs: config.selectionCacheTtlSecs * MS_PER_SEC, maxEntries: config.selectionCacheMaxEntries, maxBytes: config.selectionCacheMaxBytes },
    busyThresholds: { decode: config.decodeBusyThreshold, prefill: config.prefillBusyThreshold },
    ...(config.sessionAffinityTtlSecs === undefined
      ? {}
      : { sessionAffinity: { ttlSecs: config.sessionAffinityTtlSecs, mode: config.sessionAffinityMode } }),
  };
}

const snakeCase = (key: string): string => key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/**
 * The core's option names (its errors' `details.field`, and words in their messages) -> the
 * config field that sets them. Selector weights appear as their snake_case knob, some with the
 * reference's `router_` prefix.
 */
const CORE_FIELDS: ReadonlyMap<string, ConfigField> = new Map<string, ConfigField>([
  ["sessionReplicationWriterId", "sessionReplicationWriterId"],
  ["sessionAffinity", "sessionAffinityTtlSecs"],
  ["session_affinity_ttl_secs", "sessionAffinityTtlSecs"],
  ["replicaSync.publishBind", "replicaSyncPort"],
  ["replicaSync.advertiseEndpoint", "replicaSyncAdvertiseHost"],
  ["replicaSync.peers", "peers"],
  ["replicaSync", "replicaSyncPort"],
  ["activeRequestExpiryMs", "activeRequestExpirySecs"],
  ["predictedCache.ttlMs", "predictedTtlSecs"],
  ["predictedCache.maxBlocksPerRank", "predictedMaxBlocksPerRank"],
  ["maxLocalReservations", "maxReservations"],
  ["loadReplication", "loadReplication"],
  ["bindingRefreshCoalesceMs", "bindingRefreshCoalesceMs"],
  ["busyThresholds.decode", "decodeBusyThreshold"],
  ["busyThresholds.prefill", "prefillBusyThreshold"],
  ...Object.keys(DEFAULT_SELECTOR_CONFIG).flatMap((key): [string, ConfigField][] => {
    const field = `selector.${key as keyof SelectorConfig}` as const;
    return [
      [snakeCase(key), field],
      [`router_${snakeCase(key)}`, field],
    ];
  }),
]);

const escapeRegExp = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
/** Longest first, so `replicaSync.publishBind` is one name, not `replicaSync` and a tail. */
const CORE_NAME = new RegExp(
  `(?<![\\w.])(${[...CORE_FIELDS.keys()]
    .sort((a, b) => b.length - a.length)
    .map(escapeRegExp)
    .join("|")})(?![\\w])`,
  "g",
);

/**
 * Runs the core's own checks on exactly the options startDaemon will construct it with, and turns
 * a refusal into a config error: the field becomes this config's, and the core's option names in
 * the message become `name`'s (for the CLI: the flags). resolveServiceOptions is the core's one
 * check of its options, the one SelectionService's constructor runs.
 */
function checkCoreOptions(options: SelectionServiceOptions, name: FieldNamer): void {
  try {
    resolveServiceOptions(options);
  } catch (err) {
    const coreField = isKvmeshError(err) ? err.details?.["field"] : undefined;
    if (typeof coreField !== "string") throw err;
    const field = CORE_FIELDS.get(coreField.replace(/\[\d+\]$/, ""));
    if (field === undefined) throw err;
    const message = (err as KvmeshError).message.replace(CORE_NAME, (word: string) => {
      const mapped = CORE_FIELDS.get(word);
      return mapped === undefined ? word : name(mapped);
    });
    throw configError(field, message, err);
  }
}

/**
 * Reads the key and token files into the config. A file that cannot be used is a config error
 * naming its field; the loaders' messages already name it (with `name`) and the file.
 */
function withSecrets(config: DaemonConfig, files: SecretFiles, name: FieldNamer, warn: (message: string) => void): DaemonConfig {
  let out = config;
  if (files.meshKeyFile !== undefined) {
    const keyFile = files.meshKeyFile;
    const curve = loadingAs(["meshKeyFile", "meshAllowFiles"], name, () =>
      loadMeshCurveConfig({ keyFile, allowFiles: files.meshAllowFiles ?? [] }, { key: name("meshKeyFile"), allow: name("meshAllowFiles") }),
    );
    for (const w of curve.warnings) warn(w);
    out = { ...out, meshCurve: curve };
  }
  if (files.apiTokenFile !== undefined) {
    const file = files.apiTokenFile;
    const { token, warnings } = loadingAs(["apiTokenFile"], name, () => loadApiTokenFile(file, name("apiTokenFile")));
    for (const w of warnings) warn(w);
    out = { ...out, apiToken: token };
  }
  return out;
}

/** Runs a loader; its error becomes a config error for whichever of `fields` it named. */
function loadingAs<T>(fields: readonly [ConfigField, ...ConfigField[]], name: FieldNamer, load: () => T): T {
  try {
    return load();
  } catch (err) {
    const named = isKvmeshError(err) ? err.details?.["field"] : undefined;
    const field = fields.find((f) => name(f) === named) ?? fields[0];
    throw configError(field, err instanceof Error ? err.message : String(err), err);
  }
}
