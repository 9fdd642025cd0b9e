/**
 * The daemon's HTTP API (the reference selection service's routes and JSON shapes) on bare
 * node:http. This file is the shell: listening, closing, authentication, request ids, tracing,
 * error mapping and dispatch. The routes are in groups under src/http/routes/ (workers,
 * selection, reservations, peers, bindings, ops), and the status page's in src/http/ui/.
 *
 * Why not fastify (the usual choice): (1) its body parser is JSON.parse, which on
 * Node 20 silently rounds 64-bit worker ids and hashes (2^64-1 -> 18446744073709552000), and
 * swapping it for our lossless parser leaves ajv validating a shape (bigint) it cannot describe;
 * (2) its default ajv is lenient (strips unknown fields, coerces "7" to 7), the opposite of the
 * strict API we want; (3) it measured below bare node:http on the same host. What fastify would
 * buy (routing, 503 on close, graceful close) is ~150 lines here, and handlers stay thin:
 * parse -> validate -> call the service -> stringify.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Logger } from "pino";

import { badRequest, KvmeshError } from "../core/index.js";
import type { SelectionService } from "../core/index.js";
import { LogThrottle } from "../util/log-throttle.js";
import { withTraceCause } from "../util/trace-cause.js";
import { authFailureOf, checkBearer, requiresApiToken, wwwAuthenticateFor, type ApiToken } from "./auth.js";
import { handleClientErrors } from "./client-error.js";
import { stringifyJson } from "./json.js";
import type { MeshControl } from "./mesh-control.js";
import type { KvIngestHealth } from "./readiness.js";
import { limitConnections, type ConnectionLimits } from "./connection-limits.js";
import type { HttpMetrics } from "./metrics.js";
import { MAX_PIPELINED_WAITING, PipelineGate } from "./pipeline.js";
import { ClientGoneError, JSON_CONTENT_TYPE, readJsonBody } from "./request-body.js";
import { decisionFields, REQUEST_ID_HEADER, requestIdOf } from "./request-id.js";
import type { RequestTracer } from "./request-trace.js";
import type { Route } from "./route.js";
import { decodeSegment, Router } from "./router.js";
import { bindingRoutes } from "./routes/bindings.js";
import { opsRoutes } from "./routes/ops.js";
import { peerRoutes } from "./routes/peers.js";
import { reservationRoutes } from "./routes/reservations.js";
import { selectionRoutes } from "./routes/selection.js";
import { workerRoutes } from "./routes/workers.js";
import { SessionBindingsHttp } from "./session-bindings.js";
import { TRACEPARENT_HEADER } from "./traceparent.js";
import { StatusPage, type UiMeshSelf } from "./ui/ui-routes.js";

/** What this server drives of the mesh (src/http/mesh-control.ts). */
export type { MeshControl };

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
  /** The KV ingest thread's life, which GET /ready reports (src/http/readiness.ts); unset without one. */
  kvIngest?: KvIngestHealth | undefined;
  /** Bearer token for state-changing routes (src/http/auth.ts); unset: no authentication. */
  apiToken?: ApiToken | undefined;
  /** What the status page (GET /ui) shows of this replica's mesh; unset without one. */
  meshSelf?: (() => UiMeshSelf) | undefined;
  /** Request tracing (src/http/tracing.ts); unset: off, and a request pays one undefined check. */
  tracer?: RequestTracer | undefined;
  /** Connection caps (src/http/connection-limits.ts); unset: none (tests, the library). */
  connections?: ConnectionLimits | undefined;
}

export interface RunningHttpServer {
  readonly host: string;
  readonly port: number;
  close(): Promise<void>;
}

/** nginx's "client closed request": the client left before we could answer. */
const STATUS_CLIENT_GONE = 499;
const UNMATCHED_ROUTE = "unmatched";

/** Every route, by group (src/http/routes/; the status page's own in src/http/ui/). */
function buildRoutes(o: HttpServerOptions, bindings: SessionBindingsHttp, page: StatusPage): Route[] {
  const svc = o.service;
  return [
    ...workerRoutes(svc, o.mesh),
    ...selectionRoutes(svc),
    ...reservationRoutes(svc, o.mesh),
    ...peerRoutes(o.mesh),
    ...bindingRoutes(bindings),
    ...opsRoutes(svc, o.mesh, o.metrics, page, o.kvIngest),
  ];
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
  readonly #pipelineLog = new LogThrottle();
  readonly #connectionLog = new LogThrottle();
  /** Pipelined requests answered a few at a time per socket (src/http/pipeline.ts). */
  readonly #pipeline: PipelineGate;
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
    if (!(Number.isInteger(this.#limit) && this.#limit > 0)) throw badRequest(`bodyLimitBytes must be a positive integer, got ${this.#limit}`, "bodyLimitBytes");
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
    this.#pipeline = new PipelineGate((socket) => {
      o.metrics.observePipelineOverflow();
      this.#pipelineLog.hit((suppressed) => {
        this.#log.warn({ remote: socket.remoteAddress, suppressed }, `connection closed: more than ${String(MAX_PIPELINED_WAITING)} pipelined requests waiting for their answers to be read (kvmesh_http_pipeline_overflow_total)`);
      });
    });
    if (o.connections !== undefined) {
      const limits = o.connections;
      limitConnections(this.#server, limits, (reason, remote) => {
        o.metrics.observeConnectionRefused(reason);
        this.#connectionLog.hit((suppressed) => {
          this.#log.warn({ reason, remote, max_connections: limits.max, max_connections_per_client: limits.perClient, suppressed }, "connection refused: at the connection cap (kvmesh_http_connections_refused_total)");
        });
      });
    }
    this.#server.on("request", (req: IncomingMessage, res: ServerResponse) => {
      this.#pipeline.admit(req, res, () => void this.#handle(req, res));
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
      else if (tr === undefined) body = await readJsonBody(req, route.body, route.prompt === true, this.#limit);
      else {
        tr.bodyStartMs = performance.now();
        body = await readJsonBody(req, route.body, route.prompt === true, this.#limit);
        tr.bodyEndMs = performance.now();
      }
      const ctx = { params, query: q < 0 ? undefined : new URLSearchParams(url.slice(q + 1)), body, note: tr?.note };
      // A sampled request's changes carry its trace context to peers (src/util/trace-cause.ts).
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

/** Starts the HTTP API on host:port (port 0 picks a free port; the bound one is returned). */
export function startHttpServer(o: HttpServerOptions): Promise<RunningHttpServer> {
  return new HttpApi(o).listen();
}
