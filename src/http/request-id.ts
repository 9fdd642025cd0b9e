/**
 * Request ids and the access log's decision fields. A caller's `x-request-id` is kept when it is
 * a plausible id (what proxies and frontends send: a UUID, a ULID, a trace-like token); anything
 * else, or none, gets a fresh UUID. Either way the id is answered in `x-request-id` and is on
 * every log line about the request, so a frontend's log can be joined with the router's.
 */
import { randomUUID } from "node:crypto";

export const REQUEST_ID_HEADER = "x-request-id";
/** Longest caller id kept, characters: longer ones are replaced (a log field must stay small). */
export const MAX_REQUEST_ID_CHARS = 128;
/** Visible ASCII only: no spaces, no control characters that could forge a log line. */
const PLAUSIBLE_ID = new RegExp(`^[\\x21-\\x7e]{1,${MAX_REQUEST_ID_CHARS}}$`);

/** The caller's id if it is plausible, else a fresh one from `make`. */
export function requestIdOf(header: string | string[] | undefined, make: () => string = randomUUID): string {
  const given = Array.isArray(header) ? header[0] : header;
  return given !== undefined && PLAUSIBLE_ID.test(given) ? given : make();
}

/** What a routing answer decided, for the access log: selection id, worker and rank, when present. */
export function decisionFields(body: unknown): Record<string, unknown> {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return {};
  const b = body as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  if (typeof b.selection_id === "string") out.selection_id = b.selection_id;
  if (typeof b.worker_id === "bigint" || typeof b.worker_id === "number") out.worker_id = String(b.worker_id);
  if (typeof b.dp_rank === "number") out.dp_rank = b.dp_rank;
  return out;
}
