/**
 * Peers' load as this replica mirrors it: the one place that knows how a peer's bookings get
 * into this replica's view, in either LoadReplication mode.
 *
 * Exact: load events apply idempotently by `(owner, request_id)`, with tombstones and early
 * prefill marks for events that overtook each other; a peer's snapshot replaces what is mirrored
 * of it; a departed peer's bookings are dropped. Mirrored bookings are ordinary ledger entries
 * with a reservation row whose owner is the peer, so selection reads them like its own.
 *
 * Aggregate: peers' per-rank totals go into each partition's MirroredLoad (load-aggregates.ts);
 * the ledger keeps only this replica's bookings, and its changed ranks are what it publishes.
 */
import type { Clock } from "./time.js";
import type { Fleet } from "./fleet.js";
import { LoadAggregation } from "./load-aggregates.js";
import type { Partition } from "./partition.js";
import { ReorderState, type AddedBooking, type BookingSnapshot, type LoadAggregates, type LoadEvent, type LoadReplication, type OriginAggregates } from "./replica-events.js";
import type { ReservationBook } from "./reservations.js";
import type { ServiceCounters } from "./service-stats.js";
import { partitionKey } from "./worker-catalog.js";

export interface ReplicaStateOptions {
  readonly replicaId: bigint;
  readonly clock: Clock;
  readonly counters: ServiceCounters;
  readonly fleet: Pick<Fleet, "partition" | "partitions">;
  readonly book: ReservationBook;
  readonly mode: LoadReplication;
  /** Booking expiry, ms: how long a silent peer's aggregates are kept. */
  readonly expiryMs: number;
}

export class ReplicaState {
  readonly #o: ReplicaStateOptions;
  readonly #reorder = new ReorderState();
  /** Aggregate mode's state; undefined in exact mode. */
  readonly #agg: LoadAggregation | undefined;

  constructor(options: ReplicaStateOptions) {
    this.#o = options;
    this.#agg = options.mode === "aggregate" ? new LoadAggregation(options) : undefined;
  }

  get mode(): LoadReplication {
    return this.#o.mode;
  }

  /**
   * Applies a peer's load event, idempotently by `(owner, request_id)`. A Free that overtook its
   * Add leaves a tombstone so the late Add is ignored; an early prefill-complete is remembered
   * and applied with the Add. Returns whether the event changed state.
   */
  applyLoadEvent(e: LoadEvent): boolean {
    const { replicaId, clock, counters, fleet, book } = this.#o;
    if (e.origin === replicaId) return this.#ignored();
    // In aggregate mode the ledger holds only our own bookings (they are what we publish): a peer
    // only ever tells us of a lifecycle call it took for one of them.
    if (this.#agg !== undefined) {
      // Another replica took a free for a third one's booking (its owner may be gone): count it out.
      if (e.type === "free" && e.owner !== replicaId) {
        if (!this.#agg.endMirroredBooking(e.request_id)) return this.#ignored();
        counters.replicaEventsApplied++;
        return true;
      }
      if (e.type === "add" || e.owner !== replicaId || !book.has(e.request_id)) return this.#ignored();
      // Through the book, as a call made here: the change is published with our next totals.
      if (e.type === "free") book.free(e.request_id);
      else book.prefillComplete(e.request_id);
      counters.replicaEventsApplied++;
      return true;
    }
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
    // Aggregate mode: peers ignore bookings (the totals and ids in loadAggregatesSnapshot stand for them).
    if (this.#agg !== undefined) return out;
    for (const row of this.#o.book.rows()) {
      out.push({ add: row.add, prefillDone: row.partition.ledger.get(row.selectionId)?.prefillDone ?? false });
    }
    return out;
  }

  /**
   * Live bookings this replica holds that `owner` made (own or mirrored). In aggregate mode: for
   * this replica, the requests its published totals add up to; for a peer, its applied totals'.
   */
  countOwnedBy(owner: bigint): number {
    const agg = this.#agg;
    if (agg === undefined) return this.#o.book.countOwnedBy(owner);
    return owner === this.#o.replicaId ? agg.publishedRequests : agg.mirroredRequestsOf(owner);
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

  /** Frees every booking (or total) mirrored from `owner` (a deregistered peer). Returns how many. */
  dropOrigin(owner: bigint): number {
    if (owner === this.#o.replicaId) return 0;
    return this.replaceOrigin(owner, []).removed + (this.#agg?.dropOrigin(owner) ?? 0);
  }

  // ------------------------------------------------------------------ aggregate mode

  /** A new partition (aggregate mode records which of its ranks change). */
  partitionCreated(p: Partition): void {
    this.#agg?.track(p);
  }

  /** `p` left the fleet: what it still owes peers (zero rows, ended ids) goes with the next take. */
  partitionRemoved(p: Partition): void {
    this.#agg?.retire(p);
  }

  /** A rank is leaving `p`: peers' totals for it go, and ours is published as zero. */
  rankLeaving(p: Partition, rank: number): void {
    p.mirrored.dropRank(rank);
    this.#agg?.rankLeaving(p, rank);
  }

  /** This replica's totals for the ranks that changed since the last call (aggregate mode; else empty). */
  takeLoadAggregates(): LoadAggregates[] {
    return this.#agg?.take() ?? [];
  }

  /** Whether some rank's prefill estimate is still decaying (publish again after an interval). */
  get loadAggregatesDecaying(): boolean {
    return this.#agg?.decaying ?? false;
  }

  /** This replica's totals on every rank it has load on, and its live booking ids (a snapshot). */
  loadAggregatesSnapshot(): LoadAggregates[] {
    const { book, replicaId } = this.#o;
    return (
      this.#agg?.snapshot((p) => {
        const ids: AddedBooking[] = [];
        for (const row of book.rows()) if (row.partition === p && row.owner === replicaId) ids.push({ id: row.selectionId, worker_id: row.workerId, dp_rank: row.dpRank });
        return ids;
      }) ?? []
    );
  }

  /**
   * Aggregate mode's record of this replica's own booking changes (the book's load events): ids
   * that peers index so lifecycle calls resolve anywhere.
   */
  noteOwnLoadEvent(e: LoadEvent): void {
    const agg = this.#agg;
    if (agg === undefined || e.owner !== this.#o.replicaId || e.type === "prefill_complete") return;
    const p = this.#o.fleet.partition(partitionKey(e.partition.model_name, e.partition.routing_group));
    if (p === undefined) return;
    if (e.type === "add") agg.ownBooked(p, e.request_id, e.worker_id, e.dp_rank);
    else agg.ownEnded(p, e.request_id);
  }

  /** Own bookings that left with their rank (no free event was emitted for them). */
  ownBookingsGone(p: Partition, ids: readonly string[]): void {
    const agg = this.#agg;
    if (agg !== undefined) for (const id of ids) agg.ownEnded(p, id);
  }

  /**
   * Aggregate mode: a lifecycle call for a booking a peer made. Returns the event to send its
   * owner (who applies it and republishes its totals), or undefined when no peer's booking has
   * that id here. A free forgets the id at once, so a repeated free answers 404 as it would on
   * the owner.
   */
  peerLifecycle(type: "prefill_complete" | "free", id: string): LoadEvent | undefined {
    const b = this.#agg?.mirroredBooking(id);
    if (b === undefined) return undefined;
    if (type === "free") this.#agg?.endMirroredBooking(id);
    return { type, origin: this.#o.replicaId, owner: b.owner, request_id: id, partition: b.partition };
  }

  /** Applies a peer's totals (aggregate mode; ignored and counted in exact mode). */
  applyLoadAggregates(origin: bigint, a: LoadAggregates): number {
    if (this.#agg === undefined || origin === this.#o.replicaId) {
      this.#o.counters.replicaEventsIgnored += a.rows.length;
      return 0;
    }
    return this.#agg.apply(origin, a);
  }

  /** Aggregate mode: peers' bookings indexed here by id (0 in exact mode, where they are rows of the book). */
  get mirroredBookingCount(): number {
    return this.#agg?.mirroredBookings ?? 0;
  }

  /** Aggregate mode: whether a peer's booking with this id is indexed here. */
  mirrorsBooking(id: string): boolean {
    return this.#agg?.mirroredBooking(id) !== undefined;
  }

  /** What this replica mirrors of other origins (aggregate mode), for its snapshots. */
  mirroredAggregatesSnapshot(): OriginAggregates[] {
    return this.#agg?.mirroredSnapshot() ?? [];
  }

  /** From a peer's snapshot: the totals it mirrors of origins this replica has not heard from. */
  adoptMirroredAggregates(sender: bigint, mirrored: readonly OriginAggregates[]): number {
    return this.#agg?.adopt(this.#o.replicaId, sender, mirrored) ?? 0;
  }

  /** Installs a peer's totals snapshot; returns the requests it holds here now. */
  replaceOriginAggregates(origin: bigint, snapshot: readonly LoadAggregates[]): number {
    if (this.#agg === undefined || origin === this.#o.replicaId) return 0;
    return this.#agg.replaceOrigin(origin, snapshot);
  }

  /** Expires old tombstones and early marks, and silent peers' totals. */
  sweep(now: number): void {
    this.#reorder.sweep(now);
    this.#agg?.sweep(now);
  }

  get reorderEntries(): number {
    return this.#reorder.size;
  }

  get reorderShed(): number {
    return this.#reorder.shed;
  }
}
