import type { BindingEvent, CatalogEvent, LoadAggregates, LoadEvent, LoadReplication, OriginAggregates, WorkerStatusEvent } from "../../src/core/index.js";
import type { OriginFacts, ReplicaAttachment, ReplicaEvent, ReplicaLink, ReplicaPort, ReplicaSlot, ReplicaSnapshot } from "../../mesh/replica-port.js";
import type { SnapshotBooking } from "../../mesh/types.js";

/**
 * A ReplicaPort that records what the mesh does to it: the mesh's tests drive the mesh with this
 * instead of a SelectionService. What the mesh applies and installs is split back by kind into
 * the recording arrays (`applied`, `replaced`, `appliedCatalog`...). `emitLoad`/`emitBinding`/
 * `emitCatalog`/`emitStatus` play local events into the attached link; `owned` sets what
 * describe(origin).bookings answers. In aggregate mode, `pendingAggregates` is what the next
 * collect hands out and `changeLoad` plays a change of our own bookings.
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
  /** Origins that said they are leaving (describe(origin).draining). */
  readonly leaving = new Set<bigint>();
  readonly appliedCatalog: CatalogEvent[] = [];
  readonly appliedStatuses: { origin: bigint; e: WorkerStatusEvent }[] = [];
  readonly replacedStatuses: { origin: bigint; statuses: readonly WorkerStatusEvent[] }[] = [];
  /** Events of kinds without an array of their own above. */
  readonly appliedOther: { origin: bigint; e: ReplicaEvent }[] = [];
  catalog: CatalogEvent[] = [];
  statuses: WorkerStatusEvent[] = [];
  slot: (() => ReplicaSlot) | null = null;
  #link: ReplicaLink | undefined;

  constructor(replicaId = 7n, loadReplication: LoadReplication = "exact") {
    this.replicaId = replicaId;
    this.loadReplication = loadReplication;
  }

  attach(link: ReplicaLink): ReplicaAttachment {
    this.#link = link;
    this.slot = link.slot === undefined ? null : () => link.slot?.() ?? { index: 0, count: 1 };
    // eslint-disable-next-line @typescript-eslint/no-this-alias -- the attachment's getter reads the fake's field
    const self = this;
    return {
      collect: () => this.pendingAggregates.splice(0).map((event): ReplicaEvent => ({ kind: "loads", event })),
      get decaying() {
        return self.loadAggregatesDecaying;
      },
      detach: () => {
        this.#link = undefined;
        this.slot = null;
      },
    };
  }

  apply(origin: bigint, events: readonly ReplicaEvent[]): void {
    // An if-chain, not a switch: a kind added to the core lands in appliedOther without an edit here.
    for (const e of events) {
      if (e.kind === "load" || e.kind === "binding") this.applied.push(e.event);
      else if (e.kind === "loads") this.appliedAggregates.push({ origin, a: e.event });
      else if (e.kind === "catalog") this.appliedCatalog.push(e.event);
      else if (e.kind === "worker_status") this.appliedStatuses.push({ origin, e: e.event });
      else this.appliedOther.push({ origin, e });
    }
  }

  /** Recorded in the core's install order: catalogue, statuses, bookings, totals, adopted totals, bindings. */
  install(origin: bigint, s: ReplicaSnapshot): void {
    this.appliedCatalog.push(...(s.catalog ?? []));
    this.replacedStatuses.push({ origin, statuses: s.statuses ?? [] });
    this.replaced.push({ origin, bookings: s.bookings });
    this.replacedAggregates.push({ origin, snapshot: s.aggregates ?? [] });
    this.adopted.push({ sender: origin, mirrored: s.mirrored ?? [] });
    this.applied.push(...s.bindings);
    for (const o of s.drainingOrigins ?? []) this.leaving.add(o);
  }

  /** Bindings this fake's snapshot carries (whole, or walked by bindingCursor() when paged). */
  bindings: BindingEvent[] = [];

  snapshot(opts: { readonly pagedBindings?: boolean } = {}): ReplicaSnapshot {
    return { bookings: [], bindings: opts.pagedBindings === true ? [] : this.bindings, aggregates: this.aggregatesSnapshot, mirrored: [], catalog: this.catalog, statuses: this.statuses };
  }

  bindingCursor(): Iterator<BindingEvent, void, void> {
    return this.bindings.values();
  }

  dropOrigin(origin: bigint): number {
    this.dropped.push(origin);
    return 0;
  }

  describe(origin: bigint): OriginFacts {
    return { bookings: this.owned.get(origin) ?? 0, ...(this.leaving.has(origin) ? { draining: true as const } : {}) };
  }

  #emit(e: ReplicaEvent, what: string): void {
    if (this.#link === undefined) throw new Error(`mesh did not subscribe to ${what} events`);
    this.#link.event(e);
  }

  emitLoad(e: LoadEvent): void {
    this.#emit({ kind: "load", event: e }, "load");
  }
  emitBinding(e: BindingEvent): void {
    this.#emit({ kind: "binding", event: e }, "binding");
  }
  emitCatalog(e: CatalogEvent): void {
    this.#link?.event({ kind: "catalog", event: e });
  }
  emitStatus(e: WorkerStatusEvent): void {
    this.#link?.event({ kind: "worker_status", event: e });
  }
  /** A change of our own bookings (aggregate mode): coalesced totals wait. */
  changeLoad(): void {
    this.#link?.pending?.();
  }
  /** A worker changed here, and `origins` had sent load for it that could not be placed. */
  workerChanged(origins: readonly bigint[]): void {
    this.#link?.workersChanged?.(origins);
  }
  /** What the core does before each decision: the link's held inbound messages apply. */
  drainInbound(): void {
    this.#link?.drainInbound?.();
  }
}
