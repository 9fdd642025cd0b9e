/**
 * The mesh's two ports. `ReplicaPort` is all the mesh sees of the selection core: the members it
 * calls, no more (SelectionService satisfies it structurally; tests drive the mesh with a fake).
 * `MeshControl` is all the HTTP layer sees of the mesh (register, deregister, list peers).
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

/** The mesh as the HTTP layer drives it (src/http/server.ts). */
export interface MeshControl {
  registerPeer(endpoint: string): Promise<boolean>;
  deregisterPeer(endpoint: string): Promise<boolean>;
  listPeers(): unknown[];
  /**
   * While the mesh pulls its peers' first snapshots after a start (mesh/startup-sync.ts): the
   * peers still awaited, which `/ready` reports with a 503; null once that is over. Optional: a
   * host-provided mesh without it never holds readiness.
   */
  startupSyncPending?(): string[] | null;
  /**
   * Applies, synchronously, every peer update the receive thread has handed over so far (a no-op
   * without one): the HTTP layer calls it before each request, so an answer reflects every peer
   * message received up to the thread's last hand-over rather than up to the last timed apply.
   */
  applyReceived(): void;
  /**
   * Resolves once every peer message this replica has received is applied (the receive thread
   * hands over between intervals): what a lifecycle call for an unknown reservation waits for
   * before answering 404, since the booking may sit in the thread's next hand-over.
   */
  catchUp(): Promise<void>;
}
