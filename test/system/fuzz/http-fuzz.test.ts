/**
 * HTTP fuzz (issue #7, "Bad input"): a real daemon on loopback (startDaemon in process) takes a
 * seeded storm of malformed, mistyped, oversized, deeply nested, mis-encoded and mis-framed
 * requests on every endpoint, interleaved with valid "anchor" traffic whose results are recorded.
 *
 * Targets: no crash, no 500 (the only 5xx allowed is 503 KVMESH_NOT_READY, the reference's answer
 * for a partition with no eligible worker: a routing outcome, not a server fault); every error is
 * JSON `{error, code}` with a registered code and its status, 422s name the field that was
 * broken; and every worker, reservation and session binding accepted before and during the storm
 * is still there afterwards.
 *
 * Replay one failure: the seed is printed in each failure line; FUZZ_SEED / FUZZ_CASES override.
 */
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { ERROR_CODES } from "../../../src/core/index.js";
import { parseJson } from "../../../src/http/json.js";
import { DEFAULT_BODY_LIMIT_BYTES, DEFAULT_HEADERS_TIMEOUT_MS, DEFAULT_KEEP_ALIVE_TIMEOUT_MS, DEFAULT_REQUEST_TIMEOUT_MS } from "../../../src/http/server.js";
import { startHttpServer, type MeshControl } from "../../../src/http/server.js";
import { makeService } from "../../helpers/core-fixtures.js";
import { testMetrics } from "../../helpers/http-client.js";
import { parsePeerEndpoint } from "../../../mesh/endpoints.js";
import {
  EDGE_INTEGERS,
  Fuzz,
  httpRequest,
  INVALID_UTF8,
  jsonText,
  MALFORMED_JSON,
  nestedArrays,
  nestedObjects,
  percentile,
  rawExchange,
  type RawExchange,
  RawJson,
  TWO_53,
  TWO_64,
  VALUE_POOL,
} from "../../helpers/fuzz-kit.js";

const SEED = Number(process.env.FUZZ_SEED ?? 20_251_129);
const CASES = Number(process.env.FUZZ_CASES ?? 2_000);
const CONCURRENCY = 8;
const BS = 16;
/** Anchor workers: ids the fuzzer never generates (its ids are >= 1e6 or from EDGE_INTEGERS). */
const ANCHOR_WORKERS: readonly bigint[] = [TWO_64 - 2n, TWO_53 + 3n, 3n];
const ANCHOR_DURING_BASE = 5_000n;
const DEEP_LEVELS = 100_000;

// ---------------------------------------------------------------------------------------------
// The daemon, with a log capture (an "unhandled error" line is a bug even if the client got 4xx)

const logLines: string[] = [];
const logSink = new Writable({
  write(chunk: Buffer, _enc, cb) {
    logLines.push(chunk.toString());
    cb();
  },
});

/** A MeshControl that validates like the real mesh but opens no sockets (nothing to reach by accident). */
function fakeMesh(): MeshControl & { peers: Set<string> } {
  const peers = new Set<string>();
  return {
    peers,
    catchUp: () => Promise.resolve(),
    registerPeer(endpoint: string): Promise<boolean> {
      const ep = parsePeerEndpoint(endpoint);
      const added = !peers.has(ep);
      peers.add(ep);
      return Promise.resolve(added);
    },
    deregisterPeer(endpoint: string): Promise<boolean> {
      return Promise.resolve(peers.delete(parsePeerEndpoint(endpoint)));
    },
    listPeers: () => [...peers].map((endpoint) => ({ endpoint })),
  };
}

let daemon: Daemon;
let base: string;
const mesh = fakeMesh();

beforeAll(async () => {
  daemon = await startDaemon(
    { ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false, sessionAffinityTtlSecs: 600, sessionAffinityMode: "hard", logLevel: "warn" },
    pino({ level: "warn" }, logSink),
    { mesh },
  );
  base = `http://127.0.0.1:${daemon.port}`;
});

afterAll(async () => {
  await daemon.close();
});

// ---------------------------------------------------------------------------------------------
// Sending and checking

interface Sent {
  readonly method: string;
  readonly path: string;
  readonly body?: Buffer;
  readonly contentType?: string | null;
  readonly chunked?: boolean;
}

interface Got {
  readonly status: number;
  readonly contentType: string;
  readonly allow: string | null;
  readonly text: string;
  readonly json: unknown;
}

async function send(s: Sent): Promise<Got> {
  const headers: Record<string, string> = {};
  if (s.body !== undefined && s.contentType !== null) headers["content-type"] = s.contentType ?? "application/json";
  const init: RequestInit & { duplex?: "half" } = { method: s.method, headers };
  if (s.body !== undefined) {
    if (s.chunked === true) {
      const body = s.body;
      init.body = new ReadableStream<Uint8Array>({
        start(c) {
          // Two chunks, so the server really sees chunked framing.
          const mid = body.length >> 1;
          c.enqueue(new Uint8Array(body.subarray(0, mid)));
          c.enqueue(new Uint8Array(body.subarray(mid)));
          c.close();
        },
      });
      init.duplex = "half";
    } else {
      init.body = new Uint8Array(s.body);
    }
  }
  const res = await fetch(base + s.path, init);
  const text = await res.text();
  let json: unknown;
  try {
    json = parseJson(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, contentType: res.headers.get("content-type") ?? "", allow: res.headers.get("allow"), text, json };
}

const asBody = (v: unknown): Buffer => Buffer.from(jsonText(v));

interface ErrorBody {
  error: string;
  code: string;
  details?: { field?: unknown };
}

/** The invariants every response must meet, whatever was sent; a problem description or null. */
function checkResponse(s: Sent, g: Got): string | null {
  if (g.status >= 500 && !(g.status === 503 && (g.json as ErrorBody | undefined)?.code === "KVMESH_NOT_READY")) return `server error ${g.status}: ${g.text.slice(0, 200)}`;
  if (s.path.startsWith("/metrics") && g.status === 200) return g.contentType.startsWith("text/plain") ? null : `metrics content-type ${g.contentType}`;
  if (!g.contentType.startsWith("application/json")) return `content-type ${g.contentType} for ${g.status}`;
  if (s.method === "HEAD") return null;
  if (g.json === undefined) return `body is not JSON: ${g.text.slice(0, 200)}`;
  if (g.status < 400) return null;
  if (s.path === "/ready" && g.status === 503) return null;
  const e = g.json as ErrorBody;
  if (typeof e !== "object" || e === null || typeof e.error !== "string" || typeof e.code !== "string") return `error body lacks {error, code}: ${g.text.slice(0, 200)}`;
  const spec = (ERROR_CODES as Record<string, { status: number } | undefined>)[e.code];
  if (spec === undefined) return `unregistered code ${e.code}`;
  if (spec.status !== g.status) return `code ${e.code} is ${spec.status} but answered ${g.status}`;
  if (g.status === 422 && typeof e.details?.field !== "string") return `422 without details.field: ${g.text.slice(0, 200)}`;
  if (g.status === 405 && (g.allow === null || g.allow === "")) return "405 without Allow";
  return null;
}

// ---------------------------------------------------------------------------------------------
// Case generation

type Expectation =
  | { readonly kind: "any" }
  | { readonly kind: "status"; readonly status: number; readonly code?: string }
  | { readonly kind: "oneOf"; readonly statuses: readonly number[] }
  | { readonly kind: "field"; readonly field: string; readonly status?: number };

interface Case {
  readonly label: string;
  readonly sent: Sent;
  readonly expect: Expectation;
}

interface Endpoint {
  readonly name: string;
  readonly method: "GET" | "POST" | "PATCH" | "DELETE";
  readonly path: (f: Fuzz) => string;
  /** A schema-valid body (fields may still be refused by the service, e.g. an unknown id). */
  readonly body?: (f: Fuzz) => Record<string, unknown>;
  readonly optionalBody?: true;
  /** Path parameter (for path mutations): builds the path around a raw segment. */
  readonly withParam?: (seg: string) => string;
  /** A route another helper is adding (issue #6): 404 until it lands, then 409 unless enabled. */
  readonly maybeAbsent?: true;
}

const fuzzWorkerIds: bigint[] = [];
const fuzzReservationIds: string[] = [];
let serial = 0;

const fuzzWorkerId = (f: Fuzz): bigint => (f.chance(0.15) ? f.pick(EDGE_INTEGERS.filter((v) => v >= 0n && v < TWO_64)) : BigInt(1_000_000 + f.int(1_000_000_000)));
const tokenList = (f: Fuzz, blocks = 1 + f.int(3)): number[] => Array.from({ length: blocks * BS + f.int(BS) }, () => f.int(50_000));
const anyFuzzWorker = (f: Fuzz): bigint => (fuzzWorkerIds.length > 0 && f.chance(0.7) ? f.pick(fuzzWorkerIds) : fuzzWorkerId(f));
const anyReservationId = (f: Fuzz): string => (fuzzReservationIds.length > 0 && f.chance(0.6) ? f.pick(fuzzReservationIds) : `fz-r-${f.int(1e6)}`);

function promptBody(f: Fuzz): Record<string, unknown> {
  const b: Record<string, unknown> = { token_ids: tokenList(f) };
  if (f.chance(0.3)) b.model_name = "default";
  if (f.chance(0.2)) b.routing_group = "default";
  if (f.chance(0.2)) b.router_config_override = { overlap_score_credit: f.int(3), router_temperature: f.chance(0.5) ? 0 : 0.5 };
  if (f.chance(0.2)) b.allowed_worker_ids = [...ANCHOR_WORKERS];
  if (f.chance(0.1)) b.routing_constraints = { required_taints: [] };
  return b;
}

const ENDPOINTS: readonly Endpoint[] = [
  {
    name: "POST /workers",
    method: "POST",
    path: () => "/workers",
    body: (f) => ({
      worker_id: fuzzWorkerId(f),
      endpoint: `http://fuzz-${f.int(100)}:8000`,
      block_size: BS,
      model_name: "fuzz-model",
      routing_group: `g${f.int(3)}`,
      data_parallel_size: 1 + f.int(2),
      taints: ["fuzz"],
      max_num_batched_tokens: 8192,
      total_kv_blocks: 1000,
      is_eagle: false,
    }),
  },
  { name: "GET /workers", method: "GET", path: (f) => (f.chance(0.5) ? "/workers" : `/workers?model_name=${encodeURIComponent(f.pick(["default", "fuzz-model", "\u0000", "%", "é"]))}&routing_group=g1`) },
  {
    name: "PATCH /workers/:id",
    method: "PATCH",
    path: (f) => `/workers/${anyFuzzWorker(f)}`,
    withParam: (seg) => `/workers/${seg}`,
    body: (f) => (f.chance(0.5) ? { lifecycle: f.pick(["draining", "schedulable"]) } : { taints: ["a", "b"], max_num_batched_tokens: 4096 }),
  },
  { name: "DELETE /workers/:id", method: "DELETE", path: (f) => `/workers/${anyFuzzWorker(f)}`, withParam: (seg) => `/workers/${seg}` },
  { name: "GET /health", method: "GET", path: () => "/health" },
  { name: "GET /ready", method: "GET", path: () => "/ready" },
  {
    name: "POST /select",
    method: "POST",
    path: () => "/select",
    body: (f) => ({ ...promptBody(f), ...(f.chance(0.3) ? { selection_id: `fz-sel-${serial++}` } : {}), ...(f.chance(0.3) ? { session_id: `fz-s-${f.int(500)}` } : {}), ...(f.chance(0.2) ? { advisory: true } : {}) }),
  },
  {
    name: "POST /select_and_reserve",
    method: "POST",
    path: () => "/select_and_reserve",
    body: (f) => ({
      ...promptBody(f),
      selection_id: `fz-r-${serial++}`,
      ...(f.chance(0.3) ? { session_id: `fz-s-${f.int(500)}` } : {}),
      ...(f.chance(0.2) ? { session_context: { session_id: `fz-c-${f.int(500)}`, input_trigger: "user_message" } } : {}),
      ...(f.chance(0.2) ? { expected_output_tokens: f.int(1000), expected_prefill_duration_ms: f.int(100) } : {}),
    }),
  },
  {
    name: "POST /reservations",
    method: "POST",
    path: () => "/reservations",
    body: (f) => ({ selection_id: `fz-r-${serial++}`, worker_id: f.pick(ANCHOR_WORKERS), dp_rank: 0, token_ids: tokenList(f), ...(f.chance(0.3) ? { effective_prefill_tokens: f.int(20) } : {}) }),
  },
  {
    name: "POST /reservations/:id/prefill_complete",
    method: "POST",
    path: (f) => `/reservations/${encodeURIComponent(anyReservationId(f))}/prefill_complete`,
    withParam: (seg) => `/reservations/${seg}/prefill_complete`,
    body: () => ({}),
    optionalBody: true,
  },
  {
    name: "POST /reservations/:id/output_block",
    method: "POST",
    path: (f) => `/reservations/${encodeURIComponent(anyReservationId(f))}/output_block`,
    withParam: (seg) => `/reservations/${seg}/output_block`,
    body: (f) => ({ decay_fraction: f.next() }),
    optionalBody: true,
  },
  { name: "DELETE /reservations/:id", method: "DELETE", path: (f) => `/reservations/${encodeURIComponent(anyReservationId(f))}`, withParam: (seg) => `/reservations/${seg}` },
  { name: "GET /loads", method: "GET", path: (f) => (f.chance(0.5) ? "/loads" : `/loads?model_name=${f.pick(["default", "x", "%FF", "%E2%82"])}&routing_group=${f.pick(["default", "", "&&"])}`) },
  { name: "POST /potential_loads", method: "POST", path: () => "/potential_loads", body: promptBody },
  { name: "POST /overlap_scores", method: "POST", path: () => "/overlap_scores", body: promptBody },
  { name: "GET /dump", method: "GET", path: () => "/dump" },
  { name: "GET /replica_sync/peers", method: "GET", path: () => "/replica_sync/peers" },
  { name: "GET /replica_sync/status", method: "GET", path: () => "/replica_sync/status" },
  { name: "POST /replica_sync/register_peer", method: "POST", path: () => "/replica_sync/register_peer", body: (f) => ({ endpoint: `tcp://10.255.${f.int(256)}.${f.int(256)}:7100` }) },
  { name: "POST /replica_sync/deregister_peer", method: "POST", path: () => "/replica_sync/deregister_peer", body: (f) => ({ endpoint: `tcp://10.255.${f.int(256)}.${f.int(256)}:7100` }) },
  { name: "GET /metrics", method: "GET", path: () => "/metrics" },
  { name: "GET /ui/state", method: "GET", path: (f) => (f.chance(0.5) ? "/ui/state" : `/ui/state?top=${String(1 + f.int(1_024))}&q=${String(f.int(100))}`) },
  // Host-replication routes (issue #6): 409 unless enabled, 404 before they exist; either way 4xx JSON.
  { name: "POST /session_bindings", method: "POST", path: () => "/session_bindings", body: () => ({ bindings: [] }), maybeAbsent: true },
  { name: "GET /session_bindings/updates", method: "GET", path: () => "/session_bindings/updates", maybeAbsent: true },
];

const BAD_CONTENT_TYPES: readonly (string | null)[] = [null, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx", "text/json", "application", "*/*", ";", "application/json-seq"];
const GOOD_CONTENT_TYPES: readonly string[] = ["application/json; charset=utf-8", "APPLICATION/JSON", "application/merge-patch+json", " application/json ; q=1"];
const BAD_WORKER_SEGMENTS: readonly string[] = ["abc", "-1", "18446744073709551616", "99999999999999999999999", "0x10", "%ZZ", "%", "%00", "1%2F2", "%EF%BC%91", "01", "%201", "1.0", "1e3", "9".repeat(5000), "%FF%FE"];
/** Not percent-decodable (bad hex, a truncated or lone UTF-8 sequence, a surrogate), or over 256 bytes once decoded: 400. */
const BAD_RESERVATION_SEGMENTS: readonly string[] = ["%ZZ", "%", "%E", "%E2%82", "%80", "%ED%A0%80", "x".repeat(300), encodeURIComponent("é".repeat(200))];
/** Decodable odd ids (NUL is a character like any other, and the storm may have booked it): 404 or 200. */
const ODD_RESERVATION_SEGMENTS: readonly string[] = ["%00", "%F0%9F%8E%89", "%2F", "a%2Fb"];
const WRONG_METHODS: readonly string[] = ["PUT", "OPTIONS", "PATCH", "DELETE", "POST", "GET"];
const UNKNOWN_PATHS: readonly string[] = ["/workers/1/extra", "/select/", "//select", "/SELECT", "/reservations", "/reservations/x/unknown", "/..%2f..%2fetc%2fpasswd", "/metrics.json", "/%", "/workers/%ZZ/x"];

function mutateCase(f: Fuzz, ep: Endpoint): Case {
  const c = mutateCaseStrict(f, ep);
  return ep.maybeAbsent === true ? { ...c, expect: { kind: "any" } } : c;
}

function mutateCaseStrict(f: Fuzz, ep: Endpoint): Case {
  const label = (m: string): string => `${ep.name} ${m}`;
  const roll = f.int(100);
  // Path and method mutations apply to every route.
  if (roll < 6) {
    const m = f.pick(WRONG_METHODS.filter((x) => x !== ep.method && !(ep.method === "GET" && x === "HEAD")));
    const sameGroup = ENDPOINTS.some((e) => e.method === m && e.path(new Fuzz(1)).split("?")[0] === ep.path(new Fuzz(1)).split("?")[0]);
    return { label: label(`method ${m}`), sent: { method: m, path: ep.path(f) }, expect: sameGroup ? { kind: "any" } : { kind: "status", status: 405, code: "KVMESH_METHOD_NOT_ALLOWED" } };
  }
  if (roll < 9) {
    return { label: label("unknown path"), sent: { method: ep.method, path: f.pick(UNKNOWN_PATHS) }, expect: { kind: "any" } };
  }
  if (roll < 16 && ep.withParam !== undefined) {
    const isWorker = ep.name.includes("/workers/");
    const odd = !isWorker && f.chance(0.3);
    const seg = f.pick(isWorker ? BAD_WORKER_SEGMENTS : odd ? ODD_RESERVATION_SEGMENTS : BAD_RESERVATION_SEGMENTS);
    const body = ep.body === undefined ? undefined : asBody(ep.body(f));
    // A worker id that is not a canonical u64 decimal, or an id that is not valid percent-encoding
    // or too long, is 400 naming the parameter; an odd but valid id is simply not found.
    return {
      label: label(`path ${seg.slice(0, 20)}`),
      sent: { method: ep.method, path: ep.withParam(seg), ...(body === undefined ? {} : { body }) },
      expect: odd ? { kind: "oneOf", statuses: [200, 404] } : { kind: "status", status: 400, code: "KVMESH_BAD_REQUEST" },
    };
  }
  if (ep.body === undefined) {
    // Bodiless routes: a stray body (fetch sends none with GET) or query changes nothing but the answer.
    const b = ep.method !== "GET" && f.chance(0.5) ? f.bytes(f.int(64)) : undefined;
    const p = ep.path(f);
    const q = f.chance(0.5) ? `${p.includes("?") ? "&" : "?"}${f.pick(["%ZZ", "a=%FF&&b", "=", "x".repeat(4000), "model_name=%00"])}` : "";
    return { label: label("stray body/query"), sent: { method: ep.method, path: p + q, ...(b === undefined ? {} : { body: b }) }, expect: { kind: "any" } };
  }
  const valid = ep.body(f);
  const path = ep.path(f);
  const keys = Object.keys(valid);
  const post = (body: Buffer, expect: Expectation, m: string, extra: Partial<Sent> = {}): Case => ({
    label: label(m),
    sent: { method: ep.method, path, body, chunked: f.chance(0.1), ...extra },
    expect,
  });
  const required = ep.optionalBody !== true;
  if (roll < 30 && keys.length > 0) {
    const k = f.pick(keys);
    const v = f.pick(VALUE_POOL);
    return post(asBody({ ...valid, [k]: v }), { kind: "field", field: k }, `field ${k}=${jsonText(v).slice(0, 24)}`);
  }
  if (roll < 36) {
    const k = `zz_${f.int(1000)}`;
    return post(asBody({ ...valid, [k]: f.pick(VALUE_POOL) }), { kind: "field", field: k, status: 422 }, `unknown field ${k}`);
  }
  if (roll < 42 && keys.length > 0) {
    const k = f.pick(keys);
    const depth = f.chance(0.1) ? DEEP_LEVELS : 2 + f.int(2000);
    const nested = f.chance(0.5) ? nestedArrays(depth) : nestedObjects(depth);
    return post(Buffer.from(jsonText({ ...valid, [k]: new RawJson(nested) })), { kind: "field", field: k, status: 422 }, `nested ${k} x${depth}`);
  }
  if (roll < 50) {
    const text = jsonText(valid);
    const cut = 1 + f.int(Math.max(1, text.length - 1));
    return post(Buffer.from(text.slice(0, cut)), { kind: "status", status: 400, code: "KVMESH_MALFORMED_JSON" }, `truncated at ${cut}`);
  }
  if (roll < 56) {
    const bad = f.pick(MALFORMED_JSON);
    return post(Buffer.from(bad, "latin1"), { kind: "status", status: 400, code: "KVMESH_MALFORMED_JSON" }, `malformed ${JSON.stringify(bad).slice(0, 24)}`);
  }
  if (roll < 60) {
    return post(f.bytes(1 + f.int(300)), { kind: "any" }, "random bytes");
  }
  if (roll < 65) {
    // Invalid UTF-8 inside a string value: decoded with U+FFFD, never a crash.
    const marker = "@@BAD@@";
    const k = f.pick(keys.length > 0 ? keys : ["x"]);
    const text = Buffer.from(jsonText({ ...valid, [k]: `a${marker}b` }));
    const at = text.indexOf(marker);
    const body = Buffer.concat([text.subarray(0, at), f.pick(INVALID_UTF8), text.subarray(at + marker.length)]);
    return post(body, { kind: "any" }, `invalid utf-8 in ${k}`);
  }
  if (roll < 70) {
    const ct = f.pick(BAD_CONTENT_TYPES);
    return post(asBody(valid), { kind: "status", status: 415, code: "KVMESH_UNSUPPORTED_MEDIA_TYPE" }, `content-type ${String(ct)}`, { contentType: ct });
  }
  if (roll < 73) {
    return post(asBody(valid), { kind: "any" }, "good content-type variant", { contentType: f.pick(GOOD_CONTENT_TYPES) });
  }
  if (roll < 77) {
    const v = f.pick(VALUE_POOL.filter((x) => typeof x !== "object" || x === null || Array.isArray(x) || x instanceof RawJson));
    const isObjectLiteral = v instanceof RawJson && v.text.startsWith("{");
    // On the optional-body routes a literal `null` body counts as no body.
    const lenient = isObjectLiteral || (!required && v === null);
    return post(Buffer.from(jsonText(v)), lenient ? { kind: "any" } : { kind: "field", field: "body", status: 422 }, `top-level ${jsonText(v).slice(0, 20)}`);
  }
  if (roll < 80) {
    return post(Buffer.alloc(0), required ? { kind: "status", status: 400, code: "KVMESH_MALFORMED_JSON" } : { kind: "any" }, "empty body");
  }
  if (roll < 84 && keys.length > 0) {
    // A duplicate key: the last one wins (as JSON.parse), so a bad duplicate is refused.
    const k = f.pick(keys);
    const text = jsonText(valid);
    const body = Buffer.from(`${text.slice(0, -1)}${text.length > 2 ? "," : ""}${JSON.stringify(k)}:{"dup":[1]}}`);
    return post(body, { kind: "field", field: k }, `duplicate ${k}`);
  }
  if (roll < 88 && keys.length > 0) {
    const k = f.pick(keys);
    const rest = Object.fromEntries(Object.entries(valid).filter(([key]) => key !== k));
    return post(asBody(rest), { kind: "any" }, `without ${k}`);
  }
  // The valid body itself (sometimes chunked): state changes are allowed, errors must be clean.
  return post(asBody(valid), { kind: "any" }, "valid");
}

function checkExpectation(c: Case, g: Got): string | null {
  const e = c.expect;
  const body = g.json as ErrorBody | undefined;
  if (e.kind === "any") return null;
  if (e.kind === "oneOf") return e.statuses.includes(g.status) ? null : `expected one of ${e.statuses.join("/")} got ${g.status}: ${g.text.slice(0, 160)}`;
  if (e.kind === "status") {
    if (g.status !== e.status) return `expected ${e.status} got ${g.status}: ${g.text.slice(0, 160)}`;
    if (e.code !== undefined && body?.code !== e.code) return `expected code ${e.code} got ${String(body?.code)}`;
    return null;
  }
  if (g.status < 400) return e.status === undefined ? null : `expected ${e.status} got ${g.status}`;
  if (e.status !== undefined && g.status !== e.status) return `expected ${e.status} got ${g.status}: ${g.text.slice(0, 160)}`;
  if (g.status === 422) {
    const field = body?.details?.field;
    // Beyond 64 levels the exact parser refuses the body itself (a 16-digit id elsewhere sends it there).
    if (typeof field !== "string" || !(field === e.field || field.startsWith(`${e.field}.`) || field.startsWith(`${e.field}[`) || field === "body")) {
      return `422 names ${String(field)}, expected ${e.field}: ${g.text.slice(0, 160)}`;
    }
  }
  if (g.status === 400 && body?.code === "KVMESH_BAD_REQUEST" && typeof body.details?.field !== "string") return `400 without details.field: ${g.text.slice(0, 160)}`;
  return null;
}

// ---------------------------------------------------------------------------------------------
// Anchors: valid traffic whose effects must survive the storm

interface Anchors {
  readonly workers: bigint[];
  readonly reservations: string[];
  /** session -> worker it was bound to. */
  readonly sessions: Map<string, bigint>;
}

const anchors: Anchors = { workers: [], reservations: [], sessions: new Map() };

async function addAnchorWorker(id: bigint): Promise<void> {
  const g = await send({ method: "POST", path: "/workers", body: asBody({ worker_id: id, endpoint: `http://anchor-${id}:8000`, block_size: BS }) });
  expect(g.status, g.text).toBe(201);
  anchors.workers.push(id);
}

async function addAnchorReservation(f: Fuzz): Promise<void> {
  const n = anchors.reservations.length;
  const id = `anchor-r-${n}`;
  const session = `anchor-s-${n}`;
  const g = await send({
    method: "POST",
    path: "/select_and_reserve",
    body: asBody({ token_ids: tokenList(f, 2), selection_id: id, session_id: session, allowed_worker_ids: anchors.workers }),
  });
  expect(g.status, g.text).toBe(200);
  const r = g.json as { worker_id: bigint | number; selection_id: string };
  expect(r.selection_id).toBe(id);
  anchors.reservations.push(id);
  anchors.sessions.set(session, BigInt(r.worker_id));
}

// ---------------------------------------------------------------------------------------------

describe("HTTP fuzz", () => {
  it(`a seeded storm of ${CASES} bad requests over every endpoint: 4xx JSON naming the field, no 500, accepted state kept`, async () => {
    const f = new Fuzz(SEED);
    for (const id of ANCHOR_WORKERS) await addAnchorWorker(id);
    for (let i = 0; i < 4; i++) await addAnchorReservation(f);

    const cases: Case[] = [];
    for (let i = 0; i < CASES; i++) cases.push(mutateCase(f, f.pick(ENDPOINTS)));
    const failures: string[] = [];
    const statuses = new Map<number, number>();
    const perEndpoint = new Map<string, number>();
    let next = 0;
    let sinceAnchor = 0;
    const started = performance.now();
    const worker = async (): Promise<void> => {
      for (;;) {
        const i = next++;
        const c = cases[i];
        if (c === undefined) return;
        // Every ~150 cases, valid traffic lands in the middle of the storm.
        if (++sinceAnchor >= 150) {
          sinceAnchor = 0;
          await addAnchorWorker(ANCHOR_DURING_BASE + BigInt(anchors.workers.length));
          await addAnchorReservation(f);
        }
        let g: Got;
        try {
          g = await send(c.sent);
        } catch (err) {
          failures.push(`#${i} ${c.label}: request failed (${err instanceof Error ? err.message : String(err)})`);
          continue;
        }
        statuses.set(g.status, (statuses.get(g.status) ?? 0) + 1);
        const ep = c.label.split(" ").slice(0, 2).join(" ");
        perEndpoint.set(ep, (perEndpoint.get(ep) ?? 0) + 1);
        if (g.status >= 200 && g.status < 300) {
          // Remember what the storm itself created, so later cases can hit it.
          const j = g.json as { worker_id?: unknown; selection_id?: unknown } | undefined;
          if (c.sent.path === "/workers" && c.sent.method === "POST" && typeof j?.worker_id !== "undefined") fuzzWorkerIds.push(BigInt(j.worker_id as bigint | number));
          if (typeof j?.selection_id === "string" && j.selection_id.startsWith("fz-r-")) fuzzReservationIds.push(j.selection_id);
        }
        const problem = checkResponse(c.sent, g) ?? checkExpectation(c, g);
        if (problem !== null) failures.push(`#${i} seed=${SEED} ${c.label}: ${problem}`);
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, worker));
    const elapsedMs = performance.now() - started;
    console.log(
      `http fuzz: ${CASES} cases in ${Math.round(elapsedMs)} ms (seed ${SEED}); statuses ${JSON.stringify(Object.fromEntries([...statuses].sort((a, b) => a[0] - b[0])))}; ` +
        `anchors ${anchors.workers.length} workers / ${anchors.reservations.length} reservations`,
    );
    expect(failures.slice(0, 25)).toEqual([]);
    // The storm reached every endpoint and produced both outcomes.
    for (const ep of ENDPOINTS) expect(perEndpoint.get(ep.name) ?? 0, ep.name).toBeGreaterThan(0);
    expect([...statuses.keys()].some((s) => s >= 200 && s < 300)).toBe(true);
    expect(statuses.get(422) ?? 0).toBeGreaterThan(CASES / 20);
    expect(statuses.get(400) ?? 0).toBeGreaterThan(CASES / 20);
    expect(statuses.get(500) ?? 0).toBe(0);

    // Still answering, and nothing accepted was lost.
    expect((await send({ method: "GET", path: "/health" })).status).toBe(200);
    const listed = await send({ method: "GET", path: "/workers" });
    for (const id of anchors.workers) expect(listed.text).toContain(`"worker_id":${id},`);
    for (const id of anchors.reservations) {
      expect(daemon.service.hasReservation(id), id).toBe(true);
      expect((await send({ method: "POST", path: `/reservations/${id}/prefill_complete` })).status).toBe(200);
    }
    for (const [session, worker] of anchors.sessions) {
      const g = await send({ method: "POST", path: "/select", body: asBody({ token_ids: tokenList(f, 1), session_id: session, allowed_worker_ids: anchors.workers }) });
      expect(g.status, g.text).toBe(200);
      expect(BigInt((g.json as { worker_id: bigint | number }).worker_id), session).toBe(worker);
    }
    for (const id of anchors.reservations) expect((await send({ method: "DELETE", path: `/reservations/${id}` })).status).toBe(200);
    const metrics = (await send({ method: "GET", path: "/metrics" })).text;
    expect(metrics).not.toMatch(/kvmesh_http_requests_total\{[^}]*status="500"/);
    expect(logLines.filter((l) => l.includes("unhandled error"))).toEqual([]);
  }, 60_000);

  it(`nesting ${DEEP_LEVELS} levels deep on every body route is refused (422), never a stack overflow`, async () => {
    const bodies = [nestedArrays(DEEP_LEVELS), nestedObjects(DEEP_LEVELS), `{"worker_id":18446744073709551615,"taints":${nestedArrays(DEEP_LEVELS)}}`, `{"token_ids":${nestedArrays(DEEP_LEVELS, "18446744073709551615")}}`];
    for (const ep of ENDPOINTS.filter((e) => e.body !== undefined)) {
      const path = ep.path(new Fuzz(1));
      for (const b of bodies) {
        const g = await send({ method: ep.method, path, body: Buffer.from(b) });
        expect(checkResponse({ method: ep.method, path }, g), ep.name).toBeNull();
        // 404/409 when the route refuses before the body (unknown reservation, disabled feature) is fine too.
        expect([422, 404, 409], `${ep.name} ${g.text.slice(0, 120)}`).toContain(g.status);
      }
    }
    expect((await send({ method: "GET", path: "/health" })).status).toBe(200);
  });

  it("a lone surrogate in an id or name is refused (400 naming the field); a surrogate pair is fine", async () => {
    // Valid JSON, but with no UTF-8 form: the mesh would carry "\ufffd" instead, and the id could
    // not be put in a reservation URL to free it.
    const body = (extra: Record<string, unknown>): Buffer => asBody({ token_ids: tokenList(new Fuzz(9), 1), allowed_worker_ids: [...ANCHOR_WORKERS], ...extra });
    for (const [field, extra] of [
      ["selection_id", { selection_id: "r-\ud800" }],
      ["session_id", { session_id: "\udc00s" }],
      ["session_context.session_id", { session_context: { session_id: "x\ud83d" } }],
      ["model_name", { model_name: "m\udfff" }],
    ] as const) {
      const g = await send({ method: "POST", path: "/select_and_reserve", body: body(extra) });
      expect(g.status, field).toBe(400);
      expect((g.json as ErrorBody).details?.field, field).toBe(field);
    }
    const w = await send({ method: "POST", path: "/workers", body: asBody({ worker_id: 77, endpoint: "http://\ud800", block_size: BS }) });
    expect([w.status, (w.json as ErrorBody).details?.field]).toEqual([400, "endpoint"]);
    const ok = await send({ method: "POST", path: "/select_and_reserve", body: body({ selection_id: "r-🎉", session_id: "s-🎉" }) });
    expect(ok.status, ok.text).toBe(200);
    expect((await send({ method: "DELETE", path: `/reservations/${encodeURIComponent("r-🎉")}` })).status).toBe(200);
  });

  it("bodies over the 8 MiB limit are 413 JSON, with Content-Length or chunked without it, and the daemon keeps serving", async () => {
    const big = Buffer.alloc(DEFAULT_BODY_LIMIT_BYTES + 1024, 0x20);
    big[0] = 0x7b;
    // Declared length over the limit: refused before reading.
    const declared = await rawExchange("127.0.0.1", daemon.port, [httpRequest("POST", "/workers", big)], 5_000);
    expect(declared.responses[0]?.status).toBe(413);
    expect((parseJson(declared.responses[0]?.body.toString() ?? "") as ErrorBody).code).toBe("KVMESH_BODY_TOO_LARGE");
    // Chunked without a length: cut at the limit while streaming.
    const chunkSize = 256 * 1024;
    const chunks: Buffer[] = [Buffer.from("POST /select HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")];
    for (let sent = 0; sent < big.length; sent += chunkSize) {
      const part = big.subarray(sent, sent + chunkSize);
      chunks.push(Buffer.concat([Buffer.from(`${part.length.toString(16)}\r\n`), part, Buffer.from("\r\n")]));
    }
    chunks.push(Buffer.from("0\r\n\r\n"));
    const streamed = await rawExchange("127.0.0.1", daemon.port, chunks, 5_000);
    expect(streamed.responses[0]?.status).toBe(413);
    expect(streamed.responses[0]?.headers.connection).toBe("close");
    // fetch with a streamed body: 413 too (or the server closed while we were still sending).
    const viaFetch = await send({ method: "POST", path: "/select_and_reserve", body: big, chunked: true }).catch(() => undefined);
    if (viaFetch !== undefined) expect(viaFetch.status).toBe(413);
    // A body exactly at the limit is read (and refused for its content, not its size).
    const atLimit = Buffer.alloc(DEFAULT_BODY_LIMIT_BYTES, 0x20);
    atLimit[0] = 0x7b;
    atLimit[atLimit.length - 1] = 0x7d;
    const ok = await send({ method: "POST", path: "/workers", body: atLimit });
    expect(ok.status).toBe(422);
    expect((await send({ method: "GET", path: "/health" })).status).toBe(200);
  });

  it("slow clients trickling headers or bodies do not block others", async () => {
    // The timeouts exist and are ordered as node requires (keep-alive < headers <= request).
    expect(DEFAULT_KEEP_ALIVE_TIMEOUT_MS).toBeLessThan(DEFAULT_HEADERS_TIMEOUT_MS);
    expect(DEFAULT_HEADERS_TIMEOUT_MS).toBeLessThanOrEqual(DEFAULT_REQUEST_TIMEOUT_MS);
    const SLOW = 40;
    const SERVED = 50;
    // The slow clients trickle, then hold their unfinished requests open until the others are
    // served: a server they blocked would answer no one, and the test would run into its timeout.
    const stop = new AbortController();
    let slowEnded = 0;
    const slow: Promise<RawExchange>[] = [];
    for (let i = 0; i < SLOW; i++) {
      const body = jsonText({ worker_id: 900_000 + i, endpoint: "http://slow", block_size: BS });
      const head = `POST /workers HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n`;
      // Half trickle their headers, half their body, one byte every 50 ms (~2 s of trickling).
      const bytes = i % 2 === 0 ? head + body : body;
      const chunks = [...(i % 2 === 0 ? [] : [head]), ...bytes.split("").slice(0, 40)];
      slow.push(
        rawExchange("127.0.0.1", daemon.port, chunks, 60_000, 50, stop.signal).finally(() => {
          slowEnded++;
        }),
      );
    }
    const latencies: number[] = [];
    let servedWhileSlowOpen = 0;
    try {
      for (let served = 0; served < SERVED; served++) {
        const t0 = performance.now();
        const g = await send({ method: "POST", path: "/select", body: asBody({ token_ids: tokenList(new Fuzz(served), 2), allowed_worker_ids: [...ANCHOR_WORKERS] }) });
        latencies.push(performance.now() - t0);
        expect(g.status).toBe(200);
        if (slowEnded === 0) servedWhileSlowOpen++;
      }
    } finally {
      stop.abort();
    }
    const slowEnds = await Promise.all(slow);
    console.log(`slow clients: ${SLOW} trickling, ${SERVED} requests served meanwhile, p50 ${percentile(latencies, 50).toFixed(2)} ms, p99 ${percentile(latencies, 99).toFixed(2)} ms`);
    // Every request was answered while every slow client still held its unfinished request open,
    // and none of those was answered or cut by the server meanwhile.
    expect(servedWhileSlowOpen).toBe(SERVED);
    expect(slowEnds.filter((e) => e.closedByServer || e.responses.length > 0)).toEqual([]);
  });

  it("a client too slow with its headers or body is cut with a 408 JSON answer once the (shortened) timeouts pass", async () => {
    const { svc } = makeService();
    const server = await startHttpServer({
      service: svc,
      host: "127.0.0.1",
      port: 0,
      logger: pino({ level: "silent" }),
      metrics: testMetrics(svc),
      timeouts: { headersMs: 300, requestMs: 600, keepAliveMs: 200, checkIntervalMs: 50 },
    });
    try {
      const head = "POST /workers HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n";
      const t0 = performance.now();
      // The slow clients would go on for 5 s (and more); a 408 from the server shows it cut them.
      const [headers, body, idle] = await Promise.all([
        // One header byte every 100 ms, for up to 5 s.
        rawExchange("127.0.0.1", server.port, head.split(""), 5_000, 100),
        // Headers at once, then one body byte every 100 ms.
        rawExchange("127.0.0.1", server.port, [head, ..."{".repeat(50).split("")], 5_000, 100),
        // A keep-alive connection left idle after one request.
        rawExchange("127.0.0.1", server.port, [httpRequest("GET", "/health")], 5_000),
      ]);
      const elapsed = performance.now() - t0;
      for (const [name, ex] of [["headers", headers], ["body", body]] as const) {
        expect(ex.closedByServer, name).toBe(true);
        expect(ex.responses[0]?.status, name).toBe(408);
        expect((parseJson(ex.responses[0]?.body.toString() ?? "") as ErrorBody).code, name).toBe("KVMESH_REQUEST_TIMEOUT");
      }
      expect(idle.responses[0]?.status).toBe(200);
      expect(idle.closedByServer).toBe(true);
      console.log(`slow clients cut with 408 after ${Math.round(elapsed)} ms (timeouts: headers 300 ms, request 600 ms)`);
    } finally {
      await server.close();
    }
  });

  it("pipelined garbage and broken framing: valid requests before it are answered, the garbage gets a 4xx JSON error, the connection closes", async () => {
    const valid = Buffer.concat([httpRequest("GET", "/health"), httpRequest("POST", "/select", jsonText({ token_ids: tokenList(new Fuzz(3), 1), allowed_worker_ids: [...ANCHOR_WORKERS] }))]);
    const garbage: readonly (string | Buffer)[] = [
      "\u0000\u0001\u0002 garbage\r\n\r\n",
      "FOO /health HTTP/1.1\r\nhost: x\r\n\r\n",
      "GET /health HTTP/9.9\r\n\r\n",
      "GET /health\r\n\r\n",
      "GET /health HTTP/1.1\r\nbad header line\r\n\r\n",
      "GET /health HTTP/1.1\r\nhost: x\r\nx: " + "a".repeat(20_000) + "\r\n\r\n",
      "POST /select HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\nZZ\r\n{}\r\n0\r\n\r\n",
      "POST /select HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n{}",
      "POST /select HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n",
      "POST /select HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n{}",
      "GET /he\u0000alth HTTP/1.1\r\n\r\n",
      Buffer.from([0x47, 0x45, 0x54, 0x20, 0x2f, 0xff, 0xfe, 0x20, 0x48, 0x54, 0x54, 0x50, 0x2f, 0x31, 0x2e, 0x31, 0x0d, 0x0a, 0x0d, 0x0a]),
    ];
    for (const g of garbage) {
      const ex = await rawExchange("127.0.0.1", daemon.port, [Buffer.concat([valid, typeof g === "string" ? Buffer.from(g, "latin1") : g])], 3_000);
      const label = JSON.stringify(String(g).slice(0, 40));
      expect(ex.responses.length, `${label}: ${ex.bytes.toString("latin1").slice(0, 300)}`).toBeGreaterThanOrEqual(2);
      expect(ex.responses[0]?.status, label).toBe(200);
      expect(ex.responses[1]?.status, label).toBe(200);
      // The garbage's own answer: a JSON 4xx (HTTP/0.9-style "GET /health" is served as 1.0 by node).
      const last = ex.responses[2];
      expect(last, `${label}: no answer for the garbage`).toBeDefined();
      if (last !== undefined && last.status >= 300) {
        expect(last.status, label).toBeGreaterThanOrEqual(400);
        expect(last.status, label).toBeLessThan(500);
        expect(last.headers["content-type"], label).toBe("application/json");
        const e = parseJson(last.body.toString()) as ErrorBody;
        expect(typeof e.error, label).toBe("string");
        expect(ERROR_CODES[e.code as keyof typeof ERROR_CODES].status, label).toBe(last.status);
      }
      expect(ex.closedByServer, label).toBe(true);
    }
    expect((await send({ method: "GET", path: "/health" })).status).toBe(200);
  });
});
