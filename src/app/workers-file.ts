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
 */
import { createHash } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import type { Logger } from "pino";
import { isMap, isSeq, LineCounter, parseDocument, type Node } from "yaml";

import { KvmeshError } from "../core/index.js";
import type { WorkerCatalogRecord, WorkerId, WorkerRequest } from "../core/index.js";
import { parseWorkerRequest } from "../http/schemas.js";

/** How often the file's stat is polled for a change, ms (a ConfigMap update takes ~1 min to land anyway). */
export const WORKERS_FILE_POLL_MS = 2_000;
/** Larger files are refused: a catalogue of 100,000 workers is ~30 MB of YAML. */
export const MAX_WORKERS_FILE_BYTES = 64 * 1024 * 1024;

/** A refused file: where and why, in one message fit for a log line or a start-up error. */
export class WorkersFileError extends Error {
  readonly file: string;
  readonly line: number | null;
  readonly field: string | null;

  constructor(file: string, line: number | null, field: string | null, reason: string) {
    super(`${file}${line === null ? "" : `:${line}`}: ${field === null ? "" : `${field}: `}${reason}`);
    this.name = "WorkersFileError";
    this.file = file;
    this.line = line;
    this.field = field;
  }
}

/** YAML integers come as bigints (u64 worker ids must not round); safe ones become numbers. */
function normalize(v: unknown): unknown {
  if (typeof v === "bigint") return v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v;
  if (Array.isArray(v)) return v.map(normalize);
  if (typeof v === "object" && v !== null) return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, normalize(x)]));
  return v;
}

/** The entries of a workers file's text (JSON is YAML too); throws WorkersFileError. */
export function parseWorkersFile(file: string, text: string): WorkerRequest[] {
  const lines = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lines, intAsBigInt: true, uniqueKeys: true, prettyErrors: false });
  const lineOf = (node: Node | null | undefined): number | null => {
    const range = node?.range;
    return range === undefined || range === null ? null : lines.linePos(range[0]).line;
  };
  const first = doc.errors[0];
  if (first !== undefined) throw new WorkersFileError(file, lines.linePos(first.pos[0]).line, null, `not valid JSON or YAML: ${first.message.split("\n")[0] ?? ""}`);
  const root = doc.contents;
  if (root === null) return [];
  if (!isSeq(root)) throw new WorkersFileError(file, lineOf(root), null, "expected a list of workers (the POST /workers shape)");
  const out: WorkerRequest[] = [];
  const seen = new Map<WorkerId, number>();
  root.items.forEach((item, i) => {
    const node = item as Node;
    const at = lineOf(node);
    if (!isMap(node)) throw new WorkersFileError(file, at, `[${i}]`, "expected a worker object");
    let req: WorkerRequest;
    try {
      req = parseWorkerRequest(normalize(node.toJS(doc)), "");
    } catch (err) {
      if (!(err instanceof KvmeshError)) throw err;
      const field = typeof err.details?.field === "string" ? err.details.field : null;
      const key = field?.split(/[.[]/)[0];
      const fieldNode = key === undefined || key === "" ? undefined : (node.get(key, true) as Node | undefined);
      throw new WorkersFileError(file, lineOf(fieldNode) ?? at, field === null ? `[${i}]` : `[${i}].${field}`, err.message);
    }
    const dup = seen.get(req.worker_id);
    if (dup !== undefined) throw new WorkersFileError(file, at, `[${i}].worker_id`, `worker ${req.worker_id} is also entry [${dup}]`);
    seen.set(req.worker_id, i);
    out.push(req);
  });
  return out;
}

/** What reconciling changes it makes: the core's worker calls (SelectionService satisfies it). */
export interface WorkerCatalogTarget {
  upsertWorker(req: WorkerRequest): WorkerCatalogRecord;
  deleteWorker(workerId: WorkerId): WorkerCatalogRecord;
}

export interface WorkersFileStats {
  reloads: number;
  refused: number;
  upserted: number;
  deleted: number;
}

/** A stable text of an entry: an unchanged entry is not upserted again (no KV listener churn). */
const fingerprint = (r: WorkerRequest): string => JSON.stringify(r, (_k, v: unknown) => (typeof v === "bigint" ? `${v}n` : v));

export class WorkersFile {
  readonly stats: WorkersFileStats = { reloads: 0, refused: 0, upserted: 0, deleted: 0 };
  readonly #file: string;
  readonly #target: WorkerCatalogTarget;
  readonly #log: Logger;
  /** Worker id -> fingerprint of what the file last registered. */
  readonly #applied = new Map<WorkerId, string>();
  #digest = "";
  /** The stat of what was last read (mtime, size, inode): a poll that sees another re-reads. */
  #seen = "";
  #timer: NodeJS.Timeout | undefined;

  constructor(file: string, target: WorkerCatalogTarget, logger: Logger) {
    this.#file = file;
    this.#target = target;
    this.#log = logger;
  }

  /** Reads and applies the file; throws WorkersFileError (nothing applied) when it is refused. */
  load(): void {
    const text = this.#read();
    this.#apply(parseWorkersFile(this.#file, text));
    this.#digest = createHash("sha256").update(text).digest("hex");
  }

  /** Re-reads the file; a refused one is logged and counted, and the last good catalogue stays. Returns whether it applied. */
  reload(): boolean {
    let text: string;
    try {
      text = this.#read();
    } catch (err) {
      this.stats.refused++;
      this.#log.error({ err, file: this.#file }, "workers file unreadable: keeping the last good catalogue");
      return false;
    }
    const digest = createHash("sha256").update(text).digest("hex");
    if (digest === this.#digest) return true;
    try {
      this.#apply(parseWorkersFile(this.#file, text));
    } catch (err) {
      this.stats.refused++;
      const e = err instanceof WorkersFileError ? { line: err.line, field: err.field } : {};
      this.#log.error({ ...e, file: this.#file, reason: err instanceof Error ? err.message : String(err) }, "workers file refused: keeping the last good catalogue");
      // Remembered, so the same bad content is reported once, not every poll.
      this.#digest = digest;
      return false;
    }
    this.#digest = digest;
    return true;
  }

  /**
   * Polls the path's stat every `pollMs` until close(), and re-reads when it differs from the stat
   * taken when the file was last read. (Not fs.watchFile: its baseline is taken asynchronously
   * after the call, so a write landing in between was never noticed; measured as a flaky test.)
   */
  watch(pollMs = WORKERS_FILE_POLL_MS): void {
    if (this.#timer !== undefined) return;
    this.#timer = setInterval(() => {
      if (this.#statKey() !== this.#seen) this.reload();
    }, pollMs);
    this.#timer.unref();
  }

  close(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }

  #statKey(): string {
    try {
      const st = statSync(this.#file);
      return `${st.mtimeMs}:${st.size}:${st.ino}`;
    } catch {
      return "missing";
    }
  }

  #read(): string {
    // The stat before the read: a write after it shows as a different stat at the next poll.
    this.#seen = this.#statKey();
    const size = statSync(this.#file).size;
    if (size > MAX_WORKERS_FILE_BYTES) throw new WorkersFileError(this.#file, null, null, `${size} bytes exceeds the limit of ${MAX_WORKERS_FILE_BYTES}`);
    return readFileSync(this.#file, "utf8");
  }

  /** Upserts new and changed entries, deletes the file's workers that left it. */
  #apply(entries: readonly WorkerRequest[]): void {
    this.stats.reloads++;
    const wanted = new Map(entries.map((r) => [r.worker_id, r]));
    let upserted = 0;
    let deleted = 0;
    for (const [id, r] of wanted) {
      const print = fingerprint(r);
      if (this.#applied.get(id) === print) continue;
      try {
        this.#target.upsertWorker(r);
      } catch (err) {
        // Valid in shape but refused by the catalogue (e.g. a block size its partition does not
        // use): that entry only, as POST /workers would refuse it; retried when the file changes.
        if (!(err instanceof KvmeshError)) throw err;
        this.stats.refused++;
        this.#log.error({ file: this.#file, worker_id: id.toString(), code: err.code, reason: err.message }, "workers file entry refused");
        continue;
      }
      this.#applied.set(id, print);
      upserted++;
    }
    for (const id of [...this.#applied.keys()]) {
      if (wanted.has(id)) continue;
      this.#applied.delete(id);
      try {
        this.#target.deleteWorker(id);
        deleted++;
      } catch (err) {
        // Deleted over HTTP meanwhile: nothing left to remove.
        if (!(err instanceof KvmeshError && err.status === 404)) throw err;
      }
    }
    this.stats.upserted += upserted;
    this.stats.deleted += deleted;
    this.#log.info({ file: this.#file, workers: wanted.size, upserted, deleted }, "workers file applied");
  }
}
