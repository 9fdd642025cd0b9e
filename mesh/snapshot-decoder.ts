/**
 * Decodes peers' snapshot replies on a worker thread (snapshot-decode-thread.ts), so that a
 * peer's snapshot does not hold this replica's /select while it is checked.
 *
 * Why: a replica that joins copies the fleet's catalogue from its peer, and the peer then pulls
 * the joiner's snapshot, with that catalogue in it: decoding it (`decodeSnapshotFields`,
 * `workerDraft` per worker, cold code) took the peer's main thread 114-172 ms in one step at
 * 1,024 workers (bench:warm-join's profile).
 *
 * The main thread gets the decoded snapshot in parts (a head, then its lists SNAPSHOT_ITEMS_PER_PART
 * items at a time, each asked for once the last is taken) and installs it whole, as before: the
 * snapshot's meaning is unchanged, only where it is decoded. The thread is started a while after
 * the mesh (SNAPSHOT_DECODE_THREAD_START_MS) and is used once it has loaded: until then (a
 * replica's first snapshots, while it joins) the reply is decoded here as before. One thread for the mesh's life, not holding the process open.
 */
import type { Worker } from "node:worker_threads";

import { siblingFile, startWorkerThread } from "../src/util/worker-thread.js";
import type { EntrySkipCounts } from "./entry-skips.js";
import { MeshWireError } from "./errors.js";
import type { ControlReply } from "./types.js";
import { decodeControlReply, type SkippedEntry, type SkipSink } from "./wire.js";

/**
 * List items per part the thread hands over: deserializing a catalogue entry (a worker's ~20
 * fields) takes ~5-10 us on the main thread, so a part of 256 costs it ~1-3 ms.
 */
export const SNAPSHOT_ITEMS_PER_PART = 256;

/**
 * The mesh starts the thread this long after its own start at the latest, ms (the daemon starts
 * it earlier, once the replica's own warm join is over: ReplicaMesh.startSnapshotDecoding): a replica's own join (startup
 * sync, then the warm join's index pull: ~5 s at 1,024 x 4,096) is over by then, and the thread's
 * module loading (~1.5 s of CPU from source in bench:warm-join's profile, on the joiner's core:
 * its startup sync ended 0.5-0.7 s later with the thread started at once) does not compete with
 * it. Peers' snapshots before that are decoded on the main thread, as before.
 */
export const SNAPSHOT_DECODE_THREAD_START_MS = 30_000;

export type SnapshotDecodeRequest = { readonly t: "decode"; readonly id: number; readonly raw: Uint8Array } | { readonly t: "next"; readonly id: number } | { readonly t: "drop"; readonly id: number };

/** Items of one of the snapshot's lists (`key`: its key in the Snapshot, e.g. "catalog"). */
export interface SnapshotListPart {
  readonly t: "part";
  readonly id: number;
  readonly key: string;
  readonly items: readonly unknown[];
}

export type SnapshotDecodeReply =
  | { readonly t: "ready" }
  /** The reply, a snapshot's lists empty and `parts` parts of them to come. */
  | { readonly t: "reply"; readonly id: number; readonly reply: ControlReply; readonly parts: number; readonly counts: EntrySkipCounts; readonly skipped: readonly SkippedEntry[] }
  | { readonly t: "failed"; readonly id: number; readonly error: string; readonly field: string }
  | SnapshotListPart;

/** Where the thread's skipped entries go (EntrySkips: counted, and the first few logged). */
export interface SnapshotDecodeSkips {
  readonly counts: EntrySkipCounts;
  log(s: SkippedEntry, from: string): void;
}

interface Waiting {
  readonly endpoint: string;
  readonly resolve: (r: ControlReply) => void;
  readonly reject: (e: Error) => void;
  reply?: ControlReply;
  partsLeft: number;
}

export interface SnapshotDecoderStats {
  /** Replies decoded on the thread. */
  threaded: number;
  /** Replies decoded on the main thread, the thread not loaded yet (or gone). */
  inline: number;
}

export class SnapshotDecoder {
  readonly stats: SnapshotDecoderStats = { threaded: 0, inline: 0 };
  readonly #skips: SnapshotDecodeSkips;
  readonly #sink: SkipSink;
  #worker: Worker | null = null;
  #ready = false;
  #closed = false;
  #nextId = 1;
  readonly #waiting = new Map<number, Waiting>();

  /** `sink`: the main thread's own decoder's (an inline decode). */
  constructor(skips: SnapshotDecodeSkips, sink: SkipSink) {
    this.#skips = skips;
    this.#sink = sink;
  }

  /** Starts the thread (its module loading runs meanwhile); decodes go there once it has loaded. */
  start(): void {
    if (this.#closed || this.#worker !== null) return;
    const w = startWorkerThread(siblingFile(import.meta.url, "snapshot-decode-thread"), undefined);
    w.unref();
    w.on("message", (m: SnapshotDecodeReply) => {
      this.#onMessage(m);
    });
    w.on("error", (err) => {
      this.#gone(err);
    });
    w.on("exit", (code) => {
      this.#gone(new Error(`snapshot decoding thread exited (${code})`));
    });
    this.#worker = w;
  }

  /** Whether decodes go to the thread now. */
  get ready(): boolean {
    return this.#ready;
  }

  /** A raw control reply from `endpoint`: on the thread once it is up, else here. */
  decode(endpoint: string, raw: Buffer): Promise<ControlReply> {
    const w = this.#worker;
    if (!this.#ready || w === null) {
      this.stats.inline++;
      return Promise.resolve(decodeControlReply(raw, this.#sink));
    }
    this.stats.threaded++;
    const id = this.#nextId++;
    // A copy the thread owns (the reply may be a view into a pooled buffer), transferred, not copied again.
    const copy = new Uint8Array(raw.length);
    copy.set(raw);
    return new Promise((resolve, reject) => {
      this.#waiting.set(id, { endpoint, resolve, reject, partsLeft: 0 });
      w.postMessage({ t: "decode", id, raw: copy } satisfies SnapshotDecodeRequest, [copy.buffer]);
    });
  }

  async close(): Promise<void> {
    this.#closed = true;
    const w = this.#worker;
    this.#worker = null;
    this.#ready = false;
    this.#fail(new Error("the mesh closed"));
    if (w !== null) await w.terminate();
  }

  #onMessage(m: SnapshotDecodeReply): void {
    if (m.t === "ready") {
      this.#ready = !this.#closed;
      return;
    }
    const p = this.#waiting.get(m.id);
    if (p === undefined) {
      if (m.t === "reply" && m.parts > 0) this.#worker?.postMessage({ t: "drop", id: m.id } satisfies SnapshotDecodeRequest);
      return;
    }
    if (m.t === "failed") {
      this.#waiting.delete(m.id);
      const problem = m.error.startsWith(`${m.field}: `) ? m.error.slice(m.field.length + 2) : m.error;
      p.reject(new MeshWireError(m.field, problem));
      return;
    }
    if (m.t === "reply") {
      for (const r of Object.keys(m.counts) as (keyof EntrySkipCounts)[]) this.#skips.counts[r] += m.counts[r];
      for (const s of m.skipped) this.#skips.log(s, `snapshot reply of ${p.endpoint}`);
      p.reply = m.reply;
      p.partsLeft = m.parts;
    } else {
      const reply = p.reply;
      if (reply?.type !== "snapshot") return;
      const list = (reply.snapshot as unknown as Record<string, unknown[]>)[m.key];
      if (list !== undefined) for (const item of m.items) list.push(item);
      p.partsLeft--;
    }
    if (p.partsLeft > 0) {
      this.#worker?.postMessage({ t: "next", id: m.id } satisfies SnapshotDecodeRequest);
      return;
    }
    this.#waiting.delete(m.id);
    if (p.reply !== undefined) p.resolve(p.reply);
  }

  #gone(err: Error): void {
    this.#worker = null;
    this.#ready = false;
    this.#fail(err);
  }

  #fail(err: Error): void {
    for (const p of this.#waiting.values()) p.reject(err);
    this.#waiting.clear();
  }
}
