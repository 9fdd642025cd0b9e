/**
 * The OpenTelemetry side of request tracing (src/http/tracing.ts, types in request-trace.ts), loaded only when tracing is on.
 * Its own TracerProvider (never the global one: several daemons may share a test process), a
 * BatchSpanProcessor and the OTLP/HTTP (JSON) exporter. The parent comes from the request's own
 * `traceparent` (src/http/traceparent.ts), passed as an explicit context, so no context manager
 * or global propagator is installed.
 */
import { ROOT_CONTEXT, SpanKind, SpanStatusCode, TraceFlags, createTraceState, trace, type Attributes, type Context, type Link, type Span, type Tracer } from "@opentelemetry/api";
import { ExportResultCode, type ExportResult } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { defaultResource, resourceFromAttributes } from "@opentelemetry/resources";
import { BasicTracerProvider, BatchSpanProcessor, type ReadableSpan, type SpanExporter } from "@opentelemetry/sdk-trace-base";
import type { IncomingHttpHeaders } from "node:http";
import type { Logger } from "pino";

import type { SelectionNote } from "../core/index.js";
import { LogThrottle } from "../util/log-throttle.js";
import { decisionFields } from "./request-id.js";
import { formatTraceparent, parseTraceparent, TRACEPARENT_HEADER, TRACESTATE_HEADER } from "./traceparent.js";
import type { TraceCause } from "../util/trace-cause.js";
import type { AppliedBatch, RequestEnd, RequestTrace, RequestTracer, TracingOptions } from "./request-trace.js";

export const TRACER_NAME = "kvmesh";
const UNMATCHED_ROUTE = "unmatched";

/** Logs failed exports (at most once per 10 s: a collector that is down must not flood the log). */
class LoggingExporter implements SpanExporter {
  readonly #inner: SpanExporter;
  readonly #log: Logger;
  readonly #throttle = new LogThrottle();

  constructor(inner: SpanExporter, log: Logger) {
    this.#inner = inner;
    this.#log = log;
  }

  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    this.#inner.export(spans, (result) => {
      if (result.code !== ExportResultCode.SUCCESS) {
        this.#throttle.hit((suppressed) => {
          this.#log.warn({ err: result.error, spans: spans.length, suppressed }, "trace export failed: spans dropped");
        });
      }
      done(result);
    });
  }

  shutdown(): Promise<void> {
    return this.#inner.shutdown();
  }

  forceFlush(): Promise<void> {
    return this.#inner.forceFlush?.() ?? Promise.resolve();
  }
}

/** The caller's span context as a parent, or the root context (a new trace). */
function parentContextOf(headers: IncomingHttpHeaders): Context {
  const parent = parseTraceparent(headers[TRACEPARENT_HEADER]);
  if (parent === undefined) return ROOT_CONTEXT;
  const state = headers[TRACESTATE_HEADER];
  return trace.setSpanContext(ROOT_CONTEXT, {
    traceId: parent.traceId,
    spanId: parent.spanId,
    traceFlags: parent.flags,
    isRemote: true,
    ...(typeof state === "string" && state !== "" ? { traceState: createTraceState(state) } : {}),
  });
}

/** A KvmeshError's code (duck-typed: this module does not need the class). */
function errorCodeOf(err: unknown): string | undefined {
  if (typeof err !== "object" || err === null) return undefined;
  const code = (err as { code?: unknown }).code;
  return typeof code === "string" ? code : undefined;
}

/** The routing answer's attributes: the access log's decision fields and the chosen rank's overlap. */
export function decisionAttributes(answered: unknown, note: SelectionNote): Attributes {
  const a: Attributes = {};
  const d = decisionFields(answered);
  if (typeof d.selection_id === "string") a["kvmesh.selection_id"] = d.selection_id;
  if (typeof d.worker_id === "string") a["kvmesh.worker_id"] = d.worker_id;
  if (typeof d.dp_rank === "number") a["kvmesh.dp_rank"] = d.dp_rank;
  if (typeof answered === "object" && answered !== null && !Array.isArray(answered)) {
    const b = answered as Record<string, unknown>;
    if (typeof b.model_name === "string") a["kvmesh.model_name"] = b.model_name;
    if (typeof b.routing_group === "string") a["kvmesh.routing_group"] = b.routing_group;
    const overlap = b.overlap as { gpu?: unknown } | undefined;
    if (typeof b.block_size === "number" && b.block_size > 0 && typeof overlap?.gpu === "number") a["kvmesh.overlap_blocks"] = Math.floor(overlap.gpu / b.block_size);
    if (typeof b.effective_prefill_tokens === "number") a["kvmesh.effective_prefill_tokens"] = b.effective_prefill_tokens;
  }
  if (note.cost !== undefined) a["kvmesh.cost"] = note.cost;
  if (note.candidates !== undefined) a["kvmesh.candidates"] = note.candidates;
  if (note.session !== undefined) a["kvmesh.session.outcome"] = note.session;
  return a;
}

class OtelRequestTrace implements RequestTrace {
  readonly note: SelectionNote = {};
  readonly traceparent: string;
  readonly cause: TraceCause | undefined;
  bodyStartMs: number | undefined = undefined;
  bodyEndMs: number | undefined = undefined;
  readonly #tracer: Tracer;
  readonly #span: Span;

  constructor(tracer: Tracer, headers: IncomingHttpHeaders) {
    this.#tracer = tracer;
    this.#span = tracer.startSpan("HTTP", { kind: SpanKind.SERVER }, parentContextOf(headers));
    const sc = this.#span.spanContext();
    this.traceparent = formatTraceparent(sc.traceId, sc.spanId, sc.traceFlags);
    this.cause = (sc.traceFlags & TraceFlags.SAMPLED) === 0 ? undefined : { traceId: sc.traceId, spanId: sc.spanId, flags: sc.traceFlags };
  }

  end(info: RequestEnd): void {
    const span = this.#span;
    if (span.isRecording()) this.#record(span, info);
    span.end();
  }

  #record(span: Span, info: RequestEnd): void {
    const matched = info.route !== UNMATCHED_ROUTE;
    span.updateName(matched ? `${info.method} ${info.route}` : info.method);
    const attrs: Attributes = {
      "http.request.method": info.method,
      "http.response.status_code": info.status,
      "kvmesh.request_id": info.requestId,
      ...decisionAttributes(info.answered, this.note),
    };
    if (matched) attrs["http.route"] = info.route;
    const code = errorCodeOf(info.error);
    if (code !== undefined) attrs["kvmesh.error.code"] = code;
    // Server spans: 5xx is the server's failure, 4xx the caller's (OpenTelemetry's HTTP conventions).
    if (info.status >= 500) {
      attrs["error.type"] = code ?? String(info.status);
      span.setStatus({ code: SpanStatusCode.ERROR, ...(info.error instanceof Error ? { message: info.error.message } : {}) });
    }
    span.setAttributes(attrs);
    const parent = trace.setSpan(ROOT_CONTEXT, span);
    if (this.bodyStartMs !== undefined && this.bodyEndMs !== undefined) this.#child("kvmesh.read_body", parent, this.bodyStartMs, this.bodyEndMs);
    const n = this.note;
    if (n.chooseStartMs !== undefined) {
      // A selection that threw has a start and no end: it ends with the request.
      const select = this.#tracer.startSpan("kvmesh.select", { startTime: n.chooseStartMs }, parent);
      if (n.hashStartMs !== undefined && n.hashEndMs !== undefined) this.#child("kvmesh.prompt_hash", trace.setSpan(ROOT_CONTEXT, select), n.hashStartMs, n.hashEndMs);
      select.end(n.chooseEndMs);
    }
  }

  #child(name: string, parent: Context, startMs: number, endMs: number): void {
    this.#tracer.startSpan(name, { startTime: startMs }, parent).end(endMs);
  }
}

class OtelRequestTracer implements RequestTracer {
  readonly #provider: BasicTracerProvider;
  readonly #tracer: Tracer;

  constructor(provider: BasicTracerProvider) {
    this.#provider = provider;
    this.#tracer = provider.getTracer(TRACER_NAME);
  }

  start(headers: IncomingHttpHeaders): RequestTrace {
    return new OtelRequestTrace(this.#tracer, headers);
  }

  /**
   * A peer batch applied here that carried the requests causing it: a `kvmesh.mesh.apply` span
   * (a new trace: the apply is not part of any one request) with a link to each request's span,
   * so a trace view leads from the request on its origin to every replica that mirrored it.
   */
  batchApplied(b: AppliedBatch): void {
    const links: Link[] = b.causes.map((c) => ({ context: { traceId: c.traceId, spanId: c.spanId, traceFlags: c.flags, isRemote: true } }));
    const span = this.#tracer.startSpan(
      "kvmesh.mesh.apply",
      {
        kind: SpanKind.CONSUMER,
        links,
        attributes: {
          "kvmesh.mesh.origin": b.origin.toString(),
          "kvmesh.mesh.first_seq": b.firstSeq,
          "kvmesh.mesh.seq": b.seq,
          "kvmesh.mesh.events": b.events,
          "kvmesh.mesh.lag_ms": Math.max(0, Date.now() - b.sentAtMs),
        },
      },
      ROOT_CONTEXT,
    );
    span.end();
  }

  shutdown(): Promise<void> {
    return this.#provider.shutdown();
  }
}

/**
 * A tracer exporting to `endpoint`. The SDK still reads its own OTEL_* tuning variables
 * (OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_EXPORTER_OTLP_HEADERS, ...); the default sampler is
 * parent-based always-on, so a caller's unsampled traceparent is not recorded.
 */
export function createOtelTracer(o: TracingOptions): RequestTracer {
  const log = o.logger.child({ component: "tracing" });
  const exporter = new LoggingExporter(new OTLPTraceExporter({ url: o.endpoint }), log);
  const provider = new BasicTracerProvider({
    resource: defaultResource().merge(resourceFromAttributes({ "service.name": o.serviceName })),
    spanProcessors: [new BatchSpanProcessor(exporter)],
  });
  log.info({ endpoint: o.endpoint, service_name: o.serviceName }, "tracing on: exporting OTLP/HTTP spans");
  return new OtelRequestTracer(provider);
}
