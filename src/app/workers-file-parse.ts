/**
 * Parsing a workers file's text: a JSON or YAML list of entries in the `POST /workers` shape,
 * checked by the same validator; a bad file is refused whole with the line and the field named.
 */
import { isMap, isSeq, LineCounter, parseDocument, type Node } from "yaml";

import { KvmeshError } from "../core/index.js";
import type { WorkerId, WorkerRequest } from "../core/index.js";
import { parseWorkerRequest } from "../http/schemas.js";

/** A refused file: where and why, in one message fit for a log line or a start-up error. */
export class WorkersFileError extends Error {
  readonly file: string;
  readonly line: number | null;
  readonly field: string | null;
  /** Why, without where. */
  readonly reason: string;

  constructor(file: string, line: number | null, field: string | null, reason: string) {
    super(`${file}${line === null ? "" : `:${line}`}: ${field === null ? "" : `${field}: `}${reason}`);
    this.name = "WorkersFileError";
    this.file = file;
    this.line = line;
    this.field = field;
    this.reason = reason;
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
