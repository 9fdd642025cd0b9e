/**
 * The mesh's two ports. `ReplicaPort` is all the mesh sees of the selection core: the members it
 * calls, no more (SelectionService satisfies it structurally; tests drive the mesh with a fake).
 * `MeshControl` is all the HTTP layer sees of the mesh (register, deregister, list peers).
 */
import type { BindingEvent, LoadEvent } from "../src/core/replica-events.js";
import type { SnapshotBooking } from "./types.js";

/** This replica's position among itself and its live peers, for spreading argmin ties. */
export interface ReplicaSlot {
  readonly index: number;
  readonly count: number;
}

export interface ReplicaPort {
  /** This replica's id: the origin of what it publishes. */
  readonly replicaId: bigint;

  // Outbound: local changes to replicate.
  onLoadEvent(listener: (e: LoadEvent) => void): void;
  onBindingEvent(listener: (e: BindingEvent) => void): void;
  /** A worker registered or changed: peers' bookings for it may have been ignored before. */
  onWorkerChange(listener: () => void): void;
  /** Tie spreading (src/core/tie-spread.ts); null turns it off. */
  setReplicaSlot(slot: (() => ReplicaSlot) | null): void;

  // Inbound: peers' changes, idempotent.
  applyLoadEvent(e: LoadEvent): void;
  applyBindingEvent(e: BindingEvent): void;
  /** Replaces everything mirrored of `origin` with a snapshot's bookings. */
  replaceOrigin(origin: bigint, bookings: readonly SnapshotBooking[]): void;
  /** Drops what is mirrored of `origin` (deregistered); returns how many bookings went. */
  dropOrigin(origin: bigint): number;
  /** Bookings owned by `origin` (our own, or mirrored): heartbeats and the divergence check. */
  countOwnedBy(origin: bigint): number;

  // Snapshots served to peers.
  bookingsSnapshot(): SnapshotBooking[];
  bindingsSnapshot(): BindingEvent[];
}

/** The mesh as the HTTP layer drives it (src/http/server.ts). */
export interface MeshControl {
  registerPeer(endpoint: string): Promise<boolean>;
  deregisterPeer(endpoint: string): Promise<boolean>;
  listPeers(): unknown[];
}
