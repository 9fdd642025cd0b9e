/**
 * Aggregate load replication: peers' per-rank totals go into each partition's MirroredLoad
 * (load-aggregates.ts); the ledger keeps only this replica's bookings, and its changed ranks are
 * what it publishes, coalesced: a change only marks totals pending, and the subscriber collects
 * them at its pace (the mesh: once per flush interval, whatever the request rate).
 */
import { LoadAggregation } from "../load-aggregates.js";
import type { Partition } from "../partition.js";
import { predictionOf } from "../predicted-cache.js";
import type { AddedBooking, LoadAggregates, LoadEvent, OriginAggregates } from "../replica-events.js";
import { partitionKey } from "../worker-catalog.js";
import type { LoadSnapshotPart, LoadStrategy, LoadStrategyOptions } from "./load-strategy.js";

export class AggregateLoad implements LoadStrategy {
  readonly mode = "aggregate" as const;
  readonly #o: LoadStrategyOptions;
  readonly #agg: LoadAggregation;

  constructor(o: LoadStrategyOptions) {
    this.#o = o;
    this.#agg = new LoadAggregation(o);
  }

  /** The book's events: ids that peers index so lifecycle calls resolve anywhere; totals follow. */
  ownEvent(e: LoadEvent): void {
    if (e.owner === this.#o.replicaId && e.type !== "prefill_complete") {
      const p = this.#o.fleet.partition(partitionKey(e.partition.model_name, e.partition.routing_group));
      if (p !== undefined) {
        if (e.type === "add") this.#agg.ownBooked(p, e.request_id, e.worker_id, e.dp_rank, p.predicted.enabled ? predictionOf(e.sequence_hashes) : undefined);
        else this.#agg.ownEnded(p, e.request_id);
      }
    }
    this.#o.pending();
  }

  ownChanged(): void {
    this.#o.pending();
  }

  noteFreed(): void {
    // Peers hold totals, not bookings: no late add to guard against.
  }

  ownBookingsGone(p: Partition, ids: readonly string[]): void {
    for (const id of ids) this.#agg.ownEnded(p, id);
  }

  collect(): LoadAggregates[] {
    return this.#agg.take();
  }

  get decaying(): boolean {
    return this.#agg.decaying;
  }

  /**
   * A lifecycle call for a booking a peer made: the event to send its owner (who applies it and
   * republishes its totals), or undefined when no peer's booking has that id here. A free forgets
   * the id at once, so a repeated free answers 404 as it would on the owner.
   */
  peerLifecycle(type: "prefill_complete" | "free", id: string): LoadEvent | undefined {
    const b = this.#agg.mirroredBooking(id);
    if (b === undefined) return undefined;
    if (type === "free") this.#agg.endMirroredBooking(id);
    return { type, origin: this.#o.replicaId, owner: b.owner, request_id: id, partition: b.partition };
  }

  /**
   * The ledger holds only our own bookings (they are what we publish): a peer only ever tells us
   * of a lifecycle call it took for one of them, or for a third replica's (counted out here).
   */
  applyEvent(e: LoadEvent): boolean {
    const { replicaId, counters, book } = this.#o;
    if (e.origin === replicaId) return this.#ignored();
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

  applyTotals(origin: bigint, a: LoadAggregates): number {
    if (origin === this.#o.replicaId) {
      this.#o.counters.replicaEventsIgnored += a.rows.length;
      return 0;
    }
    return this.#agg.apply(origin, a);
  }

  #ignored(): false {
    this.#o.counters.replicaEventsIgnored++;
    return false;
  }

  /** Our totals on every rank we have load on and our live booking ids, and what we mirror of others (for joiners). */
  snapshot(): LoadSnapshotPart {
    const { book, replicaId } = this.#o;
    const aggregates = this.#agg.snapshot((p) => {
      const ids: AddedBooking[] = [];
      for (const row of book.rows()) if (row.partition === p && row.owner === replicaId) ids.push({ id: row.selectionId, worker_id: row.workerId, dp_rank: row.dpRank });
      return ids;
    });
    return { bookings: [], aggregates, mirrored: this.#agg.mirroredSnapshot() };
  }

  /** A peer's totals replace what was mirrored of it; then its view of origins not heard from here is adopted. */
  install(origin: bigint, s: LoadSnapshotPart): void {
    if (origin === this.#o.replicaId) return;
    this.replaceTotals(origin, s.aggregates ?? []);
    this.adopt(origin, s.mirrored ?? []);
  }

  /** A peer's totals snapshot replaces what is mirrored of it; returns the requests it holds here now. */
  replaceTotals(origin: bigint, snapshot: readonly LoadAggregates[]): number {
    return this.#agg.replaceOrigin(origin, snapshot);
  }

  /** From `sender`'s snapshot: the totals it mirrors of origins this replica has not heard from; returns how many. */
  adopt(sender: bigint, mirrored: readonly OriginAggregates[]): number {
    return this.#agg.adopt(this.#o.replicaId, sender, mirrored);
  }

  dropOrigin(owner: bigint): number {
    if (owner === this.#o.replicaId) return 0;
    return this.#agg.dropOrigin(owner);
  }

  /** For this replica, the requests its published totals add up to; for a peer, its applied totals'. */
  countOwnedBy(owner: bigint): number {
    return owner === this.#o.replicaId ? this.#agg.publishedRequests : this.#agg.mirroredRequestsOf(owner);
  }

  get mirroredBookingCount(): number {
    return this.#agg.mirroredBookings;
  }

  mirrorsBooking(id: string): boolean {
    return this.#agg.mirroredBooking(id) !== undefined;
  }

  partitionCreated(p: Partition): void {
    this.#agg.track(p);
  }

  /** `p` left the fleet: what it still owes peers (zero rows, ended ids) goes with the next collect. */
  partitionRemoved(p: Partition): void {
    this.#agg.retire(p);
  }

  /** A rank is leaving `p`: peers' totals for it go, and ours is published as zero. */
  rankLeaving(p: Partition, rank: number): void {
    p.mirrored.dropRank(rank);
    this.#agg.rankLeaving(p, rank);
  }

  sweep(now: number): void {
    this.#agg.sweep(now);
  }

  get reorderEntries(): number {
    return 0;
  }

  get reorderShed(): number {
    return 0;
  }
}
