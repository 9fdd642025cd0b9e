/**
 * A fleet of mock engines in one process: one MockEngine per worker rank, each publishing its KV
 * events on its own XPUB (and serving replay on its own ROUTER) on an ephemeral 127.0.0.1 port, as
 * a vLLM rank does.
 *
 * Socket budget: a rank is 2 ZeroMQ sockets, and libzmq's default context allows 1,023 sockets
 * (zeromq.js `context.maxSockets`), i.e. 511 ranks. The fleet therefore makes its own Context
 * sized for 2 sockets per rank plus headroom. File descriptors, measured here: a bound XPUB +
 * ROUTER pair costs 4 fds (a mailbox and a listener each) plus 1 per connected subscriber, so 256
 * ranks watched by 4 replicas need ~2,100 fds; the fleet checks the soft RLIMIT_NOFILE up front
 * instead of failing half-way through binding.
 */
import { readFileSync } from "node:fs";
import { Context } from "zeromq";

import type { Clock, Timers } from "../core/index.js";
import { badRequest } from "../core/index.js";
import { DEFAULT_MODEL_NAME, type WorkerId, type WorkerRequest } from "../core/index.js";
import { DEFAULT_SUBSCRIBER_WAIT_MS, MockKvPublisher } from "./kv-event-publisher.js";
import { MockEngine, DEFAULT_ENGINE_BLOCK_SIZE, type EngineRequest, type EngineResult, type EngineStats, type MockEngineConfig } from "./mock-engine.js";
import { MockOpenAIServer } from "./openai-server.js";

/** One engine rank as a router registers it. */
export interface EngineDescriptor {
  readonly workerId: bigint;
  readonly dpRank: number;
  /** ZeroMQ endpoint of the rank's KV-event XPUB. */
  readonly kvEndpoint: string;
  /** ZeroMQ endpoint of the rank's replay ROUTER. */
  readonly replayEndpoint: string;
  /** Base URL of the rank's OpenAI HTTP API (`http://127.0.0.1:PORT`) when the fleet serves one (FleetOptions.openai). */
  readonly httpEndpoint?: string | undefined;
}

export interface FleetStats {
  /** Sums over the engines; hitRatio is cachedTokens / promptTokens over the whole fleet; maxLagMs the worst. */
  readonly totals: EngineStats;
  /** Per engine, in descriptor order. */
  readonly engines: EngineStats[];
}

/** What a driver needs from engines, wherever they run (in process, or in host processes). */
export interface EngineFleetHandle {
  readonly descriptors: readonly EngineDescriptor[];
  submit(index: number, req: EngineRequest): Promise<EngineResult>;
  stats(): Promise<FleetStats> | FleetStats;
  /**
   * Resolves once every rank's publisher has seen `n` subscriptions (e.g. n = router replicas),
   * so nothing published afterwards is lost to the slow-joiner window; rejects after `timeoutMs`.
   */
  waitForSubscribers(n: number, timeoutMs?: number): Promise<void>;
  close(): Promise<void>;
}

/** Engine settings shared by every rank of a fleet (timing, KV size, batch budget). */
export type FleetEngineConfig = Omit<MockEngineConfig, "workerId" | "dpRank" | "events" | "clock" | "timers">;

export interface FleetOptions extends FleetEngineConfig {
  /** Engine ranks in the fleet (a multiple of ranksPerWorker). */
  readonly engines: number;
  readonly firstWorkerId?: bigint;
  /** Data-parallel ranks per worker: rank i is worker firstWorkerId + floor(i / ranksPerWorker), dp rank i % ranksPerWorker. */
  readonly ranksPerWorker?: number;
  /** Replay history per rank, batches and bytes (see DEFAULT_FLEET_HISTORY_BYTES). */
  readonly historySize?: number;
  readonly historyBytes?: number;
  /** Subscribers (router replicas) expected per rank, for the file-descriptor check. */
  readonly expectedSubscribers?: number;
  /** ZeroMQ I/O threads for the fleet's context. */
  readonly ioThreads?: number;
  /**
   * Serve vLLM's OpenAI HTTP API on each rank (openai-server.ts), on an ephemeral 127.0.0.1 port
   * (EngineDescriptor.httpEndpoint). Off by default: the benchmarks' replay path submits directly.
   */
  readonly openai?: FleetOpenAIOptions | undefined;
  readonly clock?: Clock;
  readonly timers?: Pick<Timers, "setTimeout">;
}

/** The HTTP API every rank of a fleet serves. */
export interface FleetOpenAIOptions {
  /** The served model name (default DEFAULT_MODEL_NAME, what the fleet's workers register). */
  readonly model?: string;
  /** false: the render endpoints answer 404 (a vLLM without them). */
  readonly render?: boolean;
  readonly maxModelLen?: number;
  readonly defaultMaxTokens?: number;
}

export const DEFAULT_FIRST_WORKER_ID = 1n;
/**
 * Replay history per rank in a fleet: 1 MiB holds ~6 BlockStored batches of 40,000-token prompts
 * or hundreds of short ones (replay only repairs gaps, e.g. a subscriber that joined late), and
 * bounds 256 ranks per host at 256 MiB in the worst case.
 */
export const DEFAULT_FLEET_HISTORY_BYTES = 1024 * 1024;
export const DEFAULT_FLEET_HISTORY_SIZE = 1_000;
export const DEFAULT_EXPECTED_SUBSCRIBERS = 4;
/** Sockets per rank (XPUB + ROUTER) and fds per rank before subscribers (mailbox + listener each, measured). */
const SOCKETS_PER_RANK = 2;
const FDS_PER_RANK = 4;
/** Sockets and fds for everything else in the process (replay dealers, stdio, the host's IPC). */
const SOCKET_HEADROOM = 64;
const FD_HEADROOM = 128;
/** Ranks bound concurrently while starting (each bind is a syscall pair; 64 keeps start-up ~linear). */
const BIND_CONCURRENCY = 64;

/** The soft open-files limit, or null where /proc is not available. */
export function openFilesLimit(): number | null {
  try {
    const limits = readFileSync("/proc/self/limits", "utf8");
    const m = /^Max open files\s+(\d+|unlimited)/m.exec(limits);
    if (m?.[1] === undefined) return null;
    return m[1] === "unlimited" ? Number.POSITIVE_INFINITY : Number(m[1]);
  } catch {
    return null;
  }
}

/** File descriptors a fleet of `engines` ranks uses with `subscribers` router replicas each. */
export const fleetFdEstimate = (engines: number, subscribers: number): number => engines * (FDS_PER_RANK + subscribers) + FD_HEADROOM;

export class MockEngineFleet implements EngineFleetHandle {
  readonly descriptors: readonly EngineDescriptor[];
  readonly engines: readonly MockEngine[];
  readonly #publishers: readonly MockKvPublisher[];
  /** One per engine when the fleet serves the OpenAI API, else empty. */
  readonly servers: readonly MockOpenAIServer[];
  #closed = false;

  private constructor(engines: MockEngine[], publishers: MockKvPublisher[], servers: MockOpenAIServer[]) {
    this.engines = engines;
    this.#publishers = publishers;
    this.servers = servers;
    this.descriptors = engines.map((e, i) => {
      const p = publishers[i] as MockKvPublisher;
      return { workerId: e.workerId, dpRank: e.dpRank, kvEndpoint: p.endpoint, replayEndpoint: p.replayEndpoint ?? "", httpEndpoint: servers[i]?.url };
    });
  }

  static async start(options: FleetOptions): Promise<MockEngineFleet> {
    const n = options.engines;
    const perWorker = options.ranksPerWorker ?? 1;
    if (!Number.isSafeInteger(n) || n < 1) throw new RangeError(`engines must be a positive integer, got ${n}`);
    if (!Number.isSafeInteger(perWorker) || perWorker < 1 || n % perWorker !== 0) {
      throw new RangeError(`ranksPerWorker must be a positive integer dividing engines (${n}), got ${perWorker}`);
    }
    const subscribers = options.expectedSubscribers ?? DEFAULT_EXPECTED_SUBSCRIBERS;
    const limit = openFilesLimit();
    const needFds = fleetFdEstimate(n, subscribers);
    if (limit !== null && needFds > limit) {
      throw new RangeError(`${n} engine ranks with ${subscribers} subscribers each need ~${needFds} file descriptors, the soft limit is ${limit}: raise it (ulimit -n) or split the fleet across host processes`);
    }
    const context = new Context({
      blocky: false,
      maxSockets: Math.max(1_023, n * SOCKETS_PER_RANK + SOCKET_HEADROOM),
      ...(options.ioThreads === undefined ? {} : { ioThreads: options.ioThreads }),
    });
    const firstWorkerId = options.firstWorkerId ?? DEFAULT_FIRST_WORKER_ID;
    const publishers: MockKvPublisher[] = [];
    try {
      for (let i = 0; i < n; i += BIND_CONCURRENCY) {
        const batch = await Promise.all(
          Array.from({ length: Math.min(BIND_CONCURRENCY, n - i) }, () =>
            MockKvPublisher.create({
              context,
              historySize: options.historySize ?? DEFAULT_FLEET_HISTORY_SIZE,
              historyBytes: options.historyBytes ?? DEFAULT_FLEET_HISTORY_BYTES,
            }),
          ),
        );
        publishers.push(...batch);
      }
    } catch (err) {
      await Promise.all(publishers.map((p) => p.close()));
      throw err;
    }
    const engineConfig = engineConfigOf(options);
    const engines = publishers.map((pub, i) => {
      return new MockEngine({
        ...engineConfig,
        workerId: firstWorkerId + BigInt(Math.floor(i / perWorker)),
        dpRank: i % perWorker,
        events: { publish: (events, dpRank, ts) => pub.publish(events, { dpRank, ts }) },
      });
    });
    const servers: MockOpenAIServer[] = [];
    const api = options.openai;
    if (api !== undefined) {
      try {
        for (let i = 0; i < n; i += BIND_CONCURRENCY) {
          // allSettled: a server that did start in a batch where another failed is closed too.
          const batch = await Promise.allSettled(
            engines.slice(i, i + BIND_CONCURRENCY).map((engine) =>
              MockOpenAIServer.start({
                engine,
                model: api.model ?? DEFAULT_MODEL_NAME,
                ...(api.render === undefined ? {} : { render: api.render }),
                ...(api.maxModelLen === undefined ? {} : { maxModelLen: api.maxModelLen }),
                ...(api.defaultMaxTokens === undefined ? {} : { defaultMaxTokens: api.defaultMaxTokens }),
              }),
            ),
          );
          for (const r of batch) if (r.status === "fulfilled") servers.push(r.value);
          const failed = batch.find((r) => r.status === "rejected");
          if (failed !== undefined) throw failed.reason;
        }
      } catch (err) {
        await Promise.all(servers.map((s) => s.close()));
        for (const e of engines) e.close();
        await Promise.all(publishers.map((p) => p.close()));
        throw err;
      }
    }
    return new MockEngineFleet(engines, publishers, servers);
  }

  get size(): number {
    return this.engines.length;
  }

  submit(index: number, req: EngineRequest): Promise<EngineResult> {
    const engine = this.engines[index];
    if (engine === undefined) return Promise.reject(new RangeError(`engine index ${index} is outside [0, ${this.engines.length})`));
    return engine.submit(req);
  }

  async waitForSubscribers(n: number, timeoutMs = DEFAULT_SUBSCRIBER_WAIT_MS): Promise<void> {
    await Promise.all(this.#publishers.map((p) => p.waitForSubscribers(n, timeoutMs)));
  }

  stats(): FleetStats {
    const engines = this.engines.map((e) => e.stats());
    return { totals: sumStats(engines), engines };
  }

  /** Rejects unfinished requests, then closes every socket. Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await Promise.all(this.servers.map((s) => s.close()));
    for (const e of this.engines) e.close();
    await Promise.all(this.#publishers.map((p) => p.close()));
  }
}

const ENGINE_CONFIG_KEYS = [
  "blockSize",
  "kvBlocks",
  "maxBatchTokens",
  "maxRunningRequests",
  "prefillMsPerToken",
  "prefillMsPerTokenPair",
  "decodeMsPerToken",
  "decodeMsPerSequence",
  "decodeMsPerContextToken",
  "speedup",
  "clock",
  "timers",
] as const satisfies readonly (keyof MockEngineConfig)[];

/** The per-engine settings among a fleet's options (only those set, for exactOptionalPropertyTypes). */
function engineConfigOf(options: FleetOptions): Partial<MockEngineConfig> {
  const out: Record<string, unknown> = {};
  for (const k of ENGINE_CONFIG_KEYS) if (options[k] !== undefined) out[k] = options[k];
  return out;
}

/** Fleet totals: counts summed, hitRatio recomputed from the sums, maxLagMs the worst engine's. */
export function sumStats(all: readonly EngineStats[]): EngineStats {
  const t: EngineStats = {
    requests: 0,
    promptTokens: 0,
    cachedTokens: 0,
    hitRatio: 0,
    submitted: 0,
    rejected: 0,
    running: 0,
    waiting: 0,
    steps: 0,
    evictions: 0,
    eventsPublished: 0,
    batchesPublished: 0,
    publishErrors: 0,
    kvCapacityBlocks: 0,
    kvCachedBlocks: 0,
    kvPinnedBlocks: 0,
    maxLagMs: 0,
  };
  for (const s of all) {
    t.requests += s.requests;
    t.promptTokens += s.promptTokens;
    t.cachedTokens += s.cachedTokens;
    t.submitted += s.submitted;
    t.rejected += s.rejected;
    t.running += s.running;
    t.waiting += s.waiting;
    t.steps += s.steps;
    t.evictions += s.evictions;
    t.eventsPublished += s.eventsPublished;
    t.batchesPublished += s.batchesPublished;
    t.publishErrors += s.publishErrors;
    t.kvCapacityBlocks += s.kvCapacityBlocks;
    t.kvCachedBlocks += s.kvCachedBlocks;
    t.kvPinnedBlocks += s.kvPinnedBlocks;
    t.maxLagMs = Math.max(t.maxLagMs, s.maxLagMs);
  }
  t.hitRatio = t.promptTokens === 0 ? 0 : t.cachedTokens / t.promptTokens;
  return t;
}

export interface WorkerRequestOptions {
  readonly modelName?: string;
  readonly routingGroup?: string;
  /** Must equal the engines' blockSize. */
  readonly blockSize?: number;
  readonly totalKvBlocks?: number;
  readonly maxNumBatchedTokens?: number;
  /** The `endpoint` field (where a frontend would send requests): by default the worker's first rank's httpEndpoint, else `mock://worker-<id>`. */
  readonly endpointFor?: (workerId: WorkerId) => string;
}

/**
 * `POST /workers` bodies for the fleet's descriptors, one per worker. A single-rank worker
 * registers its XPUB as `kv_events_endpoint` with its `replay_endpoint`; a multi-rank worker
 * registers `kv_events_endpoints` per rank and no replay endpoint, because the daemon's catalog
 * accepts a replay endpoint only for data_parallel_size 1 (gaps on such ranks are counted as lost).
 */
export function descriptorsToWorkerRequests(descriptors: readonly EngineDescriptor[], opts: WorkerRequestOptions = {}): WorkerRequest[] {
  const byWorker = new Map<bigint, EngineDescriptor[]>();
  for (const d of descriptors) {
    const list = byWorker.get(d.workerId);
    if (list === undefined) byWorker.set(d.workerId, [d]);
    else list.push(d);
  }
  const out: WorkerRequest[] = [];
  for (const [workerId, ranks] of byWorker) {
    ranks.sort((a, b) => a.dpRank - b.dpRank);
    const start = (ranks[0] as EngineDescriptor).dpRank;
    ranks.forEach((r, i) => {
      if (r.dpRank !== start + i) throw badRequest(`worker ${workerId}: dp ranks must be contiguous, got ${ranks.map((x) => x.dpRank).join(",")}`, "dpRank");
    });
    const req: WorkerRequest = {
      worker_id: workerId,
      model_name: opts.modelName ?? DEFAULT_MODEL_NAME,
      endpoint: opts.endpointFor?.(workerId) ?? (ranks[0] as EngineDescriptor).httpEndpoint ?? `mock://worker-${workerId}`,
      block_size: opts.blockSize ?? DEFAULT_ENGINE_BLOCK_SIZE,
      data_parallel_start_rank: start,
      data_parallel_size: ranks.length,
    };
    if (opts.routingGroup !== undefined) req.routing_group = opts.routingGroup;
    if (opts.totalKvBlocks !== undefined) req.total_kv_blocks = opts.totalKvBlocks;
    if (opts.maxNumBatchedTokens !== undefined) req.max_num_batched_tokens = opts.maxNumBatchedTokens;
    if (ranks.length === 1) {
      const only = ranks[0] as EngineDescriptor;
      req.kv_events_endpoint = only.kvEndpoint;
      req.replay_endpoint = only.replayEndpoint;
    } else {
      req.kv_events_endpoints = Object.fromEntries(ranks.map((r) => [String(r.dpRank), r.kvEndpoint]));
    }
    out.push(req);
  }
  return out;
}
