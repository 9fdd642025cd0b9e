/**
 * Session bindings across replicas: the affinity table each partition gets, the one builder of
 * the `BindingEvent`s they publish, the last-writer-wins merge of peers' bindings (from the mesh
 * or a host), parking of bindings whose worker is not known here yet, snapshots, and the host
 * replication streams (`sessionBindingUpdates`).
 *
 * Versions are a Lamport clock `(sequence, writer_id)`. A new partition's table starts at the
 * wall clock in ns, but never at or below a sequence this service already issued or merged: a
 * writer whose clock stepped back (or moved to a host whose clock is behind) would otherwise
 * stamp versions its peers already hold newer ones of, and they would keep the stale binding.
 */
import { AffinityTable, affinitySweepIntervalMs, type BindingReason, type SessionBinding } from "./affinity-table.js";
import type { Clock, WallClockNs } from "./time.js";
import { KvmeshError } from "./errors.js";
import { DEFAULT_MAX_VERSION_SKEW_NS, LamportClock, type VersionRefusal } from "./lamport.js";
import type { Partition } from "./partition.js";
import type { BindingEvent } from "./replica-events.js";
import { MAX_ID_BYTES } from "./request-ids.js";
import type { ResolvedAffinityOptions } from "./service-options.js";
import type { ServiceCounters } from "./service-stats.js";
import { checkSessionBinding, type SessionBindingInput, type SessionBindingOutcome, type SessionBindingOutcomeKind } from "./session-binding-input.js";
import { SessionBindingSubscription, type SessionBindingUpdatesOptions } from "./session-binding-stream.js";
import type { WorkerId } from "./types.js";
import { partitionKey } from "./worker-catalog.js";

/** How long a peer's binding for a worker or partition not known here yet is kept, ms. */
export const DEFAULT_PARKED_BINDING_TTL_MS = 60_000;
/** Bound on parked bindings; past it the oldest is shed (counted). */
export const DEFAULT_PARKED_BINDINGS_MAX = 65_536;


/** The partitions bindings live in (the fleet). */
export interface PartitionLookup {
  partition(key: string): Partition | undefined;
  partitions(): Iterable<Partition>;
}

export interface SessionBindingsOptions {
  readonly clock: Clock;
  readonly wallClockNs: WallClockNs;
  /** Undefined: session affinity is off (no tables, peers' bindings are ignored). */
  readonly affinity: ResolvedAffinityOptions | undefined;
  /** Refresh coalescing window, ms (0 = off); each table caps it at its TTL / 8. */
  readonly refreshCoalesceMs: number;
  readonly writerId: bigint;
  readonly hostReplication: boolean;
  readonly counters: ServiceCounters;
  readonly fleet: PartitionLookup;
  /** A binding refused for a version past the clock's horizon (the caller logs it, throttled). */
  readonly onVersionRefused?: (r: VersionRefusal) => void;
}

/** Why a host's binding was refused, for its outcome. */
function futureVersionReason(clock: LamportClock): string {
  return `sequence: more than ${String(DEFAULT_MAX_VERSION_SKEW_NS / 1_000_000_000n)} s ahead of this replica's wall clock (latest accepted now: ${String(clock.horizon())})`;
}

/** THE builder of binding events: what a partition's table publishes and what a snapshot carries. */
export function bindingEvent(p: Pick<Partition, "modelName" | "routingGroup">, b: SessionBinding, reason: BindingReason): BindingEvent {
  return {
    model_name: p.modelName,
    routing_group: p.routingGroup,
    session_id: b.sessionId,
    worker_id: b.target.workerId,
    dp_rank: b.target.dpRank,
    sequence: b.version.sequence,
    writer_id: b.version.writerId,
    reason,
  };
}

export class SessionBindings {
  readonly #o: SessionBindingsOptions;
  readonly #listeners = new Set<(e: BindingEvent) => void>();
  readonly #subscriptions = new Set<SessionBindingSubscription>();
  /** Peer bindings waiting for their worker or partition: key partition/session, insertion = age order. */
  readonly #parked = new Map<string, { event: BindingEvent; expiresAtMs: number }>();
  /** Binding sequences issued or merged here: a new table's Lamport floor. */
  readonly #clock: LamportClock;

  constructor(options: SessionBindingsOptions) {
    this.#o = options;
    this.#clock = new LamportClock(options.wallClockNs);
  }

  get enabled(): boolean {
    return this.#o.affinity !== undefined;
  }

  /** The host-supplied writer id in host-replication mode, else undefined. */
  get hostWriterId(): bigint | undefined {
    return this.#o.hostReplication ? this.#o.writerId : undefined;
  }

  onBindingEvent(listener: (e: BindingEvent) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** The affinity table of a new partition (undefined without session affinity). */
  createTable(p: Pick<Partition, "modelName" | "routingGroup">): AffinityTable | undefined {
    const a = this.#o.affinity;
    if (a === undefined) return undefined;
    const table = new AffinityTable({
      ttlMs: a.ttlSecs * 1000,
      mode: a.mode,
      maxEntries: a.maxEntries,
      maxSessionIdBytes: a.maxSessionIdBytes,
      writerId: this.#o.writerId,
      clock: this.#o.clock,
      initialSequence: this.#clock.peek(),
      versions: this.#clock,
      refreshCoalesceMs: this.#o.refreshCoalesceMs,
      onRefreshCoalesced: () => {
        this.#o.counters.bindingRefreshesCoalesced++;
      },
    });
    table.onBinding((b, reason) => {
      this.#clock.observe(b.version.sequence);
      this.#o.counters.bindingsPublished++;
      const ev = bindingEvent(p, b, reason);
      for (const l of this.#listeners) l(ev);
    });
    return table;
  }


  /** Merges a peer's session binding by `(sequence, writer_id)` (the mesh's entry point). */
  applyBindingEvent(e: BindingEvent): string {
    if (this.#o.affinity === undefined) {
      this.#o.counters.bindingsIgnored++;
      return "ignored-affinity-disabled";
    }
    return this.#merge(e);
  }

  /** Host replication: validates and merges each binding, saying what happened to it. */
  applySessionBinding(input: SessionBindingInput | readonly SessionBindingInput[]): SessionBindingOutcome | SessionBindingOutcome[] {
    this.#assertHostReplication();
    if (Array.isArray(input)) return (input as readonly unknown[]).map((b) => this.#applyOne(b));
    return this.#applyOne(input);
  }

  check(binding: unknown): ReturnType<typeof checkSessionBinding> {
    return checkSessionBinding(binding, this.#o.affinity?.maxSessionIdBytes ?? MAX_ID_BYTES);
  }

  #applyOne(input: unknown): SessionBindingOutcome {
    const checked = this.check(input);
    if (!checked.ok) {
      this.#o.counters.bindingsIgnored++;
      return { outcome: "rejected-invalid", reason: checked.reason };
    }
    if (this.#refusedAhead(checked.binding)) return { outcome: "rejected-invalid", reason: futureVersionReason(this.#clock) };
    return { outcome: this.#merge(checked.binding) };
  }

  /** A version past the clock's horizon: never merged nor observed, it would saturate every clock that heard it (#29 G3). */
  #refusedAhead(e: BindingEvent): boolean {
    if (this.#clock.admits(e.sequence)) return false;
    this.#o.counters.bindingsIgnored++;
    this.#o.counters.versionsRefusedAhead++;
    this.#o.onVersionRefused?.({ kind: "binding", writerId: e.writer_id, sequence: e.sequence });
    return true;
  }

  #merge(e: BindingEvent): SessionBindingOutcomeKind {
    const c = this.#o.counters;
    if (this.#refusedAhead(e)) return "rejected-invalid";
    this.#clock.observe(e.sequence);
    const p = this.#o.fleet.partition(partitionKey(e.model_name, e.routing_group));
    if (e.writer_id === this.#o.writerId) {
      // Our own binding coming back. A peer's *refresh* of it means the session is in use there:
      // extend our idle TTL. Anything else (an echo, a snapshot copy) changes nothing.
      if (e.reason === "refresh" && p?.affinity?.refreshOwn({ sessionId: e.session_id, target: { workerId: e.worker_id, dpRank: e.dp_rank }, version: { sequence: e.sequence, writerId: e.writer_id } }) === true) {
        c.bindingsApplied++;
        return "refreshed";
      }
      c.bindingsIgnored++;
      return "ignored-own";
    }
    if (e.reason === "unbind") return this.#mergeUnbind(e, p);
    if (p?.affinity === undefined || !p.members.has(e.worker_id)) {
      // The binding is real; this replica just has not learned the worker (or partition) yet.
      // Park it and apply it when the worker registers, instead of dropping it.
      p?.affinity?.observeSequence(e.sequence);
      this.#park(e);
      return "parked-unknown-worker";
    }
    const outcome = p.affinity.applyReplica({
      sessionId: e.session_id,
      target: { workerId: e.worker_id, dpRank: e.dp_rank },
      version: { sequence: e.sequence, writerId: e.writer_id },
    });
    if (outcome.startsWith("ignored") || outcome.startsWith("rejected")) c.bindingsIgnored++;
    else c.bindingsApplied++;
    return outcome;
  }

  /**
   * A peer's unbind (its hard-mode conflict). Its worker need not be known here: it removes a
   * binding, and one parked for that worker goes too if older. Never parked itself.
   */
  #mergeUnbind(e: BindingEvent, p: Partition | undefined): SessionBindingOutcomeKind {
    const c = this.#o.counters;
    const key = `${e.model_name}:${e.routing_group}/${e.session_id}`;
    const parked = this.#parked.get(key)?.event;
    if (parked !== undefined && (parked.sequence < e.sequence || (parked.sequence === e.sequence && parked.writer_id < e.writer_id))) this.#parked.delete(key);
    if (p?.affinity === undefined) {
      c.bindingsIgnored++;
      return "ignored-conflict";
    }
    const outcome = p.affinity.applyReplicaUnbind({
      sessionId: e.session_id,
      target: { workerId: e.worker_id, dpRank: e.dp_rank },
      version: { sequence: e.sequence, writerId: e.writer_id },
    });
    if (outcome === "unbound") c.bindingsApplied++;
    else c.bindingsIgnored++;
    return outcome;
  }

  #assertHostReplication(): void {
    if (!this.#o.hostReplication) {
      throw new KvmeshError("KVMESH_HOST_REPLICATION_DISABLED", "host replication is disabled: construct the service with sessionReplicationWriterId (kvmesh serve --session-replication-writer-id N)");
    }
  }

  // ---------------------------------------------------------------- parking

  #park(e: BindingEvent): void {
    const key = `${e.model_name}:${e.routing_group}/${e.session_id}`;
    const prev = this.#parked.get(key)?.event;
    if (prev !== undefined && (prev.sequence > e.sequence || (prev.sequence === e.sequence && prev.writer_id >= e.writer_id))) return;
    this.#parked.delete(key);
    this.#parked.set(key, { event: e, expiresAtMs: this.#o.clock.now() + DEFAULT_PARKED_BINDING_TTL_MS });
    this.#o.counters.bindingsParked++;
    if (this.#parked.size > DEFAULT_PARKED_BINDINGS_MAX) {
      const oldest = this.#parked.keys().next();
      if (oldest.done !== true) {
        this.#parked.delete(oldest.value);
        this.#o.counters.parkedBindingsShed++;
      }
    }
  }

  /** Applies parked bindings whose worker just became a member of its partition. */
  unpark(p: Partition, workerId: WorkerId): void {
    if (this.#parked.size === 0) return;
    for (const [k, v] of this.#parked) {
      const e = v.event;
      if (e.worker_id !== workerId || e.model_name !== p.modelName || e.routing_group !== p.routingGroup) continue;
      this.#parked.delete(k);
      this.#o.counters.bindingsUnparked++;
      this.#merge(e);
    }
  }

  get parkedCount(): number {
    return this.#parked.size;
  }

  /** Runs `p`'s affinity reaper when due (idle bindings go, leased ones are re-published). */
  sweepTable(p: Partition, now: number): void {
    if (p.affinity !== undefined && now >= p.nextAffinitySweepMs) {
      p.affinity.sweep();
      p.nextAffinitySweepMs = now + affinitySweepIntervalMs(p.affinity.ttlMs);
    }
  }

  /** Drops parked bindings past their TTL (oldest first; insertion order is age order). */
  sweepParked(now: number): void {
    for (const [k, v] of this.#parked) {
      if (v.expiresAtMs > now) break;
      this.#parked.delete(k);
      this.#o.counters.parkedBindingsExpired++;
    }
  }

  // ---------------------------------------------------------------- snapshots and host streams

  /**
   * Every live session binding held here, then the unbinds of the last TTL (LWW merge makes
   * re-applying them harmless; a peer that missed an unbind in a gap learns it here).
   */
  snapshot(): BindingEvent[] {
    const out: BindingEvent[] = [];
    for (const p of this.#o.fleet.partitions()) {
      for (const b of p.affinity?.snapshot() ?? []) out.push(bindingEvent(p, b, "refresh"));
      for (const b of p.affinity?.unbinds() ?? []) out.push(bindingEvent(p, b, "unbind"));
    }
    return out;
  }

  /**
   * snapshot()'s events one at a time, partition by partition, over live iterations (no copy of
   * the tables): what a snapshot sent in pages walks (ReplicationPort.bindingCursor).
   */
  *events(): Generator<BindingEvent, void, void> {
    for (const p of [...this.#o.fleet.partitions()]) {
      const table = p.affinity;
      if (table === undefined) continue;
      for (const b of table.liveBindings()) yield bindingEvent(p, b, b.unbind ? "unbind" : "refresh");
    }
  }

  /** A host-replication stream of this service's bindings (see SelectionService.sessionBindingUpdates). */
  subscribe(opts: SessionBindingUpdatesOptions, shuttingDown: boolean): SessionBindingSubscription {
    this.#assertHostReplication();
    // Filled after construction: an already-aborted signal closes the subscription inside it.
    const ref: { sub?: SessionBindingSubscription; off?: () => void } = {};
    const sub = new SessionBindingSubscription(opts, {
      onClose: () => {
        ref.off?.();
        if (ref.sub !== undefined) this.#subscriptions.delete(ref.sub);
      },
      onShed: () => {
        this.#o.counters.droppedBindings++;
      },
    });
    ref.sub = sub;
    if (sub.closed) return sub;
    if (shuttingDown) sub.end();
    else {
      ref.off = this.onBindingEvent((e) => {
        sub.push(e);
      });
      this.#subscriptions.add(sub);
    }
    return sub;
  }

  get subscriberCount(): number {
    return this.#subscriptions.size;
  }

  /** Shutdown: streams deliver what is queued, then end (a host's relay loop finishes cleanly). */
  endSubscriptions(): void {
    for (const sub of this.#subscriptions) sub.end();
  }
}
