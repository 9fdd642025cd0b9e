/**
 * The worker catalogue across replicas: every registration, patch and deletion taken here is
 * versioned and published (a `CatalogEvent`), and peers' are merged last-writer-wins, so a worker
 * registered on any replica is registered on all of them. Each replica evaluates a registration
 * itself (its own partitions, its own KV-event listeners) and publishes its outcome for every
 * worker (a `WorkerStatusEvent`) when it changes, so `GET /workers` can say where a registration
 * failed.
 *
 * Versions are a Lamport clock `(sequence, writer_id)` as for bindings (bindings.ts): a new
 * version is the wall clock in ns, but above every sequence issued or merged here, so a writer
 * whose clock stepped back still supersedes what it saw. The greater version wins on every
 * replica, ties on sequence going to the greater writer id: concurrent conflicting registrations
 * end the same everywhere, whatever the order they arrive in.
 *
 * No churn: a registration whose content (fields and draining intent) equals the entry's gets no
 * new version and publishes nothing (Dynamo's clients and `--workers-file` register every worker
 * on every replica); a peer's newer version of the content held here only moves the version.
 * Applied events are never re-published, so nothing ping-pongs.
 *
 * Deletions are tombstones, kept DEFAULT_CATALOG_TOMBSTONE_TTL_MS (bounded, oldest shed first,
 * counted) so an older registration arriving late, or in a snapshot, does not bring the worker
 * back.
 */
import type { Clock, WallClockNs } from "./time.js";
import { KvmeshError } from "./errors.js";
import { compareVersions, compareVersionsWithin, LamportClock, type Version, type VersionRefusal } from "./lamport.js";
import type { WorkerChange } from "./fleet.js";
import type { CatalogEvent, CatalogWorker, WorkerStatusEvent } from "./replica-events.js";
import type { ServiceCounters } from "./service-stats.js";
import type { Lifecycle, WorkerCatalogRecord, WorkerId, WorkerPatchRequest, WorkerRequest } from "./types.js";
import { recordToRequest, workerDraft } from "./worker-catalog.js";

/**
 * How long a deletion is remembered, ms. It must outlast the oldest copy of the worker a peer can
 * still send: a batch in flight (ms), a snapshot pull (the control timeout, seconds) or a replica
 * cut off and back (its snapshot carries its stale entry). 10 minutes covers a pod rescheduled
 * with its state; a replica cut off for longer can bring a deleted worker back (docs/limits.md).
 */
export const DEFAULT_CATALOG_TOMBSTONE_TTL_MS = 600_000;
/** Bound on tombstones; past it the oldest is dropped (counted). 65,536 deletions in 10 minutes is far past any fleet's churn. */
export const DEFAULT_CATALOG_TOMBSTONES_MAX = 65_536;
/** Reasons a status carries at most (a 1,024-rank worker missing every endpoint has 1,024); the rest are summarised in one more. */
export const MAX_WORKER_STATUS_REASONS = 64;
/** Bound on peers' statuses held (workers x replicas); past it new ones are ignored (counted). */
export const MAX_PEER_WORKER_STATUSES = 262_144;

const ZERO: Version = { sequence: 0n, writerId: 0n };

interface Entry {
  readonly version: Version;
  /** null: deleted (a tombstone, in #tombstones until it expires). */
  readonly worker: CatalogWorker | null;
  /** Canonical text of `worker`: equal content, equal print. */
  readonly print: string | null;
}

/** A catalogue entry's version, and whether it is a deletion (a tombstone). */
export interface CatalogVersion {
  readonly sequence: bigint;
  readonly writer_id: bigint;
  readonly deleted: boolean;
}

/** One replica's outcome for a worker, as `GET /workers` lists it (kvmesh addition). */
export interface WorkerReplicaStatus {
  /** The replica's id (its mesh origin), decimal: ids are u64. */
  readonly replica_id: string;
  readonly lifecycle: Lifecycle;
  readonly not_schedulable_reasons: readonly string[];
}

/** The catalogue calls this module makes (the fleet satisfies them). */
export interface CatalogFleet {
  upsertWorker(req: WorkerRequest): WorkerCatalogRecord;
  patchWorker(workerId: WorkerId, patch: WorkerPatchRequest): WorkerCatalogRecord;
  deleteWorker(workerId: WorkerId): WorkerCatalogRecord;
  applyReplicatedWorker(req: WorkerRequest, draining: boolean): WorkerCatalogRecord;
  getWorker(workerId: WorkerId): WorkerCatalogRecord | undefined;
  onWorkerChange(listener: (c: WorkerChange) => void): () => void;
}

export interface CatalogReplicationOptions {
  readonly clock: Clock;
  readonly wallClockNs: WallClockNs;
  /** The writer id of this replica's versions, and the sender of its statuses. */
  readonly replicaId: bigint;
  readonly counters: ServiceCounters;
  readonly fleet: CatalogFleet;
  readonly tombstoneTtlMs?: number;
  readonly maxTombstones?: number;
  /** A peer's event refused for its version or writer (the caller logs it, throttled). */
  readonly onVersionRefused?: (r: VersionRefusal) => void;
}

/** What applying a peer's catalogue event did. */
export type CatalogApplyOutcome = "applied" | "deleted" | "version-only" | "ignored-stale" | "rejected" | "refused";

/** Canonical JSON: sorted keys, bigints as decimal strings, so equal content prints equal. */
function canonical(v: unknown): string {
  return JSON.stringify(v, (_k, x: unknown) => {
    if (typeof x === "bigint") return `${x}n`;
    if (typeof x !== "object" || x === null || Array.isArray(x)) return x;
    const o = x as Record<string, unknown>;
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(o).sort()) if (o[k] !== undefined) Object.defineProperty(out, k, { value: o[k], enumerable: true });
    return out;
  });
}

/** What a record replicates: its resolved fields and whether it drains. */
export function catalogWorkerOf(record: WorkerCatalogRecord): CatalogWorker {
  return { request: recordToRequest(record), draining: record.lifecycle === "draining" };
}

function capReasons(reasons: readonly string[]): string[] {
  if (reasons.length <= MAX_WORKER_STATUS_REASONS) return [...reasons];
  const kept = reasons.slice(0, MAX_WORKER_STATUS_REASONS - 1);
  kept.push(`… and ${reasons.length - kept.length} more`);
  return kept;
}

const sameStatus = (a: { lifecycle: Lifecycle; reasons: readonly string[] }, b: { lifecycle: Lifecycle; reasons: readonly string[] }): boolean =>
  a.lifecycle === b.lifecycle && a.reasons.length === b.reasons.length && a.reasons.every((r, i) => r === b.reasons[i]);

export class CatalogReplication {
  readonly #o: CatalogReplicationOptions;
  readonly #ttlMs: number;
  readonly #maxTombstones: number;
  readonly #entries = new Map<WorkerId, Entry>();
  /** Worker id -> expiry (monotonic ms); insertion order is age order (the TTL is fixed). */
  readonly #tombstones = new Map<WorkerId, number>();
  readonly #catalogListeners = new Set<(e: CatalogEvent) => void>();
  readonly #statusListeners = new Set<(e: WorkerStatusEvent) => void>();
  /** This replica's last published status per worker. */
  readonly #own = new Map<WorkerId, WorkerStatusEvent>();
  /** Peers' statuses: worker id -> origin -> status. */
  readonly #peers = new Map<WorkerId, Map<bigint, WorkerStatusEvent>>();
  #peerStatusCount = 0;
  /** Workers whose local record changed since their status was last compared. */
  readonly #dirty = new Set<WorkerId>();
  /** >0 inside a catalogue change: statuses wait for its version (see #change). */
  #busy = 0;
  /** Sequences issued or merged here: the Lamport floor. */
  readonly #clock: LamportClock;

  constructor(o: CatalogReplicationOptions) {
    this.#o = o;
    this.#clock = new LamportClock(o.wallClockNs);
    this.#ttlMs = o.tombstoneTtlMs ?? DEFAULT_CATALOG_TOMBSTONE_TTL_MS;
    this.#maxTombstones = o.maxTombstones ?? DEFAULT_CATALOG_TOMBSTONES_MAX;
    // Every change of a local record (a registration from anywhere, or the ingest marking an
    // endpoint unusable) may change this replica's status for the worker.
    o.fleet.onWorkerChange((c) => {
      this.#dirty.add(c.workerId);
      if (this.#busy === 0) this.#flushStatuses();
    });
  }

  onCatalogEvent(listener: (e: CatalogEvent) => void): () => void {
    this.#catalogListeners.add(listener);
    return () => this.#catalogListeners.delete(listener);
  }

  onWorkerStatusEvent(listener: (e: WorkerStatusEvent) => void): () => void {
    this.#statusListeners.add(listener);
    return () => this.#statusListeners.delete(listener);
  }

  // ---------------------------------------------------------------- local changes (the HTTP API, the workers file)

  upsert(req: WorkerRequest): WorkerCatalogRecord {
    return this.#change(() => this.#published(this.#o.fleet.upsertWorker(req)));
  }

  patch(workerId: WorkerId, patch: WorkerPatchRequest): WorkerCatalogRecord {
    return this.#change(() => this.#published(this.#o.fleet.patchWorker(workerId, patch)));
  }

  delete(workerId: WorkerId): WorkerCatalogRecord {
    return this.#change(() => {
      const entry = this.#entries.get(workerId);
      // A registration this replica refused (its status says why) is still the fleet's: deleting
      // it here deletes it everywhere, as anywhere else.
      const removed =
        this.#o.fleet.getWorker(workerId) === undefined && entry?.worker !== undefined && entry.worker !== null
          ? { ...workerDraft(entry.worker.request), lifecycle: "unschedulable" as const }
          : this.#o.fleet.deleteWorker(workerId);
      this.#publish({ worker_id: workerId, ...this.#tombstone(workerId, this.#nextVersion()), worker: null });
      return removed;
    });
  }

  /** Publishes `record`'s content with a new version, unless the entry already holds that content. */
  #published(record: WorkerCatalogRecord): WorkerCatalogRecord {
    const worker = catalogWorkerOf(record);
    const print = canonical(worker);
    const current = this.#entries.get(record.worker_id);
    if (current?.print === print) return record;
    const version = this.#nextVersion();
    this.#setLive(record.worker_id, { version, worker, print });
    this.#publish({ worker_id: record.worker_id, sequence: version.sequence, writer_id: version.writerId, worker });
    return record;
  }

  #publish(e: CatalogEvent): void {
    this.#o.counters.catalogEventsPublished++;
    for (const l of this.#catalogListeners) l(e);
  }

  #nextVersion(): Version {
    return { sequence: this.#clock.next(), writerId: this.#o.replicaId };
  }

  /**
   * Runs one catalogue change; the statuses it changed are compared and published after it, so
   * they carry the version it set (the fleet tells of the change before the version is known).
   */
  #change<T>(fn: () => T): T {
    this.#busy++;
    try {
      return fn();
    } finally {
      this.#busy--;
      if (this.#busy === 0) this.#flushStatuses();
    }
  }

  // ---------------------------------------------------------------- peers' changes

  /**
   * Merges a peer's catalogue event (from its stream or its snapshot) last-writer-wins. Refused
   * (#29 G4): a version past the clock's horizon (lamport.ts), and an event on `origin`'s own
   * stream that `origin` did not write.
   */
  apply(e: CatalogEvent, origin?: bigint): CatalogApplyOutcome {
    const c = this.#o.counters;
    if (!this.#clock.admits(e.sequence) || (origin !== undefined && e.writer_id !== origin)) {
      c.versionsRefusedAhead++;
      this.#o.onVersionRefused?.({ kind: "catalog", writerId: e.writer_id, sequence: e.sequence, ...(origin === undefined ? {} : { origin }) });
      return "refused";
    }
    this.#clock.observe(e.sequence);
    const version: Version = { sequence: e.sequence, writerId: e.writer_id };
    const current = this.#entries.get(e.worker_id);
    if (current !== undefined && compareVersionsWithin(version, current.version, this.#clock.horizon()) <= 0) {
      c.catalogEventsStale++;
      return "ignored-stale";
    }
    return this.#change(() => {
      if (e.worker === null) {
        this.#tombstone(e.worker_id, version);
        if (this.#o.fleet.getWorker(e.worker_id) !== undefined) this.#o.fleet.deleteWorker(e.worker_id);
        c.catalogEventsApplied++;
        return "deleted";
      }
      const print = canonical(e.worker);
      this.#setLive(e.worker_id, { version, worker: e.worker, print });
      if (current?.print === print && this.#o.fleet.getWorker(e.worker_id) !== undefined) {
        // The same registration under a newer version (another replica registered it too).
        c.catalogEventsApplied++;
        return "version-only";
      }
      try {
        this.#o.fleet.applyReplicatedWorker(e.worker.request, e.worker.draining);
      } catch (err) {
        if (!(err instanceof KvmeshError)) throw err;
        // Refused here (a fleet limit of this replica's): the worker must not route here by an
        // older version either, and peers must see why (GET /workers, `replicas`).
        c.catalogEventsRejected++;
        if (this.#o.fleet.getWorker(e.worker_id) !== undefined) this.#o.fleet.deleteWorker(e.worker_id);
        this.#dirty.delete(e.worker_id);
        this.#reportOwn(e.worker_id, version, "incomplete", [`not registered on this replica: ${err.message}`]);
        return "rejected";
      }
      c.catalogEventsApplied++;
      return "applied";
    });
  }

  /** A peer's status for one of the catalogue's workers (`origin`: the replica it describes). */
  applyStatus(origin: bigint, s: WorkerStatusEvent): boolean {
    const c = this.#o.counters;
    if (origin === this.#o.replicaId) return false;
    const entry = this.#entries.get(s.worker_id);
    // A status taken before the worker's deletion describes a registration that is gone.
    if (entry?.worker === null && compareVersions({ sequence: s.sequence, writerId: s.writer_id }, entry.version) < 0) {
      c.workerStatusesIgnored++;
      return false;
    }
    let byOrigin = this.#peers.get(s.worker_id);
    if (byOrigin?.has(origin) !== true && this.#peerStatusCount >= MAX_PEER_WORKER_STATUSES) {
      c.workerStatusesIgnored++;
      return false;
    }
    if (byOrigin === undefined) {
      byOrigin = new Map();
      this.#peers.set(s.worker_id, byOrigin);
    }
    if (!byOrigin.has(origin)) this.#peerStatusCount++;
    byOrigin.set(origin, s);
    c.workerStatusesApplied++;
    return true;
  }

  /** A snapshot of `origin`: its statuses replace what was held of it. */
  replaceStatuses(origin: bigint, statuses: readonly WorkerStatusEvent[]): void {
    this.dropOrigin(origin);
    for (const s of statuses) this.applyStatus(origin, s);
  }

  /** Forgets `origin`'s statuses (it left the mesh). */
  dropOrigin(origin: bigint): void {
    for (const [id, byOrigin] of this.#peers) {
      if (byOrigin.delete(origin)) this.#peerStatusCount--;
      if (byOrigin.size === 0) this.#peers.delete(id);
    }
  }

  // ---------------------------------------------------------------- entries and tombstones

  #setLive(id: WorkerId, entry: Entry): void {
    this.#tombstones.delete(id);
    this.#entries.set(id, entry);
  }

  /** Records a deletion at `version`; every status of the worker goes with it. */
  #tombstone(id: WorkerId, version: Version): { sequence: bigint; writer_id: bigint } {
    this.#entries.set(id, { version, worker: null, print: null });
    this.#tombstones.delete(id);
    this.#tombstones.set(id, this.#o.clock.now() + this.#ttlMs);
    if (this.#tombstones.size > this.#maxTombstones) {
      const oldest = this.#tombstones.keys().next();
      if (oldest.done !== true) this.#expire(oldest.value, "catalogTombstonesShed");
    }
    const peers = this.#peers.get(id);
    if (peers !== undefined) {
      this.#peerStatusCount -= peers.size;
      this.#peers.delete(id);
    }
    this.#own.delete(id);
    this.#dirty.delete(id);
    return { sequence: version.sequence, writer_id: version.writerId };
  }

  #expire(id: WorkerId, counter: "catalogTombstonesShed" | "catalogTombstonesExpired"): void {
    this.#tombstones.delete(id);
    if (this.#entries.get(id)?.worker === null) this.#entries.delete(id);
    this.#o.counters[counter]++;
  }

  /** Drops tombstones past their TTL (oldest first). */
  sweep(nowMs: number): void {
    for (const [id, expiresAtMs] of this.#tombstones) {
      if (expiresAtMs > nowMs) break;
      this.#expire(id, "catalogTombstonesExpired");
    }
  }

  get tombstoneCount(): number {
    return this.#tombstones.size;
  }

  /**
   * The version this catalogue holds of a worker (live, or deleted while its tombstone lasts), or
   * undefined when it holds none. Sequences are Lamport values seeded from wall-clock ns, so a
   * caller can tell whether the fleet changed the worker after a given wall-clock time (the
   * workers file's rule at start, src/app/workers-file.ts).
   */
  versionOf(workerId: WorkerId): CatalogVersion | undefined {
    const e = this.#entries.get(workerId);
    return e === undefined ? undefined : { sequence: e.version.sequence, writer_id: e.version.writerId, deleted: e.worker === null };
  }

  /** Every entry, live and deleted, as events: what a snapshot carries (LWW makes re-applying harmless). */
  snapshot(): CatalogEvent[] {
    const out: CatalogEvent[] = [];
    for (const [id, e] of this.#entries) out.push({ worker_id: id, sequence: e.version.sequence, writer_id: e.version.writerId, worker: e.worker });
    return out;
  }

  /** This replica's own statuses: what a snapshot carries (a receiver replaces the sender's with them). */
  statusSnapshot(): WorkerStatusEvent[] {
    return [...this.#own.values()];
  }

  // ---------------------------------------------------------------- statuses

  #flushStatuses(): void {
    for (const id of this.#dirty) {
      this.#dirty.delete(id);
      const record = this.#o.fleet.getWorker(id);
      const entry = this.#entries.get(id);
      if (record === undefined) {
        // Deleted here: its tombstone took the status. A rejected registration keeps its own.
        if (entry?.worker !== undefined && entry.worker !== null) continue;
        this.#own.delete(id);
        continue;
      }
      this.#reportOwn(id, entry?.version ?? ZERO, record.lifecycle, record.not_schedulable_reasons);
    }
  }

  #reportOwn(id: WorkerId, version: Version, lifecycle: Lifecycle, reasons: readonly string[]): void {
    const status: WorkerStatusEvent = { worker_id: id, sequence: version.sequence, writer_id: version.writerId, lifecycle, reasons: capReasons(reasons) };
    const prev = this.#own.get(id);
    if (prev !== undefined && sameStatus(prev, status)) return;
    this.#own.set(id, status);
    this.#o.counters.workerStatusesPublished++;
    for (const l of this.#statusListeners) l(status);
  }

  /**
   * Every replica's outcome for `workerId` this replica knows, sorted by replica id: its own
   * (from the record here, or a registration refused here) and the latest each peer reported.
   */
  replicasOf(workerId: WorkerId): WorkerReplicaStatus[] {
    const out: { id: bigint; s: WorkerReplicaStatus }[] = [];
    const record = this.#o.fleet.getWorker(workerId);
    const own = this.#own.get(workerId);
    const self = this.#o.replicaId;
    if (record !== undefined) out.push({ id: self, s: { replica_id: self.toString(), lifecycle: record.lifecycle, not_schedulable_reasons: record.not_schedulable_reasons } });
    else if (own !== undefined) out.push({ id: self, s: { replica_id: self.toString(), lifecycle: own.lifecycle, not_schedulable_reasons: own.reasons } });
    for (const [origin, s] of this.#peers.get(workerId) ?? []) out.push({ id: origin, s: { replica_id: origin.toString(), lifecycle: s.lifecycle, not_schedulable_reasons: s.reasons } });
    return out.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)).map((x) => x.s);
  }
}
