/**
 * Selection and session ids as requests carry them: their bounds, validation, and the generated
 * selection id of a `select_and_reserve` that names none.
 */
import type { Random } from "./random.js";
import { badRequest } from "./errors.js";

/** Longest selection or session id accepted, bytes (the reference's session id limit). */
export const MAX_ID_BYTES = 256;

export function validateId(id: unknown, field: string): asserts id is string {
  if (typeof id !== "string" || id.length === 0) throw badRequest(`${field} must be a non-empty string`, field);
  if (Buffer.byteLength(id, "utf8") > MAX_ID_BYTES) throw badRequest(`${field} is longer than ${MAX_ID_BYTES} bytes`, field);
}

/** The request's session id (`session_context` wins over the legacy `session_id`), validated. */
export function sessionIdOf(req: { session_id?: string | undefined; session_context?: { session_id: string } | undefined }): string | undefined {
  const id = req.session_context?.session_id ?? req.session_id;
  if (id === undefined) return undefined;
  validateId(id, req.session_context !== undefined ? "session_context.session_id" : "session_id");
  return id;
}

/** A byte's two hex digits, by byte. */
const HEX_BYTES: readonly string[] = Array.from({ length: 256 }, (_, b) => b.toString(16).padStart(2, "0"));

/**
 * RFC 4122 v4 layout from the injected random source (deterministic under a seeded Random). Built
 * by table rather than through a byte array, a hex string and slices (6.5 -> 1.0 us a call):
 * every endpoint-picker stream books under a generated id.
 */
export function randomUuid(random: Random): string {
  let s = "";
  for (let i = 0; i < 16; i++) {
    let b = Math.floor(random.next() * 256);
    if (i === 6) b = (b & 0x0f) | 0x40;
    else if (i === 8) b = (b & 0x3f) | 0x80;
    s += HEX_BYTES[b] as string;
    if (i === 3 || i === 5 || i === 7 || i === 9) s += "-";
  }
  return s;
}
