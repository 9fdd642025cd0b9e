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
 * If the thread dies (a bug: nothing a publisher sends can throw out of a listener) the error is
 * logged and the ingest stops: ranks stop updating, counted nowhere else. It is not restarted.
 */
import type { Logger } from "pino";
import { pino } from "pino";
import type { Worker } from "node:worker_threads";

import { siblingFile, startWorkerThread } from "../util/worker-thread.js";
import { systemClock, systemTimers, type Clock, type Timers } from "../core/index.js";

import { KvEndpointError, type KvIngestOptions, type KvRankEndpoints, type KvRankRef, type KvRankStats } from "./kv-ingest.js";
import type { KvEventBatch } from "../core/index.js";

import { decodePreparedBatch } from "./prepared-batch-codec.js";
import type { KvIngestCommand, KvIngestFailure, KvIngestReport, KvIngestThreadData, KvOpenRank } from "./kv-ingest-protocol.js";

/** How long close() waits for the thread to end by itself before terminating it, ms. */
const THREAD_EXIT_TIMEOUT_MS = 2_000;
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
  readonly resolve: (v: boolean) => void;
  readonly reject: (e: Error) => void;
}

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

export class KvIngestWorker {
  readonly #o: KvIngestOptions;
  readonly #log: Logger;
  readonly #worker: Worker;
  readonly #ready: Promise<void>;
  readonly #exited: Promise<void>;
  readonly #waiting = new Map<number, Waiter>();
  #nextId = 1;
  /** Calls awaiting their reply. */
  #pending = 0;
  #closed: Promise<void> | null = null;
  /** Per (worker, rank): its counters and replay endpoint, as of the thread's last report. */
  readonly #ranks = new Map<string, { stats: KvRankStats; replayEndpoint: string | null }>();
  /** Per (worker, rank): the last batch handed to onBatch (a rank's first can come before its upsert's reply). */
  readonly #positions = new Map<string, { seq: bigint; digest: bigint | null }>();
  #budgetRefusals = 0;
  /** Reports received and not yet handled, in the thread's order (see DEFAULT_INGEST_APPLY_SLICE_MS). */
  readonly #queue: Exclude<KvIngestReport, { t: "ready" }>[] = [];
  #queueHead = 0;
  #drainScheduled = false;
  readonly #clock: Clock;
  readonly #timers: Timers;
  readonly #sliceMs: number;

  constructor(options: KvIngestOptions & { readonly clock?: Clock; readonly timers?: Timers; readonly applySliceMs?: number }) {
    this.#o = options;
    this.#clock = options.clock ?? systemClock;
    this.#timers = options.timers ?? systemTimers;
    this.#sliceMs = options.applySliceMs ?? DEFAULT_INGEST_APPLY_SLICE_MS;
    this.#log = options.logger ?? pino({ enabled: false });
    const data: KvIngestThreadData = {
      logLevel: this.#log.level,
      ...(options.replayTimeoutMs === undefined ? {} : { replayTimeoutMs: options.replayTimeoutMs }),
      ...(options.maxRanks === undefined ? {} : { maxRanks: options.maxRanks }),
    };
    this.#worker = startWorkerThread(siblingFile(import.meta.url, "kv-ingest-thread"), data);
    let started!: () => void;
    this.#ready = new Promise<void>((resolve) => (started = resolve));
    this.#worker.on("message", (m: KvIngestReport) => {
      if (m.t === "ready") started();
      else this.#enqueue(m);
    });
    this.#worker.on("error", (err) => {
      this.#log.error({ err }, "kv ingest thread failed: KV events are no longer applied");
      this.#failAll(err);
    });
    // The daemon closes it; a thread left running must not keep the process alive on its own.
    this.#worker.unref();
    this.#exited = new Promise<void>((resolve) => this.#worker.once("exit", () => { resolve(); }));
    this.#worker.on("exit", (code) => {
      if (this.#closed === null) this.#log.error({ code }, "kv ingest thread exited: KV events are no longer applied");
      started();
      this.#failAll(new Error("the kv ingest thread exited"));
    });
  }

  get budgetRefusals(): number {
    return this.#budgetRefusals;
  }

  upsert(workerId: string, ranks: readonly KvRankEndpoints[]): Promise<void> {
    return this.#call((id) => ({ t: "upsert", id, workerId, ranks: ranks.map((r) => ({ rank: r.rank, endpoint: r.endpoint, replayEndpoint: r.replayEndpoint ?? null })) })).then(() => undefined);
  }

  remove(workerId: string): Promise<boolean> {
    return this.#call((id) => ({ t: "remove", id, workerId }));
  }

  position(workerId: string, rank: number): { seq: bigint; digest: bigint | null } | null {
    return this.#positions.get(key(workerId, rank)) ?? null;
  }

  replayEndpointOf(workerId: string, rank: number): string | null {
    return this.#ranks.get(key(workerId, rank))?.replayEndpoint ?? null;
  }

  stats(): KvRankStats[] {
    return [...this.#ranks.values()].map((r) => r.stats);
  }

  close(): Promise<void> {
    this.#closed ??= (async () => {
      try {
        await this.#call((id) => ({ t: "close", id }));
      } catch {
        // The thread is gone already: nothing left to close but the worker itself.
      }
      // It ends by itself once its sockets and observers are closed; terminated only if it does not.
      this.#worker.ref();
      const timer = setTimeout(() => void this.#worker.terminate(), THREAD_EXIT_TIMEOUT_MS);
      await this.#exited;
      clearTimeout(timer);
      this.#ranks.clear();
      this.#positions.clear();
    })();
    return this.#closed;
  }

  async #call(make: (id: number) => KvIngestCommand): Promise<boolean> {
    // Referenced while a reply is awaited (the thread's start included): a closing daemon has
    // nothing else keeping it alive.
    if (this.#pending++ === 0) this.#worker.ref();
    try {
      await this.#ready;
      const id = this.#nextId++;
      return await new Promise<boolean>((resolve, reject) => {
        this.#waiting.set(id, { resolve, reject });
        this.#worker.postMessage(make(id));
      });
    } finally {
      if (--this.#pending === 0 && this.#closed === null) this.#worker.unref();
    }
  }

  #enqueue(m: Exclude<KvIngestReport, { t: "ready" }>): void {
    this.#queue.push(m);
    if (!this.#drainScheduled) {
      this.#drainScheduled = true;
      this.#timers.setImmediate(() => { this.#drain(); });
    }
  }

  /** Handles queued reports in order for up to one slice, then yields to I/O if any are left. */
  #drain(): void {
    this.#drainScheduled = false;
    const end = this.#clock.now() + this.#sliceMs;
    const q = this.#queue;
    while (this.#queueHead < q.length) {
      const m = q[this.#queueHead] as Exclude<KvIngestReport, { t: "ready" }>;
      q[this.#queueHead++] = undefined as unknown as Exclude<KvIngestReport, { t: "ready" }>;
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

  #onReport(m: Exclude<KvIngestReport, { t: "ready" }>): void {
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
      case "done": {
        if (m.workerId !== undefined && m.open !== undefined) this.#setOpen(m.workerId, m.open);
        const w = this.#waiting.get(m.id);
        this.#waiting.delete(m.id);
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
