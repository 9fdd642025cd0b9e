/**
 * The .proto files are field-number compatible with upstream (envoyproxy/data-plane-api
 * envoy/service/ext_proc/v3/external_processor.proto, envoy/config/core/v3/base.proto,
 * google/protobuf/struct.proto): bytes hand-encoded here from the upstream numbers decode to the
 * right fields, and what the picker encodes carries the upstream numbers.
 */
import { describe, expect, it } from "vitest";

import { immediateErrorResponse, routedHeadersResponse, streamedBodyResponses } from "../../../src/extproc/gateway-protocol.js";
import { decodeProcessingRequest, encodeProcessingResponse } from "../../../src/extproc/ext-proc-codec.js";
import { packageDefinition, type ProcessingRequest } from "../../../src/extproc/protos.js";

// ---------------------------------------------------------------- a minimal protobuf writer/reader

const varint = (n: number): number[] => {
  const out: number[] = [];
  let v = n;
  while (v > 0x7f) {
    out.push((v & 0x7f) | 0x80);
    v = Math.floor(v / 128);
  }
  out.push(v);
  return out;
};
const tag = (field: number, wire: 0 | 2): number[] => varint(field * 8 + wire);
const len = (field: number, bytes: number[] | Buffer): number[] => [...tag(field, 2), ...varint(bytes.length), ...bytes];
const str = (field: number, s: string): number[] => len(field, [...Buffer.from(s)]);
const num = (field: number, n: number): number[] => [...tag(field, 0), ...varint(n)];

interface Field {
  field: number;
  wire: number;
  value: number | Buffer;
}
function read(buf: Buffer): Field[] {
  const out: Field[] = [];
  let at = 0;
  const v = (): number => {
    let n = 0;
    let mul = 1;
    for (;;) {
      const b = buf[at++] ?? 0;
      n += (b & 0x7f) * mul;
      mul *= 128;
      if (b < 0x80) return n;
    }
  };
  while (at < buf.length) {
    const key = v();
    const field = Math.floor(key / 8);
    const wire = key % 8;
    if (wire === 0) out.push({ field, wire, value: v() });
    else if (wire === 2) {
      const n = v();
      out.push({ field, wire, value: buf.subarray(at, at + n) });
      at += n;
    } else throw new Error(`unexpected wire type ${wire}`);
  }
  return out;
}
const sub = (fields: Field[], field: number): Buffer => {
  const f = fields.find((x) => x.field === field);
  if (f === undefined || !Buffer.isBuffer(f.value)) throw new Error(`no length-delimited field ${field}`);
  return f.value;
};

interface Codec {
  serialize(v: unknown): Buffer;
  deserialize(b: Buffer): unknown;
}
const protoLoader = (name: string): Codec => packageDefinition()[name] as unknown as Codec;
/** The picker's hand-written codec for the Process call's two messages (src/extproc/ext-proc-codec.ts). */
const handWritten = (name: string): Codec => {
  if (name === "envoy.service.ext_proc.v3.ProcessingRequest") return { serialize: () => Buffer.alloc(0), deserialize: (b) => decodeProcessingRequest(b) };
  if (name === "envoy.service.ext_proc.v3.ProcessingResponse") return { serialize: (v) => encodeProcessingResponse(v as never), deserialize: () => ({}) };
  return protoLoader(name);
};

describe.each([
  ["proto-loader", protoLoader],
  ["hand-written codec", handWritten],
])("ext_proc wire compatibility (%s)", (_label, type) => {
  it("decodes a ProcessingRequest encoded from upstream's field numbers, skipping fields it does not know", () => {
    // HeaderValue{key=1, raw_value=3}; HeaderMap{headers=1}; HttpHeaders{headers=1, end_of_stream=3}
    const header = (k: string, val: string): number[] => len(1, [...str(1, k), ...len(3, [...Buffer.from(val)])]);
    const httpHeaders = [...len(1, [...header(":path", "/v1/completions"), ...header("x-session-id", "s1")]), ...num(3, 0)];
    // Metadata{filter_metadata=1: map entry{key=1, value=2: Struct{fields=1: entry{key=1, value=2: Value{string_value=3}}}}}
    const value = str(3, "10.0.0.1:8000");
    const struct = len(1, [...str(1, "x-gateway-destination-endpoint-subset"), ...len(2, value)]);
    const metadata = len(1, [...str(1, "envoy.lb.subset_hint"), ...len(2, struct)]);
    // ProtocolConfiguration{request_body_mode=1, response_body_mode=2}: FULL_DUPLEX_STREAMED = 4
    const protocol = [...num(1, 4), ...num(2, 4)];
    const bytes = Buffer.from([...len(2, httpHeaders), ...len(8, metadata), ...len(11, protocol), ...num(10, 0), ...str(99, "a field from the future")]);
    const req = type("envoy.service.ext_proc.v3.ProcessingRequest").deserialize(bytes) as ProcessingRequest;
    expect(req.request).toBe("request_headers");
    const h = req.request_headers?.headers?.headers ?? [];
    expect(h.map((x) => [x.key, Buffer.from(x.raw_value ?? Buffer.alloc(0)).toString()])).toEqual([
      [":path", "/v1/completions"],
      ["x-session-id", "s1"],
    ]);
    expect(req.protocol_config).toEqual({ request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" });
    expect(req.metadata_context?.filter_metadata?.["envoy.lb.subset_hint"]?.fields?.["x-gateway-destination-endpoint-subset"]?.stringValue).toBe("10.0.0.1:8000");
  });

  it("decodes request_body (4), response_headers (3) and response_body (5) by their numbers", () => {
    const t = type("envoy.service.ext_proc.v3.ProcessingRequest");
    const body = t.deserialize(Buffer.from(len(4, [...len(1, [...Buffer.from("{}")]), ...num(2, 1)]))) as ProcessingRequest;
    expect(body.request).toBe("request_body");
    expect(body.request_body?.end_of_stream).toBe(true);
    expect(t.deserialize(Buffer.from(len(3, num(3, 1)))) as ProcessingRequest).toMatchObject({ request: "response_headers", response_headers: { end_of_stream: true } });
    expect((t.deserialize(Buffer.from(len(5, len(1, [0x61])))) as ProcessingRequest).request).toBe("response_body");
  });

  it("encodes the routed answer with upstream's numbers: request_headers=1 > response=1 > header_mutation=2 > set_headers=1 > header=1 > key=1/raw_value=3; clear_route_cache=5; dynamic_metadata=8", () => {
    const bytes = type("envoy.service.ext_proc.v3.ProcessingResponse").serialize(routedHeadersResponse({ destinations: ["10.0.0.1:8000", "10.0.0.2:8000"] }));
    const top = read(bytes);
    const common = read(sub(read(sub(top, 1)), 1));
    expect(common.find((f) => f.field === 5)?.value).toBe(1);
    const option = read(sub(read(sub(common, 2)), 1));
    const hv = read(sub(option, 1));
    expect(sub(hv, 1).toString()).toBe("x-gateway-destination-endpoint");
    expect(sub(hv, 3).toString()).toBe("10.0.0.1:8000,10.0.0.2:8000");
    // append_action=3: OVERWRITE_IF_EXISTS_OR_ADD = 2
    expect(option.find((f) => f.field === 3)?.value).toBe(2);
    // dynamic_metadata: Struct{fields: "envoy.lb" -> Value{struct_value=5: Struct{fields: key -> Value{string_value=3}}}}
    const entry = read(sub(read(sub(top, 8)), 1));
    expect(sub(entry, 1).toString()).toBe("envoy.lb");
    const inner = read(sub(read(sub(read(sub(entry, 2)), 5)), 1));
    expect(sub(inner, 1).toString()).toBe("x-gateway-destination-endpoint");
    expect(sub(read(sub(inner, 2)), 3).toString()).toBe("10.0.0.1:8000,10.0.0.2:8000");
  });

  it("encodes an ImmediateResponse (7) with HttpStatus.code (1) as the HTTP status, and a streamed body as body_mutation.streamed_response (3)", () => {
    const t = type("envoy.service.ext_proc.v3.ProcessingResponse");
    const imm = read(sub(read(t.serialize(immediateErrorResponse({ status: 503, code: "KVMESH_NOT_READY", message: "no" }))), 7));
    expect(read(sub(imm, 1)).find((f) => f.field === 1)?.value).toBe(503);
    expect(JSON.parse(sub(imm, 3).toString())).toEqual({ error: "no", code: "KVMESH_NOT_READY" });
    const [chunk] = streamedBodyResponses("request_body", Buffer.from("abc"), true);
    const streamed = read(sub(read(sub(read(sub(read(t.serialize(chunk)), 3)), 1)), 3));
    const sr = read(sub(streamed, 3));
    expect(sub(sr, 1).toString()).toBe("abc");
    expect(sr.find((f) => f.field === 2)?.value).toBe(1);
  });

  it("health: HealthCheckRequest.service (1) and HealthCheckResponse.status (1) by number", () => {
    expect(type("grpc.health.v1.HealthCheckRequest").deserialize(Buffer.from(str(1, "readiness")))).toEqual({ service: "readiness" });
    expect(read(type("grpc.health.v1.HealthCheckResponse").serialize({ status: "NOT_SERVING" }))).toEqual([{ field: 1, wire: 0, value: 2 }]);
  });

  it("splits a streamed body into chunks under Envoy's 64 KiB buffer, the last one ending the stream", () => {
    const body = Buffer.alloc(150_000, 7);
    const chunks = streamedBodyResponses("request_body", body, true).map((r) => r.request_body?.response?.body_mutation?.streamed_response);
    expect(chunks.length).toBe(3);
    expect(chunks.map((c) => c?.end_of_stream)).toEqual([false, false, true]);
    expect(Buffer.concat(chunks.map((c) => Buffer.from(c?.body ?? Buffer.alloc(0)))).equals(body)).toBe(true);
  });
});
