/**
 * The publisher's outbound queue: local load and binding events wait here until the publisher
 * wakes, takes everything queued and sends it as a few batch frames (a burst of 10 000 events
 * costs ~40 frames of 256, not 10 000: msgpack over zeromq moves many times more records a
 * second at 100 per message than at one; `npm run bench:mesh`).
 *
 * Bounded by events and by estimated encoded bytes. A push into a full queue is refused and
 * counted (`shed`, `onShed`), never silent, and the local mutation it described has already
 * happened, so peers must repair it from a snapshot. The contract with the publisher glue:
 *
 *   after each `drainBatches()`, call `takeShedSinceLastDrain()`; if it returns n > 0, burn one
 *   extra sequence number (seq += 1 without sending anything) before numbering the next batch
 *   or heartbeat. Every receiver then sees a gap (at the next batch or, when idle, the next
 *   heartbeat, whose seq is ahead of what it applied) and re-snapshots, and the snapshot
 *   reflects the shed changes because it is taken from the origin's live state.
 *
 * The count survives until taken, so a publisher that skips a call loses nothing.
 */
import { MeshOptionError } from "./errors.js";
import type { MeshEvent } from "./types.js";
import { estimateEventBytes, MAX_EVENTS_PER_BATCH } from "./wire.js";

/** Reference: the outbound channel's capacity is 100 000 events (dynamo §5.5). */
export const DEFAULT_OUTBOUND_MAX_EVENTS = 100_000;
/** 100k add events of 219 hashes estimate at ~180 MB; this bound binds first on longer prompts. */
export const DEFAULT_OUTBOUND_MAX_BYTES = 256 * 1024 * 1024;
/** Dynamo's frontend batches 256 events per message (dynamo §5.5). */
export const DEFAULT_BATCH_MAX_EVENTS = 256;
export const DEFAULT_BATCH_MAX_BYTES = 1024 * 1024;

export interface OutboundQueueOptions {
  readonly maxEvents?: number;
  readonly maxBytes?: number;
  /** Called for every refused event, with the running total: a hook for logs and metrics. */
  readonly onShed?: (event: MeshEvent, shedTotal: number) => void;
}

export class OutboundQueue {
  readonly maxEvents: number;
  readonly maxBytes: number;
  readonly #onShed: ((event: MeshEvent, shedTotal: number) => void) | undefined;
  #events: MeshEvent[] = [];
  /** Estimated bytes per queued event, by position; allocated once so push allocates nothing. */
  readonly #sizes: Uint32Array;
  #bytes = 0;
  #shedSinceDrain = 0;
  #shed = 0;
  #pushed = 0;
  #drained = 0;

  constructor(options: OutboundQueueOptions = {}) {
    this.maxEvents = options.maxEvents ?? DEFAULT_OUTBOUND_MAX_EVENTS;
    this.maxBytes = options.maxBytes ?? DEFAULT_OUTBOUND_MAX_BYTES;
    if (!Number.isInteger(this.maxEvents) || this.maxEvents < 1) throw new MeshOptionError("maxEvents", `must be a positive integer, got ${this.maxEvents}`);
    if (!(this.maxBytes > 0)) throw new MeshOptionError("maxBytes", `must be positive, got ${this.maxBytes}`);
    this.#onShed = options.onShed;
    this.#sizes = new Uint32Array(this.maxEvents);
  }

  /** Events refused because the queue was full, since construction. */
  get shed(): number {
    return this.#shed;
  }
  /** Events accepted, since construction. */
  get pushed(): number {
    return this.#pushed;
  }
  /** Events handed out by drainBatches, since construction. */
  get drained(): number {
    return this.#drained;
  }
  get size(): number {
    return this.#events.length;
  }
  get bytes(): number {
    return this.#bytes;
  }

  /** Queues `e`; false (counted, reported to onShed) when the queue is full. */
  push(e: MeshEvent): boolean {
    const size = estimateEventBytes(e);
    const n = this.#events.length;
    // An event larger than the whole byte budget still goes through an empty queue, or it
    // would be shed forever.
    if (n >= this.maxEvents || (n > 0 && this.#bytes + size > this.maxBytes)) {
      this.#shed++;
      this.#shedSinceDrain++;
      this.#onShed?.(e, this.#shed);
      return false;
    }
    this.#events.push(e);
    this.#sizes[n] = size;
    this.#bytes += size;
    this.#pushed++;
    return true;
  }

  /**
   * Takes everything queued now, in order, split into batches of at most `maxEvents` events and
   * `maxBytes` estimated bytes (an event larger than `maxBytes` travels alone). Empty queue: [].
   */
  drainBatches(maxEvents = DEFAULT_BATCH_MAX_EVENTS, maxBytes = DEFAULT_BATCH_MAX_BYTES): MeshEvent[][] {
    if (!Number.isInteger(maxEvents) || maxEvents < 1 || maxEvents > MAX_EVENTS_PER_BATCH) {
      throw new MeshOptionError("maxEvents", `must be an integer in [1, ${MAX_EVENTS_PER_BATCH}], got ${maxEvents}`);
    }
    if (!(maxBytes > 0)) throw new MeshOptionError("maxBytes", `must be positive, got ${maxBytes}`);
    const events = this.#events;
    const n = events.length;
    if (n === 0) return [];
    const total = this.#bytes;
    this.#events = [];
    this.#bytes = 0;
    this.#drained += n;
    if (n <= maxEvents && total <= maxBytes) return [events];
    const batches: MeshEvent[][] = [];
    let start = 0;
    let bytes = 0;
    for (let i = 0; i < n; i++) {
      const size = this.#sizes[i] as number;
      if (i > start && (i - start >= maxEvents || bytes + size > maxBytes)) {
        batches.push(events.slice(start, i));
        start = i;
        bytes = 0;
      }
      bytes += size;
    }
    batches.push(events.slice(start, n));
    return batches;
  }

  /** Events shed since this was last called (see the contract above); resets the count. */
  takeShedSinceLastDrain(): number {
    const n = this.#shedSinceDrain;
    this.#shedSinceDrain = 0;
    return n;
  }
}
