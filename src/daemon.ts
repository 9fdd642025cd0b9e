/**
 * The daemon: a SelectionService fed by KV-event listeners (one ZeroMQ SUB per worker rank, kept
 * in step with the worker catalog), served over HTTP, with periodic upkeep. `kvmesh serve`
 * builds a DaemonConfig from flags and calls startDaemon; tests start it in process.
 */
import type { Logger } from "pino";
import { KvmeshError } from "./core/errors.js";
import { KvIngest } from "./ingest/kv-ingest.js";
import { raiseZmqSocketLimit } from "./ingest/zmq-socket-limit.js";
import { HttpMetrics } from "./http/metrics.js";
import { registerIngestMetrics } from "./metrics/ingest-metrics.js";
import { createMetricsRegistry } from "./metrics/registry.js";
import { registerServiceMetrics } from "./metrics/service-metrics.js";
import { startHttpServer, type MeshControl, type RunningHttpServer } from "./http/server.js";
import { ReplicaMesh } from "../mesh/replica-mesh.js";
import type { MeshCurveConfig } from "../mesh/curve.js";
import type { ApiToken } from "./http/auth.js";
import { DEFAULT_MAX_LOCAL_RESERVATIONS, SelectionService } from "./core/selection-service.js";
import type { SelectorConfig } from "./core/selector-config.js";

/** How often expiry, reservation sweeps and cache reaping run, ms. */
export const MAINTENANCE_INTERVAL_MS = 1_000;

export type LogLevel = "trace" | "debug" | "info" | "warn" | "error" | "fatal" | "silent";

export interface DaemonConfig {
  readonly host: string;
  readonly port: number;
  readonly logLevel: LogLevel;
  readonly sessionAffinityTtlSecs?: number | undefined;
  readonly sessionAffinityMode: "hard" | "soft";
  readonly selector: Partial<SelectorConfig>;
  readonly activeRequestExpirySecs: number;
  /** Most live bookings this replica makes itself (429 beyond). */
  readonly maxReservations: number;
  /** Spread argmin ties across mesh replicas by slot (on by default; off to measure the race). */
  readonly replicaTieSpread: boolean;
  /** With KV events on (the default) a worker rank needs a kv_events_endpoint to be schedulable. */
  readonly kvEvents: boolean;
  readonly replayTimeoutMs: number;
  readonly selectionCacheTtlSecs: number;
  readonly selectionCacheMaxEntries: number;
  readonly bodyLimitBytes: number;
  /** Enables the replica mesh: the XPUB binds here on `host` (the control ROUTER on the next port). */
  readonly replicaSyncPort?: number | undefined;
  /** Peers' replica-sync endpoints (`tcp://host:port`); needs replicaSyncPort. */
  readonly peers: readonly string[];
  /** Host peers use to reach this replica, when `host` is a wildcard (default: `host`, or 127.0.0.1). */
  readonly replicaSyncAdvertiseHost?: string | undefined;
  /** CURVE for the mesh (`--mesh-key`, `--mesh-allow`): this replica's key pair and the keys it accepts. Needs replicaSyncPort. */
  readonly meshCurve?: MeshCurveConfig | undefined;
  /** Bearer token the state-changing HTTP routes require (`--api-token-file`, src/http/auth.ts); unset: no authentication. */
  readonly apiToken?: ApiToken | undefined;
  /**
   * Host replication: the writer id of this replica's session bindings, which a host relays
   * through GET /session_bindings/updates and POST /session_bindings. Needs session affinity;
   * excludes replicaSyncPort.
   */
  readonly sessionReplicationWriterId?: bigint | undefined;
}

export const DEFAULT_DAEMON_CONFIG: DaemonConfig = Object.freeze({
  host: "127.0.0.1",
  port: 8092,
  logLevel: "info",
  sessionAffinityTtlSecs: undefined,
  sessionAffinityMode: "hard",
  selector: {},
  activeRequestExpirySecs: 300,
  maxReservations: DEFAULT_MAX_LOCAL_RESERVATIONS,
  replicaTieSpread: true,
  kvEvents: true,
  replayTimeoutMs: 2_000,
  selectionCacheTtlSecs: 120,
  selectionCacheMaxEntries: 4_096,
  bodyLimitBytes: 8 * 1024 * 1024,
  replicaSyncPort: undefined,
  peers: [],
  replicaSyncAdvertiseHost: undefined,
  meshCurve: undefined,
  apiToken: undefined,
  sessionReplicationWriterId: undefined,
});

export interface Daemon {
  readonly host: string;
  readonly port: number;
  readonly service: SelectionService;
  readonly mesh: ReplicaMesh | undefined;
  close(): Promise<void>;
}

export interface DaemonHooks {
  /** A host-provided mesh control instead of the built-in ZeroMQ mesh. */
  readonly mesh?: MeshControl;
}

const WILDCARD_HOSTS = new Set(["0.0.0.0", "::", "*"]);

/** The replica-sync endpoints: where the XPUB binds, and how peers reach it. */
export function replicaSyncEndpoints(config: DaemonConfig): { bind: string; advertise: string } | undefined {
  if (config.replicaSyncPort === undefined) return undefined;
  const wild = WILDCARD_HOSTS.has(config.host);
  const bracket = (h: string): string => (h.includes(":") ? `[${h}]` : h);
  const bindHost = wild ? "*" : bracket(config.host);
  const adv = config.replicaSyncAdvertiseHost ?? (wild ? "127.0.0.1" : config.host);
  return { bind: `tcp://${bindHost}:${config.replicaSyncPort}`, advertise: `tcp://${bracket(adv)}:${config.replicaSyncPort}` };
}

const LOOPBACK_HOSTS = new Set(["localhost", "::1", "[::1]"]);

/** 127.0.0.0/8, ::1 and localhost: reachable from this machine only. */
export function isLoopbackHost(host: string): boolean {
  return LOOPBACK_HOSTS.has(host.toLowerCase()) || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

/**
 * Says at startup what is protected, and warns when a socket others can reach is not: the
 * defaults (loopback HTTP, no mesh) are safe, so these fire only when the operator opened a port.
 */
function logSecurityPosture(config: DaemonConfig, logger: Logger): void {
  const exposed = !isLoopbackHost(config.host);
  const curve = config.meshCurve;
  logger.info(
    {
      host: config.host,
      api_token: config.apiToken !== undefined,
      mesh_curve: curve === undefined ? false : { public_key: curve.keyPair.publicKey, allowed_keys: curve.allow.length },
    },
    "security settings",
  );
  if (exposed && config.apiToken === undefined) {
    logger.warn({ host: config.host }, "HTTP API listens beyond loopback without --api-token-file: anyone who can reach it can register workers and book or free load");
  }
  if (exposed && config.replicaSyncPort !== undefined && curve === undefined) {
    logger.warn({ host: config.host, port: config.replicaSyncPort }, "replica mesh listens beyond loopback without --mesh-key: anyone who can reach it can read the replication stream and inject bookings");
  }
}

export async function startDaemon(config: DaemonConfig, logger: Logger, hooks: DaemonHooks = {}): Promise<Daemon> {
  if (config.meshCurve !== undefined && config.replicaSyncPort === undefined) {
    throw new KvmeshError("KVMESH_BAD_REQUEST", "meshCurve requires replicaSyncPort (--mesh-key needs --replica-sync-port)", { details: { field: "meshCurve" } });
  }
  logSecurityPosture(config, logger);
  raiseZmqSocketLimit();
  const syncEndpoints = replicaSyncEndpoints(config);
  // The service checks replication settings: host replication needs affinity and excludes the mesh.
  const service = new SelectionService({
    ...(syncEndpoints === undefined ? {} : { replicaSync: { publishBind: syncEndpoints.bind, advertiseEndpoint: syncEndpoints.advertise, peers: config.peers } }),
    ...(config.sessionReplicationWriterId === undefined ? {} : { sessionReplicationWriterId: config.sessionReplicationWriterId }),
    selector: config.selector,
    activeRequestExpiryMs: config.activeRequestExpirySecs * 1000,
    maxLocalReservations: config.maxReservations,
    requireKvEventsEndpoint: config.kvEvents,
    selectionCache: { ttlMs: config.selectionCacheTtlSecs * 1000, maxEntries: config.selectionCacheMaxEntries },
    ...(config.sessionAffinityTtlSecs === undefined
      ? {}
      : { sessionAffinity: { ttlSecs: config.sessionAffinityTtlSecs, mode: config.sessionAffinityMode } }),
  });
  const ingestLog = logger.child({ subsystem: "ingest" });
  const ingest = new KvIngest({
    logger: ingestLog,
    replayTimeoutMs: config.replayTimeoutMs,
    onBatch: (ref, batch) => {
      const r = service.applyKvEvents(BigInt(ref.workerId), ref.rank, batch);
      if (r.dropped > 0 && ingestLog.isLevelEnabled("debug")) {
        ingestLog.debug({ worker_id: ref.workerId, dp_rank: ref.rank, dropped: r.dropped }, "kv events dropped");
      }
    },
    onReset: (ref) => {
      ingestLog.info({ worker_id: ref.workerId, dp_rank: ref.rank }, "kv publisher restarted: clearing its blocks");
      service.clearWorkerKv(BigInt(ref.workerId), ref.rank);
    },
  });
  if (config.peers.length > 0 && config.replicaSyncPort === undefined) {
    throw new KvmeshError("KVMESH_BAD_REQUEST", "peers require replicaSyncPort (--peers needs --replica-sync-port)", { details: { field: "peers" } });
  }
  if (config.kvEvents) {
    // Listeners follow the catalog. KvIngest serialises its own changes, so a burst of
    // upserts applies in order; failures are logged, never unhandled.
    service.onWorkerChange(({ workerId, record }) => {
      const id = workerId.toString();
      const done =
        record === null
          ? ingest.remove(id)
          : ingest.upsert(
              id,
              service.kvEventsEndpointsOf(workerId).map(({ dpRank, endpoint }) => ({
                rank: dpRank,
                endpoint,
                replayEndpoint: record.data_parallel_size === 1 ? record.replay_endpoint : null,
              })),
            );
      done.catch((err: unknown) => {
        ingestLog.error({ err, worker_id: id }, "kv event listener update failed");
      });
    });
  }
  let mesh: ReplicaMesh | undefined;
  const sync = syncEndpoints;
  if (service.sessionReplicationWriterId !== undefined) {
    logger.info({ writer_id: service.sessionReplicationWriterId.toString() }, "host replication on: GET /session_bindings/updates, POST /session_bindings");
  }
  if (sync !== undefined) {
    try {
      mesh = await ReplicaMesh.start({
        service,
        publishBind: sync.bind,
        advertiseEndpoint: sync.advertise,
        peers: config.peers,
        logger: logger.child({ subsystem: "mesh" }),
        ...(config.meshCurve === undefined ? {} : { curve: config.meshCurve }),
        tieSpread: config.replicaTieSpread,
      });
      logger.info({ publish: sync.advertise, peers: config.peers, origin: service.replicaId.toString() }, "replica mesh up");
    } catch (err) {
      await ingest.close();
      throw err;
    }
  }
  // One registry per daemon (several run in one test process); each component adds its series.
  const registry = createMetricsRegistry();
  const metrics = new HttpMetrics(registry);
  registerServiceMetrics(registry, service);
  registerIngestMetrics(registry, () => ingest.stats());
  // Bridge until the mesh registers its own series on the registry (mesh/mesh-metrics.ts).
  if (mesh !== undefined) registry.appendText(() => mesh.metricsText());
  let http: RunningHttpServer;
  try {
    http = await startHttpServer({
      service,
      host: config.host,
      port: config.port,
      logger: logger.child({ subsystem: "http" }),
      metrics,
      bodyLimitBytes: config.bodyLimitBytes,
      mesh: hooks.mesh ?? mesh,
      apiToken: config.apiToken,
    });
  } catch (err) {
    await mesh?.close();
    await ingest.close();
    throw err;
  }
  const timer = setInterval(() => {
    service.tick();
  }, MAINTENANCE_INTERVAL_MS);
  timer.unref();

  let closing: Promise<void> | undefined;
  return {
    host: http.host,
    port: http.port,
    service,
    mesh,
    close(): Promise<void> {
      closing ??= (async () => {
        service.shutdown();
        clearInterval(timer);
        await http.close();
        await mesh?.close();
        await ingest.close();
      })();
      return closing;
    },
  };
}
