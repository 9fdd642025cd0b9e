/**
 * The daemon's HTTP API (the reference selection service's routes and JSON shapes) on bare node:http.
 *
 * Why not fastify (the usual choice): (1) its body parser is JSON.parse, which on
 * Node 20 silently rounds 64-bit worker ids and hashes (2^64-1 -> 18446744073709552000), and
 * swapping it for our lossless parser leaves ajv validating a shape (bigint) it cannot describe;
 * (2) its default ajv is lenient (strips unknown fields, coerces "7" to 7), the opposite of the
 * strict API we want; (3) it measured 5-15% below node:http on the same host. What fastify would
 * buy (routing, 503 on close, graceful close) is ~150 lines here, and handlers stay thin:
 * parse -> validate -> call the service -> stringify.
 */
import { createServer, type IncomingHttpHeaders, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Logger } from "pino";

import { KvmeshError } from "../core/errors.js";
import { LogThrottle } from "../util/log-throttle.js";
import type { SelectionService } from "../core/selection-service.js";
import { handleClientErrors } from "./client-error.js";
import { JsonDepthError, parseJsonBytes, stringifyJson } from "./json.js";
import type { HttpMetrics } from "./metrics.js";
import { authFailureOf, checkBearer, requiresApiToken, wwwAuthenticateFor, type ApiToken } from "./auth.js";
import { SessionBindingsHttp } from "./session-bindings.js";
import { decisionFields, REQUEST_ID_HEADER, requestIdOf } from "./request-id.js";
import { TRACEPARENT_HEADER } from "./traceparent.js";
import type { RequestTracer } from "./tracing.js";
import type { SelectionNote } from "../core/types.js";
import type { MeshControl } from "../../mesh/replica-port.js";
import { withTraceCause } from "../../mesh/trace-cause.js";
import { readiness } from "./readiness.js";
import { StatusPage, type UiMeshSelf } from "./ui/ui-routes.js";

/** The mesh as this server drives it; defined on the mesh side (mesh/replica-port.ts). */
export type { MeshControl };
import {
  parseEmptyRequest,
  parseOutputBlockRequest,
  parsePeerRequest,
  parseReservationRequest,
  parseScoreRequest,
  parseSelectAndReserveRequest,
  parseSelectionIdParam,
  parseSelectRequest,
  parseWorkerIdParam,
  parseWorkerPatch,
  parseWorkerRequest,
} from "./schemas.js";
import { parseJsonBytesWithTokenIds } from "./token-ids.js";

/** The reference's body limit. A 2M-token prompt (the service's cap) is ~16 MB of JSON, but real prompts are < 1 MB. */
export const DEFAULT_BODY_LIMIT_BYTES = 8 * 1024 * 1024;
/** Above common client/LB idle timeouts (60 s), so the server is never the side that races a reused socket closed. */
export const DEFAULT_KEEP_ALIVE_TIMEOUT_MS = 65_000;
/** Must exceed keepAliveTimeout, or node may time out a reused socket's next request headers first. */
export const DEFAULT_HEADERS_TIMEOUT_MS = 66_000;
/** Whole-request deadline: an 8 MiB body at 1 Mbit/s takes ~67 s. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 120_000;
/** After close(), in-flight requests get this long before their sockets are cut. */
export const DEFAULT_CLOSE_GRACE_MS = 2_000;

/** How often node checks connections against the header and request timeouts (its default), ms. */
export const DEFAULT_CONNECTIONS_CHECK_INTERVAL_MS = 30_000;

export interface HttpTimeouts {
  readonly headersMs?: number;
  readonly requestMs?: number;
  readonly keepAliveMs?: number;
  readonly checkIntervalMs?: number;
}

export interface HttpServerOptions {
  service: SelectionService;
  host: string;
  port: number;
  logger: Logger;
  /** The HTTP series; GET /metrics serves `metrics.registry`, which holds every component's. */
  metrics: HttpMetrics;
  bodyLimitBytes?: number;
  /** Slow-client bounds (tests shorten them); defaults DEFAULT_*_TIMEOUT_MS. */
  timeouts?: HttpTimeouts;
  mesh?: MeshControl | undefined;
  /** Bearer token for state-changing routes (src/http/auth.ts); unset: no authentication. */
  apiToken?: ApiToken | undefined;
  /** What the status page (GET /ui) shows of this replica's mesh; unset without one. */
  meshSelf?: (() => UiMeshSelf) | undefined;
  /** Request tracing (src/http/tracing.ts); unset: off, and a request pays one undefined check. */
  tracer?: RequestTracer | undefined;
}

export interface RunningHttpServer {
  readonly host: string;
  readonly port: number;
  close(): Promise<void>;
}

type BodyMode = "none" | "required" | "optional";

export interface Reply {
  readonly status: number;
  readonly body: unknown;
  /** Pre-rendered non-JSON body (GET /metrics, the status page's files). */
  readonly text?: { readonly body: string; readonly contentType: string };
  /** Extra response headers (a redirect's location, the status page's cache and CSP headers). */
  readonly headers?: Readonly<Record<string, string>>;
  /** Takes over the response (GET /session_bindings/updates streams NDJSON). */
  readonly stream?: (req: IncomingMessage, res: ServerResponse) => void;
}

export interface RequestContext {
  readonly params: readonly string[];
  readonly query: URLSearchParams | undefined;
  readonly body: unknown;
  /** With tracing on: filled by the selection routes with what the choice decided (the span's attributes). */
  readonly note: SelectionNote | undefined;
}

export interface Route {
  readonly method: "GET" | "POST" | "PATCH" | "DELETE";
  /** Metric label and matcher: ":id" matches one URL-decoded path segment. */
  readonly pattern: string;
  readonly body: BodyMode;
  /** The body may carry a prompt: its token_ids are parsed straight into a Uint32Array (token-ids.ts). */
  readonly prompt?: true;
  readonly handle: (ctx: RequestContext) => Reply | Promise<Reply>;
}

interface RouteGroup {
  readonly pattern: string;
  readonly parts: readonly string[];
  readonly routes: Route[];
  readonly allow: string;
}

const OK = { status: "ok" } as const;
const JSON_CONTENT_TYPE = "application/json";
/** nginx's "client closed request": the client left before we could answer. */
const STATUS_CLIENT_GONE = 499;
const UNMATCHED_ROUTE = "unmatched";

const reply = (status: number, body: unknown): Reply => ({ status, body });
const queryParam = (q: URLSearchParams | undefined, name: string): string | undefined => {
  const v = q?.get(name);
  return v === null || v === undefined || v === "" ? undefined : v;
};
const param = (ctx: RequestContext, i: number): string => ctx.params[i] ?? "";

/**
 * Runs a lifecycle call; a reservation unknown here gets one more try once the mesh has applied
 * everything it has received (MeshControl.catchUp): a peer's booking may still sit in the receive
 * thread's next hand-over, up to --mesh-apply-interval-ms behind, and a frontend may send the
 * lifecycle call to any replica right after another one booked it.
 */
async function withCatchUp(mesh: MeshControl | undefined, call: () => void): Promise<void> {
  try {
    call();
  } catch (err) {
    if (mesh === undefined || !(err instanceof KvmeshError) || err.code !== "KVMESH_RESERVATION_NOT_FOUND") throw err;
    await mesh.catchUp();
    call();
  }
}

function buildRoutes(o: HttpServerOptions, bindings: SessionBindingsHttp, page: StatusPage): Route[] {
  const svc = o.service;
  const mesh = (): MeshControl => {
    if (o.mesh === undefined) throw new KvmeshError("KVMESH_REPLICA_SYNC_DISABLED", "replica sync is disabled");
    return o.mesh;
  };
  return [
    { method: "POST", pattern: "/workers", body: "required", handle: (c) => reply(201, svc.upsertWorker(parseWorkerRequest(c.body, ""))) },
    {
      method: "GET",
      pattern: "/workers",
      body: "none",
      handle: (c) => {
        const records = svc.listWorkers(queryParam(c.query, "model_name"), queryParam(c.query, "routing_group"));
        // kvmesh addition with the mesh: each replica's lifecycle and reasons for the worker (a
        // registration can fail on one replica only). Without the mesh the reference's records as they are.
        return reply(200, o.mesh === undefined ? records : records.map((r) => ({ ...r, replicas: svc.workerReplicas(r.worker_id) })));
      },
    },
    {
      method: "PATCH",
      pattern: "/workers/:id",
      body: "required",
      handle: (c) => reply(200, svc.patchWorker(parseWorkerIdParam(param(c, 0)), parseWorkerPatch(c.body, ""))),
    },
    { method: "DELETE", pattern: "/workers/:id", body: "none", handle: (c) => reply(200, svc.deleteWorker(parseWorkerIdParam(param(c, 0)))) },
    { method: "GET", pattern: "/health", body: "none", handle: () => reply(200, OK) },
    {
      method: "GET",
      pattern: "/ready",
      body: "none",
      handle: () => {
        const r = readiness(svc, o.mesh);
        return reply(r.ready ? 200 : 503, r);
      },
    },
    {
      method: "POST",
      pattern: "/select",
      body: "required",
      prompt: true,
      handle: (c) => {
        const r = parseSelectRequest(c.body, "");
        return reply(200, svc.select(r, c.note));
      },
    },
    {
      method: "POST",
      pattern: "/select_and_reserve",
      body: "required",
      prompt: true,
      handle: (c) => {
        const r = parseSelectAndReserveRequest(c.body, "");
        return reply(200, svc.selectAndReserve(r, c.note));
      },
    },
    {
      method: "POST",
      pattern: "/reservations",
      body: "required",
      prompt: true,
      handle: (c) => {
        const r = parseReservationRequest(c.body, "");
        return reply(201, svc.createReservation(r));
      },
    },
    {
      method: "POST",
      pattern: "/reservations/:id/prefill_complete",
      body: "optional",
      handle: async (c) => {
        const id = parseSelectionIdParam(param(c, 0));
        parseEmptyRequest(c.body ?? {}, "");
        await withCatchUp(o.mesh, () => {
          svc.prefillComplete(id);
        });
        return reply(200, OK);
      },
    },
    {
      method: "POST",
      pattern: "/reservations/:id/output_block",
      body: "optional",
      handle: async (c) => {
        const id = parseSelectionIdParam(param(c, 0));
        const b = parseOutputBlockRequest(c.body ?? {}, "");
        await withCatchUp(o.mesh, () => {
          svc.addOutputBlock(id, b.decay_fraction);
        });
        return reply(200, OK);
      },
    },
    {
      method: "DELETE",
      pattern: "/reservations/:id",
      body: "none",
      handle: async (c) => {
        const id = parseSelectionIdParam(param(c, 0));
        await withCatchUp(o.mesh, () => {
          svc.freeReservation(id);
        });
        return reply(200, OK);
      },
    },
    { method: "GET", pattern: "/loads", body: "none", handle: (c) => reply(200, svc.loads(queryParam(c.query, "model_name"), queryParam(c.query, "routing_group"))) },
    { method: "POST", pattern: "/potential_loads", body: "required", prompt: true, handle: (c) => reply(200, svc.potentialLoads(parseScoreRequest(c.body, ""))) },
    { method: "POST", pattern: "/overlap_scores", body: "required", prompt: true, handle: (c) => reply(200, svc.overlapScores(parseScoreRequest(c.body, ""))) },
    {
      method: "GET",
      pattern: "/dump",
      body: "none",
      handle: (c) => {
        // kvmesh additions (the reference's /dump takes none): one partition's or one worker's index.
        const workerId = queryParam(c.query, "worker_id");
        return reply(200, svc.dump({ modelName: queryParam(c.query, "model_name"), routingGroup: queryParam(c.query, "routing_group"), workerId: workerId === undefined ? undefined : parseWorkerIdParam(workerId) }));
      },
    },
    // The reference's shape: a sorted array of endpoint strings, [] without the mesh (server.rs
    // list_peers -> Json(list_replica_peers())); Dynamo's endpoint-picker reconciler diffs it.
    { method: "GET", pattern: "/replica_sync/peers", body: "none", handle: () => reply(200, peerEndpoints(o.mesh?.listPeers() ?? [])) },
    // kvmesh addition: the per-peer detail (origin, state, last_seq, lag, gaps, snapshots, sync).
    { method: "GET", pattern: "/replica_sync/status", body: "none", handle: () => reply(200, o.mesh?.listPeers() ?? []) },
    {
      method: "POST",
      pattern: "/replica_sync/register_peer",
      body: "required",
      handle: async (c) => {
        const { endpoint } = parsePeerRequest(c.body, "");
        const added = await mesh().registerPeer(endpoint);
        return reply(added ? 201 : 200, { status: "ok", endpoint, added });
      },
    },
    {
      method: "POST",
      pattern: "/replica_sync/deregister_peer",
      body: "required",
      handle: async (c) => {
        const { endpoint } = parsePeerRequest(c.body, "");
        if (!(await mesh().deregisterPeer(endpoint))) throw new KvmeshError("KVMESH_PEER_NOT_FOUND", "peer not found");
        return reply(200, { status: "ok", endpoint, removed: true });
      },
    },
    { method: "GET", pattern: "/session_bindings/updates", body: "none", handle: (c) => bindings.updates(c.query) },
    { method: "POST", pattern: "/session_bindings", body: "required", handle: (c) => bindings.apply(c.body) },
    {
      method: "GET",
      pattern: "/metrics",
      body: "none",
      handle: async () => ({ status: 200, body: undefined, text: { body: await o.metrics.registry.metrics(), contentType: o.metrics.registry.contentType } }),
    },
    // The status page: GET / redirects to /ui, its files, and GET /ui/state (src/http/ui/).
    ...page.routes(),
  ];
}

/**
 * GET /replica_sync/peers: the endpoints of MeshControl.listPeers()'s views (mesh/membership.ts
 * PeerView; a bare string is taken as the endpoint), sorted by code unit as the reference's
 * list_replica_peers() is.
 */
export function peerEndpoints(views: readonly unknown[]): string[] {
  const out: string[] = [];
  for (const v of views) {
    const e = typeof v === "string" ? v : typeof v === "object" && v !== null ? (v as { endpoint?: unknown }).endpoint : undefined;
    if (typeof e === "string") out.push(e);
  }
  return out.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

/** Static paths resolve with one Map lookup; the four ":id" patterns are tried by segment. */
class Router {
  readonly #static = new Map<string, RouteGroup>();
  readonly #dynamic: RouteGroup[] = [];

  constructor(routes: readonly Route[]) {
    const groups = new Map<string, RouteGroup>();
    for (const r of routes) {
      let g = groups.get(r.pattern);
      if (g === undefined) {
        g = { pattern: r.pattern, parts: r.pattern.split("/").slice(1), routes: [], allow: "" };
        groups.set(r.pattern, g);
      }
      g.routes.push(r);
    }
    for (const g of groups.values()) {
      const methods: string[] = g.routes.map((r) => r.method);
      if (methods.includes("GET")) methods.push("HEAD");
      const full: RouteGroup = { ...g, allow: methods.join(", ") };
      if (g.parts.some((p) => p.startsWith(":"))) this.#dynamic.push(full);
      else this.#static.set(g.pattern, full);
    }
  }

  /** The route group for a path and its raw (still encoded) parameters, or undefined. */
  match(path: string): { group: RouteGroup; params: string[] } | undefined {
    const s = this.#static.get(path);
    if (s !== undefined) return { group: s, params: [] };
    const segs = path.split("/").slice(1);
    for (const g of this.#dynamic) {
      if (g.parts.length !== segs.length) continue;
      const params: string[] = [];
      let ok = true;
      for (let i = 0; i < segs.length && ok; i++) {
        const p = g.parts[i] as string;
        const seg = segs[i] as string;
        if (p.startsWith(":")) {
          if (seg.length === 0) ok = false;
          else params.push(seg);
        } else if (p !== seg) ok = false;
      }
      if (ok) return { group: g, params };
    }
    return undefined;
  }
}

class HttpApi {
  readonly #o: HttpServerOptions;
  readonly #log: Logger;
  readonly #router: Router;
  readonly #bindings: SessionBindingsHttp;
  readonly #page: StatusPage;
  readonly #limit: number;
  readonly #server: Server;
  /** Refused tokens are logged at most once per 10 s (a scanner must not flood the log). */
  readonly #authLog = new LogThrottle();
  #closing = false;
  #closed: Promise<void> | undefined;

  constructor(o: HttpServerOptions) {
    this.#o = o;
    this.#log = o.logger.child({ component: "http" });
    // Host replication's HTTP side (409 on its routes unless the service has a writer id).
    this.#bindings = new SessionBindingsHttp({ service: o.service, logger: this.#log.child({ component: "session-bindings" }), registry: o.metrics.registry });
    this.#page = new StatusPage({ service: o.service, mesh: o.mesh, meshSelf: o.meshSelf });
    this.#router = new Router(buildRoutes(o, this.#bindings, this.#page));
    this.#limit = o.bodyLimitBytes ?? DEFAULT_BODY_LIMIT_BYTES;
    if (!(Number.isInteger(this.#limit) && this.#limit > 0)) throw new RangeError(`bodyLimitBytes must be a positive integer, got ${this.#limit}`);
    const t = o.timeouts ?? {};
    this.#server = createServer({
      noDelay: true,
      keepAlive: true,
      requestTimeout: t.requestMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
      headersTimeout: t.headersMs ?? DEFAULT_HEADERS_TIMEOUT_MS,
      connectionsCheckingInterval: t.checkIntervalMs ?? DEFAULT_CONNECTIONS_CHECK_INTERVAL_MS,
    });
    this.#server.keepAliveTimeout = t.keepAliveMs ?? DEFAULT_KEEP_ALIVE_TIMEOUT_MS;
    // Parser-level refusals (bad framing, oversized headers, slow clients) answer JSON too.
    handleClientErrors(this.#server, this.#log);
    this.#server.on("request", (req: IncomingMessage, res: ServerResponse) => {
      void this.#handle(req, res);
    });
  }

  async listen(): Promise<RunningHttpServer> {
    const server = this.#server;
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.#o.port, this.#o.host, () => {
        server.off("error", reject);
        resolve();
      });
    });
    server.on("error", (err) => {
      this.#log.error({ err }, "http server error");
    });
    const addr = server.address() as AddressInfo;
    this.#page.start(`${addr.family === "IPv6" ? `[${addr.address}]` : addr.address}:${String(addr.port)}`);
    this.#log.info({ host: addr.address, port: addr.port }, "http api listening");
    return { host: addr.address, port: addr.port, close: () => this.close() };
  }

  close(): Promise<void> {
    this.#closed ??= new Promise<void>((resolve) => {
      this.#closing = true;
      // Open binding streams would otherwise hold the server open until the grace period cuts them.
      this.#bindings.close();
      this.#page.close();
      const timer = setTimeout(() => {
        this.#server.closeAllConnections();
      }, DEFAULT_CLOSE_GRACE_MS);
      timer.unref();
      this.#server.close(() => {
        clearTimeout(timer);
        resolve();
      });
      // Idle keep-alive sockets would otherwise hold the port for keepAliveTimeout (65 s).
      this.#server.closeIdleConnections();
    });
    return this.#closed;
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const started = performance.now();
    let label = UNMATCHED_ROUTE;
    const requestId = requestIdOf(req.headers[REQUEST_ID_HEADER]);
    res.setHeader(REQUEST_ID_HEADER, requestId);
    const tr = this.#o.tracer?.start(req.headers);
    if (tr !== undefined) res.setHeader(TRACEPARENT_HEADER, tr.traceparent);
    let answered: unknown;
    let failure: unknown;
    try {
      if (this.#closing) throw new KvmeshError("KVMESH_SHUTTING_DOWN", "server is shutting down");
      const url = req.url ?? "/";
      const q = url.indexOf("?");
      const path = q < 0 ? url : url.slice(0, q);
      const m = this.#router.match(path);
      if (m === undefined) throw new KvmeshError("KVMESH_ROUTE_NOT_FOUND", "route not found");
      label = m.group.pattern;
      const method = req.method === "HEAD" ? "GET" : req.method;
      const route = m.group.routes.find((r) => r.method === method);
      if (route === undefined) {
        this.#send(req, res, 405, stringifyJson({ error: "method not allowed", code: "KVMESH_METHOD_NOT_ALLOWED" }), JSON_CONTENT_TYPE, { allow: m.group.allow });
        return;
      }
      // Before the body is read: an unauthenticated client cannot make us buffer or parse one.
      if (this.#o.apiToken !== undefined && requiresApiToken(route.method, label)) checkBearer(req.headers.authorization, this.#o.apiToken);
      const params = m.params.map(decodeSegment);
      let body: unknown;
      if (route.body === "none") body = undefined;
      else if (tr === undefined) body = await this.#readBody(req, route.body, route.prompt === true);
      else {
        tr.bodyStartMs = performance.now();
        body = await this.#readBody(req, route.body, route.prompt === true);
        tr.bodyEndMs = performance.now();
      }
      // Peers' updates the receive thread handed over since: a decision or a view sees them all.
      this.#o.mesh?.applyReceived();
      const ctx = { params, query: q < 0 ? undefined : new URLSearchParams(url.slice(q + 1)), body, note: tr?.note };
      // A sampled request's changes carry its trace context to peers (mesh/trace-cause.ts).
      const cause = tr?.cause;
      const r = cause === undefined ? await route.handle(ctx) : await withTraceCause(cause, () => route.handle(ctx));
      answered = r.body;
      if (r.stream !== undefined) r.stream(req, res);
      else if (r.text !== undefined) this.#send(req, res, r.status, r.text.body, r.text.contentType, r.headers);
      else this.#send(req, res, r.status, stringifyJson(r.body), JSON_CONTENT_TYPE, r.headers);
    } catch (err) {
      failure = err;
      this.#sendError(req, res, err, label, requestId);
    } finally {
      const status = res.headersSent ? res.statusCode : STATUS_CLIENT_GONE;
      const ms = performance.now() - started;
      this.#o.metrics.observeRequest(label, status, ms);
      // The access log: debug only (one line per request is too much for info at thousands/s).
      if (this.#log.isLevelEnabled("debug")) {
        this.#log.debug({ request_id: requestId, method: req.method, route: label, status, duration_ms: Math.round(ms * 1_000) / 1_000, ...decisionFields(answered) }, "request");
      }
      tr?.end({ method: req.method ?? "GET", route: label, status, requestId, answered, error: failure });
    }
  }

  /** Reads and parses a JSON body; undefined when an optional body is absent. */
  async #readBody(req: IncomingMessage, mode: BodyMode, prompt: boolean): Promise<unknown> {
    const h = req.headers;
    const declared = h["content-length"] === undefined ? undefined : Number(h["content-length"]);
    const present = h["transfer-encoding"] !== undefined || (declared !== undefined && declared > 0);
    if (!present && mode === "optional") return undefined;
    if (!isJsonContentType(h)) {
      throw new KvmeshError("KVMESH_UNSUPPORTED_MEDIA_TYPE", `expected Content-Type: ${JSON_CONTENT_TYPE}, got ${h["content-type"] ?? "none"}`);
    }
    if (declared !== undefined && declared > this.#limit) throw tooLarge(this.#limit);
    // Parsed inside readBytes, while the (shared) body scratch still holds this body.
    return readBytes(req, this.#limit, (bytes) => {
      if (bytes.length === 0) {
        if (mode === "optional") return undefined;
        throw new KvmeshError("KVMESH_MALFORMED_JSON", "malformed JSON: request body is empty");
      }
      try {
        return prompt ? parseJsonBytesWithTokenIds(bytes) : parseJsonBytes(bytes);
      } catch (err) {
        if (err instanceof JsonDepthError) throw new KvmeshError("KVMESH_INVALID_FIELD", err.message, { details: { field: "body" } });
        if (err instanceof SyntaxError) throw new KvmeshError("KVMESH_MALFORMED_JSON", `malformed JSON: ${err.message}`);
        throw err;
      }
    });
  }

  #send(req: IncomingMessage, res: ServerResponse, status: number, body: string, contentType: string, extra?: Record<string, string>): void {
    if (res.headersSent || res.destroyed) return;
    const headers: Record<string, string | number> = { "content-type": contentType, "content-length": Buffer.byteLength(body), ...extra };
    // While closing, and after a refused body we stopped reading, the socket cannot be reused.
    // A refused token is answered before the body is read (401), like an oversized one (413).
    if (this.#closing || ((status === 413 || status === 401) && !req.complete)) headers.connection = "close";
    res.writeHead(status, headers);
    res.end(body);
  }

  #sendError(req: IncomingMessage, res: ServerResponse, err: unknown, route: string, requestId: string): void {
    if (err instanceof KvmeshError) {
      if (err.status >= 500 && err.status !== 503) this.#log.error({ err, route, request_id: requestId }, "request failed");
      const body: Record<string, unknown> = { error: err.message, code: err.code };
      if (err.details !== undefined) body.details = err.details;
      const auth = authFailureOf(err);
      if (auth !== null) {
        this.#o.metrics.observeUnauthorized(auth);
        this.#authLog.hit((suppressed) => {
          // Never the presented header: a near-miss token is still a secret.
          this.#log.warn({ route, method: req.method, reason: auth, remote: req.socket.remoteAddress, suppressed, request_id: requestId }, "request refused: missing or invalid API token");
        });
      }
      this.#send(req, res, err.status, stringifyJson(body), JSON_CONTENT_TYPE, auth === null ? undefined : { "www-authenticate": wwwAuthenticateFor(auth) });
      return;
    }
    if (err instanceof ClientGoneError) {
      this.#log.debug({ route, request_id: requestId }, "client closed the connection before the body was read");
      return;
    }
    // Anything else is a bug: log it with its stack, tell the client nothing about internals.
    this.#log.error({ err, route, method: req.method, request_id: requestId }, "unhandled error in HTTP handler");
    this.#send(req, res, 500, stringifyJson({ error: "internal error", code: "KVMESH_INTERNAL" }), JSON_CONTENT_TYPE);
  }
}

class ClientGoneError extends Error {}

const tooLarge = (limit: number): KvmeshError => new KvmeshError("KVMESH_BODY_TOO_LARGE", `request body exceeds the limit of ${limit} bytes`);

function isJsonContentType(h: IncomingHttpHeaders): boolean {
  const ct = h["content-type"];
  if (ct === undefined) return false;
  const semi = ct.indexOf(";");
  const mime = (semi < 0 ? ct : ct.slice(0, semi)).trim().toLowerCase();
  return mime === JSON_CONTENT_TYPE || (mime.startsWith("application/") && mime.endsWith("+json"));
}

function decodeSegment(seg: string): string {
  try {
    return decodeURIComponent(seg);
  } catch {
    throw new KvmeshError("KVMESH_BAD_REQUEST", "path: invalid percent-encoding");
  }
}

/**
 * Bodies of several chunks are joined in one shared scratch buffer rather than a fresh one each.
 * Why, measured: with a Buffer.concat per body, bench:http's ~900 flows/s of 85 KB bodies kept
 * V8 running a mark-compact every ~100 ms (12-36 in a 6 s run, --trace-gc); with the scratch,
 * 7-9, and the daemon's CPU per flow fell ~20%. The scratch is only read synchronously by `consume`.
 */
let bodyScratch = Buffer.allocUnsafeSlow(0);
/** A larger scratch is not kept: a few 8 MiB bodies must not pin 8 MiB for good. */
const MAX_KEPT_BODY_SCRATCH_BYTES = 1024 * 1024;

function joinChunks(chunks: readonly Buffer[], size: number): Buffer {
  if (chunks.length === 1) return chunks[0] as Buffer;
  let out = bodyScratch;
  if (out.length < size) {
    out = Buffer.allocUnsafeSlow(Math.max(size, 2 * out.length));
    if (out.length <= MAX_KEPT_BODY_SCRATCH_BYTES) bodyScratch = out;
  }
  let at = 0;
  for (const c of chunks) {
    c.copy(out, at);
    at += c.length;
  }
  return out.subarray(0, size);
}

/**
 * Collects the body up to `limit` bytes and hands it to `consume`, synchronously, at its end: the
 * bytes may live in the shared scratch, so `consume` must not keep a view of them (parsing copies
 * what it keeps). Past `limit`, stops reading (nothing more is buffered) and rejects with 413.
 */
function readBytes<T>(req: IncomingMessage, limit: number, consume: (bytes: Buffer) => T): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const cleanup = (): void => {
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("error", onError);
      req.off("close", onClose);
    };
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > limit) {
        cleanup();
        req.pause();
        chunks.length = 0;
        reject(tooLarge(limit));
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = (): void => {
      cleanup();
      try {
        resolve(consume(joinChunks(chunks, size)));
      } catch (err) {
        reject(err instanceof Error ? err : new Error(String(err)));
      }
    };
    const onError = (): void => {
      cleanup();
      reject(new ClientGoneError("request aborted"));
    };
    const onClose = (): void => {
      if (!req.complete) onError();
    };
    req.on("data", onData);
    req.on("end", onEnd);
    req.on("error", onError);
    req.on("close", onClose);
  });
}

/** Starts the HTTP API on host:port (port 0 picks a free port; the bound one is returned). */
export function startHttpServer(o: HttpServerOptions): Promise<RunningHttpServer> {
  return new HttpApi(o).listen();
}
