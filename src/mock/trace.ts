/**
 * Mooncake-format request traces (kvcache-ai/Mooncake FAST'25 release): one JSON object a line,
 *   {"timestamp": ms from start, "input_length": tokens, "output_length": tokens,
 *    "hash_ids": [prefix-block ids, one per 512 tokens]}
 * plus an optional "session_id" written by our session generator. Unknown fields are ignored so
 * other producers' extras (e.g. a conversation id) do not break a replay.
 *
 * A malformed line throws KVMESH_TRACE_INVALID naming the 1-based line number and the field: a
 * silently skipped line would change the workload and every figure measured with it.
 */
import { createReadStream, createWriteStream } from "node:fs";
import { once } from "node:events";
import { createInterface } from "node:readline";

import { KvmeshError } from "../core/index.js";

export interface TraceRecord {
  /** Arrival, ms from the start of the trace. */
  timestamp: number;
  input_length: number;
  output_length: number;
  /** One id per TRACE_BLOCK_TOKENS prompt tokens; equal ids at the same position mean a shared prefix. */
  hash_ids: number[];
  session_id?: string;
}

export interface ReadTraceOptions {
  /** Stop after this many records. */
  limit?: number;
}

function invalid(lineNo: number, field: string, problem: string): KvmeshError {
  return new KvmeshError("KVMESH_TRACE_INVALID", `trace line ${lineNo}: ${field}: ${problem}`, { details: { line: lineNo, field } });
}

function describe(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  if (typeof v === "string") return `the string ${JSON.stringify(v.length > 20 ? `${v.slice(0, 20)}...` : v)}`;
  if (typeof v === "object") return "an object";
  // JSON text of what is left (number, boolean); undefined cannot come out of JSON.parse.
  const text: string | undefined = JSON.stringify(v);
  return `${typeof v} ${text ?? ""}`;
}

function integerField(obj: Record<string, unknown>, field: string, min: number, lineNo: number): number {
  if (!(field in obj)) throw invalid(lineNo, field, "missing");
  const v = obj[field];
  if (typeof v !== "number" || !Number.isSafeInteger(v)) throw invalid(lineNo, field, `expected an integer, got ${describe(v)}`);
  if (v < min) throw invalid(lineNo, field, min === 0 ? `must not be negative, got ${v}` : `must be >= ${min}, got ${v}`);
  return v;
}

/** Parses one trace line (1-based `lineNo` for messages). Blank lines are the caller's to skip. */
export function parseTraceLine(line: string, lineNo: number): TraceRecord {
  let raw: unknown;
  try {
    raw = JSON.parse(line);
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    throw invalid(lineNo, "line", `not valid JSON (${reason})`);
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw invalid(lineNo, "line", `expected a JSON object, got ${describe(raw)}`);
  const obj = raw as Record<string, unknown>;

  if (!("timestamp" in obj)) throw invalid(lineNo, "timestamp", "missing");
  const timestamp = obj["timestamp"];
  if (typeof timestamp !== "number" || !Number.isFinite(timestamp)) throw invalid(lineNo, "timestamp", `expected a number, got ${describe(timestamp)}`);
  if (timestamp < 0) throw invalid(lineNo, "timestamp", `must not be negative, got ${timestamp}`);
  const inputLength = integerField(obj, "input_length", 1, lineNo);
  const outputLength = integerField(obj, "output_length", 0, lineNo);

  if (!("hash_ids" in obj)) throw invalid(lineNo, "hash_ids", "missing");
  const ids = obj["hash_ids"];
  if (!Array.isArray(ids)) throw invalid(lineNo, "hash_ids", `expected an array of integers, got ${describe(ids)}`);
  const hashIds = new Array<number>(ids.length);
  for (let i = 0; i < ids.length; i++) {
    const id: unknown = ids[i];
    if (typeof id !== "number" || !Number.isSafeInteger(id) || id < 0) throw invalid(lineNo, `hash_ids[${i}]`, `expected a non-negative integer, got ${describe(id)}`);
    hashIds[i] = id;
  }

  const record: TraceRecord = { timestamp, input_length: inputLength, output_length: outputLength, hash_ids: hashIds };
  const session = obj["session_id"];
  if (session !== undefined && session !== null) {
    if (typeof session !== "string" || session.length === 0) throw invalid(lineNo, "session_id", `expected a non-empty string, got ${describe(session)}`);
    record.session_id = session;
  }
  return record;
}

/** Reads a JSONL trace line by line (the file is never held whole); blank lines are skipped. */
export async function readTrace(path: string, opts: ReadTraceOptions = {}): Promise<TraceRecord[]> {
  const limit = opts.limit ?? Number.POSITIVE_INFINITY;
  if (limit !== Number.POSITIVE_INFINITY && (!Number.isInteger(limit) || limit < 0)) throw new RangeError(`limit must be a non-negative integer, got ${limit}`);
  const out: TraceRecord[] = [];
  if (limit === 0) return out;
  const stream = createReadStream(path, { encoding: "utf8" });
  const lines = createInterface({ input: stream, crlfDelay: Number.POSITIVE_INFINITY });
  let lineNo = 0;
  try {
    for await (const line of lines) {
      lineNo++;
      if (line.trim() === "") continue;
      out.push(parseTraceLine(line, lineNo));
      if (out.length >= limit) break;
    }
  } finally {
    lines.close();
    stream.destroy();
  }
  return out;
}

/** One trace line, fields in Mooncake's order (plus session_id when set); no trailing newline. */
export function formatTraceLine(r: TraceRecord): string {
  const base = `{"timestamp": ${r.timestamp}, "input_length": ${r.input_length}, "output_length": ${r.output_length}, "hash_ids": [${r.hash_ids.join(", ")}]`;
  return r.session_id === undefined ? `${base}}` : `${base}, "session_id": ${JSON.stringify(r.session_id)}}`;
}

/** Writes records as JSONL in the format readTrace reads, streaming (a long trace is never one string). */
export async function writeTrace(path: string, records: readonly TraceRecord[]): Promise<void> {
  const out = createWriteStream(path, { encoding: "utf8" });
  const failed = once(out, "error").then(([err]: unknown[]) => Promise.reject(err instanceof Error ? err : new Error(String(err))));
  // Keep the rejection observed even when no write ever waits on it.
  failed.catch(() => undefined);
  try {
    for (const r of records) {
      if (!out.write(`${formatTraceLine(r)}\n`)) await Promise.race([once(out, "drain"), failed]);
    }
    out.end();
    await Promise.race([once(out, "finish"), failed]);
  } finally {
    if (!out.writableFinished) out.destroy();
  }
}
