/**
 * Socket event observers (`socket.events`) that survive zeromq.js 6.8's naming scheme.
 *
 * zeromq.js names each observer's monitor endpoint `inproc://zmq.monitor.<address of the
 * Observer object>`, and libzmq keeps that name registered in the socket's context until its
 * reaper thread has finished closing the monitored socket, a little after close() returned. Once
 * V8 frees a closed Observer, a new one can be allocated at the same address and its constructor
 * throws EADDRINUSE ("Address already in use"). Measured: 1 of 60 short-lived dealer+observer
 * pairs in one context failed that way; keeping every closed observer referenced, none did. So
 * closed observers are retired here (kept referenced) for OBSERVER_RETIRE_MS, orders of
 * magnitude longer than the reaper needs, and creation retries once more on the rare collision.
 *
 * Closing an observer is delicate too (measured, 40 rounds each of bind + observe + close):
 * - never closing it: a `for await` over `socket.events` sometimes never ends after the socket's
 *   close() (its final "end" event does not arrive), hanging whoever awaits that loop;
 * - closing it in the same tick as its socket: the socket is never reaped and its TCP listener
 *   stays bound (40 of 40 rebinds failed with EADDRINUSE); one event-loop turn later: 2 of 40;
 *   10 ms later: 0 of 40.
 * So retireObserver() lets the observer end by itself and closes it only if it is still open
 * OBSERVER_CLOSE_GRACE_MS after its socket was closed. A receive pending at that moment is
 * rejected with ENOTSOCK inside close() (zeromq.js's poller fires it after the PAIR is gone), so
 * readers treat ENOTSOCK and undefined alike as the end.
 *
 * That rejection is why observers are only ever read by iteration here, never through the
 * emitter mode (`observer.on(...)`): zeromq.js runs that mode's receive loop as a promise nobody
 * awaits, so closing an observer with a receive pending became an unhandled rejection that ended
 * the process "at closeQuietly" however it was wrapped (#29 F1; `node -e` repro: a Subscriber,
 * `events.on("handshake", ...)`, then `events.close()`). The type below has no `on`, and
 * watchEvents() is the emitter mode's replacement, whose loop cannot reject.
 */
import type { Event, Observer, Socket } from "zeromq";

/** An observer without zeromq.js's emitter mode (see above): iterate it, or use watchEvents(). */
export type IteratedObserver = Pick<Observer, "close" | "closed" | "receive" | typeof Symbol.asyncIterator>;

/** How long a closed observer stays referenced (its address unusable for a new one), ms. */
export const OBSERVER_RETIRE_MS = 5_000;
/** How long after its socket's close an observer may end by itself before it is closed, ms. */
export const OBSERVER_CLOSE_GRACE_MS = 250;
/** Attempts at creating an observer when its monitor name collides (EADDRINUSE). */
const OBSERVE_ATTEMPTS = 3;

const retired: { readonly observer: IteratedObserver; readonly atMs: number }[] = [];

function prune(nowMs: number): void {
  let drop = 0;
  while (drop < retired.length && nowMs - (retired[drop]?.atMs ?? nowMs) >= OBSERVER_RETIRE_MS) drop++;
  if (drop > 0) retired.splice(0, drop);
}

const isAddrInUse = (err: unknown): boolean => typeof err === "object" && err !== null && "code" in err && err.code === "EADDRINUSE";

/**
 * `socket.events`, created with the collision retry described above. A failed attempt's observer
 * never existed for libzmq; its JS wrapper is kept referenced so the retry gets another address.
 */
export function observe(socket: Socket): IteratedObserver {
  const failed: unknown[] = [];
  for (let attempt = 1; ; attempt++) {
    try {
      return socket.events;
    } catch (err) {
      if (!isAddrInUse(err) || attempt >= OBSERVE_ATTEMPTS) throw err;
      failed.push(err);
    }
  }
}

/**
 * Call right after closing the observer's socket: the observer is closed OBSERVER_CLOSE_GRACE_MS
 * later unless it ended by itself, and kept referenced for OBSERVER_RETIRE_MS.
 */
export function retireObserver(observer: IteratedObserver, nowMs: number = performance.now()): void {
  prune(nowMs);
  if (retired.some((r) => r.observer === observer)) return;
  retired.push({ observer, atMs: nowMs });
  if (observer.closed) return;
  const timer = setTimeout(() => {
    closeQuietly(observer);
  }, OBSERVER_CLOSE_GRACE_MS);
  timer.unref();
}

let closeFailures = 0;

/**
 * Closes a retired observer from a timer, where a throw would be uncaught and end the process.
 * It does throw: an observer whose socket failed half-way (EMFILE while registering thousands of
 * KV ranks) threw ENOTSOCK here and killed the daemon 3 times out of 3 (#17 F1). Its socket is
 * gone either way, so there is nothing left to close: counted, and the first one logged.
 */
function closeQuietly(observer: IteratedObserver): void {
  try {
    if (!observer.closed) observer.close();
  } catch (err) {
    closeFailures++;
    if (closeFailures === 1) process.emitWarning(`zmq observer close failed (counted, not rethrown): ${err instanceof Error ? err.message : String(err)}`, { code: "KVMESH_OBSERVER_CLOSE" });
  }
}

/**
 * Calls `onEvent` for each of the observer's events until it ends (its socket's "end" event, or
 * retireObserver closing it). Never rejects: a receive that fails (ENOTSOCK from a close, or a
 * half-failed socket) ends the watch, and a throwing `onEvent` is reported to `onError` and the
 * watch goes on.
 */
export async function watchEvents(observer: IteratedObserver, onEvent: (event: Event) => void, onError: (err: unknown) => void = () => undefined): Promise<void> {
  for (;;) {
    let event: Event | undefined;
    try {
      if (observer.closed) return;
      // A receive pending when the observer is closed resolves with undefined or rejects.
      event = await observer.receive();
    } catch {
      return;
    }
    if (event === undefined) return;
    try {
      onEvent(event);
    } catch (err) {
      onError(err);
    }
    if (event.type === "end") return;
  }
}

/**
 * Closes, now, every retired observer still open: for a thread about to end, after its sockets'
 * close grace. A zeromq object left open when a worker thread's environment is torn down is closed
 * by zeromq.js's reaper, and one with a receive pending then throws a Napi::Error with no
 * JavaScript frame to catch it, which aborts the whole process (#29; `terminate called after
 * throwing an instance of 'Napi::Error'`, 3 of 3 in a worker with a SUB and its observer).
 */
export function closeRetiredObservers(): void {
  for (const r of retired) closeQuietly(r.observer);
}

/** Retired observers whose close threw (their sockets were already gone). */
export function observerCloseFailures(): number {
  return closeFailures;
}

/** Observers currently retired (for tests). */
export function retiredObserverCount(): number {
  return retired.length;
}
