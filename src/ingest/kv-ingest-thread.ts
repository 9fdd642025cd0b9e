/**
 * The ingest thread (a worker_threads worker; kv-ingest-worker.ts starts and drives it). It owns
 * every KV SUB socket through a KvIngest of its own, so all of ingest's stream logic runs here
 * unchanged (gap replay, publisher restart detection, per-message caps, resets damped, counted
 * shedding), then decodes each batch and computes its blocks' hashes (prepare-kv-batch.ts). The
 * main thread only indexes what arrives.
 *
 * Why a thread (issue 26, docs/ingest-thread.md): on the main thread, ZeroMQ's receive loops,
 * decoding and hashing took 55-65% of applying a batch, and a backlog of queued messages ran as
 * microtasks ahead of every HTTP callback (select p99 1.3-2.9 s at 0.4M block ops/s). Posted
 * batches are macrotasks: /select runs between them.
 */
import type { Logger } from "pino";
import { setTimeout as sleep } from "node:timers/promises";
import { parentPort, workerData } from "node:worker_threads";

import { closeRetiredObservers, OBSERVER_CLOSE_GRACE_MS } from "../util/zmq-observers.js";

import { KvEndpointError, KvIngest, type KvRankRef, type KvRankStats } from "./kv-ingest.js";
import type { KvIngestCommand, KvIngestFailure, KvIngestReport, KvIngestThreadData, KvOpenRank } from "./kv-ingest-protocol.js";
import { prepareKvBatch } from "./prepare-kv-batch.js";
import { readPreparedKvBatch } from "./kv-batch-reader.js";
import { encodePreparedBatch, type PreparedKvBatch } from "./prepared-batch-codec.js";
import { CLONED_BYTES_PER_HASH, IngestWindow, REPORT_OVERHEAD_BYTES } from "./kv-ingest-window.js";
import type { KvEventBatch } from "../core/index.js";

/**
 * Stats of ranks with no batch (malformed, stale, lost messages) reach the main thread this often,
 * ms. Each scan reads every rank's counters: at 1,024 ranks a shorter interval costs an idle
 * daemon a visible share of a core.
 */
const STATS_SCAN_INTERVAL_MS = 200;
/**
 * While batches stream, their ranks' stats are posted at least this often, ms: zeromq.js runs a
 * socket's queued messages as microtasks, so the setImmediate flush waits for a backlog to end.
 */
const STATS_FLUSH_MS = 20;
/** Beyond the observers' close grace: their close runs from a timer that may fire a little late. */
const OBSERVER_CLOSE_MARGIN_MS = 100;

const port = parentPort;
// Assertion (a programming error): kv-ingest-worker.ts starts this file as a worker.
if (port === null) throw new Error("kv-ingest-thread.ts runs as a worker thread only");
const data = workerData as KvIngestThreadData;
const post = (m: KvIngestReport): void => { port.postMessage(m); };
/** Batches posted and not yet applied by the main thread: past its limits, listeners shed what they read (kv-ingest-window.ts). */
const handover = new IngestWindow(data.window, data.windowLimits);

const LEVELS = { trace: 10, debug: 20, info: 30, warn: 40, error: 50, fatal: 60, silent: Infinity } as const;
type Level = keyof typeof LEVELS;
const threshold = LEVELS[data.logLevel as Level] ?? LEVELS.info;

/**
 * The slice of pino's Logger the listeners use, forwarding each record to the main thread's
 * ingest logger (with its child bindings), so logs keep their destination and format.
 */
function forwardingLogger(bindings: Record<string, unknown>): Logger {
  const at =
    (level: "debug" | "info" | "warn" | "error") =>
    (obj: unknown, msg?: string): void => {
      if (LEVELS[level] < threshold) return;
      post({ t: "log", level, bindings, obj: typeof obj === "string" ? {} : obj, msg: typeof obj === "string" ? obj : (msg ?? "") });
    };
  const log = {
    child: (more: Record<string, unknown>) => forwardingLogger({ ...bindings, ...more }),
    isLevelEnabled: (level: string) => (LEVELS[level as Level] ?? 0) >= threshold,
    trace: () => undefined,
    debug: at("debug"),
    info: at("info"),
    warn: at("warn"),
    error: at("error"),
    fatal: at("error"),
  };
  return log as unknown as Logger;
}

const key = (ref: KvRankRef): string => `${ref.workerId}\u0000${String(ref.rank)}`;
/** Ranks with a batch since the last flush. */
const dirty = new Map<string, KvRankRef>();
let flushScheduled = false;
let lastFlushAt = 0;
let postedRefusals = 0;

function postStats(ranks: KvRankStats[]): void {
  if (ranks.length === 0 && ingest.budgetRefusals === postedRefusals) return;
  postedRefusals = ingest.budgetRefusals;
  post({ t: "stats", ranks, budgetRefusals: postedRefusals });
}

function flushDirty(): void {
  flushScheduled = false;
  lastFlushAt = performance.now();
  const ranks = ingest.changedStats(dirty.values());
  dirty.clear();
  postStats(ranks);
}

/** Hands a prepared batch to the main thread, its buffer transferred, and marks its rank's stats for the next flush. */
const postPrepared = (ref: KvRankRef, prepared: PreparedKvBatch, seq: bigint, replayed: boolean, digest: bigint | null): void => {
  let bytes = REPORT_OVERHEAD_BYTES + prepared.words.byteLength;
  for (const s of prepared.strings) bytes += 2 * s.length;
  handover.posted(bytes);
  port.postMessage({ t: "batch", ref, seq, replayed, digest, bytes, encoded: prepared, batch: null } satisfies KvIngestReport, [prepared.words.buffer as ArrayBuffer]);
  markDirty(ref);
};

/** A batch the prepared form cannot hold, posted as objects (cloned). */
function postCloned(ref: KvRankRef, batch: KvEventBatch, seq: bigint, replayed: boolean, digest: bigint | null): void {
  let hashes = 0;
  for (const ev of batch.events) if (ev.type !== "cleared") hashes += ev.blockHashes.length;
  const bytes = REPORT_OVERHEAD_BYTES + CLONED_BYTES_PER_HASH * hashes;
  handover.posted(bytes);
  post({ t: "batch", ref, seq, replayed, digest, bytes, encoded: null, batch });
  markDirty(ref);
}

function markDirty(ref: KvRankRef): void {
  dirty.set(key(ref), ref);
  if (performance.now() - lastFlushAt >= STATS_FLUSH_MS) flushDirty();
  else if (!flushScheduled) {
    flushScheduled = true;
    setImmediate(flushDirty);
  }
}

const ingest = new KvIngest({
  logger: forwardingLogger({}),
  ...(data.replayTimeoutMs === undefined ? {} : { replayTimeoutMs: data.replayTimeoutMs }),
  ...(data.maxRanks === undefined ? {} : { maxRanks: data.maxRanks }),
  onBatch: (ref, batch, seq, replayed, digest) => {
    prepareKvBatch(batch);
    const enc = encodePreparedBatch(batch);
    if (enc === null) postCloned(ref, batch, seq, replayed, digest);
    else postPrepared(ref, { ts: batch.ts, dpRank: batch.dpRank, ...enc }, seq, replayed, digest);
  },
  admit: (ref) => {
    if (handover.hasRoom()) return true;
    // Its shed counter moved with no batch: posted within STATS_FLUSH_MS even while a backlog of
    // messages runs as microtasks ahead of the stats scan's timer.
    markDirty(ref);
    return false;
  },
  room: () => handover.waitForRoom(),
  // The common shape read straight from the bytes (kv-batch-reader.ts); the rest takes onBatch's path.
  fastPath: { read: readPreparedKvBatch, onPrepared: postPrepared },
  onReset: (ref) => {
    post({ t: "reset", ref });
  },
});

const scan = setInterval(() => {
  postStats(ingest.changedStats());
}, STATS_SCAN_INTERVAL_MS);

function failure(err: unknown): KvIngestFailure {
  if (err instanceof KvEndpointError) {
    const cause = err.cause as { message?: unknown; code?: unknown } | null | undefined;
    const message = typeof cause?.message === "string" ? cause.message : err.detail;
    return { kind: "endpoint", rank: err.rank, endpoint: err.endpoint, message, ...(typeof cause?.code === "string" ? { code: cause.code } : {}) };
  }
  if (err instanceof RangeError) return { kind: "range", message: err.message };
  return { kind: "other", message: err instanceof Error ? err.message : String(err) };
}

/** A worker's ranks after a command, with their stats as of now (posted again from here on only when they change). */
function openRanks(workerId: string): KvOpenRank[] {
  const out: KvOpenRank[] = [];
  for (const r of ingest.statsOf(workerId)) {
    out.push({ stats: r, replayEndpoint: ingest.replayEndpointOf(workerId, r.rank) });
  }
  // Their stats as of now travel in the reply: posted again from here on only when they change.
  ingest.changedStats(out.map((o) => o.stats));
  return out;
}

/**
 * Closes every socket and observer, then lets the thread end by itself: nothing is left on its
 * event loop once the port is closed. A thread ended (terminated, or killed by an uncaught error)
 * with a zeromq socket or observer still receiving aborts the whole process: zeromq 6.8's reaper
 * closes it during the environment's teardown and the pending receive's rejection throws a
 * Napi::Error no JavaScript frame can catch (#29: 3 of 3 in an isolated worker).
 */
let ending: Promise<void> | null = null;
const end = (last: KvIngestReport): Promise<void> => {
  ending ??= (async () => {
    clearInterval(scan);
    try {
      await ingest.close();
    } catch {
      // Closing is best effort: what it could not close, the observers' sweep below still does.
    }
    flushDirty();
    // Closed sockets' observers are closed OBSERVER_CLOSE_GRACE_MS later (zmq-observers.ts); the
    // thread waits them out, then closes any left (a timer that fired late).
    await sleep(OBSERVER_CLOSE_GRACE_MS + OBSERVER_CLOSE_MARGIN_MS);
    closeRetiredObservers();
    post(last);
    port.close();
  })();
  return ending;
};

/**
 * An uncaught error (a bug: nothing a publisher sends can throw out of a listener) ends the thread
 * cleanly instead of killing it with its sockets open; the main thread restarts it.
 */
function fatal(err: unknown): void {
  void end({ t: "fatal", message: err instanceof Error ? `${err.name}: ${err.message}` : String(err) });
}
process.on("uncaughtException", fatal);
process.on("unhandledRejection", fatal);

port.on("message", (cmd: KvIngestCommand) => {
  if (ending !== null) return;
  void (async () => {
    switch (cmd.t) {
      case "upsert":
        try {
          await ingest.upsert(cmd.workerId, cmd.ranks);
          post({ t: "done", id: cmd.id, workerId: cmd.workerId, open: openRanks(cmd.workerId) });
        } catch (err) {
          post({ t: "done", id: cmd.id, workerId: cmd.workerId, open: openRanks(cmd.workerId), failure: failure(err) });
        }
        break;
      case "remove":
        try {
          const result = await ingest.remove(cmd.workerId);
          post({ t: "done", id: cmd.id, workerId: cmd.workerId, open: [], result });
        } catch (err) {
          post({ t: "done", id: cmd.id, workerId: cmd.workerId, open: openRanks(cmd.workerId), failure: failure(err) });
        }
        break;
      case "close":
        await end({ t: "done", id: cmd.id });
        break;
      case "crash":
        // Assertion (a programming error on purpose): the test hook's throw, from a fresh task so
        // that it is uncaught as a bug's would be.
        setImmediate(() => {
          throw new Error("kv ingest thread: crash requested (test hook)");
        });
        break;
    }
  })();
});
post({ t: "ready" });
