/**
 * What reading a workers file costs, as one job that runs off the main thread
 * (workers-file-thread.ts): read, parse and validate the file, and diff it against what the file
 * last registered. Only the difference crosses back to the main thread, which applies it in
 * slices (workers-file.ts).
 *
 * Why: a reload parsed and applied the whole file on the main thread, 3.5 s at 16,000 workers and
 * 8-14 s at 60,000 (#29 G12): heartbeats stopped, peers marked the replica `suspect`, then `down`,
 * and dropped what they mirrored of it. Parsing here, an unchanged entry costs the main thread
 * nothing.
 *
 * Pure but for the file read: workers-file.ts runs it in-process too (its unit tests).
 */
import { createHash } from "node:crypto";
import { readFileSync, statSync } from "node:fs";

import type { WorkerId, WorkerRequest } from "../core/index.js";
import { parseWorkersFile, WorkersFileError } from "./workers-file-parse.js";

/** Larger files are refused: a catalogue of 100,000 workers is ~30 MB of YAML. */
export const MAX_WORKERS_FILE_BYTES = 64 * 1024 * 1024;

export interface WorkersFileJob {
  readonly file: string;
  /** The digest of the text last applied (or refused): the same text again is "unchanged". */
  readonly lastDigest: string;
  /** Worker id -> the print (sha-256 of the entry's canonical text) of what the file last registered. */
  readonly applied: ReadonlyMap<WorkerId, string>;
}

export interface ChangedEntry {
  readonly request: WorkerRequest;
  readonly print: string;
}

export type WorkersFileJobResult =
  | { readonly t: "unchanged"; readonly stat: string }
  | {
      readonly t: "parsed";
      readonly stat: string;
      readonly digest: string;
      /** The file's last modification, wall-clock ns (the fleet-version rule, workers-file.ts). */
      readonly mtimeNs: bigint;
      /** Entries in the file. */
      readonly total: number;
      /** New or changed since `applied`, in file order. */
      readonly changed: readonly ChangedEntry[];
      /** Registered by the file and no longer in it. */
      readonly removed: readonly WorkerId[];
    }
  | { readonly t: "refused"; readonly stat: string; readonly digest: string; readonly line: number | null; readonly field: string | null; readonly reason: string; readonly message: string }
  | { readonly t: "unreadable"; readonly stat: string; readonly message: string };

/** A stable text of an entry: an unchanged entry is not upserted again (no KV listener churn). */
const canonical = (r: WorkerRequest): string => JSON.stringify(r, (_k, v: unknown) => (typeof v === "bigint" ? `${v}n` : v));
export const printOf = (r: WorkerRequest): string => createHash("sha256").update(canonical(r)).digest("base64");

/** mtime, size and inode: a poll that sees another stat re-reads ("missing" when there is no file). */
export function statKeyOf(file: string): string {
  try {
    const st = statSync(file);
    return `${st.mtimeMs}:${st.size}:${st.ino}`;
  } catch {
    return "missing";
  }
}

export function runWorkersFileJob(job: WorkersFileJob): WorkersFileJobResult {
  // The stat before the read: a write after it shows as a different stat at the next poll.
  const stat = statKeyOf(job.file);
  let text: string;
  let mtimeNs: bigint;
  try {
    const st = statSync(job.file, { bigint: true });
    if (st.size > BigInt(MAX_WORKERS_FILE_BYTES)) throw new WorkersFileError(job.file, null, null, `${st.size} bytes exceeds the limit of ${MAX_WORKERS_FILE_BYTES}`);
    mtimeNs = st.mtimeNs;
    text = readFileSync(job.file, "utf8");
  } catch (err) {
    return { t: "unreadable", stat, message: err instanceof Error ? err.message : String(err) };
  }
  const digest = createHash("sha256").update(text).digest("hex");
  if (digest === job.lastDigest) return { t: "unchanged", stat };
  let entries: WorkerRequest[];
  try {
    entries = parseWorkersFile(job.file, text);
  } catch (err) {
    if (!(err instanceof WorkersFileError)) throw err;
    return { t: "refused", stat, digest, line: err.line, field: err.field, reason: err.reason, message: err.message };
  }
  const changed: ChangedEntry[] = [];
  const inFile = new Set<WorkerId>();
  for (const request of entries) {
    inFile.add(request.worker_id);
    const print = printOf(request);
    if (job.applied.get(request.worker_id) !== print) changed.push({ request, print });
  }
  const removed: WorkerId[] = [];
  for (const id of job.applied.keys()) if (!inFile.has(id)) removed.push(id);
  return { t: "parsed", stat, digest, mtimeNs, total: entries.length, changed, removed };
}
