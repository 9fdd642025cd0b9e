import type { BindingEvent, BookingSnapshot, CatalogEvent, LoadAggregates, LoadEvent, OriginAggregates, WorkerStatusEvent } from "../../src/core/replica-events.js";
import type { SelectionService } from "../../src/core/selection-service.js";
import { AggregateLoad } from "../../src/core/replication/aggregate-load.js";
import { Replication, type ReplicaAttachment } from "../../src/core/replication/port.js";
import type { ReplicaEvent } from "../../src/core/replication/registry.js";
import type { ReplicaSlot } from "../../src/core/tie-spread.js";

/**
 * The core's replication port as the core tests reach it: one kind's step at a time, under the
 * names the facade had before the port (applyLoadEvent, takeLoadAggregates, ...), each a thin
 * call through `service.replication` (its `applyOne` for a kind's outcome, the aggregate
 * strategy for its two install steps). Cached per service, so subscriptions stay attached.
 */
export interface ReplicaView {
  onLoadEvent(listener: (e: LoadEvent) => void): () => void;
  onLoadChange(listener: () => void): () => void;
  onBindingEvent(listener: (e: BindingEvent) => void): () => void;
  onCatalogEvent(listener: (e: CatalogEvent) => void): () => void;
  onWorkerStatusEvent(listener: (e: WorkerStatusEvent) => void): () => void;
  setReplicaSlot(slot: (() => ReplicaSlot) | null): void;
  takeLoadAggregates(): LoadAggregates[];
  readonly loadAggregatesDecaying: boolean;
  applyLoadEvent(e: LoadEvent): boolean;
  applyBindingEvent(e: BindingEvent): string;
  /** `origin`: the replica whose stream carried it (default: its writer). */
  applyCatalogEvent(e: CatalogEvent, origin?: bigint): string;
  applyWorkerStatus(origin: bigint, e: WorkerStatusEvent): void;
  applyLoadAggregates(origin: bigint, a: LoadAggregates): number;
  replaceWorkerStatuses(origin: bigint, statuses: readonly WorkerStatusEvent[]): void;
  replaceOriginAggregates(origin: bigint, snapshot: readonly LoadAggregates[]): number;
  adoptMirroredAggregates(sender: bigint, mirrored: readonly OriginAggregates[]): number;
  countOwnedBy(origin: bigint): number;
  dropOrigin(origin: bigint): number;
  bookingsSnapshot(): BookingSnapshot[];
  catalogSnapshot(): CatalogEvent[];
  workerStatusSnapshot(): WorkerStatusEvent[];
  loadAggregatesSnapshot(): LoadAggregates[];
  mirroredAggregatesSnapshot(): OriginAggregates[];
}

const views = new WeakMap<SelectionService, ReplicaView>();

export function replicaView(svc: SelectionService): ReplicaView {
  const cached = views.get(svc);
  if (cached !== undefined) return cached;
  const port = svc.replication;
  if (!(port instanceof Replication)) throw new Error("the service's replication port is not the core's");
  const on = <K extends ReplicaEvent["kind"]>(kind: K, listener: (e: Extract<ReplicaEvent, { kind: K }>["event"]) => void): (() => void) => {
    const deliver = listener as (e: ReplicaEvent["event"]) => void;
    const a = port.attach({
      event: (e) => {
        if (e.kind === kind) deliver(e.event);
      },
    });
    return () => {
      a.detach();
    };
  };
  let collector: ReplicaAttachment | undefined;
  const collect = (): ReplicaAttachment => (collector ??= port.attach({ event: () => undefined }));
  let slotAttachment: ReplicaAttachment | undefined;
  const aggregate = (): AggregateLoad => {
    if (!(port.load instanceof AggregateLoad)) throw new Error("not in aggregate load replication");
    return port.load;
  };
  const view: ReplicaView = {
    onLoadEvent: (l) => on("load", l),
    onLoadChange: (l) => {
      const a = port.attach({ event: () => undefined, pending: l });
      return () => {
        a.detach();
      };
    },
    onBindingEvent: (l) => on("binding", l),
    onCatalogEvent: (l) => on("catalog", l),
    onWorkerStatusEvent: (l) => on("worker_status", l),
    setReplicaSlot: (slot) => {
      slotAttachment?.detach();
      slotAttachment = slot === null ? undefined : port.attach({ event: () => undefined, slot });
    },
    takeLoadAggregates: () => collect().collect().map((e) => e.event as LoadAggregates),
    get loadAggregatesDecaying() {
      return collect().decaying;
    },
    applyLoadEvent: (e) => port.applyOne(e.origin, { kind: "load", event: e }) as boolean,
    applyBindingEvent: (e) => port.applyOne(e.writer_id, { kind: "binding", event: e }) as string,
    applyCatalogEvent: (e, origin) => port.applyOne(origin ?? e.writer_id, { kind: "catalog", event: e }) as string,
    applyWorkerStatus: (origin, e) => {
      port.applyOne(origin, { kind: "worker_status", event: e });
    },
    applyLoadAggregates: (origin, a) => port.applyOne(origin, { kind: "loads", event: a }) as number,
    replaceWorkerStatuses: (origin, statuses) => {
      // A snapshot of `origin` carrying only statuses (no bookings, bindings, catalogue).
      port.install(origin, { bookings: [], bindings: [], statuses });
    },
    replaceOriginAggregates: (origin, snapshot) => aggregate().replaceTotals(origin, snapshot),
    adoptMirroredAggregates: (sender, mirrored) => aggregate().adopt(sender, mirrored),
    countOwnedBy: (origin) => port.describe(origin).bookings,
    dropOrigin: (origin) => port.dropOrigin(origin),
    bookingsSnapshot: () => [...port.snapshot().bookings],
    catalogSnapshot: () => [...(port.snapshot().catalog ?? [])],
    workerStatusSnapshot: () => [...(port.snapshot().statuses ?? [])],
    loadAggregatesSnapshot: () => [...(port.snapshot().aggregates ?? [])],
    mirroredAggregatesSnapshot: () => [...(port.snapshot().mirrored ?? [])],
  };
  views.set(svc, view);
  return view;
}
