import type { BindingEvent, LoadEvent } from "../../src/core/replica-events.js";
import type { ReplicaPort, ReplicaSlot } from "../../mesh/replica-port.js";
import type { SnapshotBooking } from "../../mesh/types.js";

/**
 * A ReplicaPort that records what the mesh does to it: the mesh's tests drive the mesh with this
 * instead of a SelectionService. `emitLoad`/`emitBinding` play local events; `owned` sets what
 * countOwnedBy answers.
 */
export class FakeReplicaPort implements ReplicaPort {
  readonly replicaId: bigint;
  readonly applied: (LoadEvent | BindingEvent)[] = [];
  readonly replaced: { origin: bigint; bookings: readonly SnapshotBooking[] }[] = [];
  readonly dropped: bigint[] = [];
  readonly owned = new Map<bigint, number>();
  slot: (() => ReplicaSlot) | null = null;
  #load: ((e: LoadEvent) => void) | undefined;
  #binding: ((e: BindingEvent) => void) | undefined;
  #workerChange: (() => void) | undefined;

  constructor(replicaId = 7n) {
    this.replicaId = replicaId;
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
