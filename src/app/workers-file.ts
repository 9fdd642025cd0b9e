/**
 * `--workers-file PATH`: the worker catalogue declared in a file (a Kubernetes ConfigMap mounted
 * into every replica), kept in step with it.
 *
 * The file is a JSON or YAML list of entries in the `POST /workers` shape (the same validator).
 * On every change it is re-read and reconciled through the same calls as the HTTP API: entries
 * that are new or changed are upserted, entries that left the file are deleted. Only workers the
 * file registered are ever deleted; those registered over HTTP are left alone.
 *
 * A bad file (unparsable, not a list, a field the API would refuse, a worker id twice) is refused
 * whole, with the line and the field named, and the last good catalogue stays; at start-up there
 * is none, so the daemon does not start. Changes are noticed by polling the path's stat (which
 * follows the symlink a ConfigMap update swaps: an inotify watch on the old file would go quiet).
 *
 * Off the main thread (#29 G12): the file is read, parsed, validated and diffed against what it
 * last registered on a thread (workers-file-job.ts); the main thread applies only the difference,
 * in slices of at most APPLY_SLICE_MS that yield to the event loop in between. A reload of 16,000
 * workers used to stall the main thread 3.5 s (8-14 s at 60,000), long enough for peers to mark the
 * replica down and drop what they mirrored of it.
 *
 * The fleet's runtime changes stand (#29 G5): in a mesh the file is first applied after the
 * startup sync, and an entry the fleet changed after the file's last modification (a drain, a
 * patch, a delete, by its catalogue version: Lamport sequences are wall-clock ns) keeps the
 * fleet's version. Before, restarting one replica re-registered every entry as the file had it:
 * a drained worker came back schedulable and a deleted one came back, on every replica.
 */
import type { Logger } from "pino";

import { KvmeshError, systemClock, type CatalogVersion, type Clock } from "../core/index.js";
import type { WorkerCatalogRecord, WorkerId, WorkerRequest } from "../core/index.js";
import { siblingFile, startWorkerThread } from "../util/worker-thread.js";
import { runWorkersFileJob, statKeyOf, type ChangedEntry, type WorkersFileJob, type WorkersFileJobResult } from "./workers-file-job.js";
import { WorkersFileError } from "./workers-file-parse.js";

export { MAX_WORKERS_FILE_BYTES } from "./workers-file-job.js";
export { parseWorkersFile, WorkersFileError } from "./workers-file-parse.js";

/** How often the file's stat is polled for a change, ms (a ConfigMap update takes ~1 min to land anyway). */
export const WORKERS_FILE_POLL_MS = 2_000;
/**
 * Longest the main thread applies entries before it yields, ms: an upsert costs ~50-200 us (its
 * catalogue event, partition and KV listeners), so a slice is tens of entries, and a request or a
 * heartbeat waits at most this long behind a reload.
 */
export const APPLY_SLICE_MS = 5;
/** How often the start waits to see whether the mesh's startup sync is over, ms. */
export const STARTUP_SYNC_POLL_MS = 100;

/** What reconciling changes it makes: the core's worker calls (SelectionService satisfies it). */
export interface WorkerCatalogTarget {
  upsertWorker(req: WorkerRequest): WorkerCatalogRecord;
  deleteWorker(workerId: WorkerId): WorkerCatalogRecord;
  /** The fleet's version of a worker (a mesh's catalogue): entries it changed after the file keep it. */
  catalogVersionOf?(workerId: WorkerId): CatalogVersion | undefined;
}

export interface WorkersFileStats {
  reloads: number;
  refused: number;
  upserted: number;
  deleted: number;
  /** Entries left as the fleet changed them after the file's last modification (G5). */
  keptFleetVersion: number;
}

/** Runs a job: on a thread in production (parseOnThread), in-process in unit tests. */
export type WorkersFileParser = (job: WorkersFileJob) => Promise<WorkersFileJobResult>;

const THREAD_FILE = siblingFile(import.meta.url, "workers-file-thread");

/** One thread per read: a read is rare (a ConfigMap edit), and a thread left idle would hold its heap. */
export const parseOnThread: WorkersFileParser = (job) =>
  new Promise((resolve, reject) => {
    const w = startWorkerThread(THREAD_FILE, job);
    let settled = false;
    w.once("message", (m: { ok: true; result: WorkersFileJobResult } | { ok: false; message: string }) => {
      settled = true;
      if (m.ok) resolve(m.result);
      else reject(new Error(`workers file parser: ${m.message}`));
      void w.terminate();
    });
    w.once("error", (err) => {
      settled = true;
      reject(err);
    });
    w.once("exit", (code) => {
      if (!settled) reject(new Error(`workers file parser thread exited with code ${code}`));
    });
  });

export const parseInProcess: WorkersFileParser = (job) => Promise.resolve(runWorkersFileJob(job));

export interface WorkersFileOptions {
  readonly parse?: WorkersFileParser;
  /** Monotonic ms: the apply's slices. */
  readonly clock?: Clock;
  /** Yields to the event loop between slices (setImmediate). */
  readonly yieldNow?: () => Promise<void>;
}

const yieldToLoop = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

export class WorkersFile {
  readonly stats: WorkersFileStats = { reloads: 0, refused: 0, upserted: 0, deleted: 0, keptFleetVersion: 0 };
  readonly #file: string;
  readonly #target: WorkerCatalogTarget;
  readonly #log: Logger;
  readonly #parse: WorkersFileParser;
  readonly #clock: Clock;
  readonly #yield: () => Promise<void>;
  /** Worker id -> print of what the file last registered (or found the fleet holding, G5). */
  readonly #applied = new Map<WorkerId, string>();
  #digest = "";
  /** The stat of what was last read (mtime, size, inode): a poll that sees another re-reads. */
  #seen = "";
  #timer: NodeJS.Timeout | undefined;
  /** The read (and apply) in progress; a change seen meanwhile is read after it. */
  #running: Promise<boolean> | undefined;
  #again = false;
  #closed = false;

  constructor(file: string, target: WorkerCatalogTarget, logger: Logger, o: WorkersFileOptions = {}) {
    this.#file = file;
    this.#target = target;
    this.#log = logger;
    this.#parse = o.parse ?? parseOnThread;
    this.#clock = o.clock ?? systemClock;
    this.#yield = o.yieldNow ?? yieldToLoop;
  }

  /**
   * Reads the file for the start; throws WorkersFileError (nothing applied) when it is refused or
   * unreadable. Apply what it returns with start().
   */
  async prepare(): Promise<Extract<WorkersFileJobResult, { t: "parsed" }>> {
    const r = await this.#parse({ file: this.#file, lastDigest: "", applied: this.#applied });
    this.#seen = r.stat;
    if (r.t === "refused") throw new WorkersFileError(this.#file, r.line, r.field, r.reason);
    if (r.t === "unreadable") throw new WorkersFileError(this.#file, null, null, r.message);
    // Assertion: lastDigest "" matches no text's digest.
    if (r.t !== "parsed") throw new Error("workers file: a first read cannot be unchanged");
    return r;
  }

  /**
   * Applies what prepare() read (in a mesh, once `synced()` holds: the fleet's catalogue is in and
   * entries the fleet changed after the file keep the fleet's version), then watches the file.
   */
  async start(first: Extract<WorkersFileJobResult, { t: "parsed" }>, synced?: () => boolean, pollMs = WORKERS_FILE_POLL_MS): Promise<void> {
    while (synced !== undefined && !synced() && !this.#closed) await new Promise((resolve) => setTimeout(resolve, STARTUP_SYNC_POLL_MS).unref());
    if (this.#closed) return;
    await this.#apply(first, synced !== undefined);
    this.#digest = first.digest;
    this.watch(pollMs);
  }

  /** Reads and applies the file (tests and tools: prepare + start without a mesh, no watch). */
  async load(): Promise<void> {
    const first = await this.prepare();
    await this.#apply(first, false);
    this.#digest = first.digest;
  }

  /**
   * Re-reads the file; a refused one is logged and counted, and the last good catalogue stays.
   * Resolves to whether the file (or its unchanged text) now stands applied.
   */
  reload(): Promise<boolean> {
    if (this.#running !== undefined) {
      this.#again = true;
      return this.#running;
    }
    this.#running = this.#reload().finally(() => {
      this.#running = undefined;
      if (this.#again && !this.#closed) {
        this.#again = false;
        void this.reload();
      }
    });
    return this.#running;
  }

  async #reload(): Promise<boolean> {
    let r: WorkersFileJobResult;
    try {
      r = await this.#parse({ file: this.#file, lastDigest: this.#digest, applied: this.#applied });
    } catch (err) {
      this.stats.refused++;
      this.#log.error({ err, file: this.#file }, "workers file could not be read: keeping the last good catalogue");
      return false;
    }
    this.#seen = r.stat;
    switch (r.t) {
      case "unchanged":
        return true;
      case "unreadable":
        this.stats.refused++;
        this.#log.error({ file: this.#file, reason: r.message }, "workers file unreadable: keeping the last good catalogue");
        return false;
      case "refused":
        this.stats.refused++;
        this.#log.error({ line: r.line, field: r.field, file: this.#file, reason: r.message }, "workers file refused: keeping the last good catalogue");
        // Remembered, so the same bad content is reported once, not every poll.
        this.#digest = r.digest;
        return false;
      case "parsed":
        await this.#apply(r, false);
        this.#digest = r.digest;
        return true;
    }
  }

  /**
   * Polls the path's stat every `pollMs` until close(), and re-reads when it differs from the stat
   * taken when the file was last read. (Not fs.watchFile: its baseline is taken asynchronously
   * after the call, so a write landing in between was never noticed; measured as a flaky test.)
   */
  watch(pollMs = WORKERS_FILE_POLL_MS): void {
    if (this.#timer !== undefined || this.#closed) return;
    this.#timer = setInterval(() => {
      if (statKeyOf(this.#file) !== this.#seen) void this.reload();
    }, pollMs);
    this.#timer.unref();
  }

  close(): void {
    this.#closed = true;
    clearInterval(this.#timer);
    this.#timer = undefined;
  }

  /**
   * Upserts new and changed entries and deletes the file's workers that left it, a slice at a time.
   * `fleetRule` (the start in a mesh): an entry whose catalogue version is newer than the file's
   * modification keeps the fleet's version (it is remembered as applied, so the file takes it
   * over again when that entry changes in the file, or deletes it when it leaves the file).
   */
  async #apply(r: Extract<WorkersFileJobResult, { t: "parsed" }>, fleetRule: boolean): Promise<void> {
    this.stats.reloads++;
    let upserted = 0;
    let deleted = 0;
    let kept = 0;
    let sliceStart = this.#clock.now();
    const slice = async (): Promise<void> => {
      if (this.#clock.now() - sliceStart < APPLY_SLICE_MS) return;
      await this.#yield();
      sliceStart = this.#clock.now();
    };
    for (const c of r.changed) {
      if (this.#closed) return;
      if (fleetRule && this.#fleetChangedSince(c, r.mtimeNs)) {
        this.#applied.set(c.request.worker_id, c.print);
        kept++;
      } else if (this.#upsert(c)) {
        upserted++;
      }
      await slice();
    }
    for (const id of r.removed) {
      if (this.#closed) return;
      this.#applied.delete(id);
      try {
        this.#target.deleteWorker(id);
        deleted++;
      } catch (err) {
        // Deleted over HTTP meanwhile: nothing left to remove.
        if (!(err instanceof KvmeshError && err.status === 404)) throw err;
      }
      await slice();
    }
    this.stats.upserted += upserted;
    this.stats.deleted += deleted;
    this.stats.keptFleetVersion += kept;
    this.#log.info({ file: this.#file, workers: r.total, upserted, deleted, kept_fleet_version: kept }, "workers file applied");
  }

  /** Whether the fleet's catalogue changed this worker (or deleted it) after the file was last modified. */
  #fleetChangedSince(c: ChangedEntry, mtimeNs: bigint): boolean {
    const v = this.#target.catalogVersionOf?.(c.request.worker_id);
    if (v === undefined || v.sequence <= mtimeNs) return false;
    this.#log.info({ file: this.#file, worker_id: c.request.worker_id.toString(), deleted: v.deleted }, "workers file entry left as the fleet changed it after the file's last modification");
    return true;
  }

  #upsert(c: ChangedEntry): boolean {
    const id = c.request.worker_id;
    try {
      this.#target.upsertWorker(c.request);
    } catch (err) {
      // Valid in shape but refused by the catalogue (e.g. a block size its partition does not
      // use): that entry only, as POST /workers would refuse it; retried when the file changes.
      if (!(err instanceof KvmeshError)) throw err;
      this.stats.refused++;
      this.#log.error({ file: this.#file, worker_id: id.toString(), code: err.code, reason: err.message }, "workers file entry refused");
      return false;
    }
    this.#applied.set(id, c.print);
    return true;
  }
}
