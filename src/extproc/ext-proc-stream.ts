/**
 * One ext_proc stream (one HTTP request through the gateway), as GIE's endpoint-picker protocol
 * runs it: request headers, then the body (BUFFERED: one message; FULL_DUPLEX_STREAMED: chunks,
 * answered only once the body has ended), the pick, then the response path that drives the
 * booking's lifecycle: the served endpoint moves it, the first response body chunk completes its
 * prefill, the end of the response frees it. close() frees whatever is still booked: no booking
 * outlives its stream (the core's expiry stays the last resort).
 *
 * handle() takes the stream's messages one at a time, in order (the server chains them), and
 * returns what to send back, so this file never sees gRPC.
 */
import type { Logger } from "pino";

import { isKvmeshError, KvmeshError } from "../core/index.js";
import type { Clock, SelectionService } from "../core/index.js";
import { openAIKindOfPath } from "../openai/parse-request.js";
import { LogThrottle } from "../util/log-throttle.js";
import type { EndpointPicker, PickResult, RankRef } from "./endpoint-picker.js";
import type { BookingEnd, ExtProcStats, RejectReason } from "./ext-proc-stats.js";
import {
  continueResponse,
  headerRecord,
  immediateErrorResponse,
  routedBufferedBodyResponse,
  routedHeadersResponse,
  servedEndpoint,
  streamedBodyResponses,
  subsetHint,
} from "./gateway-protocol.js";
import type { BodySendMode, ProcessingRequest, ProcessingResponse } from "./protos.js";

export type StreamService = Pick<SelectionService, "prefillComplete" | "freeReservation" | "moveReservation">;

export interface StreamContext {
  readonly picker: EndpointPicker;
  readonly service: StreamService;
  readonly stats: ExtProcStats;
  readonly logger: Logger;
  readonly maxBodyBytes: number;
  /** Monotonic ms: how long each pick takes (kvmesh_extproc_pick_duration_seconds). */
  readonly clock: Clock;
  /** One throttle per reason, shared by every stream of the server. */
  readonly rejectLogs: Map<RejectReason, LogThrottle>;
}

type Phase = "request_headers" | "request_body" | "response" | "done";

/**
 * The abort reason of every closed stream, made once: abort() without a reason builds a new
 * DOMException (with its stack) per stream, ~1% of the picker's main thread at bench:epp's
 * 150 streams.
 */
const STREAM_CLOSED = new DOMException("the ext_proc stream closed", "AbortError");

export class ExtProcStream {
  readonly #c: StreamContext;
  /**
   * Made on first use (only a tokenizer call awaits it): an AbortController and its signal per
   * stream were ~1% of the picker's main thread at bench:epp's 150 streams of token-id bodies.
   */
  #abort: AbortController | undefined;
  #closed = false;
  #phase: Phase = "request_headers";
  #requestBodyMode: BodySendMode | undefined;
  #responseBodyMode: BodySendMode | undefined;
  #headers: ReadonlyMap<string, string> = new Map();
  #subset: string[] | undefined;
  #chunks: Buffer[] = [];
  #bodyBytes = 0;
  #pick: PickResult | undefined;
  /** The live booking (a move gives it a new id); undefined once freed. */
  #selectionId: string | undefined;
  #prefillDone = false;

  constructor(context: StreamContext) {
    this.#c = context;
    context.stats.streams++;
    context.stats.activeStreams++;
  }

  /** The booking this stream holds now (tests, diagnostics). */
  get selectionId(): string | undefined {
    return this.#selectionId;
  }

  get done(): boolean {
    return this.#phase === "done";
  }

  async handle(req: ProcessingRequest): Promise<ProcessingResponse[]> {
    if (this.#phase === "done") return [];
    if (req.protocol_config !== undefined) {
      this.#requestBodyMode = req.protocol_config.request_body_mode ?? this.#requestBodyMode;
      this.#responseBodyMode = req.protocol_config.response_body_mode ?? this.#responseBodyMode;
    }
    // Observability mode wants no answers, and an endpoint picker cannot route without them.
    if (req.observability_mode === true) return [];
    try {
      switch (req.request) {
        case "request_headers":
          return await this.#requestHeaders(req);
        case "request_body":
          return await this.#requestBody(req.request_body?.body, req.request_body?.end_of_stream === true);
        case "request_trailers":
          return await this.#requestTrailers();
        case "response_headers":
          return this.#responseHeaders(req);
        case "response_body":
          return this.#responseBody(req.response_body?.body, req.response_body?.end_of_stream === true);
        case "response_trailers":
          this.#free("end_of_stream");
          return [{ response_trailers: {} }];
        case undefined:
        default:
          throw new KvmeshError("KVMESH_BAD_REQUEST", "ProcessingRequest carries none of request_headers, request_body, request_trailers, response_headers, response_body, response_trailers", { details: { field: "request" } });
      }
    } catch (err) {
      return [this.#reject(err)];
    }
  }

  /** The stream ended (Envoy closed it, the client left, an error, the server shutting down): frees what is booked. */
  close(how: BookingEnd): void {
    this.#closed = true;
    this.#abort?.abort(STREAM_CLOSED);
    if (this.#phase !== "done") {
      this.#phase = "done";
      this.#c.stats.activeStreams--;
    }
    // A stream that ends while its response has not: the client left (or Envoy reset it).
    this.#free(how === "end_of_stream" ? "cancelled" : how);
  }

  async #requestHeaders(req: ProcessingRequest): Promise<ProcessingResponse[]> {
    if (this.#phase !== "request_headers") throw new KvmeshError("KVMESH_BAD_REQUEST", "request_headers received twice on one stream", { details: { field: "request_headers" } });
    this.#headers = headerRecord(req.request_headers?.headers);
    this.#subset = subsetHint(req.metadata_context);
    if (req.request_headers?.end_of_stream === true) {
      // No body (GET /v1/models): routed now, to any ready worker.
      this.#phase = "response";
      const pick = await this.#pickNow(undefined);
      return [routedHeadersResponse(pick)];
    }
    this.#phase = "request_body";
    const mode = this.#requestBodyMode;
    if (mode === "FULL_DUPLEX_STREAMED") return []; // answered with the route once the body has ended
    if (mode === "STREAMED" || mode === "BUFFERED_PARTIAL" || mode === "GRPC") {
      throw new KvmeshError("KVMESH_INTERNAL", `ext_proc request_body_mode ${mode} cannot carry the route: configure FULL_DUPLEX_STREAMED or BUFFERED (docs/gateway.md)`, { details: { field: "request_body_mode" } });
    }
    // BUFFERED (or an Envoy that sends no protocol_config): the route rides on the body's answer.
    return [continueResponse("request_headers")];
  }

  async #requestBody(chunk: Buffer | Uint8Array | undefined, endOfStream: boolean): Promise<ProcessingResponse[]> {
    if (this.#phase !== "request_body") throw new KvmeshError("KVMESH_BAD_REQUEST", "request_body outside the request body phase", { details: { field: "request_body" } });
    if (chunk !== undefined && chunk.length > 0) {
      this.#bodyBytes += chunk.length;
      if (this.#bodyBytes > this.#c.maxBodyBytes) {
        this.#chunks = [];
        throw new KvmeshError("KVMESH_BODY_TOO_LARGE", `request body exceeds --ext-proc-max-body-bytes (${this.#c.maxBodyBytes} bytes)`, { details: { field: "body" } });
      }
      this.#chunks.push(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength));
    }
    if (!endOfStream) return this.#requestBodyMode === "FULL_DUPLEX_STREAMED" ? [] : [continueResponse("request_body")];
    return this.#route(true);
  }

  /** Trailers end a FULL_DUPLEX_STREAMED body whose last chunk did not say end_of_stream. */
  async #requestTrailers(): Promise<ProcessingResponse[]> {
    if (this.#phase !== "request_body") return [{ request_trailers: {} }];
    const out = await this.#route(false);
    return [...out, { request_trailers: {} }];
  }

  async #route(bodyEnded: boolean): Promise<ProcessingResponse[]> {
    const t0 = this.#c.clock.now();
    // One chunk (a BUFFERED body, a short streamed one) is the body as it came: no copy.
    const body = this.#chunks.length === 1 ? (this.#chunks[0] as Buffer) : Buffer.concat(this.#chunks, this.#bodyBytes);
    this.#chunks = [];
    this.#phase = "response";
    const pick = await this.#pickNow(body);
    const forwarded = pick.body ?? body;
    const out = this.#requestBodyMode === "FULL_DUPLEX_STREAMED" ? [routedHeadersResponse(pick), ...streamedBodyResponses("request_body", forwarded, bodyEnded)] : [routedBufferedBodyResponse(pick)];
    this.#c.stats.observePick(this.#c.clock.now() - t0);
    return out;
  }

  async #pickNow(body: Buffer | undefined): Promise<PickResult> {
    const kind = openAIKindOfPath(this.#headers.get(":path") ?? "");
    const signal = (): AbortSignal => {
      this.#abort ??= new AbortController();
      if (this.#closed) this.#abort.abort(STREAM_CLOSED);
      return this.#abort.signal;
    };
    const pick = await this.#c.picker.pick({ kind, headers: this.#headers, body: kind === undefined ? undefined : body, subset: this.#subset, signal });
    this.#pick = pick;
    this.#selectionId = pick.selectionId;
    // The stream was closed while the pick awaited (tokenization): its booking must not outlive it.
    if (this.#closed) this.#free("cancelled");
    return pick;
  }

  #responseHeaders(req: ProcessingRequest): ProcessingResponse[] {
    const headers = headerRecord(req.response_headers?.headers);
    const served = servedEndpoint(req.metadata_context, headers);
    const pick = this.#pick;
    if (served !== undefined && pick !== undefined && this.#selectionId !== undefined && served !== pick.destinations[0]) {
      const target = pick.targets.get(served);
      if (target === undefined) {
        this.#c.stats.servedUnknown++;
        this.#c.logger.debug({ served, destinations: pick.destinations }, "served endpoint matches no picked rank: the booking stays on the pick");
      } else {
        this.#move(target);
      }
    }
    if (req.response_headers?.end_of_stream === true) this.#free("end_of_stream");
    return [continueResponse("response_headers")];
  }

  #move(target: RankRef): void {
    const id = this.#selectionId;
    if (id === undefined) return;
    try {
      this.#selectionId = this.#c.service.moveReservation(id, target).selection_id;
      this.#c.stats.moves++;
    } catch (err) {
      this.#c.stats.lifecycleErrors++;
      this.#c.logger.debug({ err, selection_id: id }, "moving the booking to the served worker failed: it stays on the pick");
    }
  }

  #responseBody(chunk: Buffer | Uint8Array | undefined, endOfStream: boolean): ProcessingResponse[] {
    const id = this.#selectionId;
    if (!this.#prefillDone && id !== undefined) {
      this.#prefillDone = true;
      try {
        this.#c.service.prefillComplete(id);
      } catch (err) {
        this.#c.stats.lifecycleErrors++;
        this.#c.logger.debug({ err, selection_id: id }, "prefill_complete failed: the booking is gone");
      }
    }
    if (endOfStream) this.#free("end_of_stream");
    if (this.#responseBodyMode === "FULL_DUPLEX_STREAMED") {
      const b = chunk === undefined ? Buffer.alloc(0) : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
      return streamedBodyResponses("response_body", b, endOfStream);
    }
    return [continueResponse("response_body")];
  }

  #free(how: BookingEnd): void {
    const id = this.#selectionId;
    if (id === undefined) return;
    this.#selectionId = undefined;
    this.#c.stats.bookingEnded(how);
    try {
      this.#c.service.freeReservation(id);
    } catch (err) {
      this.#c.stats.lifecycleErrors++;
      this.#c.logger.debug({ err, selection_id: id }, "free failed: the booking is gone");
    }
  }

  /** An error -> its ImmediateResponse (counted and logged); the stream is done and frees what it booked. */
  #reject(err: unknown): ProcessingResponse {
    const e = isKvmeshError(err) ? err : new KvmeshError("KVMESH_INTERNAL", `endpoint picker failed: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    const reason = reasonOf(e);
    this.#c.stats.reject(reason, e.status);
    let throttle = this.#c.rejectLogs.get(reason);
    if (throttle === undefined) {
      throttle = new LogThrottle();
      this.#c.rejectLogs.set(reason, throttle);
    }
    throttle.hit((suppressed) => {
      this.#c.logger.warn({ reason, status: e.status, code: e.code, err: e.message, path: this.#headers.get(":path"), suppressed }, "ext_proc request answered locally (kvmesh_extproc_rejected_total)");
    });
    this.#free("error");
    if (this.#phase !== "done") {
      this.#phase = "done";
      this.#c.stats.activeStreams--;
    }
    return immediateErrorResponse(e);
  }
}

function reasonOf(e: KvmeshError): RejectReason {
  // eslint-disable-next-line @typescript-eslint/switch-exhaustiveness-check -- every other code is internal here
  switch (e.code) {
    case "KVMESH_BAD_REQUEST":
    case "KVMESH_MALFORMED_JSON":
    case "KVMESH_INVALID_FIELD":
      return "bad_body";
    case "KVMESH_BODY_TOO_LARGE":
      return "body_too_large";
    case "KVMESH_OVERLOADED":
      return "overloaded";
    case "KVMESH_SESSION_CONFLICT":
      return "session_conflict";
    case "KVMESH_NOT_READY":
    case "KVMESH_SHUTTING_DOWN":
    case "KVMESH_WORKER_NOT_SCHEDULABLE": {
      const field = e.details?.["field"];
      return field === "subset" ? "subset_empty" : field === "tokenizer" ? "tokenize_failed" : "no_endpoint";
    }
    default:
      return e.details?.["field"] === "request_body_mode" ? "unsupported_mode" : "internal";
  }
}
