/**
 * A test-only client that plays Envoy's ext_proc filter against kvmesh's picker, written from the
 * upstream protocol (envoy/service/ext_proc/v3/external_processor.proto and GIE's endpoint-picker
 * protocol): it opens a Process stream, sends ProcessingRequests as Envoy does (headers with
 * raw_value, protocol_config on the first message, body chunks, metadata_context) and reads the
 * ProcessingResponses in order.
 */
import { ChannelCredentials, makeGenericClientConstructor, type ChannelOptions, type Client, type ClientDuplexStream, type ServiceDefinition } from "@grpc/grpc-js";

import { extProcServiceDefinition } from "../../src/extproc/ext-proc-service.js";
import { EXT_PROC_SERVICE, HEALTH_SERVICE, serviceDefinition, type BodySendMode, type HealthCheckResponse, type ProcessingRequest, type ProcessingResponse, type Struct } from "../../src/extproc/protos.js";
import { toStruct, type Plain } from "../../src/extproc/struct.js";

type Process = () => ClientDuplexStream<ProcessingRequest, ProcessingResponse>;

function clientFor(definition: ServiceDefinition, service: string, address: string, credentials: ChannelCredentials, options: ChannelOptions): Client & Record<string, unknown> {
  const Ctor = makeGenericClientConstructor(definition, service);
  return new Ctor(address, credentials, options);
}

/** Envoy's default HTTP/2 receive windows (initial_stream_window_size, initial_connection_window_size), bytes. */
export const ENVOY_DEFAULT_WINDOW_BYTES = 256 * 1024 * 1024;

export interface EnvoyClientOptions {
  /**
   * `proto-loader` (the default): messages through protobufjs, independent of the picker's own
   * codec, so tests cross-check it. `hand`: the picker's codec (ext-proc-codec.ts), cheaper: the
   * benchmark's client shares the cores with the picker it measures.
   */
  readonly codec?: "proto-loader" | "hand";
  /** The client's HTTP/2 receive windows, bytes (grpc-js: 64 KiB; Envoy: ENVOY_DEFAULT_WINDOW_BYTES). */
  readonly receiveWindowBytes?: number;
  /**
   * Make sendFlushed() resolve when a message has left for the socket, past HTTP/2 flow control.
   * grpc-js otherwise copies each message into its retry buffer (256 KiB per call) and calls the
   * write callback on the next tick, before anything is sent; with that buffer at 0 (and retries
   * off, as Envoy's ext_proc client has none) the callback waits for the HTTP/2 stream's write.
   */
  readonly flushCallbacks?: boolean;
}

export const rawHeaders = (h: Record<string, string>): { headers: { key: string; raw_value: Buffer }[] } => ({ headers: Object.entries(h).map(([key, v]) => ({ key, raw_value: Buffer.from(v) })) });

export const filterMetadata = (ns: Record<string, { [k: string]: Plain }>): { filter_metadata: Record<string, Struct> } => ({
  filter_metadata: Object.fromEntries(Object.entries(ns).map(([k, v]) => [k, toStruct(v)])),
});

/** One Process stream: send() what Envoy sends, next() the picker's answers in order. */
export class EnvoyStream {
  readonly call: ClientDuplexStream<ProcessingRequest, ProcessingResponse>;
  readonly #queue: ProcessingResponse[] = [];
  readonly #waiters: ((r: ProcessingResponse | Error) => void)[] = [];
  ended = false;
  error: Error | undefined;

  constructor(call: ClientDuplexStream<ProcessingRequest, ProcessingResponse>) {
    this.call = call;
    call.on("data", (r: ProcessingResponse) => {
      const w = this.#waiters.shift();
      if (w !== undefined) w(r);
      else this.#queue.push(r);
    });
    const fail = (e: Error): void => {
      this.error = e;
      for (const w of this.#waiters.splice(0)) w(e);
    };
    call.on("error", fail);
    call.on("end", () => {
      this.ended = true;
      fail(new Error("stream ended"));
    });
  }

  send(req: ProcessingRequest): void {
    this.call.write(req);
  }

  /**
   * send(), resolving with performance.now() at the message's write callback: once it has been
   * written out past flow control when the client was made with `flushCallbacks`, else as soon
   * as grpc-js has buffered it.
   */
  sendFlushed(req: ProcessingRequest): Promise<number> {
    return new Promise((resolve) => {
      this.call.write(req, () => {
        resolve(performance.now());
      });
    });
  }

  next(timeoutMs = 10_000): Promise<ProcessingResponse> {
    const queued = this.#queue.shift();
    if (queued !== undefined) return Promise.resolve(queued);
    if (this.error !== undefined) return Promise.reject(this.error);
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => {
        reject(new Error("no ProcessingResponse in time"));
      }, timeoutMs);
      this.#waiters.push((r) => {
        clearTimeout(t);
        if (r instanceof Error) reject(r);
        else resolve(r);
      });
    });
  }

  /** Responses queued now (after the caller has awaited what it expects). */
  get queued(): number {
    return this.#queue.length;
  }

  end(): void {
    this.call.end();
  }

  cancel(): void {
    this.call.cancel();
  }
}

export interface RequestOptions {
  readonly path?: string;
  readonly method?: string;
  readonly headers?: Record<string, string>;
  readonly metadata?: Record<string, { [k: string]: Plain }>;
  readonly requestBodyMode?: BodySendMode;
  readonly responseBodyMode?: BodySendMode;
}

export class EnvoyClient {
  readonly #ext: Client & Record<string, unknown>;
  readonly #health: Client & Record<string, unknown>;

  constructor(address: string, credentials: ChannelCredentials = ChannelCredentials.createInsecure(), options: EnvoyClientOptions = {}) {
    const channel: ChannelOptions = {
      ...(options.receiveWindowBytes === undefined ? {} : { "grpc-node.flow_control_window": options.receiveWindowBytes }),
      ...(options.flushCallbacks === true ? { "grpc.enable_retries": 0, "grpc.per_rpc_retry_buffer_size": 0 } : {}),
    };
    const ext = options.codec === "hand" ? extProcServiceDefinition() : serviceDefinition(EXT_PROC_SERVICE);
    this.#ext = clientFor(ext, EXT_PROC_SERVICE, address, credentials, channel);
    this.#health = clientFor(serviceDefinition(HEALTH_SERVICE), HEALTH_SERVICE, address, credentials, channel);
  }

  open(): EnvoyStream {
    return new EnvoyStream((this.#ext["Process"] as Process).call(this.#ext));
  }

  /** The first message of a stream: request headers, with protocol_config and the metadata context. */
  headers(stream: EnvoyStream, o: RequestOptions & { endOfStream?: boolean }): void {
    stream.send({
      request_headers: {
        headers: rawHeaders({ ":method": o.method ?? "POST", ":path": o.path ?? "/v1/completions", ":authority": "gateway", "content-type": "application/json", ...o.headers }),
        end_of_stream: o.endOfStream === true,
      },
      ...(o.metadata === undefined ? {} : { metadata_context: filterMetadata(o.metadata) }),
      protocol_config: { request_body_mode: o.requestBodyMode ?? "FULL_DUPLEX_STREAMED", response_body_mode: o.responseBodyMode ?? "FULL_DUPLEX_STREAMED" },
    });
  }

  /** The body as Envoy streams it: chunks of `chunkBytes`, the last with end_of_stream. */
  body(stream: EnvoyStream, body: Buffer, chunkBytes = body.length): void {
    if (body.length === 0) stream.send({ request_body: { body: Buffer.alloc(0), end_of_stream: true } });
    for (let at = 0; at < body.length; at += chunkBytes) stream.send({ request_body: { body: body.subarray(at, at + chunkBytes), end_of_stream: at + chunkBytes >= body.length } });
  }

  check(service: string): Promise<HealthCheckResponse> {
    return new Promise((resolve, reject) => {
      (this.#health["Check"] as (req: unknown, cb: (err: Error | null, res: HealthCheckResponse) => void) => void).call(this.#health, { service }, (err, res) => {
        if (err !== null) reject(err);
        else resolve(res);
      });
    });
  }

  watch(service: string): NodeJS.ReadableStream & { cancel(): void } {
    return (this.#health["Watch"] as (req: unknown) => NodeJS.ReadableStream & { cancel(): void }).call(this.#health, { service });
  }

  close(): void {
    this.#ext.close();
    this.#health.close();
  }
}

/** The destination header's value in a routed answer (headers answer, or buffered body answer). */
export function destinationOf(r: ProcessingResponse): string | undefined {
  const common = r.request_headers?.response ?? r.request_body?.response;
  const h = common?.header_mutation?.set_headers?.find((o) => o.header.key === "x-gateway-destination-endpoint");
  const raw = h?.header.raw_value;
  return raw === undefined ? h?.header.value : Buffer.from(raw).toString("utf8");
}

export function setHeader(r: ProcessingResponse, key: string): string | undefined {
  const common = r.request_headers?.response ?? r.request_body?.response;
  const h = common?.header_mutation?.set_headers?.find((o) => o.header.key === key);
  const raw = h?.header.raw_value;
  return raw === undefined ? h?.header.value : Buffer.from(raw).toString("utf8");
}
