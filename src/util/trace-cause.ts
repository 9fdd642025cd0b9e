/**
 * Which traced request is running, when tracing is on. Shared by the HTTP layer, which sets it,
 * and the mesh publisher, which reads it, so that neither imports the other. The HTTP layer runs
 * a sampled request's handler inside `withTraceCause`, and the publisher reads
 * `currentTraceCause` as that request's changes are queued, so a batch names exactly the requests
 * whose changes it carries (and peers' apply spans link to them).
 *
 * The cause holds for the synchronous part of the call only, which is where the selection
 * service books, frees or binds (its calls are synchronous). A lifecycle call retried after
 * waiting for the receive thread (an unknown reservation, MeshControl.catchUp) sends its change
 * without a cause. Why not AsyncLocalStorage, which would follow the awaits: entering it turns on
 * Node 20's promise hooks for the whole process, which costs tracing a good part of a flow's
 * server CPU (`npm run bench:http`, tracing on against off).
 */

/** A W3C trace context of a request (lowercase hex ids, as in `traceparent`). */
export interface TraceCause {
  /** 32 hex digits, not all zero. */
  readonly traceId: string;
  /** 16 hex digits, not all zero. */
  readonly spanId: string;
  /** The trace flags (bit 0: sampled). */
  readonly flags: number;
}

/** What a peer's batch, applied here, tells tracing: a span linked to the requests that caused it. */
export interface AppliedBatch {
  readonly origin: bigint;
  /** The seqs it covered (more than one when the receive thread merged consecutive batches). */
  readonly firstSeq: number;
  readonly seq: number;
  readonly events: number;
  /** The origin's wall clock when it sent the (last) batch, ms since the Unix epoch. */
  readonly sentAtMs: number;
  readonly causes: readonly TraceCause[];
}

/** Told of each applied batch that carried trace causes (the mesh's inbound calls it; src/http/otel-tracer.ts is one). */
export interface MeshApplyTracer {
  batchApplied(batch: AppliedBatch): void;
}

let current: TraceCause | undefined;

export function withTraceCause<T>(cause: TraceCause, fn: () => T): T {
  const outer = current;
  current = cause;
  try {
    return fn();
  } finally {
    current = outer;
  }
}

export function currentTraceCause(): TraceCause | undefined {
  return current;
}
