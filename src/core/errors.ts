/**
 * The single registry of kvmesh's typed errors. Every error a caller can see has a stable
 * `code` (never reworded), a coarse `kind` (the reference's SelectionServiceError kinds) and the
 * HTTP status the daemon answers with. Messages name the offending field or id.
 */

export type ErrorKind =
  | "bad_request"
  | "unprocessable"
  | "not_found"
  | "conflict"
  | "overloaded"
  | "not_ready"
  | "disabled"
  | "unauthorized"
  | "internal";

interface ErrorSpec {
  readonly kind: ErrorKind;
  readonly status: number;
  readonly description: string;
}

/** code -> (kind, HTTP status). Documented in docs/errors.md; a test keeps the two in sync. */
export const ERROR_CODES = {
  KVMESH_BAD_REQUEST: { kind: "bad_request", status: 400, description: "invalid argument (the message names the field)" },
  KVMESH_INVALID_OPTION: { kind: "bad_request", status: 400, description: "invalid daemon configuration (details.field names the option; the CLI names the flag that set it)" },
  KVMESH_MALFORMED_JSON: { kind: "bad_request", status: 400, description: "request body is not valid JSON" },
  KVMESH_INVALID_FIELD: { kind: "unprocessable", status: 422, description: "well-formed JSON of the wrong shape (the message names the field)" },
  KVMESH_UNSUPPORTED_MEDIA_TYPE: { kind: "bad_request", status: 415, description: "body is not application/json" },
  KVMESH_BODY_TOO_LARGE: { kind: "bad_request", status: 413, description: "request body exceeds the body limit" },
  KVMESH_HEADERS_TOO_LARGE: { kind: "bad_request", status: 431, description: "request headers exceed the server's limit (16 KiB)" },
  KVMESH_REQUEST_TIMEOUT: { kind: "bad_request", status: 408, description: "request headers or body not received within the server's timeout" },
  KVMESH_WORKER_NOT_FOUND: { kind: "not_found", status: 404, description: "unknown worker id" },
  KVMESH_WORKER_NOT_SCHEDULABLE: { kind: "not_found", status: 404, description: "worker or rank is not schedulable" },
  KVMESH_RESERVATION_NOT_FOUND: { kind: "not_found", status: 404, description: "unknown (or already freed) reservation id" },
  KVMESH_PENDING_SELECTION_NOT_FOUND: { kind: "not_found", status: 404, description: "no cached selection for this selection_id" },
  KVMESH_ROUTE_NOT_FOUND: { kind: "not_found", status: 404, description: "route not found" },
  KVMESH_PEER_NOT_FOUND: { kind: "not_found", status: 404, description: "peer not found" },
  KVMESH_METHOD_NOT_ALLOWED: { kind: "bad_request", status: 405, description: "method not allowed" },
  KVMESH_DUPLICATE_ID: { kind: "conflict", status: 409, description: "selection_id is already live" },
  KVMESH_CONFIG_CONFLICT: { kind: "conflict", status: 409, description: "configuration conflicts with existing state" },
  KVMESH_FLEET_LIMIT: { kind: "conflict", status: 409, description: "the registration would exceed a fleet limit: partitions or ranks (the message names the limit and the option that sets it)" },
  KVMESH_SESSION_CONFLICT: { kind: "bad_request", status: 400, description: "session is bound to another worker (hard affinity)" },
  KVMESH_OVERLOADED: { kind: "overloaded", status: 429, description: "capacity exhausted" },
  KVMESH_NOT_READY: { kind: "not_ready", status: 503, description: "no schedulable workers" },
  KVMESH_SHUTTING_DOWN: { kind: "not_ready", status: 503, description: "selection service is shutting down" },
  KVMESH_REPLICA_SYNC_DISABLED: { kind: "disabled", status: 409, description: "replica sync is disabled" },
  KVMESH_HOST_REPLICATION_DISABLED: { kind: "disabled", status: 409, description: "host replication is disabled (no session replication writer id)" },
  KVMESH_CURSOR_EXPIRED: { kind: "not_found", status: 410, description: "the stream cursor is older than the replay ring or from another process" },
  KVMESH_TRACE_INVALID: { kind: "bad_request", status: 400, description: "a trace line is malformed (the message names the line number and the field)" },
  KVMESH_UNAUTHORIZED: { kind: "unauthorized", status: 401, description: "missing or invalid API token (Authorization: Bearer, see --api-token-file)" },
  KVMESH_MESH_OPTION_INVALID: { kind: "bad_request", status: 400, description: "a replica mesh option is out of range (the message names the field)" },
  KVMESH_MESH_WIRE_INVALID: { kind: "bad_request", status: 400, description: "a mesh frame or control message failed to decode (the message names the field)" },
  KVMESH_MESH_REMOTE: { kind: "internal", status: 502, description: "a mesh peer's control handler failed, or its reply was malformed" },
  KVMESH_MESH_TIMEOUT: { kind: "not_ready", status: 504, description: "a mesh control request got no reply in time" },
  KVMESH_MESH_AUTH: { kind: "unauthorized", status: 502, description: "a CURVE mesh peer refuses our key, holds no key we list, or runs without CURVE" },
  KVMESH_MESH_CLOSED: { kind: "not_ready", status: 503, description: "the mesh transport was closed before the operation completed" },
  KVMESH_INTERNAL: { kind: "internal", status: 500, description: "internal error" },
} as const satisfies Record<string, ErrorSpec>;

export type ErrorCode = keyof typeof ERROR_CODES;

export class KvmeshError extends Error {
  readonly code: ErrorCode;
  readonly kind: ErrorKind;
  readonly status: number;
  /** Optional structured details (e.g. the field name). */
  readonly details: Readonly<Record<string, unknown>> | undefined;

  constructor(code: ErrorCode, message: string, options?: { cause?: unknown; details?: Record<string, unknown> }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    const spec: ErrorSpec = ERROR_CODES[code];
    this.name = "KvmeshError";
    this.code = code;
    this.kind = spec.kind;
    this.status = spec.status;
    this.details = options?.details;
  }
}

export const badRequest = (message: string, field?: string): KvmeshError =>
  new KvmeshError("KVMESH_BAD_REQUEST", message, field === undefined ? undefined : { details: { field } });
export const invalidField = (field: string, problem: string): KvmeshError =>
  new KvmeshError("KVMESH_INVALID_FIELD", `${field}: ${problem}`, { details: { field } });
export const isKvmeshError = (e: unknown): e is KvmeshError => e instanceof KvmeshError;
