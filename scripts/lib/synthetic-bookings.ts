/**
 * Synthetic bookings for the stress mode of bench:scale: what an origin replica routing R
 * requests/s emits into the mesh, without HTTP or selection. Request k is booked on worker
 * (k mod workers) + 1, rank 0, in the default partition, with the sequence hashes of one of a
 * few 14,000-token prompts; its prefill completes `prefillDelayMs` later and it is freed
 * `holdMs` after the add (the means of bench-workload.ts's 20-80 ms and 200-800 ms). The live
 * bookings are kept, so a snapshot carries exactly what the published events built. Pure: time
 * comes in as arguments.
 */
import type { HashList } from "../../src/core/hash64.js";
import type { LoadAddEvent, PartitionRef } from "../../src/core/replica-events.js";
import { DEFAULT_MODEL_NAME, DEFAULT_ROUTING_GROUP } from "../../src/core/types.js";
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

const PARTITION: PartitionRef = Object.freeze({ model_name: DEFAULT_MODEL_NAME, routing_group: DEFAULT_ROUTING_GROUP });

export class SyntheticBookings {
  readonly #o: Required<SyntheticBookingsOptions>;
  readonly #live = new Map<string, { add: LoadAddEvent; prefillDone: boolean }>();
  /** FIFOs: every request waits the same delay, so due order is add order. */
  readonly #prefills = new DueQueue();
  readonly #frees = new DueQueue();
  #issued = 0;

  constructor(o: SyntheticBookingsOptions) {
    if (o.prompts.length === 0) throw new RangeError("at least one prompt is needed");
    if (!Number.isInteger(o.workers) || o.workers < 1) throw new RangeError(`workers must be a positive integer, got ${o.workers}`);
    this.#o = { prefillDelayMs: DEFAULT_PREFILL_DELAY_MS, holdMs: DEFAULT_HOLD_MS, idPrefix: "", ...o };
    if (!(this.#o.holdMs >= this.#o.prefillDelayMs)) throw new RangeError("holdMs must be >= prefillDelayMs");
  }

  /** Requests booked so far. */
  get issued(): number {
    return this.#issued;
  }

  /** Bookings added and not yet freed. */
  get live(): number {
    return this.#live.size;
  }

  /** The prefill marks and frees due at `nowMs`, then `newRequests` adds, in that order. */
  step(nowMs: number, newRequests: number): MeshEvent[] {
    const out: MeshEvent[] = [];
    this.#prefills.takeDue(nowMs, (id) => {
      const b = this.#live.get(id);
      if (b === undefined) return;
      b.prefillDone = true;
      out.push(this.#mark("prefill_complete", id));
    });
    this.#frees.takeDue(nowMs, (id) => {
      this.#live.delete(id);
      out.push(this.#mark("free", id));
    });
    for (let i = 0; i < newRequests; i++) {
      const k = this.#issued++;
      const id = `${this.#o.idPrefix}r${k}`;
      const hashes = this.#o.prompts[k % this.#o.prompts.length] as HashList;
      const add: LoadAddEvent = {
        type: "add",
        origin: this.#o.origin,
        owner: this.#o.origin,
        request_id: id,
        partition: PARTITION,
        block_size: this.#o.blockSize,
        worker_id: BigInt((k % this.#o.workers) + 1),
        dp_rank: 0,
        sequence_hashes: hashes,
        prefill_tokens: this.#o.promptTokens,
        track_prefill: true,
        expected_output_tokens: null,
        prefill_duration_ms: null,
      };
      this.#live.set(id, { add, prefillDone: false });
      this.#prefills.push({ atMs: nowMs + this.#o.prefillDelayMs, requestId: id });
      this.#frees.push({ atMs: nowMs + this.#o.holdMs, requestId: id });
      out.push({ kind: "load", event: add });
    }
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
