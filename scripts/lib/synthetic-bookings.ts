/**
 * Synthetic bookings for the stress mode of bench:scale: what an origin replica routing R
 * requests/s emits into the mesh, without HTTP or selection. Request k is booked on worker
 * (k mod workers) + 1, rank 0, in the default partition, with the sequence hashes of one of a
 * few 14,000-token prompts; its prefill completes `prefillDelayMs` later and it is freed
 * `holdMs` after the add (the means of bench-workload.ts's 20-80 ms and 200-800 ms). The live
 * bookings are kept, so a snapshot carries exactly what the published events built. Pure: time
 * comes in as arguments.
 */
import type { HashList } from "../../src/core/index.js";
import type { LoadAddEvent, PartitionRef } from "../../src/core/index.js";
import { DEFAULT_MODEL_NAME, DEFAULT_ROUTING_GROUP } from "../../src/core/index.js";
import type { MeshEvent, SnapshotBooking } from "../../mesh/types.js";

export const DEFAULT_PREFILL_DELAY_MS = 50;
export const DEFAULT_HOLD_MS = 500;

export interface SyntheticBookingsOptions {
  /** The fake origin's replica id: origin and owner of every event. */
  readonly origin: bigint;
  /** Worker ids 1..workers, registered on the peer (an unknown worker's bookings are ignored). */
  readonly workers: number;
  readonly blockSize: number;
  readonly promptTokens: number;
  /** Sequence hashes of the prompts, used in turn. */
  readonly prompts: readonly HashList[];
  readonly prefillDelayMs?: number;
  readonly holdMs?: number;
  /** Prefixes request ids, so two runs against one peer never collide. */
  readonly idPrefix?: string;
}

interface Pending {
  readonly atMs: number;
  readonly requestId: string;
}

/** A FIFO of due times read from a head index (compacted now and then, not shifted per item). */
class DueQueue {
  #items: Pending[] = [];
  #head = 0;

  push(p: Pending): void {
    this.#items.push(p);
  }

  takeDue(nowMs: number, fn: (requestId: string) => void): void {
    const items = this.#items;
    while (this.#head < items.length && (items[this.#head] as Pending).atMs <= nowMs) fn((items[this.#head++] as Pending).requestId);
    if (this.#head > COMPACT_AFTER && this.#head * 2 > items.length) {
      this.#items = items.slice(this.#head);
      this.#head = 0;
    }
  }
}

const COMPACT_AFTER = 1_024;

/** The default partition, where every synthetic booking goes. */
export const SYNTHETIC_PARTITION: PartitionRef = Object.freeze({ model_name: DEFAULT_MODEL_NAME, routing_group: DEFAULT_ROUTING_GROUP });
const PARTITION = SYNTHETIC_PARTITION;

/** What a schedule step calls, in order: due prefill marks, due frees, then new bookings. */
export interface ScheduleSink {
  prefillDue(requestId: string): void;
  freeDue(requestId: string): void;
  /** Request number `k` booked as `requestId` on `workerId` (rank 0) with `hashes`. */
  booked(k: number, requestId: string, workerId: bigint, hashes: HashList): void;
}

/**
 * The timing of the synthetic bookings, whatever is published of them: request k on worker
 * (k mod workers) + 1 with prompt k mod prompts, its prefill due `prefillDelayMs` after the add
 * and its free `holdMs` after. Exact mode (SyntheticBookings) turns it into per-booking events,
 * aggregate mode (aggregate-bookings.ts) into per-rank totals.
 */
export class BookingSchedule {
  readonly options: Required<SyntheticBookingsOptions>;
  /** FIFOs: every request waits the same delay, so due order is add order. */
  readonly #prefills = new DueQueue();
  readonly #frees = new DueQueue();
  #issued = 0;

  constructor(o: SyntheticBookingsOptions) {
    if (o.prompts.length === 0) throw new RangeError("at least one prompt is needed");
    if (!Number.isInteger(o.workers) || o.workers < 1) throw new RangeError(`workers must be a positive integer, got ${o.workers}`);
    this.options = { prefillDelayMs: DEFAULT_PREFILL_DELAY_MS, holdMs: DEFAULT_HOLD_MS, idPrefix: "", ...o };
    if (!(this.options.holdMs >= this.options.prefillDelayMs)) throw new RangeError("holdMs must be >= prefillDelayMs");
  }

  /** Requests booked so far. */
  get issued(): number {
    return this.#issued;
  }

  /** The prefill marks and frees due at `nowMs`, then `newRequests` bookings, in that order. */
  advance(nowMs: number, newRequests: number, sink: ScheduleSink): void {
    const o = this.options;
    this.#prefills.takeDue(nowMs, (id) => {
      sink.prefillDue(id);
    });
    this.#frees.takeDue(nowMs, (id) => {
      sink.freeDue(id);
    });
    for (let i = 0; i < newRequests; i++) {
      const k = this.#issued++;
      const id = `${o.idPrefix}r${k}`;
      this.#prefills.push({ atMs: nowMs + o.prefillDelayMs, requestId: id });
      this.#frees.push({ atMs: nowMs + o.holdMs, requestId: id });
      sink.booked(k, id, BigInt((k % o.workers) + 1), o.prompts[k % o.prompts.length] as HashList);
    }
  }
}

/** Exact load replication: every booking's add (with its sequence hashes), prefill_complete and free. */
export class SyntheticBookings {
  readonly #schedule: BookingSchedule;
  readonly #o: Required<SyntheticBookingsOptions>;
  readonly #live = new Map<string, { add: LoadAddEvent; prefillDone: boolean }>();

  constructor(o: SyntheticBookingsOptions) {
    this.#schedule = new BookingSchedule(o);
    this.#o = this.#schedule.options;
  }

  /** Requests booked so far. */
  get issued(): number {
    return this.#schedule.issued;
  }

  /** Bookings added and not yet freed. */
  get live(): number {
    return this.#live.size;
  }

  /** The prefill marks and frees due at `nowMs`, then `newRequests` adds, in that order. */
  step(nowMs: number, newRequests: number): MeshEvent[] {
    const out: MeshEvent[] = [];
    this.#schedule.advance(nowMs, newRequests, {
      prefillDue: (id) => {
        const b = this.#live.get(id);
        if (b === undefined) return;
        b.prefillDone = true;
        out.push(this.#mark("prefill_complete", id));
      },
      freeDue: (id) => {
        this.#live.delete(id);
        out.push(this.#mark("free", id));
      },
      booked: (_k, id, workerId, hashes) => {
        const add: LoadAddEvent = {
          type: "add",
          origin: this.#o.origin,
          owner: this.#o.origin,
          request_id: id,
          partition: PARTITION,
          block_size: this.#o.blockSize,
          worker_id: workerId,
          dp_rank: 0,
          sequence_hashes: hashes,
          prefill_tokens: this.#o.promptTokens,
          track_prefill: true,
          expected_output_tokens: null,
          prefill_duration_ms: null,
        };
        this.#live.set(id, { add, prefillDone: false });
        out.push({ kind: "load", event: add });
      },
    });
    return out;
  }

  /** Every live booking as a snapshot carries it. */
  snapshotBookings(): SnapshotBooking[] {
    return [...this.#live.values()].map((b) => ({ add: b.add, prefillDone: b.prefillDone }));
  }

  #mark(type: "prefill_complete" | "free", requestId: string): MeshEvent {
    return { kind: "load", event: { type, origin: this.#o.origin, owner: this.#o.origin, request_id: requestId, partition: PARTITION } };
  }
}
