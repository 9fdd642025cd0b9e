/**
 * Exact load replication: load events apply idempotently by `(owner, request_id)`, with tombstones
 * and early prefill marks for events that overtook each other; a peer's snapshot replaces what is
 * mirrored of it; a departed peer's bookings are dropped. Mirrored bookings are ordinary ledger
 * entries with a reservation row whose owner is the peer, so selection reads them like its own.
 */
import type { Partition } from "../partition.js";
import { ReorderState, type BookingSnapshot, type LoadAddEvent, type LoadAggregates, type LoadEvent } from "../replica-events.js";
import { partitionKey } from "../worker-catalog.js";
import type { LoadSnapshotPart, LoadStrategy, LoadStrategyOptions } from "./load-strategy.js";

export class ExactLoad implements LoadStrategy {
  readonly mode = "exact" as const;
  readonly #o: LoadStrategyOptions;
  readonly #reorder = new ReorderState();

  constructor(o: LoadStrategyOptions) {
    this.#o = o;
  }

  ownEvent(e: LoadEvent): void {
    this.#o.emit(e);
  }

  ownChanged(): void {
    // Peers count a booking's prompt, not its output blocks.
  }

  noteFreed(owner: bigint, selectionId: string): void {
    this.#reorder.addTombstone(ReorderState.key(owner, selectionId), this.#o.clock.now());
  }

  ownBookingsGone(): void {
    // Rows that leave with their rank leave peers' mirrors with it (rankLeaving on each).
  }

  collect(): LoadAggregates[] {
    return [];
  }

  get decaying(): boolean {
    return false;
  }

  peerLifecycle(): undefined {
    return undefined;
  }

  /**
   * Applies a peer's load event, idempotently by `(owner, request_id)`. A Free that overtook its
   * Add leaves a tombstone so the late Add is ignored; an early prefill-complete is remembered
   * and applied with the Add. Returns whether the event changed state.
   */
  applyEvent(e: LoadEvent): boolean {
    const { replicaId, clock, counters, fleet, book } = this.#o;
    if (e.origin === replicaId) return this.#ignored();
    const now = clock.now();
    const key = ReorderState.key(e.owner, e.request_id);
    switch (e.type) {
      case "add": {
        const p = fleet.partition(partitionKey(e.partition.model_name, e.partition.routing_group));
        if (p === undefined || e.block_size !== p.blockSize) return this.#unplaced(e);
        if (this.#reorder.hasTombstone(key, now)) return this.#ignored();
        if (book.has(e.request_id) || p.ledger.has(e.request_id)) return this.#ignored();
        const rank = p.ranks.get(e.worker_id, e.dp_rank);
        if (rank === undefined) return this.#unplaced(e);
        p.ledger.add(e.request_id, rank, e.sequence_hashes, {
          prefillTokens: e.prefill_tokens,
          trackPrefill: e.track_prefill,
          expectedPrefillDurationMs: e.prefill_duration_ms,
          expectedOutputTokens: e.expected_output_tokens,
        });
        // The peer's booking is in flight on the rank: its prefix counts as predicted cache here too.
        p.predicted.recordBooking(rank, e.sequence_hashes);
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

  /** Totals are aggregate mode's: a peer in the other mode (a misconfigured mesh) is ignored, counted. */
  applyTotals(_origin: bigint, a: LoadAggregates): number {
    this.#o.counters.replicaEventsIgnored += a.rows.length;
    return 0;
  }

  #ignored(): false {
    this.#o.counters.replicaEventsIgnored++;
    return false;
  }

  /** An add for a worker not known here (yet): ignored, and its sender noted for a re-pull (missed-state.ts). */
  #unplaced(e: LoadAddEvent): false {
    this.#o.missed?.note(e.origin, e.worker_id);
    return this.#ignored();
  }

  /**
   * Every live booking held here, own and mirrored, each with its owner. A receiver replaces what
   * it mirrors of this replica's own bookings and adds the others it lacks (a restarted replica
   * thereby learns the bookings of a peer that died).
   */
  snapshot(): LoadSnapshotPart {
    const bookings: BookingSnapshot[] = [];
    for (const row of this.#o.book.rows()) {
      bookings.push({ add: row.add, prefillDone: row.partition.ledger.get(row.selectionId)?.prefillDone ?? false });
    }
    return { bookings };
  }

  /**
   * Installs a snapshot from `owner`: rows `owner` booked that the snapshot lacks are freed;
   * bookings missing here (its own, or others' it mirrors) are added; prefill completion is
   * brought up to date. Tombstones keep a freed booking from coming back. Totals (a peer in
   * aggregate mode) are ignored.
   */
  install(owner: bigint, s: LoadSnapshotPart): void {
    this.#replace(owner, s.bookings);
  }

  #replace(owner: bigint, bookings: readonly BookingSnapshot[]): { added: number; removed: number } {
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
        if (this.applyEvent({ ...b.add, origin: owner })) added++;
      }
      // Prefill completion only moves forward, whoever reports it.
      if (b.prefillDone) book.get(b.add.request_id)?.partition.ledger.markPrefillComplete(b.add.request_id);
    }
    return { added, removed };
  }

  dropOrigin(owner: bigint): number {
    return this.#replace(owner, []).removed;
  }

  countOwnedBy(owner: bigint): number {
    return this.#o.book.countOwnedBy(owner);
  }

  get mirroredBookingCount(): number {
    return 0;
  }

  mirrorsBooking(): boolean {
    return false;
  }

  partitionCreated(): void {}

  partitionRemoved(): void {}

  rankLeaving(p: Partition, rank: number): void {
    p.mirrored.dropRank(rank);
  }

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
