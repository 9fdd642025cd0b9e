/**
 * The peer's side of the warm join, off its main thread (issue 25): one long-lived worker thread
 * (index-export-thread.ts), started on the first index request and kept for the next joiners,
 * walks and encodes the chunk copies the main thread takes (src/core/index-export-copy.ts).
 *
 * Until the thread has loaded (from source under tsx, a second or more on a loaded host) and for
 * good once it failed (it could not start, or died), `ready()` is false and the server exports
 * on its main thread in slices (index-sync.ts, export-slicer.ts), as before: a join is never
 * refused for want of the thread. A failure is counted and reported once (onFailure); a chunk
 * the thread was encoding when it failed is exported again by the slicer.
 */
import type { Worker } from "node:worker_threads";

import { indexChunkCopyBuffers, systemTimers, type IndexChunkCopy, type TimerHandle, type Timers } from "../src/core/index.js";
import { MeshWireError } from "./errors.js";
import { siblingFile, startWorkerThread } from "../src/util/worker-thread.js";

export interface ExportThreadRequest {
  readonly id: number;
  readonly copy: IndexChunkCopy;
  /** The reply's head (status, next cursor), put before the chunk. */
  readonly head: Uint8Array;
}

export interface ExportThreadReply {
  readonly id: number;
  /** The thread has loaded (id 0). */
  readonly ready?: true;
  /** The whole reply: the head, then the chunk. */
  readonly reply?: Uint8Array;
  readonly ranks?: number;
  readonly blocks?: number;
  /** The chunk's bytes (without the head). */
  readonly bytes?: number;
  /** The copy's buffers, back for the next copy (transferred both ways). */
  readonly returned?: ArrayBuffer[];
  readonly error?: string;
}

export interface EncodedChunk {
  readonly reply: Buffer;
  readonly ranks: number;
  readonly blocks: number;
  readonly bytes: number;
}

export type ExportThreadState = "idle" | "starting" | "ready" | "failed";

export interface IndexExportWorkerOptions {
  /** Starts the thread (startWorkerThread on index-export-thread.ts); tests inject one that fails. */
  readonly spawn?: () => Worker;
  /** The thread could not start or died: called once, with why. */
  readonly onFailure?: (err: Error) => void;
  /** For the recycled buffers' idle release (systemTimers). */
  readonly timers?: Timers;
}

/**
 * Bound on the copies' buffers kept for the next chunk, bytes: a 1,024 x 4,096 chunk copies
 * ~3.7 MB (2.4 MB of node arrays, 10 lookup tables of 128 KB), so this holds a few chunks'.
 */
const RECYCLED_MAX_BYTES = 16 * 1024 * 1024;
/** The recycled buffers are released after this long with no chunk, ms (a join asks every few ms). */
const RECYCLED_IDLE_MS = 5_000;
/** A fresh buffer's room over what it is asked, so that a partition's growing node arrays still fit it next chunk. */
const FRESH_HEADROOM = 1.125;

const THREAD_FILE = siblingFile(import.meta.url, "index-export-thread");

export class IndexExportWorker {
  readonly #o: IndexExportWorkerOptions;
  #worker: Worker | null = null;
  #state: ExportThreadState = "idle";
  #nextId = 1;
  #closing = false;
  readonly #waiting = new Map<number, { resolve: (r: EncodedChunk) => void; reject: (e: Error) => void }>();
  /** Buffers the thread handed back, for the next copies (copyIndexChunk's alloc). */
  #recycled: ArrayBuffer[] = [];
  #recycledBytes = 0;
  #idle: TimerHandle | null = null;

  constructor(o: IndexExportWorkerOptions = {}) {
    this.#o = o;
  }

  get state(): ExportThreadState {
    return this.#state;
  }

  /** Bytes of the copies' buffers kept for the next chunks (RECYCLED_MAX_BYTES at most). */
  get recycledBytes(): number {
    return this.#recycledBytes;
  }

  /** Whether a chunk may go to the thread now; the first call starts it (lazily: most replicas never serve a join). */
  ready(): boolean {
    this.start();
    return this.#state === "ready";
  }

  /** Starts the thread unless it is started, failed or closing. */
  start(): void {
    if (this.#state === "idle" && !this.#closing) this.#start();
  }

  /**
   * A buffer of at least `bytes` for a chunk copy (copyIndexChunk's alloc): the smallest recycled
   * one that fits, else a fresh one with some room to grow. Fresh buffers are zeroed by the
   * allocator and tracked by the collector: recycling them keeps both off the main thread.
   */
  readonly alloc = (bytes: number): ArrayBuffer => {
    let best = -1;
    for (let i = 0; i < this.#recycled.length; i++) {
      const b = this.#recycled[i] as ArrayBuffer;
      if (b.byteLength >= bytes && (best < 0 || b.byteLength < (this.#recycled[best] as ArrayBuffer).byteLength)) best = i;
    }
    if (best < 0) return new ArrayBuffer(Math.ceil((bytes * FRESH_HEADROOM) / 8) * 8);
    const [b] = this.#recycled.splice(best, 1) as [ArrayBuffer];
    this.#recycledBytes -= b.byteLength;
    return b;
  };

  #recycle(buffers: readonly ArrayBuffer[]): void {
    for (const b of buffers) {
      if (this.#recycledBytes + b.byteLength > RECYCLED_MAX_BYTES) continue;
      this.#recycled.push(b);
      this.#recycledBytes += b.byteLength;
    }
    this.#idle?.cancel();
    this.#idle = (this.#o.timers ?? systemTimers).setTimeout(() => {
      this.#idle = null;
      this.#recycled = [];
      this.#recycledBytes = 0;
    }, RECYCLED_IDLE_MS);
  }

  /** Walks and encodes `copy` on the thread (its buffers are transferred: unusable here after). Rejects if the thread fails meanwhile. */
  encode(copy: IndexChunkCopy, head: Uint8Array): Promise<EncodedChunk> {
    const w = this.#worker;
    // Assertion (a programming error, never input): callers ask ready() first.
    if (w === null || this.#state !== "ready") return Promise.reject(new Error("Assertion: the index export thread is not ready"));
    const id = this.#nextId++;
    return new Promise((resolve, reject) => {
      this.#waiting.set(id, { resolve, reject });
      const m: ExportThreadRequest = { id, copy, head };
      w.postMessage(m, indexChunkCopyBuffers(copy));
    });
  }

  async close(): Promise<void> {
    this.#closing = true;
    const w = this.#worker;
    this.#worker = null;
    if (w !== null) await w.terminate();
    this.#rejectAll(new Error("the index export thread was closed"));
    this.#idle?.cancel();
    this.#recycled = [];
    this.#recycledBytes = 0;
  }

  #start(): void {
    this.#state = "starting";
    let w: Worker;
    try {
      w = (this.#o.spawn ?? (() => startWorkerThread(THREAD_FILE, undefined)))();
    } catch (err) {
      this.#fail(err instanceof Error ? err : new Error(String(err)));
      return;
    }
    w.unref();
    this.#worker = w;
    w.on("message", (m: ExportThreadReply) => {
      if (m.ready === true) {
        if (this.#state === "starting") this.#state = "ready";
        return;
      }
      const p = this.#waiting.get(m.id);
      if (p === undefined) return;
      this.#waiting.delete(m.id);
      if (m.returned !== undefined) this.#recycle(m.returned);
      if (m.error !== undefined || m.reply === undefined) p.reject(new MeshWireError("index_export", m.error ?? "no reply"));
      else p.resolve({ reply: Buffer.from(m.reply.buffer, m.reply.byteOffset, m.reply.byteLength), ranks: m.ranks ?? 0, blocks: m.blocks ?? 0, bytes: m.bytes ?? 0 });
    });
    w.on("error", (err) => {
      this.#fail(err);
    });
    w.on("exit", (code) => {
      if (!this.#closing) this.#fail(new Error(`the index export thread exited (code ${code})`));
    });
  }

  #fail(err: Error): void {
    if (this.#state === "failed") return;
    this.#state = "failed";
    const w = this.#worker;
    this.#worker = null;
    if (w !== null) void w.terminate();
    this.#rejectAll(err);
    this.#o.onFailure?.(err);
  }

  #rejectAll(err: Error): void {
    for (const p of this.#waiting.values()) p.reject(err);
    this.#waiting.clear();
  }
}
