/**
 * The daemon: a SelectionService fed by KV-event listeners (one ZeroMQ SUB per worker rank, kept
 * in step with the worker catalog), served over HTTP, with periodic upkeep. `kvmesh serve`
 * builds a DaemonConfig from flags and calls startDaemon; tests start it in process.
 */
import type { Logger } from "pino";
import { KvIngest } from "./ingest/kv-ingest.js";
import { Metrics } from "./http/metrics.js";
import { startHttpServer, type MeshControl, type RunningHttpServer } from "./http/server.js";
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
});

export interface Daemon {
  readonly host: string;
  readonly port: number;
  readonly service: SelectionService;
  close(): Promise<void>;
}

export interface DaemonHooks {
  /** The replica mesh, when enabled (wired by the mesh issue). */
  readonly mesh?: MeshControl;
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
  const metrics = new Metrics({ service, ingestStats: () => ingest.stats() });
  let http: RunningHttpServer;
  try {
    http = await startHttpServer({
      service,
      host: config.host,
      port: config.port,
      logger: logger.child({ subsystem: "http" }),
      metrics,
      bodyLimitBytes: config.bodyLimitBytes,
      mesh: hooks.mesh,
    });
  } catch (err) {
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
    close(): Promise<void> {
      closing ??= (async () => {
        service.shutdown();
        clearInterval(timer);
        await http.close();
        await ingest.close();
      })();
      return closing;
    },
  };
}
