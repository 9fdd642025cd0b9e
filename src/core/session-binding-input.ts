/**
 * Host replication, inbound: a peer's binding handed to `SelectionService.applySessionBinding`
 * is checked field by field before anything merges or parks it. A host's transport may hand over
 * whatever it decoded (msgpack and JSON give numbers for small integers), so u64 fields accept a
 * bigint or a safe-integer number; a number above 2^53 - 1 is refused because it has already
 * lost its low bits, and binding a session to a rounded worker id would be silent corruption.
 */
import type { BindingEvent } from "./replica-events.js";

/** A peer's binding as a host passes it in: the stream's shape, numbers allowed for u64 fields. */
export interface SessionBindingInput {
  readonly model_name: string;
  readonly routing_group: string;
  readonly session_id: string;
  readonly worker_id: bigint | number;
  /** null: a worker-only binding (any rank of the worker). */
  readonly dp_rank: number | null;
  readonly sequence: bigint | number;
  readonly writer_id: bigint | number;
  /** Informational (what the writer did); optional on input. */
  readonly reason?: BindingEvent["reason"] | undefined;
}

/** What `applySessionBinding` did with one binding. */
export type SessionBindingOutcomeKind =
  /** New session here. */
  | "inserted"
  /** Same target, same or newer version: its idle TTL restarts. */
  | "refreshed"
  /** A newer version moved the session to another target. */
  | "replaced-newer"
  /** The binding held here had idled out; the peer's replaced it whatever its version. */
  | "replaced-expired"
  /** Older than what is held here (last-writer-wins kept ours), or than an unbind of the session. */
  | "ignored-conflict"
  /** An unbind (reason "unbind") newer than the binding held here removed it. */
  | "unbound"
  /** Written by this service itself (an echo). */
  | "ignored-own"
  /** Its worker or partition is not known here yet: kept and applied when the worker registers. */
  | "parked-unknown-worker"
  /** A field is invalid; `reason` names it. */
  | "rejected-invalid"
  /** The partition's affinity table is full of live bindings. */
  | "rejected-capacity";

export interface SessionBindingOutcome {
  readonly outcome: SessionBindingOutcomeKind;
  /** Only for rejected-invalid: "<field>: <problem>". */
  readonly reason?: string;
}

/**
 * A failed check says which field and whether its JSON shape is wrong ("shape": not a string,
 * missing; HTTP 422) or only its value ("value": out of range, too long; HTTP 400).
 */
export type CheckedBinding =
  | { readonly ok: true; readonly binding: BindingEvent }
  | { readonly ok: false; readonly field: string; readonly problem: "shape" | "value"; readonly reason: string };

const U64_LIMIT = 1n << 64n;
const U32_MAX = 0xffff_ffff;
const REASONS: readonly BindingEvent["reason"][] = ["bind", "rebind", "refresh", "unbind"];
const U64_PROBLEM = "must be an unsigned 64-bit integer (a bigint, or a number up to 2^53 - 1)";

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

class Invalid extends Error {
  constructor(
    readonly field: string,
    readonly problem: "shape" | "value",
    message: string,
  ) {
    super(message);
  }
}

function u64(v: unknown, field: string): bigint {
  if (typeof v === "bigint") {
    if (v >= 0n && v < U64_LIMIT) return v;
  } else if (typeof v === "number") {
    if (Number.isSafeInteger(v) && v >= 0) return BigInt(v);
  } else {
    throw new Invalid(field, "shape", U64_PROBLEM);
  }
  throw new Invalid(field, "value", U64_PROBLEM);
}

function text(v: unknown, field: string): string {
  if (typeof v !== "string") throw new Invalid(field, "shape", "must be a string");
  return v;
}

function dpRank(v: unknown): number | null {
  const problem = `must be null (a worker-only binding) or an integer in [0, ${U32_MAX}]`;
  if (v === null) return null;
  if (typeof v !== "number") throw new Invalid("dp_rank", "shape", problem);
  if (!Number.isInteger(v) || v < 0 || v > U32_MAX) throw new Invalid("dp_rank", "value", problem);
  return v;
}

/**
 * Validates every field of a peer's binding; `maxSessionIdBytes` is the affinity tables' limit.
 * The first invalid field is reported as "<field>: <problem>" (a prefix such as "bindings[3]."
 * is the caller's to add). Fields other than a binding's are ignored here (HTTP rejects them).
 */
export function checkSessionBinding(input: unknown, maxSessionIdBytes: number): CheckedBinding {
  try {
    if (!isObject(input)) throw new Invalid("binding", "shape", "must be an object");
    const model_name = text(input.model_name, "model_name");
    const routing_group = text(input.routing_group, "routing_group");
    const session_id = text(input.session_id, "session_id");
    if (session_id.length === 0) throw new Invalid("session_id", "value", "must be a non-empty string");
    // A UTF-16 unit is at most 3 UTF-8 bytes, so short ids skip the byte count.
    if (session_id.length * 3 > maxSessionIdBytes && Buffer.byteLength(session_id, "utf8") > maxSessionIdBytes) {
      throw new Invalid("session_id", "value", `is longer than ${maxSessionIdBytes} bytes (UTF-8)`);
    }
    const worker_id = u64(input.worker_id, "worker_id");
    const dp_rank = dpRank(input.dp_rank);
    const sequence = u64(input.sequence, "sequence");
    const writer_id = u64(input.writer_id, "writer_id");
    let reason: BindingEvent["reason"] = "refresh";
    if (input.reason !== undefined) {
      const r = text(input.reason, "reason");
      if (!REASONS.includes(r as BindingEvent["reason"])) throw new Invalid("reason", "value", `must be one of ${REASONS.map((x) => JSON.stringify(x)).join(", ")}`);
      reason = r as BindingEvent["reason"];
    }
    return { ok: true, binding: { model_name, routing_group, session_id, worker_id, dp_rank, sequence, writer_id, reason } };
  } catch (err) {
    if (!(err instanceof Invalid)) throw err;
    return { ok: false, field: err.field, problem: err.problem, reason: `${err.field}: ${err.message}` };
  }
}
