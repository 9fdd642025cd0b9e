/**
 * The replication port: all a replicator (the ZeroMQ mesh, or an embedding host's own transport)
 * sees of the selection core. What this replica tells its peers is one stream of typed events
 * (ReplicaEvent, keyed by kind) to the links attached; what it is told is applied through one
 * entry (`apply`); snapshots are assembled and installed here, in the kinds' order. The load
 * strategy (exact or aggregate) is chosen once; nothing on this side of the port branches on it.
 *
 * Inbound apply is the core's rule: a link that holds peers' messages for later (the mesh's
 * receive thread) gives `drainInbound`, and the service calls it before every decision and view,
 * whoever calls the service (HTTP, ext_proc, an embedding host).
 */
import type { BindingEvent, LoadReplication } from "../replica-events.js";
import type { ReplicaSlot } from "../tie-spread.js";
import type { LoadStrategy } from "./load-strategy.js";
import type { LocalLifecycle, ReplicaParts } from "./kind.js";
import type { MissedPeerState } from "./missed-state.js";
import { REPLICA_KINDS, type AnyReplicaKind, type OriginFacts, type ReplicaEvent, type ReplicaSnapshot } from "./registry.js";

/** What a replicator attaches to the port: where events go, and what it offers the core. */
export interface ReplicaLink {
  /** Every change this replica tells its peers, in order, as it happens. */
  event(e: ReplicaEvent): void;
  /**
   * Coalesced changes (aggregate load totals) are waiting: take them with the attachment's
   * `collect()` when your pacing allows.
   */
  pending?(): void;
  /**
   * A worker registered or changed here, and these origins had sent load for it that could not be
   * placed before (missed-state.ts): re-pull their snapshots. Never called with none, so an
   * idempotent re-registration or a PATCH costs peers nothing.
   */
  workersChanged?(origins: readonly bigint[]): void;
  /**
   * Applies whatever peers' messages the link holds (through `apply`): called before every
   * decision and view of the service, so each sees everything handed over so far.
   */
  drainInbound?(): void;
  /** This replica's slot among the live replicas: argmin ties spread by it (tie-spread.ts). */
  slot?(): ReplicaSlot;
}

export interface ReplicaAttachment {
  /** The coalesced changes since the last call, as events (empty when none wait). */
  collect(): ReplicaEvent[];
  /** Some coalesced value still decays with time: collect again after an interval. */
  readonly decaying: boolean;
  detach(): void;
}

export interface ReplicationPort {
  /** This replica's id: the origin of what it tells peers. */
  readonly replicaId: bigint;
  /** How it shares its load (every replica of a mesh must use the same). */
  readonly loadReplication: LoadReplication;
  attach(link: ReplicaLink): ReplicaAttachment;
  /** A batch of `origin`'s stream (or events another replica sent directly). Idempotent. */
  apply(origin: bigint, events: readonly ReplicaEvent[]): void;
  /**
   * Everything a peer needs to mirror this replica, taken synchronously. `pagedBindings`: the
   * bindings are left out (an empty list), to be walked with bindingCursor() instead (the mesh
   * sends the first page with the snapshot and the rest on request) (a snapshot
   * sent in pages, #29 G16: 16 partitions x 65,536 bindings is one legitimate replica's state).
   */
  snapshot(opts?: { readonly pagedBindings?: boolean }): ReplicaSnapshot;
  /**
   * The bindings a snapshot carries (live ones, then recent unbinds), one at a time over live
   * iterations of the tables: they merge last-writer-wins, so they may be sent and applied after
   * the rest of the snapshot, in pages.
   */
  bindingCursor(): Iterator<BindingEvent, void, void>;
  /** `origin`'s snapshot replaces what is held of it, kind by kind in install order. */
  install(origin: bigint, snapshot: ReplicaSnapshot): void;
  /** `origin` left: what is held of it goes. Returns how many of its bookings (or requests) went. */
  dropOrigin(origin: bigint): number;
  /** What is held of `origin` (for this replica itself: what it owns). */
  describe(origin: bigint): OriginFacts;
}

export interface ReplicationOptions {
  readonly replicaId: bigint;
  readonly load: LoadStrategy;
  readonly parts: Omit<ReplicaParts, "replicaId" | "load" | "local">;
  readonly local: LocalLifecycle;
  /** Tie spreading on or off (a link's slot, or null). */
  readonly setSlot: (slot: (() => ReplicaSlot) | null) => void;
  /** Peers' load that could not be placed, by worker (the load strategy notes it). */
  readonly missed: MissedPeerState;
}

export class Replication implements ReplicationPort {
  readonly replicaId: bigint;
  /** The load strategy chosen (tests reach a strategy's own steps through it). */
  readonly load: LoadStrategy;
  readonly #kinds: AnyReplicaKind[];
  readonly #byKind = new Map<string, AnyReplicaKind>();
  #links: ReplicaLink[] = [];
  readonly #setSlot: ReplicationOptions["setSlot"];
  readonly #missed: MissedPeerState;
  #syncing = false;
  readonly #bindings: ReplicaParts["bindings"];

  constructor(o: ReplicationOptions) {
    this.replicaId = o.replicaId;
    this.load = o.load;
    this.#setSlot = o.setSlot;
    this.#missed = o.missed;
    const parts: ReplicaParts = { ...o.parts, replicaId: o.replicaId, load: o.load, local: o.local };
    this.#bindings = parts.bindings;
    const emit = (e: ReplicaEvent): void => {
      for (const l of this.#links) l.event(e);
    };
    this.#kinds = REPLICA_KINDS.map((f) => f(parts, emit) as AnyReplicaKind);
    for (const k of this.#kinds) for (const name of k.kinds) this.#byKind.set(name, k);
  }

  get loadReplication(): LoadReplication {
    return this.load.mode;
  }

  attach(link: ReplicaLink): ReplicaAttachment {
    this.#links = [...this.#links, link];
    const spreads = link.slot !== undefined;
    if (spreads) this.#setSlot(() => link.slot?.() ?? { index: 0, count: 1 });
    const load = this.load;
    return {
      collect: () => {
        const out: ReplicaEvent[] = [];
        for (const event of load.collect()) out.push({ kind: "loads", event });
        return out;
      },
      get decaying() {
        return load.decaying;
      },
      detach: () => {
        this.#links = this.#links.filter((l) => l !== link);
        if (spreads) this.#setSlot(null);
      },
    };
  }

  apply(origin: bigint, events: readonly ReplicaEvent[]): void {
    const byKind = this.#byKind;
    for (const e of events) byKind.get(e.kind)?.apply(origin, e);
  }

  /** One event, with its kind's outcome (whether a load event changed state, a binding's merge result...): tests and diagnostics. */
  applyOne(origin: bigint, e: ReplicaEvent): unknown {
    return this.#byKind.get(e.kind)?.apply(origin, e);
  }

  snapshot(opts: { readonly pagedBindings?: boolean } = {}): ReplicaSnapshot {
    let s = {} as ReplicaSnapshot;
    for (const k of this.#kinds) {
      if (opts.pagedBindings === true && k.kinds.includes("binding")) s = { ...s, bindings: [] };
      else s = { ...s, ...k.snapshot() };
    }
    return s;
  }

  bindingCursor(): Iterator<BindingEvent, void, void> {
    return this.#bindings.events();
  }

  install(origin: bigint, snapshot: ReplicaSnapshot): void {
    if (origin === this.replicaId) return;
    for (const k of this.#kinds) k.install(origin, snapshot);
  }

  dropOrigin(origin: bigint): number {
    if (origin === this.replicaId) return 0;
    let n = 0;
    for (const k of this.#kinds) if (k.dropOrigin !== undefined) n += k.dropOrigin(origin);
    return n;
  }

  describe(origin: bigint): OriginFacts {
    let f = {} as OriginFacts;
    for (const k of this.#kinds) if (k.describe !== undefined) f = { ...f, ...k.describe(origin) };
    return f;
  }

  // ------------------------------------------------------------------ the service's side

  /** Coalesced changes wait (the load strategy's `pending`). */
  pending(): void {
    for (const l of this.#links) l.pending?.();
  }

  /** A lifecycle call for a peer's booking, or one of our own booking changes, to tell peers. */
  emitLoad(event: ReplicaEvent): void {
    for (const l of this.#links) l.event(event);
  }

  /** `workerId` registered or changed here (null record: deleted, which adds nothing to place). */
  workersChanged(workerId: bigint, deleted: boolean): void {
    if (deleted) return;
    const origins = this.#missed.take(workerId);
    if (origins.length === 0) return;
    for (const l of this.#links) l.workersChanged?.(origins);
  }

  /** Before a decision: what the links hold of peers' messages applies first (not re-entered). */
  drainInbound(): void {
    if (this.#syncing) return;
    const links = this.#links;
    if (links.length === 0) return;
    this.#syncing = true;
    try {
      for (const l of links) l.drainInbound?.();
    } finally {
      this.#syncing = false;
    }
  }
}
