/**
 * The mesh's outbound side: every event of the core's outbound stream goes into a bounded queue
 * (outbound-queue.ts); one flush loop drains it whole on each wake-up into numbered batches (seq
 * per (origin, epoch)) and publishes them; a heartbeat every heartbeatIntervalMs carries the last
 * seq and the bookings this origin owns, so an idle receiver still sees gaps and divergence.
 *
 * Coalesced events (aggregate load replication's per-rank totals) are not pushed: the core says
 * they are pending (`pending`), which schedules a flush, and each flush collects them from the core
 * (`CoalescedSource`) and publishes them with the queued events, so peers receive at most one
 * batch per flush interval whatever the request rate. The publisher names no event kind.
 *
 * Flush pacing reads the injected monotonic clock; only the lag stamps (`sentAtMs`) read the wall
 * clock, as receivers on other hosts compare them with theirs.
 */
import type { Logger } from "pino";
import type { Clock, TimerHandle, Timers } from "../src/core/index.js";
import { controlEndpointFor } from "./endpoints.js";
import { MeshOptionError } from "./errors.js";
import { OutboundQueue, type OutboundQueueOptions } from "./outbound-queue.js";
import { currentTraceCause } from "../src/util/trace-cause.js";
import { MAX_TRACE_CAUSES_PER_BATCH, TOPIC_BATCH, TOPIC_HEARTBEAT, type Heartbeat, type MeshBatch, type MeshEvent, type TraceCause } from "./types.js";
import { encodeBatch, encodeHeartbeat } from "./wire.js";

/** Heartbeat period, ms: bounds how long an idle gap or a silent peer goes unnoticed. */
export const DEFAULT_MESH_HEARTBEAT_INTERVAL_MS = 500;
/**
 * Minimum spacing between outbound flushes, ms. Each published batch costs a ZeroMQ send (a wake-up
 * of the I/O thread) here and a receive + decode + dispatch on every peer, whatever its size. An
 * event after a quiet spell still goes out on the next event-loop turn (no added lag when idle);
 * within this window of the previous flush it waits for the window to end and shares a batch.
 * The price is up to this much replication lag (not seen by the lag histogram, which starts at
 * the flush), widening the select-to-book race by as much. Measured in bench:mesh (4 replicas,
 * 200 req/s, 2 cores): 0 and 5 ms both gave ~2.1 batches per request (a replica's bursts are
 * ~10 ms apart); 20 ms gave 0.93 and cut total replica CPU ~7% (ZeroMQ I/O threads 880 -> 590 ms
 * per 10 s), too much lag for the race. 2 ms only merges what arrives in bursts.
 */
export const DEFAULT_MESH_FLUSH_INTERVAL_MS = 2;
/**
 * The same spacing in aggregate load replication, ms: a peer's cost per origin is then at most
 * one batch per interval, independent of the request rate. Measured with bench:scale (one origin,
 * one peer, 2 cores): the peer's main thread per replicated request at 100 / 200 req/s was 480 /
 * 240 us at 10 ms, 280 / 125 us at 25 ms and 200 / 110 us at 50 ms (exact mode: 800 / 460 us), as
 * each received batch costs ~250-300 us on a cold event loop. 10 ms is where the hit ratio (4
 * replicas -0.04 points against one), stickiness (1.0) and the select-to-book race (0 in
 * bench:mesh) were measured; a longer interval delays bindings and load by as much.
 */
export const DEFAULT_MESH_AGGREGATE_FLUSH_INTERVAL_MS = 10;

/** Where a flush collects the coalesced events from (the core's ReplicaAttachment). */
export interface CoalescedSource {
  /** The coalesced events changed since the last call. */
  collect(): MeshEvent[];
  /** Some value still decays (a prefill estimate): flush again after an interval even if nothing else changes. */
  readonly decaying: boolean;
}

/** Where published frames go (MeshTransport's PUB in production). */
export interface PublishLink {
  publish(topic: string, payload: Buffer): Promise<void>;
}

export interface PublisherStats {
  batchesSent: number;
  eventsSent: number;
  heartbeatsSent: number;
  /** Trace causes not sent because the next batch already carried MAX_TRACE_CAUSES_PER_BATCH. */
  traceCausesDropped: number;
}

export interface MeshPublisherOptions {
  readonly origin: bigint;
  readonly epoch: bigint;
  /** Our PUB endpoint as peers reach it (heartbeats carry it and the control endpoint after it). */
  readonly advertise: string;
  readonly link: PublishLink;
  /** Bookings this origin owns now (ReplicaPort.countOwnedBy(origin)). */
  readonly ownedBookings: () => number;
  readonly logger: Logger;
  /** Monotonic, ms: flush pacing. */
  readonly clock: Clock;
  /** Wall clock, ms since the Unix epoch: `sentAtMs` lag stamps only. */
  readonly wallClock: Clock;
  readonly timers: Timers;
  readonly flushIntervalMs?: number;
  readonly heartbeatIntervalMs?: number;
  readonly queue?: OutboundQueueOptions;
  /** Where each flush collects coalesced events from (its presence makes the aggregate flush interval the default). */
  readonly coalesced?: CoalescedSource;
}

/** Validates a flush interval (ms) before anything binds; throws MeshOptionError naming the field. */
export function flushIntervalOf(ms: number | undefined, aggregate = false): number {
  const v = ms ?? (aggregate ? DEFAULT_MESH_AGGREGATE_FLUSH_INTERVAL_MS : DEFAULT_MESH_FLUSH_INTERVAL_MS);
  if (!Number.isFinite(v) || v < 0) throw new MeshOptionError("flushIntervalMs", `must be a finite number >= 0, got ${v}`);
  return v;
}

export class MeshPublisher {
  readonly origin: bigint;
  readonly epoch: bigint;
  readonly stats: PublisherStats = { batchesSent: 0, eventsSent: 0, heartbeatsSent: 0, traceCausesDropped: 0 };
  /** Sampled requests whose changes the next batch carries (tracing on): see MeshBatch.causes. */
  #causes: TraceCause[] = [];
  readonly #o: MeshPublisherOptions;
  readonly #log: Logger;
  readonly #flushIntervalMs: number;
  readonly #heartbeatIntervalMs: number;
  readonly #queue: OutboundQueue;
  readonly #controlEndpoint: string;
  #seq = 0;
  /** Monotonic ms of the last flush start: -Infinity lets the first event go out at once. */
  #lastFlushAtMs = -Infinity;
  #scheduled: TimerHandle | undefined;
  #flushing: Promise<void> | undefined;
  #heartbeat: TimerHandle | undefined;
  #closed = false;
  /** Coalesced events wait since the last flush collected them. */
  #pending = false;

  constructor(o: MeshPublisherOptions) {
    this.#o = o;
    this.origin = o.origin;
    this.epoch = o.epoch;
    this.#log = o.logger;
    this.#flushIntervalMs = flushIntervalOf(o.flushIntervalMs, o.coalesced !== undefined);
    this.#heartbeatIntervalMs = o.heartbeatIntervalMs ?? DEFAULT_MESH_HEARTBEAT_INTERVAL_MS;
    this.#controlEndpoint = controlEndpointFor(o.advertise);
    this.#queue = new OutboundQueue({
      ...o.queue,
      onShed: (e, total) => {
        o.queue?.onShed?.(e, total);
        if (total === 1 || total % 1000 === 0) this.#log.warn({ shed_total: total }, "mesh outbound queue full: event shed (peers will re-snapshot)");
      },
    });
  }

  /** Starts the heartbeat. */
  start(): void {
    if (this.#closed || this.#heartbeat !== undefined) return;
    this.#heartbeat = this.#o.timers.setInterval(() => {
      this.sendHeartbeat();
    }, this.#heartbeatIntervalMs);
  }

  /** The last seq numbered (a batch sent, or burnt for shed events). */
  get seq(): number {
    return this.#seq;
  }

  /** Outbound events shed by the bounded queue since start. */
  get shed(): number {
    return this.#queue.shed;
  }

  get queued(): number {
    return this.#queue.size;
  }

  enqueue(e: MeshEvent): void {
    if (this.#closed) return;
    this.#queue.push(e);
    this.#noteCause();
    this.#schedule();
  }

  /** Coalesced events wait: the next flush collects them. */
  pending(): void {
    if (this.#closed) return;
    this.#pending = true;
    this.#noteCause();
    this.#schedule();
  }

  /**
   * Tracing on: the sampled request whose change this is (src/util/trace-cause.ts) goes with the next
   * batch, so peers' spans for applying it link back to it. Once per request and batch.
   */
  #noteCause(): void {
    const cause = currentTraceCause();
    if (cause === undefined || this.#causes.includes(cause)) return;
    if (this.#causes.length >= MAX_TRACE_CAUSES_PER_BATCH) {
      this.stats.traceCausesDropped++;
      return;
    }
    this.#causes.push(cause);
  }

  #schedule(): void {
    if (this.#scheduled !== undefined) return;
    const waitMs = this.#lastFlushAtMs + this.#flushIntervalMs - this.#o.clock.now();
    // An immediate, not a microtask: a burst of selections in one tick coalesces into one batch;
    // within the flush interval of the previous flush, a timer lets more of them share it.
    this.#scheduled = waitMs > 0 ? this.#o.timers.setTimeout(this.#startFlush, waitMs) : this.#o.timers.setImmediate(this.#startFlush);
  }

  /**
   * Resolves when the flush in progress (if any) ends. A snapshot taken right after it is
   * consistent with `seq`: every batch numbered up to it was built from events emitted before.
   */
  settled(): Promise<void> {
    return this.#flushing ?? Promise.resolve();
  }

  #cancelScheduled(): void {
    this.#scheduled?.cancel();
    this.#scheduled = undefined;
  }

  readonly #startFlush = (): void => {
    this.#scheduled = undefined;
    this.#lastFlushAtMs = this.#o.clock.now();
    // While a flush runs, its loop picks up what arrives; it ends only with the queue empty.
    this.#flushing ??= this.#flush().finally(() => {
      this.#flushing = undefined;
    });
  };

  /**
   * Queues the coalesced events (aggregate totals) ahead of the drain that publishes them. Decaying
   * estimates are re-taken once per flush (`withDecay`, the flush's first pass), never in the
   * loop that follows: a decaying rank would otherwise be republished on every pass, back to back.
   */
  #collect(withDecay: boolean): void {
    const src = this.#o.coalesced;
    if (src === undefined || !(this.#pending || (withDecay && src.decaying))) return;
    this.#pending = false;
    for (const e of src.collect()) this.#queue.push(e);
  }

  async #flush(): Promise<void> {
    for (let pass = 0; ; pass++) {
      this.#collect(pass === 0);
      if (this.#queue.size === 0 || this.#closed) break;
      const batches = this.#queue.drainBatches();
      // A shed event is repaired by snapshot: skipping a seq makes every receiver see a gap.
      if (this.#queue.takeShedSinceLastDrain() > 0) this.#seq++;
      for (const events of batches) {
        const causes = this.#causes;
        if (causes.length > 0) this.#causes = [];
        const batch: MeshBatch = { v: 1, origin: this.origin, epoch: this.epoch, seq: ++this.#seq, sentAtMs: this.#o.wallClock.now(), events, ...(causes.length > 0 ? { causes } : {}) };
        try {
          await this.#o.link.publish(TOPIC_BATCH, encodeBatch(batch));
          this.stats.batchesSent++;
          this.stats.eventsSent += events.length;
        } catch (err) {
          if (this.#closed) return;
          this.#log.warn({ err, seq: batch.seq }, "mesh publish failed (peers will re-snapshot on the gap)");
        }
      }
    }
    // A decaying prefill estimate goes stale on peers as it ages: publish it again next interval.
    if (!this.#closed && this.#o.coalesced?.decaying === true) this.#schedule();
  }

  sendHeartbeat(): void {
    if (this.#closed) return;
    const hb: Heartbeat = {
      v: 1,
      origin: this.origin,
      epoch: this.epoch,
      seq: this.#seq,
      sentAtMs: this.#o.wallClock.now(),
      controlEndpoint: this.#controlEndpoint,
      publishEndpoint: this.#o.advertise,
      bookings: this.#o.ownedBookings(),
    };
    this.#o.link.publish(TOPIC_HEARTBEAT, encodeHeartbeat(hb)).then(
      () => {
        this.stats.heartbeatsSent++;
      },
      (err: unknown) => {
        if (!this.#closed) this.#log.debug({ err }, "heartbeat publish failed");
      },
    );
  }

  /** Flushes what is queued (peers see the last frees before we go), then stops. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#cancelScheduled();
    await this.#flushing;
    if (this.#queue.size > 0 || this.#pending) {
      this.#startFlush();
      await this.#flushing;
    }
    this.#closed = true;
    // Events enqueued while the last flush ran scheduled another; they went out with it.
    this.#cancelScheduled();
    this.#heartbeat?.cancel();
  }
}
