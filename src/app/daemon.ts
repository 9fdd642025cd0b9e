/**
 * The daemon: a SelectionService fed by KV-event listeners (one ZeroMQ SUB per worker rank, kept
 * in step with the worker catalog), served over HTTP, with periodic upkeep. `kvmesh serve`
 * resolves its flags into a config (src/app/config.ts) and calls startDaemon; tests start it in process.
 */
import type { Logger } from "pino";
import { connectionLimitsOf, isLoopbackHost, replicaSyncEndpoints, resolveDaemonConfig, serviceOptionsOf, type DaemonConfig } from "./config.js";
import { KvEndpointError, KvIngest, type KvIngestOptions, type KvIngestPort } from "../ingest/kv-ingest.js";
import { KvIngestWorker } from "../ingest/kv-ingest-worker.js";
import { raiseZmqSocketLimit } from "../ingest/zmq-socket-limit.js";
import { closeAll } from "./close-all.js";
import { HttpMetrics } from "../http/metrics.js";
import { registerIngestMetrics, registerIngestThreadMetrics } from "../metrics/ingest-metrics.js";
import { createMetricsRegistry } from "../metrics/registry.js";
import { registerServiceMetrics } from "../metrics/service-metrics.js";
import { startHttpServer, type MeshControl, type RunningHttpServer } from "../http/server.js";
import { readiness } from "../http/readiness.js";
import type { RunningEndpointPicker } from "../extproc/ext-proc.js";
import type { CreatedTokenizer } from "../tokenize/create-tokenizer.js";
import type { TokenizerOptions } from "../tokenize/tokenizer-options.js";
import { startTracing, tracesExportUrl, type RequestTracer } from "../http/tracing.js";
import { ReplicaMesh } from "../../mesh/replica-mesh.js";
import type { UiMeshSelf } from "../http/ui/ui-routes.js";
import { isDnsPeer, parseDnsPeer } from "../../mesh/dns-peers.js";
import { WorkersFile } from "./workers-file.js";
import { SelectionService } from "../core/index.js";
import { hasUnusableKvEndpoint, kvEventsEndpointRefused, replayEndpointFor } from "../core/index.js";
import { LogThrottle } from "../util/log-throttle.js";
import { systemClock, systemTimers } from "../core/index.js";
import { controlEndpointFor } from "../../mesh/endpoints.js";
import type { ExportThreadState } from "../../mesh/index-export-worker.js";
import { IndexSyncClient, IndexSyncServer, registerIndexExportMetrics } from "../../mesh/index-sync.js";
import { registerWarmJoinMetrics, WarmJoin } from "./warm-join.js";

/** The daemon's configuration lives in src/app/config.ts; re-exported for the daemon's callers. */
export { DEFAULT_DAEMON_CONFIG, type DaemonConfig, type LogLevel } from "./config.js";

/** The tokenizer's part of the config (resolveDaemonConfig has checked it). */
function tokenizerOptionsOf(c: DaemonConfig): TokenizerOptions {
  const { tokenizer, tokenizerFile, tokenizerTimeoutMs, tokenizerConcurrency, tokenizerMaxQueued, tokenizerAttempts, tokenizerCacheEntries, tokenizerCacheTokens } = c;
  return { tokenizer, tokenizerFile, tokenizerTimeoutMs, tokenizerConcurrency, tokenizerMaxQueued, tokenizerAttempts, tokenizerCacheEntries, tokenizerCacheTokens };
}

/** How often expiry, reservation sweeps and cache reaping run, ms. */
export const MAINTENANCE_INTERVAL_MS = 1_000;
const MS_PER_SECOND = 1_000;

export interface Daemon {
  readonly host: string;
  readonly port: number;
  readonly service: SelectionService;
  readonly mesh: ReplicaMesh | undefined;
  /** The KV ingest thread's driver (its health, its window; tests crash it), unset without the thread. */
  readonly ingestThread: KvIngestWorker | undefined;
  /** The state of the index export thread that serves joining peers (tests wait for it to load). */
  indexExportThread(): ExportThreadState | null;
  /** The endpoint picker's ext_proc port (and its separate health port), when --ext-proc-port is set. */
  readonly extProcPort: number | undefined;
  readonly extProcHealthPort: number | undefined;
  /**
   * Draining (SIGTERM): `/ready` answers 503 at once while everything else is served, for the
   * config's drainSecs; resolves then, or at once when close() is called meanwhile.
   */
  drain(): Promise<void>;
  /** Stops accepting work and closes; peers keep this replica's bookings and bindings (handed over). */
  close(): Promise<void>;
}

export interface DaemonHooks {
  /** A host-provided mesh control instead of the built-in ZeroMQ mesh. */
  readonly mesh?: MeshControl;
}

/** What the status page (GET /ui) shows of this replica's side of the mesh; undefined without one. */
function meshSelfOf(mesh: ReplicaMesh | undefined): (() => UiMeshSelf) | undefined {
  if (mesh === undefined) return undefined;
  return () => {
    const st = mesh.stats;
    return { endpoint: mesh.publishEndpoint, events_shed: mesh.shed, snapshots_served: st.snapshotsServed, snapshots_installed: st.snapshotsInstalled, divergence_resyncs: st.divergenceResyncs };
  };
}

export { isLoopbackHost } from "./config.js";

/** The mesh as the HTTP layer drives it, with the warm join's hold on `/ready`. */
function meshWithWarmJoin(mesh: ReplicaMesh | undefined, warmJoin: WarmJoin): MeshControl | undefined {
  if (mesh === undefined) return undefined;
  return {
    registerPeer: (e) => mesh.registerPeer(e),
    deregisterPeer: (e) => mesh.deregisterPeer(e),
    listPeers: () => mesh.listPeers(),
    startupSyncPending: () => mesh.startupSyncPending(),
    indexSyncPending: () => warmJoin.readiness(),
    catchUp: () => mesh.catchUp(),
  };
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
    logger.warn(
      { host: config.host, port: config.replicaSyncPort },
      "replica mesh listens beyond loopback without CURVE (--mesh-insecure): anyone who can reach it can read the replication stream, inject bookings and bindings, and join the mesh",
    );
  }
  if (config.apiToken !== undefined && config.replicaSyncPort !== undefined && curve === undefined) {
    logger.warn(
      { port: config.replicaSyncPort },
      "--api-token-file does not cover the replica mesh: without --mesh-key its ports take bookings, bindings and peering from anyone who reaches them",
    );
  }
}

export async function startDaemon(input: DaemonConfig, logger: Logger, hooks: DaemonHooks = {}): Promise<Daemon> {
  // One check, in src/app/config.ts; a config the CLI resolved comes back as it is.
  const config = resolveDaemonConfig(input);
  logSecurityPosture(config, logger);
  raiseZmqSocketLimit();
  const service = new SelectionService(serviceOptionsOf(config));
  const versionLog = new LogThrottle();
  service.onVersionRefused((r) => {
    versionLog.hit((suppressed) => {
      logger.warn(
        { kind: r.kind, writer_id: r.writerId.toString(), sequence: r.sequence.toString(), ...(r.origin === undefined ? {} : { origin: r.origin.toString() }), suppressed },
        "replicated version refused: more than 5 minutes ahead of this replica's clock, or not written by its sender (kvmesh_versions_refused_total)",
      );
    });
  });
  const ingestLog = logger.child({ subsystem: "ingest" });
  const indexShedLog = new LogThrottle();
  const cycleLog = new LogThrottle();
  const detachedShedLog = new LogThrottle();
  // The warm join (issue 25): only with a mesh and KV events; its batches and resets go through it.
  const warmJoin = new WarmJoin({
    service,
    ingest: () => ingest,
    logger: logger.child({ subsystem: "warm-join" }),
    clock: systemClock,
    timers: systemTimers,
    timeoutMs: config.replicaSyncPort !== undefined && config.kvEvents ? config.indexSyncSecs * MS_PER_SECOND : 0,
    replayTimeoutMs: config.replayTimeoutMs,
  });
  const ingestOptions: KvIngestOptions = {
    logger: ingestLog,
    replayTimeoutMs: config.replayTimeoutMs,
    onBatch: (ref, batch, seq, _replayed, digest) => {
      const r = warmJoin.onBatch(ref, batch, seq, digest);
      if (r === null) return; // already in the peer's snapshot the warm join installed
      if (r.dropped > 0 && ingestLog.isLevelEnabled("debug")) {
        ingestLog.debug({ worker_id: ref.workerId, dp_rank: ref.rank, dropped: r.dropped }, "kv events dropped");
      }
      // An engine that overfills its rank or sends cycles does it on every batch: one line per 10 s.
      if (r.shedBlocks > 0) {
        indexShedLog.hit((suppressed) => {
          ingestLog.warn({ worker_id: ref.workerId, dp_rank: ref.rank, shed_blocks: r.shedBlocks, suppressed }, "kv blocks shed: the rank's prefix index is at its bound (kvmesh_kv_index_blocks_shed_total)");
        });
      }
      if (r.detachedShed > 0) {
        detachedShedLog.hit((suppressed) => {
          ingestLog.warn(
            { worker_id: ref.workerId, dp_rank: ref.rank, shed_blocks: r.detachedShed, suppressed },
            "parked kv blocks shed, oldest first: too many stored blocks wait for a parent this replica never saw (kvmesh_index_detached_shed_blocks_total)",
          );
        });
      }
      if (r.cycles > 0) {
        cycleLog.hit((suppressed) => {
          ingestLog.warn({ worker_id: ref.workerId, dp_rank: ref.rank, cycles: r.cycles, suppressed }, "kv stored event refused: parent-hash cycle (kvmesh_kv_parent_cycles_total)");
        });
      }
    },
    onReset: (ref) => {
      ingestLog.info({ worker_id: ref.workerId, dp_rank: ref.rank }, "kv publisher restarted: clearing its blocks");
      warmJoin.onReset(ref);
    },
  };
  const ingest: KvIngestPort = config.kvEvents && config.kvIngestThread ? new KvIngestWorker({ ...ingestOptions, window: { maxBatches: config.kvIngestWindowBatches, maxBytes: config.kvIngestWindowBytes } }) : new KvIngest(ingestOptions);
  if (config.kvEvents) {
    // Listeners follow the catalog. KvIngest serialises its own changes, so a burst of
    // upserts applies in order; failures are logged, never unhandled. A worker whose endpoint
    // cannot be used has no listeners (the reference rolls its ingress registration back); an
    // endpoint ZeroMQ refuses makes the worker incomplete with the reason, which comes back here
    // as a change and removes the ranks that had started.
    service.onWorkerChange(({ workerId, record }) => {
      const id = workerId.toString();
      const done =
        record === null || hasUnusableKvEndpoint(record)
          ? ingest.remove(id)
          : ingest.upsert(
              id,
              service.kvEventsEndpointsOf(workerId).map(({ dpRank, endpoint }) => ({
                rank: dpRank,
                endpoint,
                replayEndpoint: replayEndpointFor(record, dpRank),
              })),
            );
      done.catch((err: unknown) => {
        if (err instanceof KvEndpointError && record !== null) {
          const reason = kvEventsEndpointRefused(workerId, err.rank, err.endpoint, err.detail);
          // undefined: a newer registration replaced this one and has its own outcome.
          if (service.markKvEndpointUnusable(record, reason) !== undefined) {
            ingestLog.warn({ worker_id: id, dp_rank: err.rank, endpoint: err.endpoint, detail: err.detail }, "kv events endpoint refused: worker is incomplete");
          }
          return;
        }
        ingestLog.error({ err, worker_id: id }, "kv event listener update failed");
      });
    });
  }
  // After the ingest follows the catalogue: the file's workers get their KV listeners. A refused
  // file fails the start (there is no last good catalogue to keep yet).
  // In a mesh the file is applied after the startup sync (workers-file.ts, #29 G5).
  let workersFile: WorkersFile | undefined;
  let workersFileRead: Awaited<ReturnType<WorkersFile["prepare"]>> | undefined;
  if (config.workersFile !== undefined) {
    workersFile = new WorkersFile(config.workersFile, service, logger.child({ subsystem: "workers-file" }));
    try {
      workersFileRead = await workersFile.prepare();
      if (config.replicaSyncPort === undefined) await workersFile.start(workersFileRead);
    } catch (err) {
      await ingest.close();
      throw err;
    }
  }
  // One registry per daemon (several run in one test process); each component adds its series.
  const registry = createMetricsRegistry();
  let mesh: ReplicaMesh | undefined;
  const sync = replicaSyncEndpoints(config);
  if (service.sessionReplicationWriterId !== undefined) {
    logger.info({ writer_id: service.sessionReplicationWriterId.toString() }, "host replication on: GET /session_bindings/updates, POST /session_bindings");
  }
  let tracer: RequestTracer | undefined;
  // Off by default: then OpenTelemetry is never imported (src/http/tracing.ts). Before the mesh,
  // which traces the peer batches it applies.
  if (config.otlpTracesEndpoint !== undefined) {
    try {
      tracer = await startTracing({ endpoint: tracesExportUrl(config.otlpTracesEndpoint), serviceName: config.otlpServiceName, logger });
    } catch (err) {
      await ingest.close();
      throw err;
    }
  }
  const indexServer = new IndexSyncServer({
    source: service.indexSnapshotSource,
    positionOf: (workerId, dpRank) => ingest.position(workerId.toString(), dpRank),
    logger: logger.child({ subsystem: "index-export" }),
  });
  registerIndexExportMetrics(registry, indexServer);
  if (sync !== undefined) {
    try {
      mesh = await ReplicaMesh.start({
        service: service.replication,
        applyTracer: tracer,
        publishBind: sync.bind,
        advertiseEndpoint: sync.advertise,
        peers: config.peers.filter((p) => !isDnsPeer(p)),
        dnsPeers: config.peers.filter(isDnsPeer).map(parseDnsPeer),
        peerDnsIntervalMs: config.peerDnsIntervalSecs * MS_PER_SECOND,
        startupSyncMs: config.meshStartupSyncSecs * MS_PER_SECOND,
        logger: logger.child({ subsystem: "mesh" }),
        ...(config.meshCurve === undefined ? {} : { curve: config.meshCurve }),
        tieSpread: config.replicaTieSpread,
        flushIntervalMs: service.loadReplication === "aggregate" ? config.meshAggregateIntervalMs : config.meshFlushIntervalMs,
        heartbeatIntervalMs: config.meshHeartbeatIntervalMs,
        metrics: registry,
        controlExtension: (raw, authorize) => indexServer.handle(raw, authorize),
        ...(config.meshReceiveThread ? { receiveThreadApplyIntervalMs: config.meshApplyIntervalMs, receiveThreadMaxApplyDelayMs: config.meshApplyMaxDelayMs } : {}),
      });
      logger.info({ publish: sync.advertise, peers: config.peers, origin: service.replicaId.toString() }, "replica mesh up");
      const m = mesh;
      if (workersFile !== undefined && workersFileRead !== undefined) {
        const wf = workersFile;
        wf.start(workersFileRead, () => m.startupSyncPending() === null).catch((err: unknown) => {
          wf.close();
          logger.error({ err, file: config.workersFile }, "workers file could not be applied after the mesh's startup sync: not watched");
        });
      }
      const client = new IndexSyncClient({ link: m.controlLink, from: service.replicaId, advertise: m.advertiseEndpoint });
      void warmJoin.run({
        prepare: () => {
          client.prepare();
        },
        release: () => client.release(),
        startupSyncPending: () => m.startupSyncPending(),
        // Live peers first: they answered our snapshot request already.
        peerControlEndpoints: () =>
          m
            .listPeers()
            .sort((a, b) => Number(b.sync === "live") - Number(a.sync === "live"))
            .map((p) => controlEndpointFor(p.endpoint)),
        pull: (endpoint, install, trees) => client.pull(endpoint, install, trees),
      }).then(() => {
        // This replica's own join is over: start the threads that serve the next joiner (in a
        // rolling restart it may join from this one seconds later), rather than at the first
        // request (the export) or 30 s after the mesh (the snapshot decode). Not before: their
        // module loading would compete with this replica's own sync.
        if (m.startupSyncPending() !== null) return; // no warm join (--index-sync-secs 0): the mesh's own timer, and lazily
        m.startSnapshotDecoding();
        indexServer.startExportThread();
      });
    } catch (err) {
      await tracer?.shutdown();
      await ingest.close();
      throw err;
    }
  }
  const metrics = new HttpMetrics(registry);
  registerServiceMetrics(registry, service);
  registerWarmJoinMetrics(registry, warmJoin);
  registerIngestMetrics(
    registry,
    () => ingest.stats(),
    () => ingest.budgetRefusals,
  );
  if (ingest instanceof KvIngestWorker) registerIngestThreadMetrics(registry, () => ingest);
  let http: RunningHttpServer;
  try {
    http = await startHttpServer({
      service,
      host: config.host,
      port: config.port,
      logger: logger.child({ subsystem: "http" }),
      metrics,
      bodyLimitBytes: config.bodyLimitBytes,
      mesh: hooks.mesh ?? meshWithWarmJoin(mesh, warmJoin),
      apiToken: config.apiToken,
      meshSelf: meshSelfOf(mesh),
      kvIngest: ingest instanceof KvIngestWorker ? ingest : undefined,
      tracer,
      connections: connectionLimitsOf(config),
    });
  } catch (err) {
    await tracer?.shutdown();
    await mesh?.close();
    await ingest.close();
    throw err;
  }
  let extProc: RunningEndpointPicker | undefined;
  let tokenizer: CreatedTokenizer | undefined;
  if (config.extProcPort !== undefined) {
    // Loaded only when asked for, as tracing is: a daemon without it never loads gRPC or a tokenizer.
    const { startEndpointPicker } = await import("../extproc/ext-proc.js");
    const { createTokenizer } = await import("../tokenize/create-tokenizer.js");
    const meshControl = hooks.mesh ?? meshWithWarmJoin(mesh, warmJoin);
    try {
      tokenizer = createTokenizer(tokenizerOptionsOf(config), {
        // --tokenizer engine asks the model's ready workers, by their catalogue endpoint.
        workerUrls: (model) => service.listWorkers(model).flatMap((w) => (w.lifecycle === "schedulable" && typeof w.endpoint === "string" ? [w.endpoint] : [])),
        metrics: registry,
      });
      extProc = await startEndpointPicker(
        {
          host: config.host,
          port: config.extProcPort,
          tlsCertFile: config.extProcTlsCertFile,
          tlsKeyFile: config.extProcTlsKeyFile,
          healthPort: config.extProcHealthPort,
          maxBodyBytes: config.extProcMaxBodyBytes,
          streamWindowBytes: config.extProcStreamWindowBytes,
          connectionWindowBytes: config.extProcConnectionWindowBytes,
          sessionHeader: config.sessionHeader,
          routingGroupHeader: config.routingGroupHeader,
          tokenizerFailure: config.tokenizerFailure,
          dpRankPortStride: config.dpRankPortStride,
        },
        {
          service,
          // The same rule as GET /ready (startup sync and drain included).
          health: { ready: () => readiness(service, meshControl, false, ingest instanceof KvIngestWorker ? ingest : undefined).ready, closing: () => service.shuttingDown },
          logger: logger.child({ subsystem: "extproc" }),
          registry,
          tokenizer,
        },
      );
    } catch (err) {
      await tokenizer?.close();
      await http.close();
      await tracer?.shutdown();
      await mesh?.close();
      await ingest.close();
      throw err;
    }
  }
  const timer = setInterval(() => {
    service.tick();
  }, MAINTENANCE_INTERVAL_MS);
  timer.unref();

  let closing: Promise<void> | undefined;
  let endDrain: (() => void) | undefined;
  return {
    host: http.host,
    port: http.port,
    service,
    mesh,
    extProcPort: extProc?.port,
    extProcHealthPort: extProc?.healthPort,
    ingestThread: ingest instanceof KvIngestWorker ? ingest : undefined,
    indexExportThread: () => indexServer.exportThreadState,
    drain(): Promise<void> {
      if (closing !== undefined || service.draining) return Promise.resolve();
      service.drain();
      logger.info({ drain_secs: config.drainSecs }, "draining: /ready answers 503, still serving");
      return new Promise<void>((resolve) => {
        const t = setTimeout(resolve, config.drainSecs * MS_PER_SECOND);
        endDrain = () => {
          clearTimeout(t);
          resolve();
        };
      });
    },
    close(): Promise<void> {
      endDrain?.();
      closing ??= (async () => {
        try {
          workersFile?.close();
          // ext_proc streams end with the process: each frees its booking (no booking outlives its stream).
          await extProc?.close();
          await tokenizer?.close();
          // Bookings are handed over, not freed: peers keep mirroring them, and a frontend's
          // prefill_complete or free for one at any replica counts it out there, so the load stays
          // accounted while the requests run (freeing them here instead made 10 lifecycle calls
          // answer 404 at live replicas in test/system/faults/shutdown-under-load.test.ts).
          service.shutdown();
          clearInterval(timer);
          await http.close();
          // Exports the spans still queued (the last requests') before the process goes.
          await tracer?.shutdown().catch((err: unknown) => {
            logger.warn({ err }, "trace export at shutdown failed");
          });
        } finally {
          // Whatever failed above, the threads that own ZeroMQ sockets (the mesh's receive thread,
          // the KV ingest thread) close them and end before the process exits: one still running
          // at exit is torn down with its sockets open, which aborts the process (#29, zeromq 6.8:
          // "terminate called after throwing an instance of 'Napi::Error'").
          await closeAll([() => mesh?.close(), () => ingest.close(), () => indexServer.close()]);
        }
      })();
      return closing;
    },
  };
}
