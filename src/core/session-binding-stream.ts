/**
 * Host replication, outbound: the session bindings this service commits or refreshes, as an
 * async iterable of batches (`SelectionService.sessionBindingUpdates()`).
 *
 * Fed by the same per-partition sink the mesh uses (`onBindingEvent`). Each subscription keeps
 * its own bounded queue and hands over everything queued as one batch on each wake-up, so a
 * consumer that spends 20 ms sending a batch gets the next 20 ms of bindings in one batch rather
 * than one at a time (the reference's frontend channel held 4,096 bindings and sent one message
 * per binding, so at `npm run bench:host`'s rate it dropped a large share of them).
 *
 * Coalescing: while a binding waits in the queue, a newer one for the same (model, group,
 * session) replaces it in place. Peers merge last-writer-wins on (sequence, writer_id), so only
 * the newest version of a session matters; a refresh of the same version carries the same
 * target. The queue therefore holds at most one binding per session, and a bound equal to the
 * affinity table's (65,536 sessions) is never reached by a slow consumer of one partition, only
 * by a stalled one. A push into a full queue is refused and counted (`dropped`, on the next
 * batch and in the service's `droppedBindings`); the consumer repairs by publishing
 * `bindingsSnapshot()` once (LWW makes re-sending harmless).
 *
 * Several consumers: every call to `sessionBindingUpdates()` is an independent subscription
 * that sees every binding published after it subscribed, with its own bound; a slow consumer
 * sheds only its own bindings.
 */
import { compareVersions } from "./affinity-table.js";
import { badRequest } from "./errors.js";
import type { BindingEvent } from "./replica-events.js";

/** Per-subscription bound, in distinct sessions waiting (the affinity table's default size). */
export const DEFAULT_MAX_PENDING_BINDINGS = 65_536;

export interface SessionBindingBatch {
  /** Everything queued since the previous batch, at most one binding per (model, group, session). */
  readonly bindings: readonly BindingEvent[];
  /** Bindings shed by this subscription's bound since its previous batch (0 normally). */
  readonly dropped: number;
}

export interface SessionBindingUpdatesOptions {
  /** Bound on distinct sessions waiting in this subscription's queue. */
  readonly maxPendingBindings?: number;
  /** Ends the iteration (what is still queued is discarded). */
  readonly signal?: AbortSignal;
}

export interface SubscriptionHooks {
  /** Called once when the subscription ends, whatever ended it. */
  readonly onClose: () => void;
  /** Called for every binding the bound refused. */
  readonly onShed: () => void;
}

const DONE: IteratorReturnResult<undefined> = { done: true, value: undefined };

/** The coalescing key; length prefixes keep ("a:b", "c") and ("a", "b:c") apart. */
const keyOf = (e: BindingEvent): string => `${e.model_name.length}:${e.model_name}${e.routing_group.length}:${e.routing_group}${e.session_id}`;

/** The binding to keep when `next` arrives while `prev` (same session) still waits. */
function coalesce(prev: BindingEvent, next: BindingEvent): BindingEvent {
  const order = compareVersions({ sequence: next.sequence, writerId: next.writer_id }, { sequence: prev.sequence, writerId: prev.writer_id });
  if (order < 0) return prev;
  // A refresh of the binding that has not gone out yet is still, for peers, that bind.
  if (order === 0 && next.reason === "refresh" && prev.reason !== "refresh") return { ...next, reason: prev.reason };
  return next;
}

export class SessionBindingSubscription implements AsyncIterableIterator<SessionBindingBatch, undefined> {
  readonly maxPendingBindings: number;
  readonly #hooks: SubscriptionHooks;
  readonly #signal: AbortSignal | undefined;
  #pending = new Map<string, BindingEvent>();
  #droppedSinceBatch = 0;
  #dropped = 0;
  #coalesced = 0;
  #waiter: ((r: IteratorResult<SessionBindingBatch, undefined>) => void) | undefined;
  #wakeScheduled = false;
  /** open -> ending (service shut down: deliver what is queued, then done) -> closed. */
  #state: "open" | "ending" | "closed" = "open";

  constructor(options: SessionBindingUpdatesOptions, hooks: SubscriptionHooks) {
    const max = options.maxPendingBindings ?? DEFAULT_MAX_PENDING_BINDINGS;
    if (!Number.isSafeInteger(max) || max < 1) {
      throw badRequest(`maxPendingBindings must be a positive integer (got ${String(max)})`, "maxPendingBindings");
    }
    this.maxPendingBindings = max;
    this.#hooks = hooks;
    this.#signal = options.signal;
    if (this.#signal?.aborted === true) this.#close();
    else this.#signal?.addEventListener("abort", this.#onAbort, { once: true });
  }

  /** Bindings waiting for the consumer now. */
  get pending(): number {
    return this.#pending.size;
  }

  /** Bindings this subscription shed since it started. */
  get dropped(): number {
    return this.#dropped;
  }

  /** Bindings that replaced an older one of the same session while it waited. */
  get coalesced(): number {
    return this.#coalesced;
  }

  get closed(): boolean {
    return this.#state === "closed";
  }

  /** Queues a binding (the service calls this for every binding it publishes). */
  push(e: BindingEvent): void {
    if (this.#state !== "open") return;
    const key = keyOf(e);
    const prev = this.#pending.get(key);
    if (prev !== undefined) {
      // Map.set on an existing key keeps its position: no reordering, no allocation of a slot.
      this.#pending.set(key, coalesce(prev, e));
      this.#coalesced++;
    } else if (this.#pending.size >= this.maxPendingBindings) {
      this.#dropped++;
      this.#droppedSinceBatch++;
      this.#hooks.onShed();
    } else {
      this.#pending.set(key, e);
    }
    this.#scheduleWake();
  }

  /** No more bindings will come: deliver what is queued, then finish. */
  end(): void {
    if (this.#state !== "open") return;
    this.#state = "ending";
    if (this.#waiter !== undefined && !this.#hasBatch()) this.#resolve(DONE);
  }

  next(): Promise<IteratorResult<SessionBindingBatch, undefined>> {
    if (this.#waiter !== undefined) return Promise.reject(new Error("sessionBindingUpdates: next() called again before the previous call resolved"));
    if (this.#hasBatch()) return Promise.resolve({ done: false, value: this.#drain() });
    if (this.#state !== "open") {
      this.#close();
      return Promise.resolve(DONE);
    }
    return new Promise((resolve) => {
      this.#waiter = resolve;
    });
  }

  /** `break` in a for-await loop lands here: unsubscribe, discard what is queued. */
  return(): Promise<IteratorResult<SessionBindingBatch, undefined>> {
    this.#close();
    return Promise.resolve(DONE);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  #hasBatch(): boolean {
    return this.#pending.size > 0 || this.#droppedSinceBatch > 0;
  }

  #drain(): SessionBindingBatch {
    const bindings = [...this.#pending.values()];
    this.#pending = new Map();
    const dropped = this.#droppedSinceBatch;
    this.#droppedSinceBatch = 0;
    return { bindings, dropped };
  }

  /**
   * setImmediate, not a microtask: every binding committed in this event-loop turn (a burst of
   * HTTP requests parsed from one read) joins the batch before the consumer wakes.
   */
  #scheduleWake(): void {
    if (this.#waiter === undefined || this.#wakeScheduled) return;
    this.#wakeScheduled = true;
    setImmediate(this.#wake);
  }

  readonly #wake = (): void => {
    this.#wakeScheduled = false;
    if (this.#waiter === undefined) return;
    if (this.#hasBatch()) this.#resolve({ done: false, value: this.#drain() });
    else if (this.#state !== "open") {
      this.#close();
      this.#resolve(DONE);
    }
  };

  readonly #onAbort = (): void => {
    this.#close();
  };

  #resolve(r: IteratorResult<SessionBindingBatch, undefined>): void {
    const w = this.#waiter;
    this.#waiter = undefined;
    w?.(r);
  }

  #close(): void {
    if (this.#state === "closed") return;
    this.#state = "closed";
    this.#pending = new Map();
    this.#droppedSinceBatch = 0;
    this.#signal?.removeEventListener("abort", this.#onAbort);
    this.#hooks.onClose();
    this.#resolve(DONE);
  }
}
