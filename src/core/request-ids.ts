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

/** RFC 4122 v4 layout from the injected random source (deterministic under a seeded Random). */
export function randomUuid(random: Random): string {
  const b = new Uint8Array(16);
  for (let i = 0; i < 16; i++) b[i] = Math.floor(random.next() * 256);
  b[6] = ((b[6] as number) & 0x0f) | 0x40;
  b[8] = ((b[8] as number) & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}
