/**
 * The seam between the selection core and whatever replicates it (the ZeroMQ mesh, or an
 * embedding host). The core emits a load event for every local booking change and a binding
 * event for every committed or refreshed session binding; peers' events come back through
 * `SelectionService.applyLoadEvent` / `applyBindingEvent`.
 *
 * Load events are keyed by `(owner, request_id)`: `owner` is the replica that booked the
 * request, whichever replica later reports its prefill completion or free.
 */
import type { HashList } from "./hash64.js";
import type { Lifecycle, WorkerRequest } from "./types.js";

export interface PartitionRef {
  readonly model_name: string;
  readonly routing_group: string;
}

export interface LoadAddEvent {
  readonly type: "add";
  /** The replica that emitted this event (echo suppression). */
  readonly origin: bigint;
  /** The replica that booked the request (the idempotency key with request_id). */
  readonly owner: bigint;
  readonly request_id: string;
  readonly partition: PartitionRef;
  readonly block_size: number;
  readonly worker_id: bigint;
  readonly dp_rank: number;
  readonly sequence_hashes: HashList;
  /** Prefill tokens this booking adds while in prefill (the prefill load hint). */
  readonly prefill_tokens: number;
  readonly track_prefill: boolean;
  readonly expected_output_tokens: number | null;
  readonly prefill_duration_ms: number | null;
}

export interface LoadMarkEvent {
  readonly type: "prefill_complete" | "free";
  readonly origin: bigint;
  readonly owner: bigint;
  readonly request_id: string;
  readonly partition: PartitionRef;
}

export type LoadEvent = LoadAddEvent | LoadMarkEvent;

/**
 * How a replica shares the load it books: "exact" emits every booking's add (with its sequence
 * hashes), prefill-complete and free, and peers mirror each booking; "aggregate" publishes, per
 * rank, the absolute totals of what this replica has booked there, and peers sum them (see
 * mirrored-load.ts for why and what it costs). Every replica of one mesh must use the same mode.
 */
export type LoadReplication = "exact" | "aggregate";
export const LOAD_REPLICATION_MODES: readonly LoadReplication[] = ["exact", "aggregate"];

/** One rank's totals of what the origin booked there (absolute values, not deltas). */
export interface LoadAggregateRow {
  readonly worker_id: bigint;
  readonly dp_rank: number;
  readonly prefill_tokens: number;
  readonly blocks: number;
  readonly requests: number;
}

/** An origin's totals for the ranks of one partition that changed (or all of them, in a snapshot). */
export interface LoadAggregates {
  readonly partition: PartitionRef;
  readonly block_size: number;
  readonly rows: readonly LoadAggregateRow[];
  /**
   * Ids of the bookings the origin made (`added`) and ended (`removed`) in this partition since
   * its last publish; a snapshot lists every live one as added. Peers index them, so that a
   * lifecycle call for the booking resolves on any replica (it is forwarded to the owner), as in
   * exact mode and the reference.
   */
  readonly added: readonly AddedBooking[];
  readonly removed: readonly string[];
}

/** A booking id as peers index it: with its rank, so a free taken for it elsewhere can count it out. */
export interface AddedBooking {
  readonly id: string;
  readonly worker_id: bigint;
  readonly dp_rank: number;
  /**
   * The booking's prompt as predicted cache (predicted-cache.ts predictionOf: checkpoint sequence
   * hashes), when the origin predicts; peers hold it on the rank until confirmed or expired.
   */
  readonly predicted?: HashList;
}

/** Another origin's totals as a snapshot carries them (what the sender mirrors of it). */
export interface OriginAggregates {
  readonly origin: bigint;
  readonly aggregates: readonly LoadAggregates[];
}

/** A booking as a snapshot carries it: its add event, and whether its prefill completed. */
export interface BookingSnapshot {
  readonly add: LoadAddEvent;
  readonly prefillDone: boolean;
}

export interface BindingEvent {
  readonly model_name: string;
  readonly routing_group: string;
  readonly session_id: string;
  readonly worker_id: bigint;
  readonly dp_rank: number | null;
  readonly sequence: bigint;
  readonly writer_id: bigint;
  /**
   * Why it was emitted: a new binding, a move, a refresh (a use that extends the idle TTL), or an
   * unbind (hard mode: a dispatch away from it invalidated it; peers drop theirs if older).
   */
  readonly reason: "bind" | "rebind" | "refresh" | "unbind";
}

/**
 * One worker's entry of the replicated catalogue (src/core/catalog-replication.ts): its
 * registration as the writer resolved it, or `null` for a deletion (a tombstone). Versions
 * `(sequence, writer_id)` are a Lamport clock; the greater one wins everywhere.
 */
export interface CatalogEvent {
  readonly worker_id: bigint;
  readonly sequence: bigint;
  readonly writer_id: bigint;
  readonly worker: CatalogWorker | null;
}

/** What a registration replicates: the fields (the `POST /workers` shape) and the draining intent. */
export interface CatalogWorker {
  readonly request: WorkerRequest;
  readonly draining: boolean;
}

/**
 * A replica's own outcome for one worker (its lifecycle and reasons there: a KV endpoint it could
 * not open shows here), sent when it changes. The sender is the event's origin; the version is
 * the catalogue entry's when the status was taken.
 */
export interface WorkerStatusEvent {
  readonly worker_id: bigint;
  readonly sequence: bigint;
  readonly writer_id: bigint;
  readonly lifecycle: Lifecycle;
  readonly reasons: readonly string[];
}

/** How long a Free is remembered so an Add it overtook is not applied, ms (reference: 300 s). */
export const DEFAULT_REORDER_STATE_TTL_MS = 300_000;
/** Bound on remembered tombstones and early prefill marks; past it the oldest are shed (counted). */
export const DEFAULT_REORDER_STATE_MAX_ENTRIES = 200_000;

/**
 * Tombstones (a Free seen before or instead of its Add) and early prefill-complete marks,
 * expiring after a TTL, oldest first. Map insertion order is age order since the TTL is fixed.
 */
export class ReorderState {
  readonly #ttlMs: number;
  readonly #max: number;
  readonly #tombstones = new Map<string, number>();
  readonly #earlyMarks = new Map<string, number>();
  shed = 0;

  constructor(ttlMs = DEFAULT_REORDER_STATE_TTL_MS, maxEntries = DEFAULT_REORDER_STATE_MAX_ENTRIES) {
    this.#ttlMs = ttlMs;
    this.#max = maxEntries;
  }

  static key(owner: bigint, requestId: string): string {
    return `${owner}:${requestId}`;
  }

  addTombstone(key: string, nowMs: number): void {
    this.#put(this.#tombstones, key, nowMs);
    this.#earlyMarks.delete(key);
  }

  hasTombstone(key: string, nowMs: number): boolean {
    const exp = this.#tombstones.get(key);
    return exp !== undefined && exp > nowMs;
  }

  addEarlyMark(key: string, nowMs: number): void {
    this.#put(this.#earlyMarks, key, nowMs);
  }

  takeEarlyMark(key: string, nowMs: number): boolean {
    const exp = this.#earlyMarks.get(key);
    if (exp === undefined) return false;
    this.#earlyMarks.delete(key);
    return exp > nowMs;
  }

  get size(): number {
    return this.#tombstones.size + this.#earlyMarks.size;
  }

  sweep(nowMs: number): void {
    for (const m of [this.#tombstones, this.#earlyMarks]) {
      for (const [k, exp] of m) {
        if (exp > nowMs) break;
        m.delete(k);
      }
    }
  }

  #put(m: Map<string, number>, key: string, nowMs: number): void {
    m.delete(key);
    m.set(key, nowMs + this.#ttlMs);
    if (m.size > this.#max) {
      const oldest = m.keys().next();
      if (oldest.done !== true) {
        m.delete(oldest.value);
        this.shed++;
      }
    }
  }
}
