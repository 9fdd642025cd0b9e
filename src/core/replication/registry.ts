/**
 * The replicated kinds, in the order a snapshot installs them: the catalogue first (a joiner's
 * bookings, bindings and predictions then find their workers), the origin's worker statuses, its
 * load, its bindings, its drain flag, then its predicted cache. A new kind is one file here, a line in each list below, and its codec entry in
 * mesh/wire.ts.
 */
import { bindingKind, type BindingKindEvent, type BindingSnapshotPart } from "./binding-kind.js";
import { catalogKind, type CatalogKindEvent, type CatalogSnapshotPart } from "./catalog-kind.js";
import { drainKind, type DrainFacts, type DrainKindEvent, type DrainSnapshotPart } from "./drain-kind.js";
import type { ReplicaKind, ReplicaKindFactory } from "./kind.js";
import { loadKind, type LoadFacts, type LoadKindEvent } from "./load-kind.js";
import type { LoadSnapshotPart } from "./load-strategy.js";
import { predictedKind, type PredictedSnapshotPart } from "./predicted-kind.js";
import { workerStatusKind, type WorkerStatusKindEvent, type WorkerStatusSnapshotPart } from "./worker-status-kind.js";

/** One replicated change, keyed by `kind`: what a replica tells its peers, and what it is told. */
export type ReplicaEvent = LoadKindEvent | BindingKindEvent | CatalogKindEvent | WorkerStatusKindEvent | DrainKindEvent;

/** What a snapshot of one replica carries (the mesh adds its envelope: origin, epoch, seq). */
export type ReplicaSnapshot = LoadSnapshotPart & BindingSnapshotPart & CatalogSnapshotPart & WorkerStatusSnapshotPart & DrainSnapshotPart & PredictedSnapshotPart;

/** What this replica holds of one origin. */
export type OriginFacts = LoadFacts & DrainFacts;

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- each factory checks its own event and snapshot types
type AnyKindFactory = ReplicaKindFactory<any, any, any>;

/** Install order. */
export const REPLICA_KINDS: readonly AnyKindFactory[] = [catalogKind, workerStatusKind, loadKind, bindingKind, drainKind, predictedKind];

export type AnyReplicaKind = ReplicaKind<ReplicaEvent, ReplicaSnapshot, Partial<OriginFacts>>;
