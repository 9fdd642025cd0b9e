/**
 * The mesh's errors. Each is a KvmeshError with a code from the one registry (src/core/errors.ts),
 * so a caller (HTTP, CLI, logs) sees a stable code; the class names stay for `instanceof` and for
 * the `name` a log line shows.
 */
import { KvmeshError } from "../src/core/index.js";
import type { KeyLookupOutcome } from "./curve-key-directory.js";

/** A replica mesh option out of range; `details.field` names it. */
export class MeshOptionError extends KvmeshError {
  readonly field: string;
  constructor(field: string, problem: string) {
    super("KVMESH_MESH_OPTION_INVALID", `${field}: ${problem}`, { details: { field } });
    this.name = "MeshOptionError";
    this.field = field;
  }
}

/** A frame or control message that failed to decode; `field` is the path in the TS shape. */
export class MeshWireError extends KvmeshError {
  /** Path of the offending field in the TS shape, e.g. `events[3].event.sequence_hashes`. */
  readonly field: string;
  /** Whether a bound was passed (a count, a length), as opposed to a wrong type or value. */
  readonly overBound: boolean;
  constructor(field: string, problem: string, options?: { cause?: unknown; overBound?: boolean }) {
    super("KVMESH_MESH_WIRE_INVALID", `${field}: ${problem}`, { ...(options?.cause === undefined ? {} : { cause: options.cause }), details: { field } });
    this.name = "MeshWireError";
    this.field = field;
    this.overBound = options?.overBound === true;
  }
}

/** The transport was closed before the operation completed. */
export class MeshClosedError extends KvmeshError {
  constructor(what: string) {
    super("KVMESH_MESH_CLOSED", `mesh transport closed: ${what}`);
    this.name = "MeshClosedError";
  }
}

export class MeshRequestTimeoutError extends KvmeshError {
  readonly endpoint: string;
  readonly timeoutMs: number;
  constructor(endpoint: string, timeoutMs: number) {
    super("KVMESH_MESH_TIMEOUT", `control request to ${endpoint} got no reply within ${timeoutMs} ms`, { details: { endpoint } });
    this.name = "MeshRequestTimeoutError";
    this.endpoint = endpoint;
    this.timeoutMs = timeoutMs;
  }
}

/** The peer's control handler failed (an ERR reply), or its reply was malformed. */
export class MeshRemoteError extends KvmeshError {
  readonly endpoint: string;
  constructor(endpoint: string, message: string) {
    super("KVMESH_MESH_REMOTE", message, { details: { endpoint } });
    this.name = "MeshRemoteError";
    this.endpoint = endpoint;
  }
}

/** Why a CURVE request or connection could not be made (see curve-key-directory.ts). */
export type MeshAuthFailure = Exclude<KeyLookupOutcome, "found" | "unreachable">;

/** A CURVE peer refused our key, holds no key we list, or runs without CURVE. */
export class MeshAuthError extends KvmeshError {
  readonly endpoint: string;
  readonly reason: MeshAuthFailure;
  constructor(endpoint: string, reason: MeshAuthFailure) {
    const why: Record<MeshAuthFailure, string> = {
      rejected: "refuses our CURVE key (our .pub is not in its --mesh-allow)",
      not_listed: "holds no CURVE key listed in --mesh-allow",
      no_curve: "runs without CURVE",
    };
    super("KVMESH_MESH_AUTH", `mesh peer ${endpoint} ${why[reason]}`, { details: { endpoint, reason } });
    this.name = "MeshAuthError";
    this.endpoint = endpoint;
    this.reason = reason;
  }
}
