import type { BindingEvent, CatalogEvent, LoadAggregates, LoadEvent, LoadReplication, OriginAggregates, WorkerStatusEvent } from "../../src/core/replica-events.js";
import type { ReplicaPort, ReplicaSlot } from "../../mesh/replica-port.js";
import type { SnapshotBooking } from "../../mesh/types.js";

/**
 * A ReplicaPort that records what the mesh does to it: the mesh's tests drive the mesh with this
 * instead of a SelectionService. `emitLoad`/`emitBinding` play local events; `owned` sets what
 * countOwnedBy answers. In aggregate mode, `pendingAggregates` is what the next
 * takeLoadAggregates hands out and `changeLoad` plays a change of our own bookings.
 */
export class FakeReplicaPort implements ReplicaPort {
  readonly replicaId: bigint;
  readonly loadReplication: LoadReplication;
  readonly applied: (LoadEvent | BindingEvent)[] = [];
  readonly appliedAggregates: { origin: bigint; a: LoadAggregates }[] = [];
  readonly replacedAggregates: { origin: bigint; snapshot: readonly LoadAggregates[] }[] = [];
  readonly adopted: { sender: bigint; mirrored: readonly OriginAggregates[] }[] = [];
  pendingAggregates: LoadAggregates[] = [];
  loadAggregatesDecaying = false;
  aggregatesSnapshot: LoadAggregates[] = [];
  readonly replaced: { origin: bigint; bookings: readonly SnapshotBooking[] }[] = [];
  readonly dropped: bigint[] = [];
  readonly owned = new Map<bigint, number>();
  slot: (() => ReplicaSlot) | null = null;
  #load: ((e: LoadEvent) => void) | undefined;
  #binding: ((e: BindingEvent) => void) | undefined;
  #workerChange: (() => void) | undefined;
  #loadChange: (() => void) | undefined;

  constructor(replicaId = 7n, loadReplication: LoadReplication = "exact") {
    this.replicaId = replicaId;
    this.loadReplication = loadReplication;
  }

  onLoadChange(listener: () => void): void {
    this.#loadChange = listener;
  }
  takeLoadAggregates(): LoadAggregates[] {
    return this.pendingAggregates.splice(0);
  }
  applyLoadAggregates(origin: bigint, a: LoadAggregates): void {
    this.appliedAggregates.push({ origin, a });
  }
  replaceOriginAggregates(origin: bigint, snapshot: readonly LoadAggregates[]): void {
    this.replacedAggregates.push({ origin, snapshot });
  }
  loadAggregatesSnapshot(): LoadAggregates[] {
    return this.aggregatesSnapshot;
  }
  mirroredAggregatesSnapshot(): OriginAggregates[] {
    return [];
  }
  adoptMirroredAggregates(sender: bigint, mirrored: readonly OriginAggregates[]): void {
    this.adopted.push({ sender, mirrored });
  }
  changeLoad(): void {
    this.#loadChange?.();
  }

  onLoadEvent(listener: (e: LoadEvent) => void): void {
    this.#load = listener;
  }
  onBindingEvent(listener: (e: BindingEvent) => void): void {
    this.#binding = listener;
  }
  onWorkerChange(listener: () => void): void {
    this.#workerChange = listener;
  }
  readonly appliedCatalog: CatalogEvent[] = [];
  readonly appliedStatuses: { origin: bigint; e: WorkerStatusEvent }[] = [];
  readonly replacedStatuses: { origin: bigint; statuses: readonly WorkerStatusEvent[] }[] = [];
  catalog: CatalogEvent[] = [];
  statuses: WorkerStatusEvent[] = [];
  #catalogEvent: ((e: CatalogEvent) => void) | undefined;
  #statusEvent: ((e: WorkerStatusEvent) => void) | undefined;
  onCatalogEvent(listener: (e: CatalogEvent) => void): void {
    this.#catalogEvent = listener;
  }
  onWorkerStatusEvent(listener: (e: WorkerStatusEvent) => void): void {
    this.#statusEvent = listener;
  }
  emitCatalog(e: CatalogEvent): void {
    this.#catalogEvent?.(e);
  }
  emitStatus(e: WorkerStatusEvent): void {
    this.#statusEvent?.(e);
  }
  applyCatalogEvent(e: CatalogEvent): void {
    this.appliedCatalog.push(e);
  }
  applyWorkerStatus(origin: bigint, e: WorkerStatusEvent): void {
    this.appliedStatuses.push({ origin, e });
  }
  replaceWorkerStatuses(origin: bigint, statuses: readonly WorkerStatusEvent[]): void {
    this.replacedStatuses.push({ origin, statuses });
  }
  catalogSnapshot(): CatalogEvent[] {
    return this.catalog;
  }
  workerStatusSnapshot(): WorkerStatusEvent[] {
    return this.statuses;
  }
  setReplicaSlot(slot: (() => ReplicaSlot) | null): void {
    this.slot = slot;
  }
  applyLoadEvent(e: LoadEvent): void {
    this.applied.push(e);
  }
  applyBindingEvent(e: BindingEvent): void {
    this.applied.push(e);
  }
  replaceOrigin(origin: bigint, bookings: readonly SnapshotBooking[]): void {
    this.replaced.push({ origin, bookings });
  }
  dropOrigin(origin: bigint): number {
    this.dropped.push(origin);
    return 0;
  }
  countOwnedBy(origin: bigint): number {
    return this.owned.get(origin) ?? 0;
  }
  bookingsSnapshot(): SnapshotBooking[] {
    return [];
  }
  bindingsSnapshot(): BindingEvent[] {
    return [];
  }

  emitLoad(e: LoadEvent): void {
    if (this.#load === undefined) throw new Error("mesh did not subscribe to load events");
    this.#load(e);
  }
  emitBinding(e: BindingEvent): void {
    if (this.#binding === undefined) throw new Error("mesh did not subscribe to binding events");
    this.#binding(e);
  }
  workerChanged(): void {
    this.#workerChange?.();
  }
}
