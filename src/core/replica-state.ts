/**
 * Peers' load as this replica mirrors it: the one place that knows how a peer's bookings get
 * into the ledgers. Load events apply idempotently by `(owner, request_id)`, with tombstones and
 * early prefill marks for events that overtook each other; a peer's snapshot replaces what is
 * mirrored of it; a departed peer's bookings are dropped. Mirrored bookings are ordinary ledger
 * entries with a reservation row whose owner is the peer, so selection reads them like its own.
 */
import type { Clock } from "./clock.js";
import type { Fleet } from "./fleet.js";
import { ReorderState, type BookingSnapshot, type LoadEvent } from "./replica-events.js";
import type { ReservationBook } from "./reservations.js";
import type { ServiceCounters } from "./service-stats.js";
import { partitionKey } from "./worker-catalog.js";

export interface ReplicaStateOptions {
  readonly replicaId: bigint;
  readonly clock: Clock;
  readonly counters: ServiceCounters;
  readonly fleet: Pick<Fleet, "partition">;
  readonly book: ReservationBook;
}

export class ReplicaState {
  readonly #o: ReplicaStateOptions;
  readonly #reorder = new ReorderState();

  constructor(options: ReplicaStateOptions) {
    this.#o = options;
  }

  /**
   * Applies a peer's load event, idempotently by `(owner, request_id)`. A Free that overtook its
   * Add leaves a tombstone so the late Add is ignored; an early prefill-complete is remembered
   * and applied with the Add. Returns whether the event changed state.
   */
  applyLoadEvent(e: LoadEvent): boolean {
    const { replicaId, clock, counters, fleet, book } = this.#o;
    if (e.origin === replicaId) return this.#ignored();
    const now = clock.now();
    const key = ReorderState.key(e.owner, e.request_id);
    const p = fleet.partition(partitionKey(e.partition.model_name, e.partition.routing_group));
    switch (e.type) {
      case "add": {
        if (p === undefined || e.block_size !== p.blockSize) return this.#ignored();
        if (this.#reorder.hasTombstone(key, now)) return this.#ignored();
        if (book.has(e.request_id) || p.ledger.has(e.request_id)) return this.#ignored();
        const rank = p.ranks.get(e.worker_id, e.dp_rank);
        if (rank === undefined) return this.#ignored();
        p.ledger.add(e.request_id, rank, e.sequence_hashes, {
          prefillTokens: e.prefill_tokens,
          trackPrefill: e.track_prefill,
          expectedPrefillDurationMs: e.prefill_duration_ms,
          expectedOutputTokens: e.expected_output_tokens,
        });
        if (this.#reorder.takeEarlyMark(key, now)) p.ledger.markPrefillComplete(e.request_id);
        book.install({ selectionId: e.request_id, partition: p, workerId: e.worker_id, dpRank: e.dp_rank, owner: e.owner, add: e, lease: undefined });
        break;
      }
      case "prefill_complete": {
        const row = book.get(e.request_id);
        if (row === undefined || row.owner !== e.owner) {
          this.#reorder.addEarlyMark(key, now);
          return this.#ignored();
        }
        row.partition.ledger.markPrefillComplete(e.request_id);
        break;
      }
      case "free": {
        this.#reorder.addTombstone(key, now);
        const row = book.get(e.request_id);
        if (row === undefined || row.owner !== e.owner) return this.#ignored();
        row.partition.ledger.free(e.request_id);
        book.drop(e.request_id);
        break;
      }
    }
    counters.replicaEventsApplied++;
    return true;
  }

  #ignored(): false {
    this.#o.counters.replicaEventsIgnored++;
    return false;
  }

  /** A booking was freed here: remember it, so a peer's late copy of its Add is not applied. */
  noteFreed(owner: bigint, selectionId: string): void {
    this.#reorder.addTombstone(ReorderState.key(owner, selectionId), this.#o.clock.now());
  }

  /**
   * Every live booking held here, own and mirrored, each with its owner: what a snapshot of this
   * replica carries. A receiver replaces what it mirrors of this replica's own bookings and adds
   * the others it lacks (a restarted replica thereby learns the bookings of a peer that died).
   */
  bookingsSnapshot(): BookingSnapshot[] {
    const out: BookingSnapshot[] = [];
    for (const row of this.#o.book.rows()) {
      out.push({ add: row.add, prefillDone: row.partition.ledger.get(row.selectionId)?.prefillDone ?? false });
    }
    return out;
  }

  /** Live bookings this replica holds that `owner` made (own or mirrored). */
  countOwnedBy(owner: bigint): number {
    return this.#o.book.countOwnedBy(owner);
  }

  /**
   * Installs a snapshot from `owner`: rows `owner` booked that the snapshot lacks are freed;
   * bookings missing here (its own, or others' it mirrors) are added; prefill completion is
   * brought up to date. Tombstones keep a freed booking from coming back.
   */
  replaceOrigin(owner: bigint, bookings: readonly BookingSnapshot[]): { added: number; removed: number } {
    const { replicaId, book } = this.#o;
    if (owner === replicaId) return { added: 0, removed: 0 };
    const live = new Map(bookings.map((b) => [b.add.request_id, b]));
    let removed = 0;
    for (const row of [...book.rows()]) {
      if (row.owner !== owner || live.has(row.selectionId)) continue;
      row.partition.ledger.free(row.selectionId);
      book.drop(row.selectionId);
      removed++;
    }
    let added = 0;
    for (const b of bookings) {
      if (b.add.owner === replicaId) continue;
      if (!book.has(b.add.request_id)) {
        if (this.applyLoadEvent({ ...b.add, origin: owner })) added++;
      }
      // Prefill completion only moves forward, whoever reports it.
      if (b.prefillDone) book.get(b.add.request_id)?.partition.ledger.markPrefillComplete(b.add.request_id);
    }
    return { added, removed };
  }

  /** Frees every booking mirrored from `owner` (a deregistered peer). Returns how many. */
  dropOrigin(owner: bigint): number {
    if (owner === this.#o.replicaId) return 0;
    return this.replaceOrigin(owner, []).removed;
  }

  /** Expires old tombstones and early marks. */
  sweep(now: number): void {
    this.#reorder.sweep(now);
  }

  get reorderEntries(): number {
    return this.#reorder.size;
  }

  get reorderShed(): number {
    return this.#reorder.shed;
  }
}
