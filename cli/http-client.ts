/**
 * A tiny JSON client for the admin commands. Worker ids and hashes are u64 on the wire, so bodies
 * are written and read with src/http/json.ts, which keeps integers beyond 2^53 exact as bigint
 * (JSON.parse/stringify would round 18446744073709551615 to 18446744073709552000).
 */
import { Option, type Command } from "commander";
import { DEFAULT_DAEMON_CONFIG } from "../src/app/daemon.js";
import { readApiTokenText } from "../src/http/auth.js";
import { parseJson, stringifyJson } from "../src/http/json.js";
import { envNameFor, integerInRange, parseHttpUrl, parseNonEmpty } from "./parsers.js";

/** select may queue on the daemon (reference: queue re-check every 60 s); admin calls are fast. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
/** Longest error body echoed to the terminal, characters. */
const MAX_ERROR_TEXT_CHARS = 500;

export type FetchFn = (input: URL, init: RequestInit) => Promise<Response>;

// ---------------------------------------------------------------- pretty output

/**
 * Indented JSON for the terminal, with bigints as bare integers (src/http/json.ts's stringifyJson
 * does the same compactly; JSON.stringify would throw on them).
 */
export function prettyJson(value: unknown, indent = 2): string {
  return write(value, indent, "");
}

function write(value: unknown, indent: number, pad: string): string {
  switch (typeof value) {
    case "bigint":
      return value.toString();
    case "number":
      return Number.isFinite(value) ? String(value) : "null";
    case "string":
      return JSON.stringify(value);
    case "boolean":
      return value ? "true" : "false";
    case "undefined":
    case "function":
    case "symbol":
      return "null";
    case "object":
      break;
  }
  if (value === null) return "null";
  const inner = pad + " ".repeat(indent);
  if (Array.isArray(value)) {
    if (value.length === 0) return "[]";
    return `[\n${value.map((v: unknown) => inner + write(v, indent, inner)).join(",\n")}\n${pad}]`;
  }
  const entries = Object.entries(value as Record<string, unknown>).filter(([, v]) => v !== undefined);
  if (entries.length === 0) return "{}";
  return `{\n${entries.map(([k, v]) => `${inner}${JSON.stringify(k)}: ${write(v, indent, inner)}`).join(",\n")}\n${pad}}`;
}

// ---------------------------------------------------------------- requests

export interface HttpResult {
  readonly status: number;
  readonly ok: boolean;
  /** Parsed JSON body, or the raw text when the body is not JSON. */
  readonly body: unknown;
  readonly text: string;
}

/** Connection-level failure (refused, DNS, timeout): the message names the URL. */
export class ConnectionError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ConnectionError";
  }
}

export interface RequestOptions {
  readonly baseUrl: URL;
  readonly fetch: FetchFn;
  readonly timeoutMs: number;
  /** Sent as `Authorization: Bearer <token>` (from --api-token-file). */
  readonly apiToken?: string | undefined;
}

/** Joins `path` under the base URL's own path, so a daemon behind a path prefix works. */
export function resolveUrl(baseUrl: URL, path: string, query?: Readonly<Record<string, string | undefined>>): URL {
  const url = new URL(baseUrl.href);
  url.pathname = url.pathname.replace(/\/+$/, "") + path;
  for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) url.searchParams.set(k, v);
  return url;
}

export async function requestJson(opts: RequestOptions, method: string, path: string, body?: unknown, query?: Readonly<Record<string, string | undefined>>): Promise<HttpResult> {
  const url = resolveUrl(opts.baseUrl, path, query);
  const headers: Record<string, string> = { accept: "application/json" };
  if (opts.apiToken !== undefined) headers["authorization"] = `Bearer ${opts.apiToken}`;
  const init: RequestInit = { method, headers, signal: AbortSignal.timeout(opts.timeoutMs) };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = stringifyJson(body);
  }
  let res: Response;
  let text: string;
  try {
    res = await opts.fetch(url, init);
    text = await res.text();
  } catch (err) {
    throw new ConnectionError(`cannot reach kvmesh at ${opts.baseUrl.origin} (${describeFailure(err, opts.timeoutMs)}); is the daemon running?`, { cause: err });
  }
  let parsed: unknown = text;
  try {
    parsed = text === "" ? null : parseJson(text);
  } catch {
    // Not JSON (a proxy's HTML error page, say): keep the text for the error message.
  }
  return { status: res.status, ok: res.ok, body: parsed, text };
}

function describeFailure(err: unknown, timeoutMs: number): string {
  if (err instanceof DOMException && err.name === "TimeoutError") return `no answer within ${timeoutMs} ms`;
  // undici wraps the socket error: TypeError("fetch failed", { cause: { code: "ECONNREFUSED" } }).
  // "localhost" tries ::1 and 127.0.0.1, and then the cause is an AggregateError of both.
  let cause = err instanceof Error ? err.cause : undefined;
  if (cause instanceof AggregateError && cause.errors.length > 0) cause = cause.errors[0];
  if (typeof cause === "object" && cause !== null) {
    const code = (cause as { code?: unknown }).code;
    if (typeof code === "string") return code === "ECONNREFUSED" ? "connection refused" : code;
    // fetch's own refusals (e.g. "bad port" for the ports browsers block) carry no code.
    if (cause instanceof Error) return cause.message;
  }
  return err instanceof Error ? err.message : String(err);
}

/** `<status> <message>` for an error answer: the body's `error` field, else its text. */
export function errorMessageOf(result: HttpResult): string {
  const b = result.body;
  if (typeof b === "object" && b !== null && typeof (b as { error?: unknown }).error === "string") {
    return `${result.status} ${(b as { error: string }).error}`;
  }
  const text = result.text.trim().slice(0, MAX_ERROR_TEXT_CHARS);
  return text === "" ? `${result.status}` : `${result.status} ${text}`;
}

// ---------------------------------------------------------------- command plumbing

/** What an admin command needs from the outside world (all injectable for tests). */
export interface ClientDeps {
  readonly fetch: FetchFn;
  readonly writeOut: (text: string) => void;
  readonly writeErr: (text: string) => void;
  readonly exit: (code: number) => void;
  readonly readFile: (path: string) => Promise<string>;
}

export interface ClientCall {
  readonly method: "GET" | "POST" | "DELETE";
  readonly path: string;
  readonly body?: unknown;
  readonly query?: Readonly<Record<string, string | undefined>>;
  /** Turns a 2xx body into stdout text; default: pretty JSON. */
  readonly render?: (body: unknown) => string;
}

/**
 * Performs one admin call: 2xx -> rendered body on stdout; HTTP error -> `error: <status>
 * <message>` on stderr and exit 1; no connection -> a message naming the URL and exit 1.
 */
export async function runClientCall(deps: ClientDeps, opts: RequestOptions, call: ClientCall): Promise<void> {
  let result: HttpResult;
  try {
    result = await requestJson(opts, call.method, call.path, call.body, call.query);
  } catch (err) {
    if (!(err instanceof ConnectionError)) throw err;
    deps.writeErr(`error: ${err.message}\n`);
    deps.exit(1);
    return;
  }
  if (!result.ok) {
    deps.writeErr(`error: ${errorMessageOf(result)}\n`);
    deps.exit(1);
    return;
  }
  const render = call.render ?? ((body: unknown) => prettyJson(body));
  deps.writeOut(`${render(result.body)}\n`);
}

/** Where `kvmesh serve` listens by default. */
export const DEFAULT_ADMIN_URL = `http://${DEFAULT_DAEMON_CONFIG.host}:${DEFAULT_DAEMON_CONFIG.port}`;
const MAX_REQUEST_TIMEOUT_MS = 3_600_000;

/** Where addApiTokenOption leaves the token read from --api-token-file, among the command's options. */
const API_TOKEN_OPTION = "apiToken";

/**
 * `--api-token-file` (env KVMESH_API_TOKEN_FILE): the daemon's bearer token, read from a file
 * (never a flag value: argv shows in `ps`) before the action runs, with the daemon's checks
 * (mode 0600-ish, one line); a bad file is a usage error naming the flag.
 */
export function addApiTokenOption(cmd: Command): Command {
  const flag = "--api-token-file";
  cmd.addOption(new Option(`${flag} <file>`, "file holding the daemon's API token (serve --api-token-file), sent as Authorization: Bearer").argParser(parseNonEmpty).env(envNameFor(flag)));
  cmd.hook("preAction", (thisCommand: Command) => {
    const file = thisCommand.opts<{ apiTokenFile?: string }>().apiTokenFile;
    if (file === undefined) return;
    const label = thisCommand.getOptionValueSource("apiTokenFile") === "env" ? `${flag} (from ${envNameFor(flag)})` : flag;
    let token: string;
    try {
      token = readApiTokenText(file, label);
    } catch (err) {
      thisCommand.error(`error: ${err instanceof Error ? err.message : String(err)}`);
    }
    thisCommand.setOptionValue(API_TOKEN_OPTION, token);
  });
  return cmd;
}

/** The token addApiTokenOption read, as a RequestOptions fragment. */
export function apiTokenOf(opts: Readonly<Record<string, unknown>>): { apiToken?: string } {
  const t = opts[API_TOKEN_OPTION];
  return typeof t === "string" ? { apiToken: t } : {};
}

/** `--url` (env KVMESH_URL), `--timeout-ms` (env KVMESH_TIMEOUT_MS) and `--api-token-file`, shared by every admin command. */
export function addClientOptions(cmd: Command): Command {
  return addApiTokenOption(cmd)
    .addOption(new Option("--url <url>", "kvmesh daemon base URL").argParser(parseHttpUrl).default(new URL(DEFAULT_ADMIN_URL), DEFAULT_ADMIN_URL).env(envNameFor("--url")))
    .addOption(
      new Option("--timeout-ms <ms>", "give up on the daemon after this long")
        .argParser(integerInRange(1, MAX_REQUEST_TIMEOUT_MS))
        .default(DEFAULT_REQUEST_TIMEOUT_MS)
        .env(envNameFor("--timeout-ms")),
    );
}

export function requestOptionsOf(opts: Readonly<Record<string, unknown>>, fetch: FetchFn): RequestOptions {
  return { baseUrl: opts["url"] as URL, timeoutMs: opts["timeoutMs"] as number, fetch, ...apiTokenOf(opts) };
}
