/**
 * The hand-over window between the ingest thread and the main thread: the prepared batches (and
 * their bytes) the thread has posted that the main thread has not applied yet, counted in a
 * SharedArrayBuffer both read without a message.
 *
 * Why a bound: the ingest thread prepares a block op in ~385 ns, the main thread applies one in
 * ~0.5-1 us (docs/ingest-thread.md), so past ~0.8M block ops/s the thread outruns the main
 * thread, and before this window its reports queued on the port and in KvIngestWorker's queue
 * without limit: memory grew (~2.3 KB a batch of 128 block ops) and the index fell ever further
 * behind real time.
 *
 * How it is used: the thread asks `hasRoom()` before it hands a message's batch on; while the
 * window is full its listeners keep reading their SUB sockets (so nothing piles up in libzmq,
 * whose queues hold the raw messages, ~3x a prepared batch, 10,000 per rank) but shed what they
 * read, unparsed and counted (kvmesh_kv_batches_shed_total). The rank's cursor stays where it
 * was, so its next message after the window opens is a gap, replayed from the engine as any gap
 * is, or counted lost where the engine no longer holds it (kv-event-listener.ts). The main thread
 * calls `applied(bytes)` after each batch.
 *
 * Counters are int32 and wrap: only differences are read, which stay far below 2^31 (the window
 * is at most MAX_INGEST_WINDOW_BYTES).
 */
import { badRequest } from "../core/index.js";

/**
 * Batches posted and not yet applied, at most (one more can be in flight: the check comes before
 * a message is read). 16,384 batches of the bench's 128 block ops (~1.9 KB each) are ~31 MB and
 * ~2 s of the main thread's work at ~1 us a block op; an engine's batches (one scheduler step) are
 * smaller, so the bytes bound below comes first for large ones. Not less: with 4,096, a loaded
 * machine (load 7, the main thread at 38% of a core) shed 1,223 batches of a 3 s step at 0.8M
 * block ops/s that it had applied within 0.8 s of the step's end without a window.
 */
export const DEFAULT_INGEST_WINDOW_BATCHES = 16_384;
/** The same window in bytes of posted batches (their prepared words, strings and a message's overhead): one at the per-message caps is ~3 MB. */
export const DEFAULT_INGEST_WINDOW_BYTES = 32 * 1024 * 1024;
/** The largest windows a flag may set: the counters are int32 and wrap (see above). */
export const MAX_INGEST_WINDOW_BATCHES = 1_048_576;
export const MAX_INGEST_WINDOW_BYTES = 1024 * 1024 * 1024;
/** What a posted report costs beside its buffer, bytes (the message object, its ref and bigints). */
export const REPORT_OVERHEAD_BYTES = 256;
/** A batch posted as objects (not in the prepared form) per hash, bytes: a BigInt and its array slot. */
export const CLONED_BYTES_PER_HASH = 64;

const APPLIED_BATCHES = 0;
const APPLIED_BYTES = 1;
const POSTED_BATCHES = 2;
const POSTED_BYTES = 3;
const PEAK_BATCHES = 4;
const PEAK_BYTES = 5;
/** 1 while a replay on the thread waits for room (waitForRoom); the main thread clears it and notifies. */
const WAITING = 6;
const SLOTS = 7;

/**
 * A replay that filled the window waits until it is at most this share full before asking the
 * engine for the rest: each resumption is a new replay request (a round trip), so it should bring
 * half a window, not one batch.
 */
const LOW_WATER_DIVISOR = 2;
/**
 * Longest single wait for room, ms: the main thread wakes the waiter when the window falls to its
 * low-water mark; this bound only lets a closing listener see that it is closing.
 */
export const ROOM_WAIT_MS = 100;

/** Atomics.waitAsync (Node >= 16), absent from the es2023 lib typings. */
const waitAsync = (Atomics as unknown as { waitAsync: (a: Int32Array, index: number, value: number, timeoutMs: number) => { async: boolean; value: Promise<string> | string } }).waitAsync;

export interface IngestWindowLimits {
  readonly maxBatches: number;
  readonly maxBytes: number;
}

/** The shared counters of a window (one per ingest thread: a restarted thread gets new ones). */
export function createIngestWindowBuffer(): SharedArrayBuffer {
  return new SharedArrayBuffer(SLOTS * Int32Array.BYTES_PER_ELEMENT);
}

export function checkIngestWindowLimits(l: IngestWindowLimits): IngestWindowLimits {
  const check = (field: string, v: number, max: number): void => {
    if (!Number.isInteger(v) || v < 1 || v > max) throw badRequest(`${field} must be an integer in 1..${String(max)}, got ${String(v)}`, field);
  };
  check("kvIngestWindowBatches", l.maxBatches, MAX_INGEST_WINDOW_BATCHES);
  check("kvIngestWindowBytes", l.maxBytes, MAX_INGEST_WINDOW_BYTES);
  return l;
}

/** Both sides of the window over one buffer: the thread uses hasRoom/posted, the main thread applied and the readings. */
export class IngestWindow {
  readonly #c: Int32Array;
  readonly #limits: IngestWindowLimits;

  constructor(sab: SharedArrayBuffer, limits: IngestWindowLimits) {
    this.#c = new Int32Array(sab);
    this.#limits = checkIngestWindowLimits(limits);
  }

  get limits(): IngestWindowLimits {
    return this.#limits;
  }

  /** Batches posted and not applied yet. */
  get pendingBatches(): number {
    return (Atomics.load(this.#c, POSTED_BATCHES) - Atomics.load(this.#c, APPLIED_BATCHES)) | 0;
  }

  /** Their bytes. */
  get pendingBytes(): number {
    return (Atomics.load(this.#c, POSTED_BYTES) - Atomics.load(this.#c, APPLIED_BYTES)) | 0;
  }

  /** The most batches (and bytes) ever pending at once on this window. */
  get peakBatches(): number {
    return Atomics.load(this.#c, PEAK_BATCHES);
  }

  get peakBytes(): number {
    return Atomics.load(this.#c, PEAK_BYTES);
  }

  /** Thread: whether one more batch may be handed on. An empty window always takes one, however large. */
  hasRoom(): boolean {
    const batches = this.pendingBatches;
    return batches <= 0 || (batches < this.#limits.maxBatches && this.pendingBytes < this.#limits.maxBytes);
  }

  /** Thread: a batch of `bytes` was posted. */
  posted(bytes: number): void {
    const batches = (Atomics.add(this.#c, POSTED_BATCHES, 1) + 1 - Atomics.load(this.#c, APPLIED_BATCHES)) | 0;
    const pendingBytes = (Atomics.add(this.#c, POSTED_BYTES, bytes) + bytes - Atomics.load(this.#c, APPLIED_BYTES)) | 0;
    if (batches > Atomics.load(this.#c, PEAK_BATCHES)) Atomics.store(this.#c, PEAK_BATCHES, batches);
    if (pendingBytes > Atomics.load(this.#c, PEAK_BYTES)) Atomics.store(this.#c, PEAK_BYTES, pendingBytes);
  }

  /**
   * Thread: resolves true once the window is down to its low-water mark (half its limits), false
   * after ROOM_WAIT_MS without (the caller checks whether it should still wait). A replay that
   * filled the window waits here, as its live socket already waits for the replay.
   */
  async waitForRoom(): Promise<boolean> {
    if (this.#lowWater()) return true;
    Atomics.store(this.#c, WAITING, 1);
    // Checked again after the flag is up: the main thread reads the flag after its counters move.
    if (this.#lowWater()) {
      Atomics.store(this.#c, WAITING, 0);
      return true;
    }
    const w = waitAsync(this.#c, WAITING, 1, ROOM_WAIT_MS);
    if (w.async) await w.value;
    return this.#lowWater();
  }

  /** Main thread: a posted batch of `bytes` was applied (or dropped with its dead thread's queue). */
  applied(bytes: number): void {
    Atomics.add(this.#c, APPLIED_BATCHES, 1);
    Atomics.add(this.#c, APPLIED_BYTES, bytes);
    if (Atomics.load(this.#c, WAITING) === 1 && this.#lowWater() && Atomics.compareExchange(this.#c, WAITING, 1, 0) === 1) Atomics.notify(this.#c, WAITING);
  }

  #lowWater(): boolean {
    return this.pendingBatches <= Math.floor(this.#limits.maxBatches / LOW_WATER_DIVISOR) && this.pendingBytes <= Math.floor(this.#limits.maxBytes / LOW_WATER_DIVISOR);
  }
}
