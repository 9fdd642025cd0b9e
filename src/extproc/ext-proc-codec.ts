/**
 * The ext_proc Process call's messages, hand-coded on protobuf's wire format with upstream's field
 * numbers (envoyproxy/data-plane-api envoy/service/ext_proc/v3/external_processor.proto,
 * envoy/config/core/v3/base.proto, google/protobuf/struct.proto; our trimmed .proto files next to
 * this module list the same numbers). The objects are exactly the ones @grpc/proto-loader hands
 * over with LOAD_OPTIONS (protos.ts: snake_case, enums as names, a oneof's name in its own field,
 * absent fields absent), so the picker cannot tell the two apart; test/unit/extproc/ext-proc-codec
 * checks that on randomised messages.
 *
 * Why by hand: protobufjs decoded each 64 KiB body chunk into a message, then copied it into a
 * plain object (toObject), and encoded each echoed chunk through its writer (a copy) into a
 * finished buffer (another copy). Here a body is a view of the received bytes and a response's
 * body is copied once. Fields the picker never reads (attributes, typed metadata, a newer Envoy's
 * additions) are skipped, as protobuf skips unknown fields.
 */
import type {
  BodyMutation,
  BodySendMode,
  CommonResponse,
  HeaderMap,
  HeaderMutation,
  HeaderValue,
  HeaderValueOption,
  HttpBody,
  HttpHeaders,
  HttpTrailers,
  ImmediateResponse,
  Metadata,
  ProcessingRequest,
  ProcessingResponse,
  ProtocolConfiguration,
  Struct,
  StructValue,
} from "./protos.js";
import { WIRE_FIXED64, WIRE_LEN, WIRE_VARINT, WireError, WireReader, WireWriter } from "./protobuf-wire.js";

// ---------------------------------------------------------------- enums (upstream numbers)

const BODY_SEND_MODES: readonly BodySendMode[] = ["NONE", "STREAMED", "BUFFERED", "BUFFERED_PARTIAL", "FULL_DUPLEX_STREAMED", "GRPC"];
const APPEND_ACTIONS = ["APPEND_IF_EXISTS_OR_ADD", "ADD_IF_ABSENT", "OVERWRITE_IF_EXISTS_OR_ADD", "OVERWRITE_IF_EXISTS"] as const;
const RESPONSE_STATUSES = ["CONTINUE", "CONTINUE_AND_REPLACE"] as const;
/** envoy.type.v3.StatusCode's names: the value is the HTTP status (our http_status.proto's subset). */
const STATUS_CODES: Readonly<Record<string, number>> = {
  Empty: 0,
  OK: 200,
  BadRequest: 400,
  NotFound: 404,
  Conflict: 409,
  PayloadTooLarge: 413,
  UnprocessableEntity: 422,
  TooManyRequests: 429,
  InternalServerError: 500,
  BadGateway: 502,
  ServiceUnavailable: 503,
  GatewayTimeout: 504,
};

/** An enum number as its name, or the number itself when unknown (proto-loader's `enums: String` does the same). */
function enumName<T extends string>(names: readonly T[], n: number): T {
  return (names[n] ?? n) as T;
}

function enumNumber(names: readonly string[], v: string | number | undefined, field: string): number {
  if (typeof v === "number") return v;
  const i = names.indexOf(v ?? names[0] ?? "");
  if (i < 0) throw new WireError(`${field}: unknown enum value ${String(v)}`);
  return i;
}

const wireOf = (key: number): number => key & 7;
const fieldOf = (key: number): number => Math.floor(key / 8);

/** Reads a known field's value only when it came with the wire type its declaration gives; anything else is skipped like an unknown field. */
function expect(r: WireReader, key: number, wire: number): boolean {
  if (wireOf(key) === wire) return true;
  r.skip(wireOf(key));
  return false;
}

// ---------------------------------------------------------------- google.protobuf.Struct

function readValue(r: WireReader): StructValue {
  const v: StructValue = {};
  while (!r.done) {
    const key = r.varint();
    switch (fieldOf(key)) {
      case 1:
        if (expect(r, key, WIRE_VARINT)) {
          const n = r.int32();
          setKind(v, "nullValue");
          v.nullValue = n === 0 ? "NULL_VALUE" : (n as 0);
        }
        break;
      case 2:
        if (expect(r, key, WIRE_FIXED64)) {
          setKind(v, "numberValue");
          v.numberValue = r.double();
        }
        break;
      case 3:
        if (expect(r, key, WIRE_LEN)) {
          setKind(v, "stringValue");
          v.stringValue = r.string();
        }
        break;
      case 4:
        if (expect(r, key, WIRE_VARINT)) {
          setKind(v, "boolValue");
          v.boolValue = r.bool();
        }
        break;
      case 5:
        if (expect(r, key, WIRE_LEN)) {
          setKind(v, "structValue");
          v.structValue = readStruct(r.sub());
        }
        break;
      case 6:
        if (expect(r, key, WIRE_LEN)) {
          setKind(v, "listValue");
          v.listValue = readList(r.sub());
        }
        break;
      default:
        r.skip(wireOf(key));
    }
  }
  return v;
}

/** A oneof keeps its last member: an earlier one is dropped. */
function setKind(v: StructValue, kind: NonNullable<StructValue["kind"]>): void {
  if (v.kind !== undefined && v.kind !== kind) Reflect.deleteProperty(v, v.kind);
  v.kind = kind;
}

function readList(r: WireReader): { values?: StructValue[] } {
  const values: StructValue[] = [];
  while (!r.done) {
    const key = r.varint();
    if (fieldOf(key) === 1 && expect(r, key, WIRE_LEN)) values.push(readValue(r.sub()));
    else if (fieldOf(key) !== 1) r.skip(wireOf(key));
  }
  return values.length === 0 ? {} : { values };
}

/** A map<string, M> entry: key = 1, value = 2. */
function readMapEntry<M>(r: WireReader, readM: (r: WireReader) => M, empty: () => M): [string, M] {
  let k = "";
  let m: M | undefined;
  while (!r.done) {
    const key = r.varint();
    const f = fieldOf(key);
    if (f === 1 && expect(r, key, WIRE_LEN)) k = r.string();
    else if (f === 2 && expect(r, key, WIRE_LEN)) m = readM(r.sub());
    else if (f !== 1 && f !== 2) r.skip(wireOf(key));
  }
  return [k, m ?? empty()];
}

function readStruct(r: WireReader): Struct {
  let fields: Record<string, StructValue> | undefined;
  while (!r.done) {
    const key = r.varint();
    if (fieldOf(key) === 1 && expect(r, key, WIRE_LEN)) {
      const [k, v] = readMapEntry(r.sub(), readValue, () => ({}));
      fields ??= {};
      fields[k] = v;
    } else if (fieldOf(key) !== 1) r.skip(wireOf(key));
  }
  return fields === undefined ? {} : { fields };
}

function writeValue(w: WireWriter, v: StructValue): void {
  // Exactly one member, as the oneof `kind` (or the first member set) says.
  const kind =
    v.kind ??
    (v.nullValue !== undefined
      ? "nullValue"
      : v.numberValue !== undefined
        ? "numberValue"
        : v.stringValue !== undefined
          ? "stringValue"
          : v.boolValue !== undefined
            ? "boolValue"
            : v.structValue !== undefined
              ? "structValue"
              : v.listValue !== undefined
                ? "listValue"
                : undefined);
  switch (kind) {
    case "nullValue":
      w.varintField(1, 0);
      return;
    case "numberValue":
      w.doubleField(2, v.numberValue ?? 0);
      return;
    case "stringValue":
      w.stringField(3, v.stringValue ?? "");
      return;
    case "boolValue":
      w.boolField(4, v.boolValue ?? false);
      return;
    case "structValue": {
      const c = new WireWriter();
      writeStruct(c, v.structValue ?? {});
      w.messageField(5, c);
      return;
    }
    case "listValue": {
      const c = new WireWriter();
      for (const e of v.listValue?.values ?? []) {
        const cv = new WireWriter();
        writeValue(cv, e);
        c.messageField(1, cv);
      }
      w.messageField(6, c);
      return;
    }
    case undefined:
      return;
  }
}

function writeStruct(w: WireWriter, s: Struct): void {
  for (const [k, v] of Object.entries(s.fields ?? {})) {
    const entry = new WireWriter();
    entry.stringField(1, k);
    const vw = new WireWriter();
    writeValue(vw, v);
    entry.messageField(2, vw);
    w.messageField(1, entry);
  }
}

function structField(w: WireWriter, field: number, s: Struct | undefined): void {
  if (s === undefined) return;
  const c = new WireWriter();
  writeStruct(c, s);
  w.messageField(field, c);
}

// ---------------------------------------------------------------- envoy.config.core.v3

function readHeaderValue(r: WireReader): HeaderValue {
  const h = { key: "" } as HeaderValue;
  let keySeen = false;
  while (!r.done) {
    const key = r.varint();
    switch (fieldOf(key)) {
      case 1:
        if (expect(r, key, WIRE_LEN)) {
          h.key = r.string();
          keySeen = true;
        }
        break;
      case 2:
        if (expect(r, key, WIRE_LEN)) h.value = r.string();
        break;
      case 3:
        if (expect(r, key, WIRE_LEN)) h.raw_value = r.bytes();
        break;
      default:
        r.skip(wireOf(key));
    }
  }
  // proto-loader leaves an absent key out; the picker reads an absent key as "".
  if (!keySeen) delete (h as { key?: string }).key;
  return h;
}

function readHeaderMap(r: WireReader): HeaderMap {
  const headers: HeaderValue[] = [];
  while (!r.done) {
    const key = r.varint();
    if (fieldOf(key) === 1 && expect(r, key, WIRE_LEN)) headers.push(readHeaderValue(r.sub()));
    else if (fieldOf(key) !== 1) r.skip(wireOf(key));
  }
  return headers.length === 0 ? {} : { headers };
}

function readMetadata(r: WireReader): Metadata {
  let filter: Record<string, Struct> | undefined;
  while (!r.done) {
    const key = r.varint();
    if (fieldOf(key) === 1 && expect(r, key, WIRE_LEN)) {
      const [k, s] = readMapEntry(r.sub(), readStruct, () => ({}));
      filter ??= {};
      filter[k] = s;
    } else if (fieldOf(key) !== 1) r.skip(wireOf(key));
  }
  return filter === undefined ? {} : { filter_metadata: filter };
}

function writeHeaderValue(w: WireWriter, h: HeaderValue): void {
  if (h.key !== undefined) w.stringField(1, h.key);
  if (h.value !== undefined) w.stringField(2, h.value);
  if (h.raw_value !== undefined) w.bytesField(3, h.raw_value);
}

function writeHeaderMap(w: WireWriter, m: HeaderMap): void {
  for (const h of m.headers ?? []) {
    const c = new WireWriter();
    writeHeaderValue(c, h);
    w.messageField(1, c);
  }
}

function writeHeaderValueOption(w: WireWriter, o: HeaderValueOption): void {
  const c = new WireWriter();
  writeHeaderValue(c, o.header);
  w.messageField(1, c);
  if (o.append_action !== undefined) w.varintField(3, enumNumber(APPEND_ACTIONS, o.append_action, "append_action"));
}

function writeHeaderMutation(w: WireWriter, m: HeaderMutation): void {
  for (const o of m.set_headers ?? []) {
    const c = new WireWriter();
    writeHeaderValueOption(c, o);
    w.messageField(1, c);
  }
  for (const name of m.remove_headers ?? []) w.stringField(2, name);
}

function headerMutationField(w: WireWriter, field: number, m: HeaderMutation | undefined): void {
  if (m === undefined) return;
  const c = new WireWriter();
  writeHeaderMutation(c, m);
  w.messageField(field, c);
}

function headerMapField(w: WireWriter, field: number, m: HeaderMap | undefined): void {
  if (m === undefined) return;
  const c = new WireWriter();
  writeHeaderMap(c, m);
  w.messageField(field, c);
}

// ---------------------------------------------------------------- ProcessingRequest

function readHttpHeaders(r: WireReader): HttpHeaders {
  const out: HttpHeaders = {};
  while (!r.done) {
    const key = r.varint();
    const f = fieldOf(key);
    if (f === 1 && expect(r, key, WIRE_LEN)) out.headers = readHeaderMap(r.sub());
    else if (f === 3 && expect(r, key, WIRE_VARINT)) out.end_of_stream = r.bool();
    else if (f !== 1 && f !== 3) r.skip(wireOf(key));
  }
  return out;
}

function readHttpBody(r: WireReader): HttpBody {
  const out: HttpBody = {};
  while (!r.done) {
    const key = r.varint();
    const f = fieldOf(key);
    if (f === 1 && expect(r, key, WIRE_LEN)) out.body = r.bytes();
    else if (f === 2 && expect(r, key, WIRE_VARINT)) out.end_of_stream = r.bool();
    else if (f !== 1 && f !== 2) r.skip(wireOf(key));
  }
  return out;
}

function readHttpTrailers(r: WireReader): HttpTrailers {
  const out: HttpTrailers = {};
  while (!r.done) {
    const key = r.varint();
    if (fieldOf(key) === 1 && expect(r, key, WIRE_LEN)) out.trailers = readHeaderMap(r.sub());
    else if (fieldOf(key) !== 1) r.skip(wireOf(key));
  }
  return out;
}

function readProtocolConfig(r: WireReader): ProtocolConfiguration {
  const out: ProtocolConfiguration = {};
  while (!r.done) {
    const key = r.varint();
    const f = fieldOf(key);
    if (f === 1 && expect(r, key, WIRE_VARINT)) out.request_body_mode = enumName(BODY_SEND_MODES, r.int32());
    else if (f === 2 && expect(r, key, WIRE_VARINT)) out.response_body_mode = enumName(BODY_SEND_MODES, r.int32());
    else if (f === 3 && expect(r, key, WIRE_VARINT)) out.send_body_without_waiting_for_header_response = r.bool();
    else if (f < 1 || f > 3) r.skip(wireOf(key));
  }
  return out;
}

const REQUEST_KINDS = [undefined, undefined, "request_headers", "response_headers", "request_body", "response_body", "request_trailers", "response_trailers"] as const;

/** ProcessingRequest bytes -> the object proto-loader would hand over (bodies are views of `buf`). */
export function decodeProcessingRequest(buf: Buffer): ProcessingRequest {
  const r = new WireReader(buf);
  const out: ProcessingRequest = {};
  while (!r.done) {
    const key = r.varint();
    const f = fieldOf(key);
    switch (f) {
      case 2:
      case 3:
      case 4:
      case 5:
      case 6:
      case 7: {
        if (!expect(r, key, WIRE_LEN)) break;
        const kind = REQUEST_KINDS[f] as NonNullable<ProcessingRequest["request"]>;
        if (out.request !== undefined && out.request !== kind) Reflect.deleteProperty(out, out.request);
        out.request = kind;
        const sub = r.sub();
        if (kind === "request_headers" || kind === "response_headers") out[kind] = readHttpHeaders(sub);
        else if (kind === "request_body" || kind === "response_body") out[kind] = readHttpBody(sub);
        else out[kind] = readHttpTrailers(sub);
        break;
      }
      case 8:
        if (expect(r, key, WIRE_LEN)) out.metadata_context = readMetadata(r.sub());
        break;
      case 10:
        if (expect(r, key, WIRE_VARINT)) out.observability_mode = r.bool();
        break;
      case 11:
        if (expect(r, key, WIRE_LEN)) out.protocol_config = readProtocolConfig(r.sub());
        break;
      default:
        // 9 attributes (the picker reads none), and fields a newer Envoy adds.
        r.skip(wireOf(key));
    }
  }
  return out;
}

function writeHttpHeaders(w: WireWriter, h: HttpHeaders): void {
  headerMapField(w, 1, h.headers);
  if (h.end_of_stream !== undefined) w.boolField(3, h.end_of_stream);
}

function writeHttpBody(w: WireWriter, b: HttpBody): void {
  if (b.body !== undefined) w.bytesField(1, b.body);
  if (b.end_of_stream !== undefined) w.boolField(2, b.end_of_stream);
}

/** The object -> ProcessingRequest bytes (what Envoy sends; the benchmark's client uses it). */
export function encodeProcessingRequest(req: ProcessingRequest): Buffer {
  const w = new WireWriter();
  const kinds = ["request_headers", "response_headers", "request_body", "response_body", "request_trailers", "response_trailers"] as const;
  for (let i = 0; i < kinds.length; i++) {
    const kind = kinds[i] as (typeof kinds)[number];
    const m = req[kind];
    if (m === undefined) continue;
    const c = new WireWriter();
    if (kind === "request_headers" || kind === "response_headers") writeHttpHeaders(c, m as HttpHeaders);
    else if (kind === "request_body" || kind === "response_body") writeHttpBody(c, m as HttpBody);
    else headerMapField(c, 1, (m as HttpTrailers).trailers);
    w.messageField(i + 2, c);
  }
  if (req.metadata_context !== undefined) {
    const c = new WireWriter();
    for (const [k, s] of Object.entries(req.metadata_context.filter_metadata ?? {})) {
      const entry = new WireWriter();
      entry.stringField(1, k);
      structField(entry, 2, s);
      c.messageField(1, entry);
    }
    w.messageField(8, c);
  }
  if (req.observability_mode !== undefined) w.boolField(10, req.observability_mode);
  const pc = req.protocol_config;
  if (pc !== undefined) {
    const c = new WireWriter();
    if (pc.request_body_mode !== undefined) c.varintField(1, enumNumber(BODY_SEND_MODES, pc.request_body_mode, "request_body_mode"));
    if (pc.response_body_mode !== undefined) c.varintField(2, enumNumber(BODY_SEND_MODES, pc.response_body_mode, "response_body_mode"));
    if (pc.send_body_without_waiting_for_header_response !== undefined) c.boolField(3, pc.send_body_without_waiting_for_header_response);
    w.messageField(11, c);
  }
  return w.finish();
}

// ---------------------------------------------------------------- ProcessingResponse

function writeBodyMutation(w: WireWriter, m: BodyMutation): void {
  // The oneof: the member `mutation` names, else the one set.
  const which = m.mutation ?? (m.body !== undefined ? "body" : m.clear_body !== undefined ? "clear_body" : m.streamed_response !== undefined ? "streamed_response" : undefined);
  if (which === "body" && m.body !== undefined) w.bytesField(1, m.body);
  else if (which === "clear_body" && m.clear_body !== undefined) w.boolField(2, m.clear_body);
  else if (which === "streamed_response" && m.streamed_response !== undefined) {
    const c = new WireWriter();
    writeHttpBody(c, m.streamed_response);
    w.messageField(3, c);
  }
}

function writeCommonResponse(w: WireWriter, c: CommonResponse): void {
  if (c.status !== undefined) w.varintField(1, enumNumber(RESPONSE_STATUSES, c.status, "status"));
  headerMutationField(w, 2, c.header_mutation);
  if (c.body_mutation !== undefined) {
    const b = new WireWriter();
    writeBodyMutation(b, c.body_mutation);
    w.messageField(3, b);
  }
  if (c.clear_route_cache !== undefined) w.boolField(5, c.clear_route_cache);
}

function writeImmediateResponse(w: WireWriter, i: ImmediateResponse): void {
  const status = new WireWriter();
  const code = typeof i.status.code === "number" ? i.status.code : STATUS_CODES[i.status.code];
  if (code === undefined) throw new WireError(`immediate_response.status.code: unknown status ${String(i.status.code)}`);
  status.varintField(1, code);
  w.messageField(1, status);
  headerMutationField(w, 2, i.headers);
  if (i.body !== undefined) w.bytesField(3, i.body);
  if (i.details !== undefined) w.stringField(5, i.details);
}

/** The object -> ProcessingResponse bytes; each body is copied once. */
export function encodeProcessingResponse(res: ProcessingResponse): Buffer {
  return writeProcessingResponse(res).finish();
}

/** Largest answer kept in the transient encoder's buffer, bytes: a streamed body chunk (62,000) and its framing fit. */
const TRANSIENT_MAX_BYTES = 256 * 1024;
let transient = Buffer.allocUnsafe(0);

/**
 * encodeProcessingResponse into one buffer reused by every call: the bytes are valid until the
 * next call. For the server's serializer only: grpc-js copies what it returns into the frame it
 * writes before returning (ServerInterceptingCall.serializeMessage), so each echoed body chunk
 * costs one copy here and no 62 KB allocation (four per stream of a 220 KB body).
 */
export function encodeProcessingResponseTransient(res: ProcessingResponse): Buffer {
  return writeProcessingResponse(res).finish((length) => {
    if (length > TRANSIENT_MAX_BYTES) return Buffer.allocUnsafe(length);
    if (transient.length < length) transient = Buffer.allocUnsafe(TRANSIENT_MAX_BYTES);
    return transient;
  });
}

function writeProcessingResponse(res: ProcessingResponse): WireWriter {
  const w = new WireWriter();
  const common = [res.request_headers, res.response_headers, res.request_body, res.response_body] as const;
  for (let i = 0; i < common.length; i++) {
    const m = common[i];
    if (m === undefined) continue;
    const c = new WireWriter();
    if (m.response !== undefined) {
      const cr = new WireWriter();
      writeCommonResponse(cr, m.response);
      c.messageField(1, cr);
    }
    w.messageField(i + 1, c);
  }
  const trailers = [res.request_trailers, res.response_trailers] as const;
  for (let i = 0; i < trailers.length; i++) {
    const m = trailers[i];
    if (m === undefined) continue;
    const c = new WireWriter();
    headerMutationField(c, 1, m.header_mutation);
    w.messageField(i + 5, c);
  }
  if (res.immediate_response !== undefined) {
    const c = new WireWriter();
    writeImmediateResponse(c, res.immediate_response);
    w.messageField(7, c);
  }
  structField(w, 8, res.dynamic_metadata);
  return w;
}

function readHeaderValueOption(r: WireReader): HeaderValueOption {
  const out = {} as HeaderValueOption;
  while (!r.done) {
    const key = r.varint();
    const f = fieldOf(key);
    if (f === 1 && expect(r, key, WIRE_LEN)) out.header = readHeaderValue(r.sub());
    else if (f === 3 && expect(r, key, WIRE_VARINT)) out.append_action = enumName(APPEND_ACTIONS, r.int32());
    else if (f !== 1 && f !== 3) r.skip(wireOf(key));
  }
  return out;
}

function readHeaderMutation(r: WireReader): HeaderMutation {
  const set: HeaderValueOption[] = [];
  const remove: string[] = [];
  while (!r.done) {
    const key = r.varint();
    const f = fieldOf(key);
    if (f === 1 && expect(r, key, WIRE_LEN)) set.push(readHeaderValueOption(r.sub()));
    else if (f === 2 && expect(r, key, WIRE_LEN)) remove.push(r.string());
    else if (f !== 1 && f !== 2) r.skip(wireOf(key));
  }
  return { ...(set.length === 0 ? {} : { set_headers: set }), ...(remove.length === 0 ? {} : { remove_headers: remove }) };
}

function readCommonResponse(r: WireReader): CommonResponse {
  const out: CommonResponse = {};
  while (!r.done) {
    const key = r.varint();
    const f = fieldOf(key);
    if (f === 1 && expect(r, key, WIRE_VARINT)) out.status = enumName(RESPONSE_STATUSES, r.int32());
    else if (f === 2 && expect(r, key, WIRE_LEN)) out.header_mutation = readHeaderMutation(r.sub());
    else if (f === 3 && expect(r, key, WIRE_LEN)) {
      const b = r.sub();
      const m: BodyMutation = {};
      while (!b.done) {
        const k = b.varint();
        const bf = fieldOf(k);
        if (bf === 1 && expect(b, k, WIRE_LEN)) Object.assign(m, { mutation: "body", body: b.bytes(), clear_body: undefined, streamed_response: undefined });
        else if (bf === 2 && expect(b, k, WIRE_VARINT)) Object.assign(m, { mutation: "clear_body", clear_body: b.bool(), body: undefined, streamed_response: undefined });
        else if (bf === 3 && expect(b, k, WIRE_LEN)) Object.assign(m, { mutation: "streamed_response", streamed_response: readHttpBody(b.sub()), body: undefined, clear_body: undefined });
        else if (bf < 1 || bf > 3) b.skip(wireOf(k));
      }
      for (const k of ["body", "clear_body", "streamed_response"] as const) if (m[k] === undefined) Reflect.deleteProperty(m, k);
      out.body_mutation = m;
    } else if (f === 5 && expect(r, key, WIRE_VARINT)) out.clear_route_cache = r.bool();
    else if (f < 1 || f > 5 || f === 4) r.skip(wireOf(key));
  }
  return out;
}

const RESPONSE_KINDS = [undefined, "request_headers", "response_headers", "request_body", "response_body", "request_trailers", "response_trailers", "immediate_response"] as const;

/** ProcessingResponse bytes -> the object (what Envoy reads; the benchmark's client uses it). Immediate responses' status comes back as its number. */
export function decodeProcessingResponse(buf: Buffer): ProcessingResponse {
  const r = new WireReader(buf);
  const out: ProcessingResponse = {};
  while (!r.done) {
    const key = r.varint();
    const f = fieldOf(key);
    if (f >= 1 && f <= 7 && expect(r, key, WIRE_LEN)) {
      const kind = RESPONSE_KINDS[f] as NonNullable<ProcessingResponse["response"]>;
      if (out.response !== undefined && out.response !== kind) Reflect.deleteProperty(out, out.response);
      out.response = kind;
      const sub = r.sub();
      if (kind === "request_trailers" || kind === "response_trailers") {
        const t: { header_mutation?: HeaderMutation } = {};
        while (!sub.done) {
          const k = sub.varint();
          if (fieldOf(k) === 1 && expect(sub, k, WIRE_LEN)) t.header_mutation = readHeaderMutation(sub.sub());
          else if (fieldOf(k) !== 1) sub.skip(wireOf(k));
        }
        out[kind] = t;
      } else if (kind === "immediate_response") {
        const i = { status: { code: 0 } } as ImmediateResponse;
        while (!sub.done) {
          const k = sub.varint();
          const g = fieldOf(k);
          if (g === 1 && expect(sub, k, WIRE_LEN)) {
            const s = sub.sub();
            while (!s.done) {
              const sk = s.varint();
              if (fieldOf(sk) === 1 && expect(s, sk, WIRE_VARINT)) i.status = { code: s.int32() };
              else if (fieldOf(sk) !== 1) s.skip(wireOf(sk));
            }
          } else if (g === 2 && expect(sub, k, WIRE_LEN)) i.headers = readHeaderMutation(sub.sub());
          else if (g === 3 && expect(sub, k, WIRE_LEN)) i.body = sub.bytes();
          else if (g === 5 && expect(sub, k, WIRE_LEN)) i.details = sub.string();
          else if (g !== 1 && g !== 2 && g !== 3 && g !== 5) sub.skip(wireOf(k));
        }
        out.immediate_response = i;
      } else {
        const m: { response?: CommonResponse } = {};
        while (!sub.done) {
          const k = sub.varint();
          if (fieldOf(k) === 1 && expect(sub, k, WIRE_LEN)) m.response = readCommonResponse(sub.sub());
          else if (fieldOf(k) !== 1) sub.skip(wireOf(k));
        }
        out[kind] = m;
      }
    } else if (f === 8 && expect(r, key, WIRE_LEN)) out.dynamic_metadata = readStruct(r.sub());
    else if (f < 1 || f > 8) r.skip(wireOf(key));
  }
  return out;
}
