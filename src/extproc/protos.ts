/**
 * The ext_proc and gRPC health definitions, loaded at run time from the project's own .proto
 * files next to this module (src/extproc/proto/, copied to dist by `npm run build`), and the
 * TypeScript shapes of the messages as @grpc/proto-loader hands them over with LOAD_OPTIONS:
 * snake_case fields, enums as their names, bytes as Buffers, a oneof's name in its own field.
 */
import { fileURLToPath } from "node:url";

import type { ServiceDefinition } from "@grpc/grpc-js";
import { loadSync, type Options, type PackageDefinition } from "@grpc/proto-loader";

/** Where the .proto files live, relative to this module in src/ and in dist/. */
export const PROTO_DIR = fileURLToPath(new URL("./proto", import.meta.url));

export const EXT_PROC_PROTO = "envoy/service/ext_proc/v3/external_processor.proto";
export const HEALTH_PROTO = "grpc/health/v1/health.proto";
export const EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor";
export const HEALTH_SERVICE = "grpc.health.v1.Health";

export const LOAD_OPTIONS: Options = { includeDirs: [PROTO_DIR], keepCase: true, longs: String, enums: String, defaults: false, oneofs: true };

let loaded: PackageDefinition | undefined;

/** Both services' definitions, parsed once per process. */
export function packageDefinition(): PackageDefinition {
  loaded ??= loadSync([EXT_PROC_PROTO, HEALTH_PROTO], LOAD_OPTIONS);
  return loaded;
}

/** A service's method table as proto-loader defines it (the shape grpc-js's addService and clients take). */
export function serviceDefinition(name: string): ServiceDefinition {
  return packageDefinition()[name] as unknown as ServiceDefinition;
}

// ---------------------------------------------------------------- google.protobuf.Struct

export interface StructValue {
  kind?: "nullValue" | "numberValue" | "stringValue" | "boolValue" | "structValue" | "listValue";
  nullValue?: "NULL_VALUE" | 0;
  numberValue?: number;
  stringValue?: string;
  boolValue?: boolean;
  structValue?: Struct;
  listValue?: { values?: StructValue[] };
}

export interface Struct {
  fields?: Record<string, StructValue>;
}

// ---------------------------------------------------------------- envoy.config.core.v3

export interface HeaderValue {
  key: string;
  value?: string;
  raw_value?: Buffer | Uint8Array;
}

export interface HeaderValueOption {
  header: HeaderValue;
  append_action?: "APPEND_IF_EXISTS_OR_ADD" | "ADD_IF_ABSENT" | "OVERWRITE_IF_EXISTS_OR_ADD" | "OVERWRITE_IF_EXISTS";
}

export interface HeaderMap {
  headers?: HeaderValue[];
}

export interface Metadata {
  filter_metadata?: Record<string, Struct>;
}

// ---------------------------------------------------------------- envoy.service.ext_proc.v3

export type BodySendMode = "NONE" | "STREAMED" | "BUFFERED" | "BUFFERED_PARTIAL" | "FULL_DUPLEX_STREAMED" | "GRPC";

export interface ProtocolConfiguration {
  request_body_mode?: BodySendMode;
  response_body_mode?: BodySendMode;
  send_body_without_waiting_for_header_response?: boolean;
}

export interface HttpHeaders {
  headers?: HeaderMap;
  end_of_stream?: boolean;
}

export interface HttpBody {
  body?: Buffer | Uint8Array;
  end_of_stream?: boolean;
}

export interface HttpTrailers {
  trailers?: HeaderMap;
}

export type ProcessingRequestKind = "request_headers" | "response_headers" | "request_body" | "response_body" | "request_trailers" | "response_trailers";

export interface ProcessingRequest {
  request?: ProcessingRequestKind;
  request_headers?: HttpHeaders;
  response_headers?: HttpHeaders;
  request_body?: HttpBody;
  response_body?: HttpBody;
  request_trailers?: HttpTrailers;
  response_trailers?: HttpTrailers;
  metadata_context?: Metadata;
  observability_mode?: boolean;
  protocol_config?: ProtocolConfiguration;
}

export interface HeaderMutation {
  set_headers?: HeaderValueOption[];
  remove_headers?: string[];
}

export interface BodyMutation {
  mutation?: "body" | "clear_body" | "streamed_response";
  body?: Buffer | Uint8Array;
  clear_body?: boolean;
  streamed_response?: { body?: Buffer | Uint8Array; end_of_stream?: boolean };
}

export interface CommonResponse {
  status?: "CONTINUE" | "CONTINUE_AND_REPLACE";
  header_mutation?: HeaderMutation;
  body_mutation?: BodyMutation;
  clear_route_cache?: boolean;
}

export interface ImmediateResponse {
  /** The HTTP status as envoy.type.v3.StatusCode (its value is the status number). */
  status: { code: number | string };
  headers?: HeaderMutation;
  body?: Buffer | Uint8Array;
  details?: string;
}

export type ProcessingResponseKind = "request_headers" | "response_headers" | "request_body" | "response_body" | "request_trailers" | "response_trailers" | "immediate_response";

export interface ProcessingResponse {
  response?: ProcessingResponseKind;
  request_headers?: { response?: CommonResponse };
  response_headers?: { response?: CommonResponse };
  request_body?: { response?: CommonResponse };
  response_body?: { response?: CommonResponse };
  request_trailers?: { header_mutation?: HeaderMutation };
  response_trailers?: { header_mutation?: HeaderMutation };
  immediate_response?: ImmediateResponse;
  dynamic_metadata?: Struct;
}

// ---------------------------------------------------------------- grpc.health.v1

export type ServingStatus = "UNKNOWN" | "SERVING" | "NOT_SERVING" | "SERVICE_UNKNOWN";

export interface HealthCheckRequest {
  service?: string;
}

export interface HealthCheckResponse {
  status: ServingStatus;
}
