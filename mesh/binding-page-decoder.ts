/**
 * Decodes a paged snapshot's binding pages on a worker thread (binding-page-thread.ts): the main
 * thread gets each page as plain binding events to apply in slices (inbound.ts). One thread for
 * the mesh's life, started on the first page and not holding the process open.
 */
import type { Worker } from "node:worker_threads";

import type { BindingEvent } from "../src/core/index.js";
import { siblingFile, startWorkerThread } from "../src/util/worker-thread.js";
import type { EntrySkipCounts } from "./entry-skips.js";
import { MeshRemoteError, MeshWireError } from "./errors.js";
import type { SkippedEntry } from "./wire.js";

export interface PageRequest {
  readonly id: number;
  readonly raw: Uint8Array;
}

/** A part of a page's bindings, ahead of the page's reply (which carries the last part). */
export interface PagePart {
  readonly id: number;
  readonly part: readonly BindingEvent[];
}

export type PageReply = {
  readonly id: number;
  /** Entries the thread's decoder left out, by reason, and the first few of them (to log). */
  readonly counts: EntrySkipCounts;
  readonly skipped: readonly SkippedEntry[];
} & ({ readonly bindings: readonly BindingEvent[]; readonly more: boolean } | { readonly remote: string } | { readonly error: string });

export interface DecodedPage {
  readonly bindings: readonly BindingEvent[];
  readonly more: boolean;
  readonly counts: EntrySkipCounts;
  readonly skipped: readonly SkippedEntry[];
}

export class BindingPageDecoder {
  #worker: Worker | null = null;
  #nextId = 1;
  readonly #waiting = new Map<number, { endpoint: string; parts: (readonly BindingEvent[])[]; resolve: (r: DecodedPage) => void; reject: (e: Error) => void }>();

  /** Decodes a raw reply of `endpoint` to a bindings request; rejects on an error reply or a malformed one. */
  decode(endpoint: string, raw: Buffer): Promise<DecodedPage> {
    const w = this.#start();
    const id = this.#nextId++;
    // A copy the thread owns (the reply may be a view into a pooled buffer), transferred, not copied again.
    const copy = new Uint8Array(raw.length);
    copy.set(raw);
    return new Promise((resolve, reject) => {
      this.#waiting.set(id, { endpoint, parts: [], resolve, reject });
      w.postMessage({ id, raw: copy } satisfies PageRequest, [copy.buffer]);
    });
  }

  async close(): Promise<void> {
    const w = this.#worker;
    this.#worker = null;
    this.#fail(new Error("the mesh closed"));
    if (w !== null) await w.terminate();
  }

  #fail(err: Error): void {
    for (const p of this.#waiting.values()) p.reject(err);
    this.#waiting.clear();
  }

  #start(): Worker {
    if (this.#worker !== null) return this.#worker;
    const w = startWorkerThread(siblingFile(import.meta.url, "binding-page-thread"), undefined);
    w.unref();
    w.on("message", (m: PageReply | PagePart) => {
      const p = this.#waiting.get(m.id);
      if (p === undefined) return;
      if ("part" in m) {
        p.parts.push(m.part);
        return;
      }
      this.#waiting.delete(m.id);
      if ("bindings" in m) p.resolve({ bindings: p.parts.length === 0 ? m.bindings : [...p.parts, m.bindings].flat(), more: m.more, counts: m.counts, skipped: m.skipped });
      else if ("remote" in m) p.reject(new MeshRemoteError(p.endpoint, m.remote));
      else p.reject(new MeshWireError("bindings", m.error));
    });
    w.on("error", (err) => {
      this.#worker = null;
      this.#fail(err);
    });
    w.on("exit", (code) => {
      this.#worker = null;
      if (this.#waiting.size > 0) this.#fail(new Error(`binding page decoding thread exited (${code})`));
    });
    this.#worker = w;
    return w;
  }
}
