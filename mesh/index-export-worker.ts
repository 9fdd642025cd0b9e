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

import { indexChunkCopyBuffers, type IndexChunkCopy } from "../src/core/index.js";
import { MeshWireError } from "./errors.js";
import { spawnThread, threadFile } from "./spawn-thread.js";

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
  /** Starts the thread (spawnThread on index-export-thread.ts); tests inject one that fails. */
  readonly spawn?: () => Worker;
  /** The thread could not start or died: called once, with why. */
  readonly onFailure?: (err: Error) => void;
}

const THREAD_FILE = threadFile("index-export-thread");

export class IndexExportWorker {
  readonly #o: IndexExportWorkerOptions;
  #worker: Worker | null = null;
  #state: ExportThreadState = "idle";
  #nextId = 1;
  #closing = false;
  readonly #waiting = new Map<number, { resolve: (r: EncodedChunk) => void; reject: (e: Error) => void }>();

  constructor(o: IndexExportWorkerOptions = {}) {
    this.#o = o;
  }

  get state(): ExportThreadState {
    return this.#state;
  }

  /** Whether a chunk may go to the thread now; the first call starts it (lazily: most replicas never serve a join). */
  ready(): boolean {
    if (this.#state === "idle" && !this.#closing) this.#start();
    return this.#state === "ready";
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
  }

  #start(): void {
    this.#state = "starting";
    let w: Worker;
    try {
      w = (this.#o.spawn ?? (() => spawnThread(THREAD_FILE)))();
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
