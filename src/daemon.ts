/**
 * The daemon: a SelectionService fed by KV-event listeners (one ZeroMQ SUB per worker rank, kept
 * in step with the worker catalog), served over HTTP, with periodic upkeep. `kvmesh serve`
 * builds a DaemonConfig from flags and calls startDaemon; tests start it in process.
 */
import type { Logger } from "pino";
import { KvmeshError } from "./errors.js";
import { KvIngest } from "./ingest/kv-ingest.js";
import { Metrics } from "./http/metrics.js";
import { startHttpServer, type MeshControl, type RunningHttpServer } from "./http/server.js";
import { ReplicaMesh } from "../mesh/replica-mesh.js";
import { SelectionService } from "./selection-service.js";
import type { SelectorConfig } from "./selector-config.js";

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
}

export const DEFAULT_DAEMON_CONFIG: DaemonConfig = Object.freeze({
  host: "127.0.0.1",
  port: 8092,
  logLevel: "info",
  sessionAffinityTtlSecs: undefined,
  sessionAffinityMode: "hard",
  selector: {},
  activeRequestExpirySecs: 300,
  kvEvents: true,
  replayTimeoutMs: 2_000,
  selectionCacheTtlSecs: 120,
  selectionCacheMaxEntries: 4_096,
  bodyLimitBytes: 8 * 1024 * 1024,
  replicaSyncPort: undefined,
  peers: [],
  replicaSyncAdvertiseHost: undefined,
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

export async function startDaemon(config: DaemonConfig, logger: Logger, hooks: DaemonHooks = {}): Promise<Daemon> {
  const service = new SelectionService({
    selector: config.selector,
    activeRequestExpiryMs: config.activeRequestExpirySecs * 1000,
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
  const sync = replicaSyncEndpoints(config);
  if (sync !== undefined) {
    try {
      mesh = await ReplicaMesh.start({
        service,
        publishBind: sync.bind,
        advertiseEndpoint: sync.advertise,
        peers: config.peers,
        logger: logger.child({ subsystem: "mesh" }),
      });
      logger.info({ publish: sync.advertise, peers: config.peers, origin: service.replicaId.toString() }, "replica mesh up");
    } catch (err) {
      await ingest.close();
      throw err;
    }
  }
  const metrics = new Metrics({
    service,
    ingestStats: () => ingest.stats(),
    ...(mesh === undefined ? {} : { extra: () => mesh.metricsText() }),
  });
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
