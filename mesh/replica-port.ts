/**
 * The mesh's port to the core. `ReplicaPort` is all the mesh sees of the selection core: the
 * members it calls, no more (SelectionService satisfies it structurally; tests drive the mesh
 * with a fake). What the HTTP layer sees of the mesh is its own (src/http/mesh-control.ts).
 */
import type { BindingEvent, CatalogEvent, LoadAggregates, LoadEvent, LoadReplication, OriginAggregates, WorkerStatusEvent } from "../src/core/replica-events.js";
import type { SnapshotBooking } from "./types.js";

/** This replica's position among itself and its live peers, for spreading argmin ties. */
export interface ReplicaSlot {
  readonly index: number;
  readonly count: number;
}

export interface ReplicaPort {
  /** This replica's id: the origin of what it publishes. */
  readonly replicaId: bigint;

  /** How this replica shares its load (every replica of a mesh must use the same). */
  readonly loadReplication: LoadReplication;

  // Outbound: local changes to replicate.
  /** Per booking change (exact mode), and lifecycle calls forwarded to a peer's booking (both modes). */
  onLoadEvent(listener: (e: LoadEvent) => void): void;
  /** Any change of our own bookings: in aggregate mode, changed totals wait in takeLoadAggregates. */
  onLoadChange(listener: () => void): void;
  /** Aggregate mode: our totals for the ranks that changed since the last call (empty otherwise). */
  takeLoadAggregates(): LoadAggregates[];
  /** Aggregate mode: a rank's prefill estimate still decays, so take again after an interval. */
  readonly loadAggregatesDecaying: boolean;
  onBindingEvent(listener: (e: BindingEvent) => void): void;
  /** A worker registered or changed: peers' bookings for it may have been ignored before. */
  onWorkerChange(listener: () => void): void;
  /** A worker catalogue change taken here (registration, patch, deletion), versioned. */
  onCatalogEvent(listener: (e: CatalogEvent) => void): void;
  /** This replica's own outcome for a worker changed. */
  onWorkerStatusEvent(listener: (e: WorkerStatusEvent) => void): void;
  /** Tie spreading (src/core/tie-spread.ts); null turns it off. */
  setReplicaSlot(slot: (() => ReplicaSlot) | null): void;

  // Inbound: peers' changes, idempotent.
  applyLoadEvent(e: LoadEvent): void;
  applyBindingEvent(e: BindingEvent): void;
  /** A peer's catalogue entry, merged last-writer-wins. */
  applyCatalogEvent(e: CatalogEvent): void;
  /** `origin`'s status for a worker. */
  applyWorkerStatus(origin: bigint, e: WorkerStatusEvent): void;
  /** Replaces `origin`'s statuses with a snapshot's. */
  replaceWorkerStatuses(origin: bigint, statuses: readonly WorkerStatusEvent[]): void;
  /** Aggregate mode: a peer's changed totals. */
  applyLoadAggregates(origin: bigint, a: LoadAggregates): void;
  /** Aggregate mode: replaces everything mirrored of `origin` with a snapshot's totals. */
  replaceOriginAggregates(origin: bigint, snapshot: readonly LoadAggregates[]): void;
  /** Aggregate mode: a snapshot's totals of other origins, for those this replica has not heard from. */
  adoptMirroredAggregates(sender: bigint, mirrored: readonly OriginAggregates[]): void;
  /** Replaces everything mirrored of `origin` with a snapshot's bookings. */
  replaceOrigin(origin: bigint, bookings: readonly SnapshotBooking[]): void;
  /** Drops what is mirrored of `origin` (deregistered), its worker statuses too; returns how many bookings went. */
  dropOrigin(origin: bigint): number;
  /** Bookings owned by `origin` (our own, or mirrored): heartbeats and the divergence check. */
  countOwnedBy(origin: bigint): number;

  // Snapshots served to peers.
  bookingsSnapshot(): SnapshotBooking[];
  bindingsSnapshot(): BindingEvent[];
  catalogSnapshot(): CatalogEvent[];
  workerStatusSnapshot(): WorkerStatusEvent[];
  loadAggregatesSnapshot(): LoadAggregates[];
  mirroredAggregatesSnapshot(): OriginAggregates[];
}
