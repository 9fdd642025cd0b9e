/**
 * The hand-written Process codec (src/extproc/ext-proc-codec.ts) against proto-loader's codec of
 * the same .proto files, on randomised messages: what proto-loader encodes, the codec decodes to
 * the same object; what the codec encodes is byte for byte what proto-loader encodes, and decodes
 * back in proto-loader to the same object. Plus malformed input and fields it does not know.
 */
import { describe, expect, it } from "vitest";

import { decodeProcessingRequest, decodeProcessingResponse, encodeProcessingRequest, encodeProcessingResponse, encodeProcessingResponseTransient } from "../../../src/extproc/ext-proc-codec.js";
import { routedBufferedBodyResponse, routedHeadersResponse, streamedBodyResponses, immediateErrorResponse } from "../../../src/extproc/gateway-protocol.js";
import { packageDefinition, type ProcessingRequest, type ProcessingResponse, type Struct, type StructValue } from "../../../src/extproc/protos.js";
import { WireError } from "../../../src/extproc/protobuf-wire.js";

interface Codec {
  serialize(v: unknown): Buffer;
  deserialize(b: Buffer): unknown;
}
const loader = (name: string): Codec => packageDefinition()[`envoy.service.ext_proc.v3.${name}`] as unknown as Codec;
const REQ = loader("ProcessingRequest");
const RES = loader("ProcessingResponse");

/** A seeded generator (mulberry32): the same messages on every run. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

class Gen {
  readonly r: () => number;
  constructor(seed: number) {
    this.r = rng(seed);
  }
  int(n: number): number {
    return Math.floor(this.r() * n);
  }
  maybe(p = 0.5): boolean {
    return this.r() < p;
  }
  pick<T>(xs: readonly T[]): T {
    return xs[this.int(xs.length)] as T;
  }
  str(max = 12): string {
    const alphabet = ["a", "b", "Z", "-", ":", "/", "0", "9", " ", "é", "→", "😀", "\u0000"];
    return Array.from({ length: this.int(max + 1) }, () => this.pick(alphabet)).join("");
  }
  bytes(max = 300): Buffer {
    // Sometimes past the writer's by-reference threshold, sometimes under it.
    const n = this.maybe(0.2) ? 600 + this.int(3_000) : this.int(max);
    const b = Buffer.allocUnsafe(n);
    for (let i = 0; i < n; i++) b[i] = this.int(256);
    return b;
  }
  value(depth: number): StructValue {
    const kinds = depth > 2 ? ["nullValue", "numberValue", "stringValue", "boolValue"] : ["nullValue", "numberValue", "stringValue", "boolValue", "structValue", "listValue"];
    switch (this.pick(kinds)) {
      case "nullValue":
        return { nullValue: "NULL_VALUE", kind: "nullValue" };
      case "numberValue":
        return { numberValue: this.pick([0, -1.5, 3, 1e300, -0.000123, 2 ** 53 + 2, this.r() * 1e6]), kind: "numberValue" };
      case "stringValue":
        return { stringValue: this.str(), kind: "stringValue" };
      case "boolValue":
        return { boolValue: this.maybe(), kind: "boolValue" };
      case "structValue":
        return { structValue: this.struct(depth + 1), kind: "structValue" };
      default: {
        const values = Array.from({ length: this.int(4) }, () => this.value(depth + 1));
        return { listValue: values.length === 0 ? {} : { values }, kind: "listValue" };
      }
    }
  }
  struct(depth = 0): Struct {
    const n = this.int(4);
    if (n === 0) return {};
    const fields: Record<string, StructValue> = {};
    for (let i = 0; i < n; i++) fields[`k${i}${this.str(4)}`] = this.value(depth);
    return { fields };
  }
  headerMap(): { headers?: { key: string; value?: string; raw_value?: Buffer }[] } {
    const n = this.int(5);
    if (n === 0) return {};
    return {
      headers: Array.from({ length: n }, () => ({
        key: this.pick([":path", ":method", "x-session-id", "content-type", this.str()]),
        ...(this.maybe(0.3) ? { value: this.str() } : {}),
        ...(this.maybe(0.8) ? { raw_value: this.bytes(40) } : {}),
      })),
    };
  }
  request(): ProcessingRequest {
    const kind = this.pick(["request_headers", "response_headers", "request_body", "response_body", "request_trailers", "response_trailers"] as const);
    const req: ProcessingRequest = { request: kind };
    if (kind === "request_headers" || kind === "response_headers") req[kind] = { headers: this.headerMap(), ...(this.maybe() ? { end_of_stream: this.maybe() } : {}) };
    else if (kind === "request_body" || kind === "response_body") req[kind] = { ...(this.maybe(0.9) ? { body: this.bytes() } : {}), ...(this.maybe() ? { end_of_stream: this.maybe() } : {}) };
    else req[kind] = this.maybe() ? { trailers: this.headerMap() } : {};
    if (this.maybe(0.4)) {
      const n = this.int(3);
      const fm: Record<string, Struct> = {};
      for (let i = 0; i < n; i++) fm[this.pick(["envoy.lb", "envoy.lb.subset_hint", this.str()])] = this.struct();
      req.metadata_context = n === 0 ? {} : { filter_metadata: fm };
    }
    if (this.maybe(0.2)) req.observability_mode = this.maybe();
    if (this.maybe(0.3)) {
      const modes = ["NONE", "STREAMED", "BUFFERED", "BUFFERED_PARTIAL", "FULL_DUPLEX_STREAMED", "GRPC"] as const;
      req.protocol_config = {
        ...(this.maybe(0.8) ? { request_body_mode: this.pick(modes) } : {}),
        ...(this.maybe(0.8) ? { response_body_mode: this.pick(modes) } : {}),
        ...(this.maybe(0.3) ? { send_body_without_waiting_for_header_response: this.maybe() } : {}),
      };
    }
    return req;
  }
  response(): ProcessingResponse {
    const dest = Array.from({ length: 1 + this.int(3) }, () => `10.0.${this.int(256)}.${this.int(256)}:${8000 + this.int(100)}`);
    const extra = new Map<string, string>(this.maybe() ? [["x-data-parallel-host-port", dest[0] as string]] : []);
    switch (this.int(7)) {
      case 0:
        return routedHeadersResponse({ destinations: dest, extraHeaders: extra });
      case 1:
        return routedBufferedBodyResponse({ destinations: dest, extraHeaders: extra, body: this.maybe() ? this.bytes() : undefined });
      case 2:
        return this.pick(streamedBodyResponses(this.pick(["request_body", "response_body"] as const), this.bytes(300), this.maybe()));
      case 3:
        return immediateErrorResponse({ status: this.pick([400, 413, 429, 500, 503]), code: "KVMESH_NOT_READY", message: this.str(40) });
      case 4:
        return { [this.pick(["request_headers", "response_headers", "request_body", "response_body"])]: { response: this.maybe() ? { status: this.pick(["CONTINUE", "CONTINUE_AND_REPLACE"] as const) } : {} } };
      case 5:
        return { [this.pick(["request_trailers", "response_trailers"])]: this.maybe() ? { header_mutation: { set_headers: [{ header: { key: "k", value: this.str() }, append_action: "ADD_IF_ABSENT" }], remove_headers: [this.str(), "x"] } } : {} };
      default:
        return {
          request_body: { response: { header_mutation: { remove_headers: ["a"] }, body_mutation: this.pick([{ clear_body: this.maybe() }, { body: this.bytes() }]), clear_route_cache: this.maybe() } },
          dynamic_metadata: this.struct(),
        };
    }
  }
}

/** proto-loader's view of a response: an ImmediateResponse's status as its enum name; the codec's decoder gives the number. */
function statusAsNumber(o: unknown): unknown {
  const r = o as ProcessingResponse;
  if (r.immediate_response === undefined) return o;
  const names: Record<string, number> = { BadRequest: 400, PayloadTooLarge: 413, TooManyRequests: 429, InternalServerError: 500, ServiceUnavailable: 503 };
  const code = r.immediate_response.status.code;
  return { ...r, immediate_response: { ...r.immediate_response, status: { code: typeof code === "string" ? names[code] : code } } };
}

const RUNS = 200;

describe("ext_proc Process codec", () => {
  it("decodes what proto-loader encodes into the same ProcessingRequest, on randomised messages", () => {
    const g = new Gen(1);
    for (let i = 0; i < RUNS; i++) {
      const req = g.request();
      const bytes = REQ.serialize(req);
      expect(decodeProcessingRequest(bytes), `message ${i}`).toEqual(REQ.deserialize(bytes));
    }
  });

  it("encodes a ProcessingRequest to proto-loader's bytes, on randomised messages", () => {
    const g = new Gen(2);
    for (let i = 0; i < RUNS; i++) {
      const req = g.request();
      const ours = encodeProcessingRequest(req);
      expect(ours.equals(REQ.serialize(req)), `message ${i}`).toBe(true);
      expect(REQ.deserialize(ours)).toEqual(decodeProcessingRequest(ours));
    }
  });

  it("encodes a ProcessingResponse to proto-loader's bytes, and decodes them back, on randomised messages", () => {
    const g = new Gen(3);
    for (let i = 0; i < RUNS; i++) {
      const res = g.response();
      const ours = encodeProcessingResponse(res);
      expect(ours.equals(RES.serialize(res)), `message ${i}`).toBe(true);
      expect(decodeProcessingResponse(ours)).toEqual(statusAsNumber(RES.deserialize(ours)));
    }
  });

  it("the transient encoder (the server's serializer) writes the same bytes, into one buffer reused by the next call", () => {
    const g = new Gen(4);
    for (let i = 0; i < RUNS; i++) {
      const res = g.response();
      expect(encodeProcessingResponseTransient(res).equals(encodeProcessingResponse(res)), `message ${i}`).toBe(true);
    }
    const chunk = (fill: number): ProcessingResponse => ({ request_body: { response: { body_mutation: { streamed_response: { body: Buffer.alloc(62_000, fill), end_of_stream: false } } } } });
    const first = encodeProcessingResponseTransient(chunk(1));
    const copy = Buffer.from(first);
    const second = encodeProcessingResponseTransient(chunk(2));
    expect(second.buffer).toBe(first.buffer);
    expect(first.equals(copy)).toBe(false);
    expect(second.equals(encodeProcessingResponse(chunk(2)))).toBe(true);
    // Past its bound, a fresh buffer each call.
    const big = encodeProcessingResponseTransient({ request_body: { response: { body_mutation: { body: Buffer.alloc(300_000, 3) } } } });
    expect(big.buffer).not.toBe(second.buffer);
  });

  it("hands a body out as a view of the received bytes, not a copy", () => {
    const body = Buffer.alloc(65_536, 7);
    const bytes = REQ.serialize({ request_body: { body, end_of_stream: true } });
    const req = decodeProcessingRequest(bytes);
    const got = req.request_body?.body as Buffer;
    expect(got.equals(body)).toBe(true);
    expect(got.buffer).toBe(bytes.buffer);
  });

  it("skips fields it does not know, of every wire type (attributes, a newer Envoy's additions)", () => {
    // attributes = 9: map<string, Struct>; 99 varint; 98 fixed64; 97 fixed32; 96 bytes
    const base = REQ.serialize({ request_body: { body: Buffer.from("{}"), end_of_stream: true } });
    const unknown = Buffer.from([0x4a, 0x04, 0x0a, 0x02, 0x61, 0x62, 0x98, 0x06, 0x96, 0x01, 0x91, 0x06, 1, 2, 3, 4, 5, 6, 7, 8, 0x8d, 0x06, 1, 2, 3, 4, 0x82, 0x06, 0x01, 0x00]);
    const req = decodeProcessingRequest(Buffer.concat([unknown, base]));
    expect(req).toEqual({ request: "request_body", request_body: { body: Buffer.from("{}"), end_of_stream: true } });
  });

  it("refuses truncated and malformed messages with a WireError (grpc-js answers INTERNAL), never a wrong object", () => {
    const bytes = REQ.serialize({ request_body: { body: Buffer.alloc(100, 1), end_of_stream: true } });
    for (const cut of [1, 2, 3, 50, bytes.length - 1]) expect(() => decodeProcessingRequest(bytes.subarray(0, cut)), `cut at ${cut}`).toThrow(WireError);
    // wire type 3 (a proto2 group) and a varint of 11 bytes
    expect(() => decodeProcessingRequest(Buffer.from([0x0b]))).toThrow(WireError);
    expect(() => decodeProcessingRequest(Buffer.from([0x50, ...Array<number>(10).fill(0xff), 0x01]))).toThrow(WireError);
  });

  it("reads a known field sent with another wire type as unknown (skipped), as protobuf parsers must not misread it", () => {
    // request_body (4) as a varint, then a real response_body (5)
    const bytes = Buffer.concat([Buffer.from([0x20, 0x01]), REQ.serialize({ response_body: { end_of_stream: true } })]);
    expect(decodeProcessingRequest(bytes)).toEqual({ request: "response_body", response_body: { end_of_stream: true } });
  });

  it("keeps an unknown enum number as the number, as proto-loader does", () => {
    const bytes = Buffer.from([0x5a, 0x02, 0x08, 0x09]);
    expect(decodeProcessingRequest(bytes)).toEqual(REQ.deserialize(bytes));
    expect(decodeProcessingRequest(bytes).protocol_config?.request_body_mode).toBe(9);
  });

  it("refuses to encode an ImmediateResponse status it has no number for", () => {
    expect(() => encodeProcessingResponse({ immediate_response: { status: { code: "Teapot" } } })).toThrow(WireError);
  });
});
