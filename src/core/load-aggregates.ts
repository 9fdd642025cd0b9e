/**
 * Aggregate load replication (replica-events.ts LoadReplication "aggregate"), both directions:
 * - out: which of this replica's ranks changed since the last publish, and their absolute totals
 *   (prefill tokens owed, unique active blocks, requests) read from its own ledger;
 * - in: a peer's totals into each partition's MirroredLoad, by (worker_id, dp_rank).
 *
 * In this mode a partition's ledger holds only this replica's own bookings, so its totals are
 * exactly what this replica contributes to the fleet's load.
 */
import type { Clock } from "./time.js";
import { aggregateRow, partitionRef, type Partition } from "./partition.js";
import type { HashList } from "./hash64.js";
import type { AddedBooking, LoadAggregateRow, LoadAggregates, OriginAggregates, PartitionRef } from "./replica-events.js";
import type { ServiceCounters } from "./service-stats.js";
import { partitionKey } from "./worker-catalog.js";
import type { MissedPeerState } from "./replication/missed-state.js";

export interface LoadAggregatesOptions {
  readonly clock: Clock;
  readonly counters: ServiceCounters;
  /** A peer whose totals have not changed for this long is forgotten, ms (the booking expiry). */
  readonly expiryMs: number;
  readonly fleet: {
    partition(key: string): Partition | undefined;
    partitions(): IterableIterator<Partition>;
  };
  /** Where a peer's non-zero totals for workers not known here are noted (re-pulled when they register). */
  readonly missed?: MissedPeerState;
}

/** Per partition: what was last published per rank key (requests), for the heartbeat's count. */
interface Published {
  readonly requests: Map<number, number>;
  /** Ranks whose prefill estimate decays: re-published on every take until it stops. */
  decaying: number[];
  /** Ranks that left the partition since the last take: published as zero, by worker id. */
  gone: LoadAggregateRow[];
  /** Own bookings made and ended since the last take (one made and ended in between is in neither). */
  readonly added: Map<string, AddedBooking>;
  readonly removed: Set<string>;
}

/** A peer's live booking as indexed here: whom to forward a lifecycle call for it to. */
export interface MirroredBooking {
  readonly owner: bigint;
  readonly partition: PartitionRef;
  readonly workerId: bigint;
  readonly dpRank: number;
}

export class LoadAggregation {
  readonly #o: LoadAggregatesOptions;
  readonly #published = new Map<Partition, Published>();
  /** Partitions that left the fleet with rows or ids still to publish (once, at the next take). */
  #retired: [Partition, Published][] = [];
  #publishedRequests = 0;
  /** Peer origin -> when its totals last changed here, clock ms. */
  readonly #heardAt = new Map<bigint, number>();
  readonly #scratch: number[] = [];
  /** Peers' live bookings by id, and each peer's ids (for snapshots and departures). */
  readonly #bookings = new Map<string, MirroredBooking>();
  /** Origins known only from other replicas' snapshots (adopted), not heard from directly. */
  readonly #indirect = new Set<bigint>();
  readonly #idsByOrigin = new Map<bigint, Set<string>>();

  constructor(options: LoadAggregatesOptions) {
    this.#o = options;
  }

  // ------------------------------------------------------------------ out (this replica's totals)

  /** A new partition: start recording which of its ranks change. */
  track(p: Partition): void {
    p.ledger.trackChanges();
  }

  /**
   * `p` left the fleet (its last worker went; rankLeaving ran for each of its ranks): its zero
   * rows and ended ids still go out at the next take, then nothing of it is kept.
   */
  retire(p: Partition): void {
    const pub = this.#published.get(p);
    if (pub === undefined) return;
    this.#published.delete(p);
    for (const requests of pub.requests.values()) this.#publishedRequests -= requests;
    if (pub.gone.length > 0 || pub.removed.size > 0) this.#retired.push([p, pub]);
  }

  /** A rank is leaving `p` (its worker went): peers get a zero row for it at the next take. */
  rankLeaving(p: Partition, rank: number): void {
    const pub = this.#published.get(p);
    const last = pub?.requests.get(rank);
    if (pub === undefined || last === undefined) return;
    pub.requests.delete(rank);
    this.#publishedRequests -= last;
    pub.gone.push(aggregateRow(p, rank, 0, 0, 0));
  }

  /** This replica booked `id` in `p`. */
  ownBooked(p: Partition, id: string, workerId: bigint, dpRank: number, predicted?: HashList): void {
    this.#pub(p).added.set(id, predicted === undefined ? { id, worker_id: workerId, dp_rank: dpRank } : { id, worker_id: workerId, dp_rank: dpRank, predicted });
  }

  /** This replica's booking `id` in `p` ended (freed, expired, or its worker left). */
  ownEnded(p: Partition, id: string): void {
    const pub = this.#pub(p);
    if (!pub.added.delete(id)) pub.removed.add(id);
  }

  /**
   * The totals of every rank whose load changed since the last call (and of ranks whose prefill
   * estimate is still decaying), per partition; empty when nothing changed.
   */
  take(): LoadAggregates[] {
    const out: LoadAggregates[] = [];
    for (const [p, pub] of this.#retired) out.push({ partition: partitionRef(p), block_size: p.blockSize, rows: pub.gone, added: [], removed: [...pub.removed] });
    this.#retired = [];
    for (const p of this.#o.fleet.partitions()) {
      const pub = this.#pub(p);
      const ranks = this.#scratch;
      ranks.length = 0;
      p.ledger.takeChanged(ranks);
      if (ranks.length === 0 && pub.decaying.length === 0 && pub.gone.length === 0 && pub.added.size === 0 && pub.removed.size === 0) continue;
      const rows: LoadAggregateRow[] = pub.gone;
      pub.gone = [];
      const seen = new Set<number>();
      const decaying: number[] = [];
      for (const rank of [...ranks, ...pub.decaying]) {
        if (seen.has(rank)) continue;
        seen.add(rank);
        // A rank key released (and maybe reused) since it changed: rankLeaving covered it.
        if (p.ranks.get(p.ranks.workerOf(rank), p.ranks.dpRankOf(rank)) !== rank) continue;
        const requests = p.ledger.activeRequests(rank);
        rows.push(aggregateRow(p, rank, p.ledger.activePrefillTokens(rank), p.ledger.activeBlocks(rank), requests));
        this.#publishedRequests += requests - (pub.requests.get(rank) ?? 0);
        if (requests === 0) pub.requests.delete(rank);
        else pub.requests.set(rank, requests);
        if (p.ledger.prefillDecaying(rank)) decaying.push(rank);
      }
      pub.decaying = decaying;
      const added = [...pub.added.values()];
      const removed = [...pub.removed];
      pub.added.clear();
      pub.removed.clear();
      out.push({ partition: partitionRef(p), block_size: p.blockSize, rows, added, removed });
    }
    return out;
  }

  /** Whether a take now would publish anything that a change has not already announced (decay). */
  get decaying(): boolean {
    if (this.#retired.length > 0) return true;
    for (const pub of this.#published.values()) if (pub.decaying.length > 0) return true;
    return false;
  }

  /** Requests this replica's published totals add up to: what peers mirror once they applied them. */
  get publishedRequests(): number {
    return this.#publishedRequests;
  }

  /** Every rank this replica has load on, per partition (what a snapshot of it carries). */
  snapshot(ownIds: (p: Partition) => AddedBooking[]): LoadAggregates[] {
    const out: LoadAggregates[] = [];
    for (const p of this.#o.fleet.partitions()) {
      const rows = p.ledger.loads().map((l) => aggregateRow(p, l.rank, l.activePrefillTokens, l.activeBlocks, l.activeRequests));
      const added = ownIds(p);
      if (rows.length > 0 || added.length > 0) out.push({ partition: partitionRef(p), block_size: p.blockSize, rows, added, removed: [] });
    }
    return out;
  }

  /**
   * What this replica mirrors of each peer, for a snapshot: a replica that joins or restarts
   * learns from it the load of a peer it cannot hear (one that died), as exact mode's snapshots
   * carry the mirrored bookings.
   */
  mirroredSnapshot(): OriginAggregates[] {
    const out: OriginAggregates[] = [];
    for (const origin of new Set([...this.#heardAt.keys(), ...this.#idsByOrigin.keys()])) {
      const aggregates: LoadAggregates[] = [];
      const ids = this.#idsByOrigin.get(origin);
      for (const p of this.#o.fleet.partitions()) {
        const rows = p.mirrored.rowsOf(origin).map(([rank, a]) => aggregateRow(p, rank, a.prefillTokens, a.blocks, a.requests));
        const ref = partitionRef(p);
        const added: AddedBooking[] = [];
        for (const id of ids ?? []) {
          const b = this.#bookings.get(id);
          if (b !== undefined && b.partition.model_name === ref.model_name && b.partition.routing_group === ref.routing_group) {
            added.push({ id, worker_id: b.workerId, dp_rank: b.dpRank });
          }
        }
        if (rows.length > 0 || added.length > 0) aggregates.push({ partition: ref, block_size: p.blockSize, rows, added, removed: [] });
      }
      if (aggregates.length > 0) out.push({ origin, aggregates });
    }
    return out;
  }

  /**
   * Installs what a snapshot's sender mirrors of other origins, for each one this replica has
   * not heard from itself (its own view of an origin it hears wins). An origin known only this
   * way is adopted again from later snapshots: the first may have come before this replica's
   * workers registered (its rows then had nowhere to go), and a worker registration pulls fresh
   * snapshots for exactly that. Returns the origins adopted.
   */
  adopt(self: bigint, sender: bigint, mirrored: readonly OriginAggregates[]): number {
    let adopted = 0;
    for (const m of mirrored) {
      if (m.origin === self || m.origin === sender) continue;
      const direct = (this.#heardAt.has(m.origin) || this.#idsByOrigin.has(m.origin)) && !this.#indirect.has(m.origin);
      if (direct) continue;
      this.#install(m.origin, m.aggregates, sender);
      this.#indirect.add(m.origin);
      adopted++;
    }
    return adopted;
  }

  // ------------------------------------------------------------------ in (peers' totals)

  /** Applies a peer's totals; rows for partitions, block sizes or workers unknown here are ignored. */
  apply(origin: bigint, a: LoadAggregates): number {
    this.#indexIds(origin, a);
    const p = this.#o.fleet.partition(partitionKey(a.partition.model_name, a.partition.routing_group));
    const { counters } = this.#o;
    if (p === undefined || p.blockSize !== a.block_size) {
      counters.replicaEventsIgnored += a.rows.length;
      this.#noteUnplaced(origin, a.rows);
      return 0;
    }
    let applied = 0;
    for (const r of a.rows) {
      const rank = p.ranks.get(r.worker_id, r.dp_rank);
      if (rank === undefined) {
        counters.replicaEventsIgnored++;
        this.#noteUnplaced(origin, [r]);
        continue;
      }
      p.mirrored.set(origin, rank, r.prefill_tokens, r.blocks, r.requests);
      applied++;
    }
    // The peer's new bookings' prompts: predicted cache on their ranks here too.
    if (p.predicted.enabled) {
      for (const b of a.added) {
        if (b.predicted === undefined) continue;
        const rank = p.ranks.get(b.worker_id, b.dp_rank);
        if (rank !== undefined) p.predicted.add(rank, b.predicted);
      }
    }
    counters.replicaEventsApplied += applied;
    this.#heardAt.set(origin, this.#o.clock.now());
    this.#indirect.delete(origin);
    return applied;
  }

  /** Installs a peer's own snapshot: its totals replace what is mirrored of it, partition by partition. */
  replaceOrigin(origin: bigint, snapshot: readonly LoadAggregates[]): number {
    this.#indirect.delete(origin);
    return this.#install(origin, snapshot);
  }

  /** `sender`: whose snapshot carried these totals (re-pulled if some could not be placed). */
  #install(origin: bigint, snapshot: readonly LoadAggregates[], sender = origin): number {
    this.#dropIds(origin);
    for (const a of snapshot) this.#indexIds(origin, a);
    const byPartition = new Map<Partition, [number, { prefillTokens: number; blocks: number; requests: number }][]>();
    for (const a of snapshot) {
      const p = this.#o.fleet.partition(partitionKey(a.partition.model_name, a.partition.routing_group));
      if (p === undefined || p.blockSize !== a.block_size) {
        this.#noteUnplaced(sender, a.rows);
        continue;
      }
      const rows = byPartition.get(p) ?? [];
      byPartition.set(p, rows);
      for (const r of a.rows) {
        const rank = p.ranks.get(r.worker_id, r.dp_rank);
        if (rank !== undefined) rows.push([rank, { prefillTokens: r.prefill_tokens, blocks: r.blocks, requests: r.requests }]);
        else this.#noteUnplaced(sender, [r]);
      }
    }
    let requests = 0;
    for (const p of this.#o.fleet.partitions()) {
      p.mirrored.replaceOrigin(origin, byPartition.get(p) ?? []);
      requests += p.mirrored.requestsOf(origin);
    }
    this.#heardAt.set(origin, this.#o.clock.now());
    return requests;
  }

  /** Non-zero rows for workers not known here: their sender is re-pulled once they register (missed-state.ts). A zero row (a rank that left) is nothing missing. */
  #noteUnplaced(sender: bigint, rows: readonly LoadAggregateRow[]): void {
    const missed = this.#o.missed;
    if (missed === undefined) return;
    for (const r of rows) if (r.requests > 0 || r.blocks > 0 || r.prefill_tokens > 0) missed.note(sender, r.worker_id);
  }

  /** Forgets a peer's totals everywhere; returns the requests they held. */
  dropOrigin(origin: bigint): number {
    let requests = 0;
    for (const p of this.#o.fleet.partitions()) requests += p.mirrored.dropOrigin(origin);
    this.#heardAt.delete(origin);
    this.#indirect.delete(origin);
    this.#dropIds(origin);
    return requests;
  }

  /** A peer's live booking, if it is indexed here. */
  mirroredBooking(id: string): MirroredBooking | undefined {
    return this.#bookings.get(id);
  }

  /**
   * A peer's booking ended through a lifecycle call taken elsewhere than at its owner (here, or
   * at a replica whose forwarded free we received): count it out of the owner's totals now and
   * forget it. The request count is exact; the rank's blocks and prefill stay until the owner
   * republishes its totals (which then replace these), except that a rank left with no request
   * holds no load at all. So an owner that is gone (shut down, killed) leaves no load behind once
   * the frontends free its bookings, as in exact mode. Returns whether the id was indexed.
   */
  endMirroredBooking(id: string): boolean {
    const b = this.#bookings.get(id);
    if (b === undefined) return false;
    this.#bookings.delete(id);
    this.#idsByOrigin.get(b.owner)?.delete(id);
    const p = this.#o.fleet.partition(partitionKey(b.partition.model_name, b.partition.routing_group));
    const rank = p?.ranks.get(b.workerId, b.dpRank);
    if (p === undefined || rank === undefined) return true;
    const row = p.mirrored.rowOf(b.owner, rank);
    if (row === undefined) return true;
    const requests = Math.max(0, row.requests - 1);
    if (requests === 0) p.mirrored.set(b.owner, rank, 0, 0, 0);
    else p.mirrored.set(b.owner, rank, row.prefillTokens, row.blocks, requests);
    return true;
  }

  get mirroredBookings(): number {
    return this.#bookings.size;
  }

  #indexIds(origin: bigint, a: LoadAggregates): void {
    if (a.added.length === 0 && a.removed.length === 0) return;
    let ids = this.#idsByOrigin.get(origin);
    if (ids === undefined) {
      ids = new Set();
      this.#idsByOrigin.set(origin, ids);
    }
    for (const id of a.removed) {
      if (this.#bookings.get(id)?.owner !== origin) continue;
      this.#bookings.delete(id);
      ids.delete(id);
    }
    const partition = a.partition;
    for (const b of a.added) {
      this.#bookings.set(b.id, { owner: origin, partition, workerId: b.worker_id, dpRank: b.dp_rank });
      ids.add(b.id);
    }
  }

  #dropIds(origin: bigint): void {
    const ids = this.#idsByOrigin.get(origin);
    if (ids === undefined) return;
    for (const id of ids) if (this.#bookings.get(id)?.owner === origin) this.#bookings.delete(id);
    this.#idsByOrigin.delete(origin);
  }

  /** Requests a peer's applied totals add up to (the heartbeat divergence check). */
  mirroredRequestsOf(origin: bigint): number {
    let n = 0;
    for (const p of this.#o.fleet.partitions()) n += p.mirrored.requestsOf(origin);
    return n;
  }

  /**
   * Forgets peers whose totals have not changed for the booking expiry: their own ledgers would
   * have expired those bookings by now (and published zeros, had they been alive to).
   */
  sweep(now: number): void {
    for (const [origin, at] of this.#heardAt) {
      if (now - at >= this.#o.expiryMs) this.dropOrigin(origin);
    }
  }

  #pub(p: Partition): Published {
    let pub = this.#published.get(p);
    if (pub === undefined) {
      pub = { requests: new Map(), decaying: [], gone: [], added: new Map(), removed: new Set() };
      this.#published.set(p, pub);
    }
    return pub;
  }
}

