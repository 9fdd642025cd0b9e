/**
 * A replicated kind: one sort of state a replica tells its peers about (bookings or load totals,
 * session bindings, catalogue entries, worker statuses, ...). Each kind is one file of this
 * folder exporting a factory; registry.ts lists them (in snapshot install order) and composes
 * their event, snapshot and per-origin types; the mesh's codec (mesh/wire.ts) has one entry per
 * event kind and snapshot key. Nothing else names a kind: the port (port.ts) dispatches by `kind`.
 */
import type { SessionBindings } from "../bindings.js";
import type { CatalogReplication } from "../catalog-replication.js";
import type { PredictionSnapshotRow } from "../predicted-snapshot.js";
import type { LoadStrategy } from "./load-strategy.js";

/** What a kind is built from: the core's parts it replicates, and this replica's own state. */
export interface ReplicaParts {
  readonly replicaId: bigint;
  /** The load strategy chosen for this replica's mode (load-strategy.ts). */
  readonly load: LoadStrategy;
  readonly bindings: SessionBindings;
  readonly catalog: CatalogReplication;
  /** The predicted cache of every partition, as snapshots carry it (predicted-snapshot.ts). */
  readonly predictions: PredictionSnapshots;
  /** This replica's own lifecycle as its peers may need it. */
  readonly local: LocalLifecycle;
}

/** The predicted cache's side of a snapshot. */
export interface PredictionSnapshots {
  snapshot(): PredictionSnapshotRow[];
  install(rows: readonly PredictionSnapshotRow[]): void;
}

/** This replica's own lifecycle: draining means it is leaving (`POST /drain`, a shutdown's drain window). */
export interface LocalLifecycle {
  readonly draining: boolean;
  /** Called once draining starts. */
  onDraining(listener: () => void): void;
}

/**
 * One kind's behaviour. `E` is its events (a `{ kind, event }` union member or members), `S` the
 * part of a snapshot it owns, `F` what it tells of an origin (GET /replica_sync/peers, heartbeats).
 */
export interface ReplicaKind<E extends { readonly kind: string }, S extends object, F extends object = object> {
  /** The event kinds this one applies (dispatch keys). */
  readonly kinds: readonly E["kind"][];
  /** A peer's event, `origin` the replica whose stream carried it. Idempotent. Returns the part's outcome (tests, diagnostics). */
  apply(origin: bigint, e: E): unknown;
  /** This replica's part of a snapshot. */
  snapshot(): S;
  /** `origin`'s snapshot part replaces what is held of it (kinds install in registry order). */
  install(origin: bigint, s: S): void;
  /** `origin` left (deregistered or down): forget what is held of it. Returns how many of its bookings went (0 for kinds without any). */
  dropOrigin?(origin: bigint): number;
  /** What this kind holds of `origin`. */
  describe?(origin: bigint): F;
}

/** A kind's factory: built once per service from its parts, `emit` telling peers. */
export type ReplicaKindFactory<E extends { readonly kind: string }, S extends object, F extends object = object> = (parts: ReplicaParts, emit: (e: E) => void) => ReplicaKind<E, S, F>;
