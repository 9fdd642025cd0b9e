/**
 * Which traced request is running, when tracing is on: the HTTP layer runs a sampled request's
 * handler inside `withTraceCause`, and the publisher reads `currentTraceCause` as that request's
 * changes are queued, so a batch names exactly the requests whose changes it carries (and peers'
 * apply spans link to them).
 *
 * Why AsyncLocalStorage rather than a variable set around the call: a handler may await before it
 * books (a lifecycle call first waits for the receive thread), and other requests run meanwhile.
 * Nothing calls `run` with tracing off, so the storage stays disabled and `getStore` is a field
 * check.
 */
import { AsyncLocalStorage } from "node:async_hooks";

import type { TraceCause } from "./types.js";

const current = new AsyncLocalStorage<TraceCause>();

export function withTraceCause<T>(cause: TraceCause, fn: () => T): T {
  return current.run(cause, fn);
}

export function currentTraceCause(): TraceCause | undefined {
  return current.getStore();
}
