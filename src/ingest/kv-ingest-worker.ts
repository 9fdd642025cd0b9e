/**
 * KvIngest's API on the main thread, with the sockets, decoding and hashing on the ingest thread
 * (kv-ingest-thread.ts; why: docs/ingest-thread.md). Batches arrive decoded, their blocks' hashes
 * computed, and go to `onBatch` in each rank's sequence order, as KvIngest delivers them.
 *
 * What the main thread answers itself, from what the thread reported:
 * - position(): the last batch handed to onBatch (seq and digest). It is what the index holds,
 *   which is what a warm join's snapshot must be stamped with; the thread's own cursor runs ahead
 *   by whatever is still in flight.
 * - stats() and budgetRefusals: the thread posts a rank's counters after each batch and, for
 *   counters that move without one (malformed, stale, lost), within STATS_SCAN_INTERVAL_MS.
 * - replayEndpointOf(): from the thread's reply to the last upsert.
 *
 * Reports are handled in the thread's order, in slices (DEFAULT_INGEST_APPLY_SLICE_MS) so that
 * HTTP callbacks run between them however far the thread runs ahead.
 *
 * If the thread dies (a bug: nothing a publisher sends can throw out of a listener; the thread
 * catches its own uncaught errors, closes its sockets and ends, see kv-ingest-thread.ts) it is
 * counted (`restarts`, kvmesh_ingest_thread_restarts_total), logged at error and started again
 * after a backoff that doubles while it keeps dying. The new thread subscribes every registered
 * rank again from where the index is (position(): a gap is replayed as after a reconnect, a
 * publisher that restarted meanwhile resets its rank), and the calls in flight are sent again.
 * Counters carry over: a rank's counters are the dead threads' plus the live one's.
 */
import type { Logger } from "pino";
import { pino } from "pino";
import type { Worker } from "node:worker_threads";

import { siblingFile, startWorkerThread } from "../util/worker-thread.js";
import { systemClock, systemTimers, type Clock, type TimerHandle, type Timers } from "../core/index.js";

import type { KvEventListenerStats } from "./kv-event-listener.js";
import { KvEndpointError, type KvIngestOptions, type KvRankEndpoints, type KvRankRef, type KvRankStats } from "./kv-ingest.js";
import type { KvEventBatch } from "../core/index.js";

import { decodePreparedBatch } from "./prepared-batch-codec.js";
import { checkIngestWindowLimits, createIngestWindowBuffer, DEFAULT_INGEST_WINDOW_BATCHES, DEFAULT_INGEST_WINDOW_BYTES, IngestWindow, type IngestWindowLimits } from "./kv-ingest-window.js";
import type { KvIngestCommand, KvIngestFailure, KvIngestReport, KvIngestThreadData, KvOpenRank } from "./kv-ingest-protocol.js";

/**
 * How long close() waits for the thread to end by itself once it has closed its sockets, ms. It
 * is then terminated, counted and logged: a last resort, since terminating a thread whose sockets
 * are still open aborts the process (kv-ingest-thread.ts). Closing takes its observers' grace
 * (~350 ms); 5 s leaves room for a loaded machine.
 */
export const INGEST_THREAD_EXIT_TIMEOUT_MS = 5_000;
/** Backoff between restarts of a thread that keeps dying, ms: first, then doubling to the max. */
export const INGEST_THREAD_RESTART_MIN_MS = 100;
export const INGEST_THREAD_RESTART_MAX_MS = 5_000;
/** A thread that lived this long resets the backoff, ms. */
export const INGEST_THREAD_HEALTHY_MS = 10_000;
/**
 * Main-thread time spent applying the thread's reports in one event-loop turn before yielding to
 * I/O, ms. Node delivers every message queued on a port in one callback, so once the thread
 * outran the main thread (the fast reader, 2.6M ops/s per core against ~1M applied) a select
 * waited for the whole backlog: p99 1.5 s at 0.8M block ops/s. Reports are queued on arrival
 * (a push each) and applied in slices of this much; one batch of 128 block ops takes ~0.13 ms,
 * so a select waits at most about this long behind ingest.
 */
export const DEFAULT_INGEST_APPLY_SLICE_MS = 2;

const key = (workerId: string, rank: number): string => `${workerId}\u0000${String(rank)}`;

interface Waiter {
  /** Sent again to a restarted thread if the one it went to died first. */
  readonly cmd: KvIngestCommand;
  readonly resolve: (v: boolean) => void;
  readonly reject: (e: Error) => void;
}

type Report = Exclude<KvIngestReport, { t: "ready" }>;

function toError(f: KvIngestFailure): Error {
  switch (f.kind) {
    case "endpoint":
      return new KvEndpointError(f.rank, f.endpoint, Object.assign(new Error(f.message), f.code === undefined ? {} : { code: f.code }));
    case "range":
      return new RangeError(f.message);
    case "other":
      return new Error(f.message);
  }
}

const ZERO_STATS: Omit<KvEventListenerStats, "lastSeq"> = { received: 0, applied: 0, replayed: 0, malformed: 0, stale: 0, implausible: 0, lost: 0, resets: 0, oversized: 0, eventsShed: 0, resetsDamped: 0, shed: 0 };

/** `a` + `b`, counter by counter; lastSeq is `b`'s (the live thread's) when it has one. */
function addStats(a: KvEventListenerStats, b: KvEventListenerStats): KvEventListenerStats {
  const out: KvEventListenerStats = { ...a, lastSeq: b.lastSeq ?? a.lastSeq };
  for (const k of Object.keys(ZERO_STATS) as (keyof typeof ZERO_STATS)[]) out[k] = a[k] + b[k];
  return out;
}

/** One started thread: its worker and when it said it was ready and when it exited. */
interface Thread {
  readonly worker: Worker;
  /** Its hand-over window (kv-ingest-window.ts): what it posted and the main thread has not applied. */
  readonly window: IngestWindow;
  readonly exited: Promise<void>;
  readonly startedAtMs: number;
  dead: boolean;
}

export class KvIngestWorker {
  readonly #o: KvIngestOptions;
  readonly #log: Logger;
  readonly #data: Omit<KvIngestThreadData, "window">;
  /** The highest pending batches and bytes of the threads that died (the live one's are in its window). */
  #peakBase = { batches: 0, bytes: 0 };
  #thread: Thread;
  /** Resolves once the current (or, while one restarts, the next) thread is ready. */
  #ready!: Promise<void>;
  #markReady!: () => void;
  readonly #waiting = new Map<number, Waiter>();
  #nextId = 1;
  /** Calls awaiting their reply. */
  #pending = 0;
  #closed: Promise<void> | null = null;
  /** Per worker: the ranks its last upsert asked for (what a restarted thread subscribes again). */
  readonly #registered = new Map<string, readonly KvRankEndpoints[]>();
  /** Per (worker, rank): its counters (the live thread's) and replay endpoint, as of the thread's last report. */
  readonly #ranks = new Map<string, { stats: KvRankStats; replayEndpoint: string | null }>();
  /** Per (worker, rank): the counters of threads that died. */
  readonly #statsBase = new Map<string, KvEventListenerStats>();
  /** Per (worker, rank): the last batch handed to onBatch (a rank's first can come before its upsert's reply). */
  readonly #positions = new Map<string, { seq: bigint; digest: bigint | null }>();
  #budgetRefusals = 0;
  #budgetRefusalsBase = 0;
  /** Reports received and not yet handled, in the thread's order (see DEFAULT_INGEST_APPLY_SLICE_MS). */
  readonly #queue: Report[] = [];
  #queueHead = 0;
  #drainScheduled = false;
  readonly #clock: Clock;
  readonly #timers: Timers;
  readonly #sliceMs: number;
  #restarts = 0;
  #terminations = 0;
  #backoffMs = INGEST_THREAD_RESTART_MIN_MS;
  #restartTimer: TimerHandle | undefined;

  constructor(options: KvIngestOptions & { readonly clock?: Clock; readonly timers?: Timers; readonly applySliceMs?: number; readonly window?: Partial<IngestWindowLimits> }) {
    this.#o = options;
    this.#clock = options.clock ?? systemClock;
    this.#timers = options.timers ?? systemTimers;
    this.#sliceMs = options.applySliceMs ?? DEFAULT_INGEST_APPLY_SLICE_MS;
    this.#log = options.logger ?? pino({ enabled: false });
    const windowLimits = checkIngestWindowLimits({ maxBatches: options.window?.maxBatches ?? DEFAULT_INGEST_WINDOW_BATCHES, maxBytes: options.window?.maxBytes ?? DEFAULT_INGEST_WINDOW_BYTES });
    this.#data = {
      logLevel: this.#log.level,
      windowLimits,
      ...(options.replayTimeoutMs === undefined ? {} : { replayTimeoutMs: options.replayTimeoutMs }),
      ...(options.maxRanks === undefined ? {} : { maxRanks: options.maxRanks }),
    };
    this.#gateReady();
    this.#thread = this.#spawn();
  }

  /** Threads started again after one died (kvmesh_ingest_thread_restarts_total). */
  get restarts(): number {
    return this.#restarts;
  }

  /** Threads terminated because they did not end by themselves in time (each risks a native abort). */
  get terminations(): number {
    return this.#terminations;
  }

  /** Whether a live thread is reading the KV streams (false while a dead one waits for its restart). */
  get up(): boolean {
    return !this.#thread.dead;
  }

  /**
   * The hand-over window (kv-ingest-window.ts): batches and bytes the live thread posted and the
   * main thread has not applied yet, and the most ever pending at once.
   */
  get window(): { readonly pendingBatches: number; readonly pendingBytes: number; readonly peakBatches: number; readonly peakBytes: number; readonly limits: IngestWindowLimits } {
    const w = this.#thread.window;
    return {
      pendingBatches: this.#thread.dead ? 0 : w.pendingBatches,
      pendingBytes: this.#thread.dead ? 0 : w.pendingBytes,
      peakBatches: Math.max(this.#peakBase.batches, w.peakBatches),
      peakBytes: Math.max(this.#peakBase.bytes, w.peakBytes),
      limits: w.limits,
    };
  }

  /** Test hook: the thread throws an uncaught error, as a bug would; it is restarted as for one. */
  crashThreadForTest(): void {
    this.#thread.worker.postMessage({ t: "crash" } satisfies KvIngestCommand);
  }

  get budgetRefusals(): number {
    return this.#budgetRefusalsBase + this.#budgetRefusals;
  }

  upsert(workerId: string, ranks: readonly KvRankEndpoints[]): Promise<void> {
    const wire = ranks.map((r) => ({ rank: r.rank, endpoint: r.endpoint, replayEndpoint: r.replayEndpoint ?? null }));
    this.#registered.set(workerId, wire);
    return this.#call((id) => ({ t: "upsert", id, workerId, ranks: wire })).then(() => undefined);
  }

  remove(workerId: string): Promise<boolean> {
    this.#registered.delete(workerId);
    return this.#call((id) => ({ t: "remove", id, workerId }));
  }

  position(workerId: string, rank: number): { seq: bigint; digest: bigint | null } | null {
    return this.#positions.get(key(workerId, rank)) ?? null;
  }

  replayEndpointOf(workerId: string, rank: number): string | null {
    return this.#ranks.get(key(workerId, rank))?.replayEndpoint ?? null;
  }

  stats(): KvRankStats[] {
    const out: KvRankStats[] = [];
    for (const [k, r] of this.#ranks) {
      const base = this.#statsBase.get(k);
      out.push(base === undefined ? r.stats : { ...r.stats, stats: addStats(base, r.stats.stats) });
    }
    return out;
  }

  close(): Promise<void> {
    this.#closed ??= (async () => {
      this.#restartTimer?.cancel();
      this.#restartTimer = undefined;
      const t = this.#thread;
      if (!t.dead) {
        try {
          await this.#call((id) => ({ t: "close", id }));
        } catch {
          // The thread is gone already: nothing left to close but the worker itself.
        }
      }
      // It ends by itself once its sockets and observers are closed; terminated only if it does not.
      await this.#awaitExit(t, "close");
      this.#failAll(new Error("the kv ingest is closed"));
      this.#markReady();
      this.#ranks.clear();
      this.#positions.clear();
    })();
    return this.#closed;
  }

  /** A new pending #ready: calls made from now on wait for the next thread. */
  #gateReady(): void {
    this.#ready = new Promise<void>((resolve) => (this.#markReady = resolve));
  }

  #spawn(): Thread {
    const sab = createIngestWindowBuffer();
    const handover = new IngestWindow(sab, this.#data.windowLimits);
    const worker = startWorkerThread(siblingFile(import.meta.url, "kv-ingest-thread"), { ...this.#data, window: sab } satisfies KvIngestThreadData);
    const t: Thread = { worker, window: handover, exited: new Promise<void>((resolve) => worker.once("exit", () => { resolve(); })), startedAtMs: this.#clock.now(), dead: false };
    worker.on("message", (m: KvIngestReport) => {
      if (t !== this.#thread) return;
      if (m.t === "ready") this.#onThreadReady();
      // At once, with its thread: by the time the queue reaches it a new thread may be running.
      else if (m.t === "fatal") this.#died(t, m.message);
      else this.#enqueue(m);
    });
    worker.on("error", (err) => {
      if (t === this.#thread) this.#died(t, `uncaught error: ${err.message}`);
    });
    worker.on("exit", (code) => {
      if (t === this.#thread) this.#died(t, `exited with code ${String(code)}`);
    });
    // The daemon closes it; a thread left running must not keep the process alive on its own.
    if (this.#pending === 0) worker.unref();
    return t;
  }

  /**
   * A new thread is up: after a restart it first subscribes every registered rank again from the
   * index's position, then gets the calls that were in flight when the last one died.
   */
  #onThreadReady(): void {
    if (this.#restarts > 0) {
      // The dead thread's last reports first: positions are then where the index is.
      this.#drainAll();
      for (const [workerId, ranks] of this.#registered) {
        const cmd: KvIngestCommand = { t: "upsert", id: this.#nextId++, workerId, ranks: ranks.map((r) => ({ ...r, resumeAt: this.position(workerId, r.rank) })) };
        this.#thread.worker.postMessage(cmd);
      }
      for (const w of [...this.#waiting.values()]) this.#thread.worker.postMessage(w.cmd);
    }
    this.#markReady();
  }

  /** Waits up to INGEST_THREAD_EXIT_TIMEOUT_MS for `t` to end by itself, then terminates it (counted, logged). */
  async #awaitExit(t: Thread, why: string): Promise<void> {
    t.worker.ref();
    let timer: TimerHandle | undefined;
    const late = new Promise<boolean>((resolve) => {
      timer = this.#timers.setTimeout(() => { resolve(true); }, INGEST_THREAD_EXIT_TIMEOUT_MS);
    });
    const timedOut = await Promise.race([t.exited.then(() => false), late]);
    timer?.cancel();
    if (timedOut) {
      this.#terminations++;
      this.#log.error({ why, wait_ms: INGEST_THREAD_EXIT_TIMEOUT_MS, terminations: this.#terminations }, "kv ingest thread did not end by itself: terminating it (its sockets may still be open)");
      await t.worker.terminate();
    }
    await t.exited;
  }

  /** The thread died: counted, logged, and started again after a backoff. */
  #died(t: Thread, reason: string): void {
    if (t.dead) return;
    t.dead = true;
    if (this.#closed !== null) {
      // Closing: nothing to restart; whatever waited on this thread is answered now.
      this.#failAll(new Error("the kv ingest thread exited"));
      this.#markReady();
      return;
    }
    this.#restarts++;
    this.#gateReady();
    // What it reported before it died is still good: applied now, so positions are where the index is.
    this.#drainAll();
    for (const [k, r] of this.#ranks) {
      const base = this.#statsBase.get(k);
      this.#statsBase.set(k, base === undefined ? r.stats.stats : addStats(base, r.stats.stats));
      r.stats = { ...r.stats, stats: { ...ZERO_STATS, lastSeq: r.stats.stats.lastSeq } };
    }
    this.#budgetRefusalsBase += this.#budgetRefusals;
    this.#budgetRefusals = 0;
    if (this.#clock.now() - t.startedAtMs >= INGEST_THREAD_HEALTHY_MS) this.#backoffMs = INGEST_THREAD_RESTART_MIN_MS;
    const delayMs = this.#backoffMs;
    this.#backoffMs = Math.min(this.#backoffMs * 2, INGEST_THREAD_RESTART_MAX_MS);
    this.#log.error({ reason, restarts: this.#restarts, workers: this.#registered.size, restart_in_ms: delayMs }, "kv ingest thread died: KV events are not applied until it is started again (ranks resume from the index's position)");
    void this.#awaitExit(t, "died").then(() => {
      if (this.#closed !== null) return;
      this.#restartTimer = this.#timers.setTimeout(() => {
        this.#restartTimer = undefined;
        if (this.#closed !== null) return;
        // The dead thread's last reports, before a new thread (and its window) takes their place.
        this.#drainAll();
        const dead = this.#thread.window;
        this.#peakBase = { batches: Math.max(this.#peakBase.batches, dead.peakBatches), bytes: Math.max(this.#peakBase.bytes, dead.peakBytes) };
        this.#thread = this.#spawn();
      }, delayMs);
    });
  }

  async #call(make: (id: number) => KvIngestCommand): Promise<boolean> {
    // Referenced while a reply is awaited (the thread's start included): a closing daemon has
    // nothing else keeping it alive.
    if (this.#pending++ === 0) this.#thread.worker.ref();
    try {
      await this.#ready;
      // Assertion (a programming error): the daemon makes no call after close().
      if (this.#closed !== null && this.#thread.dead) throw new Error("the kv ingest is closed");
      const id = this.#nextId++;
      const cmd = make(id);
      return await new Promise<boolean>((resolve, reject) => {
        this.#waiting.set(id, { cmd, resolve, reject });
        this.#thread.worker.postMessage(cmd);
      });
    } finally {
      if (--this.#pending === 0 && this.#closed === null) this.#thread.worker.unref();
    }
  }

  #enqueue(m: Report): void {
    this.#queue.push(m);
    if (!this.#drainScheduled) {
      this.#drainScheduled = true;
      this.#timers.setImmediate(() => { this.#drain(); });
    }
  }

  /** Handles every queued report now (a thread died: its last reports before its restart). */
  #drainAll(): void {
    const q = this.#queue;
    while (this.#queueHead < q.length) {
      const m = q[this.#queueHead] as Report;
      q[this.#queueHead++] = undefined as unknown as Report;
      this.#onReport(m);
    }
    q.length = 0;
    this.#queueHead = 0;
  }

  /** Handles queued reports in order for up to one slice, then yields to I/O if any are left. */
  #drain(): void {
    this.#drainScheduled = false;
    const end = this.#clock.now() + this.#sliceMs;
    const q = this.#queue;
    while (this.#queueHead < q.length) {
      const m = q[this.#queueHead] as Report;
      q[this.#queueHead++] = undefined as unknown as Report;
      this.#onReport(m);
      if (this.#clock.now() >= end) break;
    }
    if (this.#queueHead >= q.length) {
      q.length = 0;
      this.#queueHead = 0;
    } else {
      if (this.#queueHead > 1024 && this.#queueHead * 2 > q.length) {
        q.splice(0, this.#queueHead);
        this.#queueHead = 0;
      }
      this.#drainScheduled = true;
      this.#timers.setImmediate(() => { this.#drain(); });
    }
  }

  #failAll(err: Error): void {
    for (const w of this.#waiting.values()) w.reject(err);
    this.#waiting.clear();
  }

  #onReport(m: Report): void {
    switch (m.t) {
      case "batch": {
        this.#positions.set(key(m.ref.workerId, m.ref.rank), { seq: m.seq, digest: m.digest });
        const e = m.encoded;
        const batch = e === null ? (m.batch as KvEventBatch) : decodePreparedBatch(e.ts, e.dpRank, e.words, e.strings);
        try {
          this.#o.onBatch(m.ref, batch, m.seq, m.replayed, m.digest);
        } catch (err) {
          this.#log.child({ workerId: m.ref.workerId, rank: m.ref.rank }).error({ err, seq: m.seq }, "onBatch handler threw");
        }
        // Its room in the window goes back to the thread (reports of a dead thread are all handled before the next starts).
        this.#thread.window.applied(m.bytes);
        break;
      }
      case "reset":
        this.#reset(m.ref);
        break;
      case "stats":
        this.#budgetRefusals = m.budgetRefusals;
        for (const s of m.ranks) {
          const r = this.#ranks.get(key(s.workerId, s.rank));
          if (r !== undefined) r.stats = s;
        }
        break;
      case "log":
        this.#log.child(m.bindings)[m.level](m.obj, m.msg);
        break;
      case "fatal":
        // Handled on arrival (#spawn).
        break;
      case "done": {
        if (m.workerId !== undefined && m.open !== undefined) this.#setOpen(m.workerId, m.open);
        const w = this.#waiting.get(m.id);
        this.#waiting.delete(m.id);
        // A restarted thread's own re-subscription (#onThreadReady) has no caller to tell.
        if (w === undefined && m.failure !== undefined) this.#log.warn({ worker_id: m.workerId, failure: m.failure }, "kv ingest thread restarted: a worker's ranks could not be subscribed again");
        if (m.failure !== undefined) w?.reject(toError(m.failure));
        else w?.resolve(m.result ?? true);
        break;
      }
    }
  }

  /** `workerId` has exactly `open` now: others of its ranks are gone. */
  #setOpen(workerId: string, open: readonly KvOpenRank[]): void {
    const keep = new Set(open.map((o) => key(workerId, o.stats.rank)));
    const prefix = `${workerId}\u0000`;
    for (const k of [...this.#ranks.keys()]) if (k.startsWith(prefix) && !keep.has(k)) this.#ranks.delete(k);
    for (const k of [...this.#positions.keys()]) if (k.startsWith(prefix) && !keep.has(k)) this.#positions.delete(k);
    for (const k of [...this.#statsBase.keys()]) if (k.startsWith(prefix) && !keep.has(k)) this.#statsBase.delete(k);
    for (const o of open) this.#ranks.set(key(workerId, o.stats.rank), { stats: o.stats, replayEndpoint: o.replayEndpoint });
  }

  #reset(ref: KvRankRef): void {
    this.#positions.delete(key(ref.workerId, ref.rank));
    try {
      this.#o.onReset(ref);
    } catch (err) {
      this.#log.error({ err, ...ref }, "onReset handler threw");
    }
  }
}
