/**
 * The Gateway API Inference Extension's endpoint-picker protocol (GIE
 * docs/proposals/004-endpoint-picker-protocol) on top of ext_proc: the names it fixes, and the
 * ProcessingResponses the picker sends. Pure: no service, no sockets.
 */
import type { KvmeshError } from "../core/index.js";
import type { HeaderMap, HeaderValueOption, Metadata, ProcessingResponse, Struct } from "./protos.js";
import { fromStruct, toStruct, type Plain } from "./struct.js";

/** The picked endpoints, `ip:port[,ip:port...]`: a request header and a dynamic-metadata key. */
export const DESTINATION_HEADER = "x-gateway-destination-endpoint";
/** Namespace of the destination in dynamic_metadata, and of the served endpoint in metadata_context. */
export const DESTINATION_NAMESPACE = "envoy.lb";
/** The endpoint that served (after the gateway's retries): metadata key, or a response header. */
export const SERVED_KEY = "x-gateway-destination-endpoint-served";
/** Where the gateway restricts the pick: metadata_context.filter_metadata[namespace][key]. */
export const SUBSET_NAMESPACE = "envoy.lb.subset_hint";
export const SUBSET_KEY = "x-gateway-destination-endpoint-subset";
/** The gateway's model rewrite (GIE InferenceModelRewrite): the body's model is replaced by it. */
export const MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite";
/** The data-parallel rank's `host:port`, which llm-d's data-parallel sidecar reads. */
export const DATA_PARALLEL_HEADER = "x-data-parallel-host-port";

/**
 * Largest body chunk the picker sends back in FULL_DUPLEX_STREAMED mode, bytes: under Envoy's
 * default 64 KiB per-stream buffer, as GIE's EPP splits its streamed body responses.
 */
export const STREAMED_BODY_CHUNK_BYTES = 62_000;

/** Lower-cased header name -> value (raw_value preferred, as current Envoys send; the last wins). */
export function headerRecord(map: HeaderMap | undefined): Map<string, string> {
  const out = new Map<string, string>();
  for (const h of map?.headers ?? []) {
    const raw = h.raw_value;
    const value = raw !== undefined && raw.length > 0 ? Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength).toString("utf8") : (h.value ?? "");
    out.set(h.key.toLowerCase(), value);
  }
  return out;
}

/** A metadata namespace as plain values (undefined when absent). */
export function metadataNamespace(md: Metadata | undefined, namespace: string): { [key: string]: Plain } | undefined {
  const s: Struct | undefined = md?.filter_metadata?.[namespace];
  return s === undefined ? undefined : fromStruct(s);
}

/**
 * The subset hint's entries (`ip` or `ip:port`), or undefined when the gateway set none. Gateways
 * write it as a list, or as one comma-separated string (a header copied into metadata); both
 * are read, as GIE's reference EPP does. An empty list is a subset that allows nothing.
 */
export function subsetHint(md: Metadata | undefined): string[] | undefined {
  const ns = metadataNamespace(md, SUBSET_NAMESPACE);
  if (ns === undefined || !(SUBSET_KEY in ns)) return undefined;
  const v = ns[SUBSET_KEY];
  const parts = typeof v === "string" ? [v] : Array.isArray(v) ? v.filter((e): e is string => typeof e === "string") : [];
  return parts.flatMap((p) => p.split(",")).map((p) => p.trim()).filter((p) => p !== "");
}

/** The served endpoint the gateway reported (metadata first, then the response header). */
export function servedEndpoint(md: Metadata | undefined, headers: ReadonlyMap<string, string>): string | undefined {
  const v = metadataNamespace(md, DESTINATION_NAMESPACE)?.[SERVED_KEY];
  const raw = typeof v === "string" ? v : headers.get(SERVED_KEY);
  const first = raw?.split(",")[0]?.trim();
  return first === undefined || first === "" ? undefined : first;
}

const overwrite = (key: string, value: string): HeaderValueOption => ({ header: { key, raw_value: Buffer.from(value, "utf8") }, append_action: "OVERWRITE_IF_EXISTS_OR_ADD" });

export interface RouteAnswer {
  /** Pick first, then fallbacks, each `ip:port`. */
  readonly destinations: readonly string[];
  /** More headers to set (the data-parallel rank, a content-length for a rewritten body). */
  readonly extraHeaders?: ReadonlyMap<string, string>;
  /** The body to forward instead of the original (model rewrite). */
  readonly body?: Buffer | undefined;
}

/** The destination header plus extras, and the same destination in dynamic metadata. */
function routing(answer: RouteAnswer): { header_mutation: { set_headers: HeaderValueOption[]; remove_headers?: string[] }; dynamic_metadata: Struct } {
  const value = answer.destinations.join(",");
  const set_headers = [overwrite(DESTINATION_HEADER, value)];
  for (const [k, v] of answer.extraHeaders ?? []) set_headers.push(overwrite(k, v));
  return { header_mutation: { set_headers }, dynamic_metadata: toStruct({ [DESTINATION_NAMESPACE]: { [DESTINATION_HEADER]: value } }) };
}

/** The request-headers answer that routes (no body, or FULL_DUPLEX_STREAMED after the body). */
export function routedHeadersResponse(answer: RouteAnswer): ProcessingResponse {
  const r = routing(answer);
  return { request_headers: { response: { header_mutation: r.header_mutation, clear_route_cache: true } }, dynamic_metadata: r.dynamic_metadata };
}

/** The request-body answer that routes (BUFFERED: header mutations apply there), with a rewritten body when given. */
export function routedBufferedBodyResponse(answer: RouteAnswer): ProcessingResponse {
  const r = routing(answer);
  const body_mutation = answer.body === undefined ? undefined : { body: answer.body };
  return { request_body: { response: { header_mutation: r.header_mutation, clear_route_cache: true, ...(body_mutation === undefined ? {} : { body_mutation }) } }, dynamic_metadata: r.dynamic_metadata };
}

/** An empty answer to one message: go on unchanged. */
export function continueResponse(kind: "request_headers" | "request_body" | "response_headers" | "response_body"): ProcessingResponse {
  return { [kind]: { response: {} } };
}

/**
 * FULL_DUPLEX_STREAMED: the body passed on as streamed chunks (at most STREAMED_BODY_CHUNK_BYTES
 * each), the last with end_of_stream. An empty body is one empty last chunk.
 */
export function streamedBodyResponses(kind: "request_body" | "response_body", body: Buffer, endOfStream: boolean): ProcessingResponse[] {
  const out: ProcessingResponse[] = [];
  for (let at = 0; at < body.length || out.length === 0; at += STREAMED_BODY_CHUNK_BYTES) {
    const chunk = body.subarray(at, Math.min(body.length, at + STREAMED_BODY_CHUNK_BYTES));
    const last = at + STREAMED_BODY_CHUNK_BYTES >= body.length;
    out.push({ [kind]: { response: { body_mutation: { streamed_response: { body: chunk, end_of_stream: last && endOfStream } } } } });
  }
  return out;
}

/** A local reply Envoy sends downstream instead of forwarding: the registry error's status and JSON body. */
export function immediateErrorResponse(err: Pick<KvmeshError, "status" | "code" | "message">): ProcessingResponse {
  const body = JSON.stringify({ error: err.message, code: err.code });
  return {
    immediate_response: {
      status: { code: err.status },
      headers: { set_headers: [overwrite("content-type", "application/json")] },
      body: Buffer.from(body, "utf8"),
      details: err.code.toLowerCase(),
    },
  };
}
