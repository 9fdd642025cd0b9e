/**
 * Bearer-token authentication of the HTTP API (`--api-token-file`, RFC 6750).
 *
 * Policy (which routes need the token) is by method, so a route added later is covered without
 * anyone remembering to mark it:
 * - every POST, PATCH and DELETE needs it. That includes the data plane (select,
 *   select_and_reserve, reservations, prefill_complete, output_block, free), not only the admin
 *   routes: a booking is replicated to every replica, so a client that can book or free load can
 *   skew routing for the whole fleet (book phantom load on every worker, free other frontends'
 *   reservations); /select with a selection_id writes the selection cache that POST
 *   /reservations books from (a flood evicts honest entries); and /select, /potential_loads and
 *   /overlap_scores hash whole prompts (up to the 8 MiB body limit of CPU per call). Frontends
 *   are services that can hold a token; checking it costs one SHA-256 of the presented token
 *   and a 32-byte constant-time compare, small against a selection's cost (`npm run bench:http`
 *   with --api-token-file).
 * - GET and HEAD stay open: probes (/health, /ready), scrapers (/metrics) and dashboards
 *   (/loads, /workers, /replica_sync/peers and /status, /dump) read state and change nothing, and the daemon
 *   binds loopback unless told otherwise. The exception is the host-replication feed GET
 *   /session_bindings/updates: it streams every session id and binding (the read half of a
 *   replication channel whose write half, POST /session_bindings, needs the token) and holds a
 *   connection open, so it needs the token too. So does the status page's data, GET /ui/state:
 *   the page (GET /ui and its script and style, which hold no data) stays open so that a browser,
 *   which cannot send a bearer token on navigation, can load it and ask for the token.
 *
 * The presented token is hashed and compared with timingSafeEqual: hashing first makes both
 * sides 32 bytes whatever the token's length, so neither the content nor the length of the
 * expected token leaks through timing. The token itself never appears in logs or errors: the
 * ApiToken object keeps only its digest, in a #private field, and serialises as "[redacted]".
 */
import { hash, timingSafeEqual } from "node:crypto";
import { inspect } from "node:util";

import { badRequest, KvmeshError } from "../core/index.js";
import { contentLines, fileError, readSecretFile } from "../util/secret-file.js";

/** RFC 6750 `WWW-Authenticate` realm. */
export const API_TOKEN_REALM = "kvmesh";
/** Shortest token accepted from --api-token-file: 16 characters of base64 are 96 bits. */
export const MIN_API_TOKEN_CHARS = 16;
/** Longest token: header-size territory beyond this (node's default header limit is 16 KiB). */
export const MAX_API_TOKEN_CHARS = 4_096;
/** RFC 6750 b64token (token68): the characters a bearer token may use. */
const TOKEN68 = /^[A-Za-z0-9\-._~+/]+=*$/;
/** GET routes that need the token despite the read-only default (see the module comment). */
export const PROTECTED_READ_ROUTES: ReadonlySet<string> = new Set(["/session_bindings/updates", "/ui/state"]);

/** Why a request was refused (the metric label and the KvmeshError detail). */
export type AuthFailure = "missing" | "malformed" | "invalid";
export const AUTH_FAILURES: readonly AuthFailure[] = ["missing", "malformed", "invalid"];

/** One-shot SHA-256 (crypto.hash: ~40% cheaper than createHash().update().digest(), measured). */
const digest = (s: string): Buffer => hash("sha256", s, "buffer");

/** The expected API token, held as its SHA-256 digest only. */
export class ApiToken {
  readonly #digest: Buffer;

  private constructor(token: string) {
    this.#digest = digest(token);
  }

  /** Validates and wraps a token; RangeError says what is wrong (never echoing the token). */
  static fromString(token: string): ApiToken {
    if (token.length < MIN_API_TOKEN_CHARS) throw badRequest(`token is shorter than ${MIN_API_TOKEN_CHARS} characters`, "token");
    if (token.length > MAX_API_TOKEN_CHARS) throw badRequest(`token is longer than ${MAX_API_TOKEN_CHARS} characters`, "token");
    if (!TOKEN68.test(token)) throw badRequest("token must be one line of letters, digits and - . _ ~ + / (optionally ending in =), e.g. from: openssl rand -base64 32", "token");
    return new ApiToken(token);
  }

  /** Constant-time comparison with a presented token. */
  matches(presented: string): boolean {
    return timingSafeEqual(digest(presented), this.#digest);
  }

  toJSON(): string {
    return "[redacted]";
  }

  [inspect.custom](): string {
    return "ApiToken [redacted]";
  }
}

/** Reads `--api-token-file` (permission rules of src/util/secret-file.ts); `field` names the flag in errors. */
export function loadApiTokenFile(file: string, field = "--api-token-file"): { token: ApiToken; warnings: readonly string[] } {
  const { text, warnings } = readSecretFile(file, field);
  const lines = contentLines(text);
  if (lines.length !== 1) throw fileError(field, file, `expected the token on one line, found ${lines.length} non-comment lines`);
  try {
    return { token: ApiToken.fromString(lines[0] as string), warnings };
  } catch (err) {
    throw fileError(field, file, (err as Error).message, err);
  }
}

/** Reads the token text of a client's `--api-token-file` (same checks as the daemon's). */
export function readApiTokenText(file: string, field = "--api-token-file"): string {
  const { text } = readSecretFile(file, field);
  const lines = contentLines(text);
  if (lines.length !== 1) throw fileError(field, file, `expected the token on one line, found ${lines.length} non-comment lines`);
  const token = lines[0] as string;
  try {
    ApiToken.fromString(token);
  } catch (err) {
    throw fileError(field, file, (err as Error).message, err);
  }
  return token;
}

/** Whether a request to `route` (the matched pattern) with `method` needs the token. */
export function requiresApiToken(method: string, route: string): boolean {
  if (method === "GET" || method === "HEAD") return PROTECTED_READ_ROUTES.has(route);
  return true;
}

const unauthorized = (reason: AuthFailure, message: string): KvmeshError => new KvmeshError("KVMESH_UNAUTHORIZED", message, { details: { reason } });

/** Throws KVMESH_UNAUTHORIZED unless `authorization` is `Bearer <token>` with the expected token. */
export function checkBearer(authorization: string | undefined, token: ApiToken): void {
  if (authorization === undefined || authorization.trim() === "") throw unauthorized("missing", "this route needs Authorization: Bearer <token> (see --api-token-file)");
  const m = /^Bearer +(\S+) *$/i.exec(authorization);
  if (m === null) throw unauthorized("malformed", "Authorization must be: Bearer <token>");
  if (!token.matches(m[1] as string)) throw unauthorized("invalid", "invalid API token");
}

/** The reason carried by a KVMESH_UNAUTHORIZED error (for metrics), or null for any other error. */
export function authFailureOf(err: unknown): AuthFailure | null {
  if (!(err instanceof KvmeshError) || err.code !== "KVMESH_UNAUTHORIZED") return null;
  const r = err.details?.["reason"];
  return r === "missing" || r === "malformed" || r === "invalid" ? r : "invalid";
}

/** RFC 6750 section 3: the challenge for a refused request (error code only when credentials were sent). */
export function wwwAuthenticateFor(reason: AuthFailure): string {
  if (reason === "missing") return `Bearer realm="${API_TOKEN_REALM}"`;
  return `Bearer realm="${API_TOKEN_REALM}", error="${reason === "malformed" ? "invalid_request" : "invalid_token"}"`;
}
