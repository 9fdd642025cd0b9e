/**
 * Which traced request is running, when tracing is on: the HTTP layer runs a sampled request's
 * handler inside `withTraceCause`, and the publisher reads `currentTraceCause` as that request's
 * changes are queued, so a batch names exactly the requests whose changes it carries (and peers'
 * apply spans link to them).
 *
 * The cause holds for the synchronous part of the call only, which is where the selection
 * service books, frees or binds (its calls are synchronous). A lifecycle call retried after
 * waiting for the receive thread (an unknown reservation, MeshControl.catchUp) sends its change
 * without a cause. Why not AsyncLocalStorage, which would follow the awaits: entering it turns on
 * Node 20's promise hooks for the whole process: bench:http measured tracing on at 1,022 us of
 * server CPU per flow with it (662 us off), and 788 us this way (685 us off).
 */
import type { TraceCause } from "./types.js";

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
