/**
 * How a replica shares the load it books (LoadReplication): one strategy per mode, chosen once
 * when the service is built (LOAD_STRATEGIES, load-strategies.ts), so no other part of the core asks which mode it
 * runs in. Both sides of replication go through it: this replica's own booking changes (out) and
 * peers' events, totals and snapshots (in).
 *
 * - exact-load.ts: every booking's add, prefill-complete and free is an event; peers mirror each
 *   booking (idempotent by `(owner, request_id)`, with tombstones and early marks).
 * - aggregate-load.ts: per-rank totals of what this replica booked, taken at the subscriber's
 *   pace (coalesced); peers sum them, and index booking ids so lifecycle calls resolve anywhere.
 */
import type { Clock } from "../time.js";
import type { Fleet } from "../fleet.js";
import type { Partition } from "../partition.js";
import type { BookingSnapshot, LoadAggregates, LoadEvent, LoadReplication, OriginAggregates } from "../replica-events.js";
import type { ReservationBook } from "../reservations.js";
import type { ServiceCounters } from "../service-stats.js";
import type { MissedPeerState } from "./missed-state.js";

/** What a snapshot carries of an origin's load (the wire keeps these names). */
export interface LoadSnapshotPart {
  /** Exact: every live booking held, own and mirrored, each with its owner (empty in aggregate mode). */
  readonly bookings: readonly BookingSnapshot[];
  /** Aggregate: the origin's totals on every rank it has load on, and its booking ids. */
  readonly aggregates?: readonly LoadAggregates[];
  /** Aggregate: the totals the origin mirrors of other origins (for joiners). */
  readonly mirrored?: readonly OriginAggregates[];
}

export interface LoadStrategyOptions {
  readonly replicaId: bigint;
  readonly clock: Clock;
  readonly counters: ServiceCounters;
  readonly fleet: Pick<Fleet, "partition" | "partitions">;
  readonly book: ReservationBook;
  /** Booking expiry, ms: how long a silent peer's aggregates are kept. */
  readonly expiryMs: number;
  /** Tells peers: an event of this replica's own (exact), or a lifecycle call forwarded to a peer's booking (both). */
  readonly emit: (e: LoadEvent) => void;
  /** Coalesced totals changed: the subscriber takes them (collect) at its pace. */
  readonly pending: () => void;
  /** Where peers' load for workers not known here is noted (re-pulled when they register). */
  readonly missed?: MissedPeerState;
}

export interface LoadStrategy {
  readonly mode: LoadReplication;

  // Out: this replica's own bookings.
  /** The book's event for a change of our own bookings. */
  ownEvent(e: LoadEvent): void;
  /** Our load changed without a booking event (an output block): only totals carry it. */
  ownChanged(): void;
  /** A booking was freed here: a peer's late copy of its add must not bring it back. */
  noteFreed(owner: bigint, selectionId: string): void;
  /** Own bookings that left with their rank (no free event was emitted for them). */
  ownBookingsGone(p: Partition, ids: readonly string[]): void;
  /** Coalesced totals changed since the last call (aggregate; exact: always empty). */
  collect(): LoadAggregates[];
  /** Some coalesced value still decays with time: collect again after an interval. */
  readonly decaying: boolean;
  /**
   * A lifecycle call for a booking this replica does not hold but indexes (aggregate): the event
   * to send its owner, or undefined (exact mode resolves it on the mirrored row).
   */
  peerLifecycle(type: "prefill_complete" | "free", id: string): LoadEvent | undefined;

  // In: peers'.
  applyEvent(e: LoadEvent): boolean;
  applyTotals(origin: bigint, a: LoadAggregates): number;
  snapshot(): LoadSnapshotPart;
  install(origin: bigint, s: LoadSnapshotPart): void;
  dropOrigin(origin: bigint): number;
  /** Bookings owned by `origin` (our own, or mirrored): heartbeats and the divergence check. */
  countOwnedBy(origin: bigint): number;

  // Views and upkeep.
  /** Peers' bookings held here that are not rows of the book (aggregate: indexed ids). */
  readonly mirroredBookingCount: number;
  mirrorsBooking(id: string): boolean;
  partitionCreated(p: Partition): void;
  partitionRemoved(p: Partition): void;
  rankLeaving(p: Partition, rank: number): void;
  sweep(now: number): void;
  readonly reorderEntries: number;
  readonly reorderShed: number;
}
