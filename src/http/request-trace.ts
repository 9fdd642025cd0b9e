/**
 * Request tracing's types as the HTTP layer sees them, with no tracing library behind them: what
 * the server (src/http/server.ts) and the OpenTelemetry side (src/http/otel-tracer.ts) share.
 * The mesh's inbound calls `batchApplied` (MeshApplyTracer, src/util/trace-cause.ts, shared by
 * both sides).
 */
import type { IncomingHttpHeaders } from "node:http";
import type { Logger } from "pino";

import type { SelectionNote } from "../core/index.js";
import type { AppliedBatch, MeshApplyTracer, TraceCause } from "../util/trace-cause.js";

export type { AppliedBatch };

export interface TracingOptions {
  /** Where spans are POSTed (OTLP/HTTP, JSON): the full traces URL, e.g. http://collector:4318/v1/traces. */
  readonly endpoint: string;
  /** The resource's service.name. */
  readonly serviceName: string;
  readonly logger: Logger;
}

/** What the HTTP layer knows when a request ends. */
export interface RequestEnd {
  readonly method: string;
  /** The matched route pattern (the metrics label), "unmatched" for none. */
  readonly route: string;
  readonly status: number;
  readonly requestId: string;
  /** The JSON body answered, whose routing fields become attributes (decisionFields and more). */
  readonly answered: unknown;
  /** What the handler threw, if anything. */
  readonly error: unknown;
}

/** One request's span, started when its headers arrive. */
export interface RequestTrace {
  /** Handed to the selection service, which fills in the decision and its timings. */
  readonly note: SelectionNote;
  /** The `traceparent` this server answers: the trace, and its own span as the parent. */
  readonly traceparent: string;
  /** This span's context when it is sampled: the mesh batches carrying the request's changes name it. */
  readonly cause: TraceCause | undefined;
  /** performance.now() around reading and parsing the body; set by the HTTP layer. */
  bodyStartMs: number | undefined;
  bodyEndMs: number | undefined;
  end(info: RequestEnd): void;
}

export interface RequestTracer extends MeshApplyTracer {
  /** Starts a request's server span, as a child of the caller's `traceparent` when valid. */
  start(headers: IncomingHttpHeaders): RequestTrace;
  /** Exports what is queued and stops; later spans are dropped. */
  shutdown(): Promise<void>;
}
