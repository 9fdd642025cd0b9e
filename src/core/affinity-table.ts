/**
 * Session affinity, one table per partition (as Dynamo's
 * lib/kv-router/src/services/selection/affinity.rs, github.com/ai-dynamo/dynamo).
 *
 * kvmesh runs select -> book -> commit synchronously on one event loop, so the reference's
 * `Initializing` state, wait handles and join logic have no job here: a session is either vacant
 * or bound, and `commit()` decides the binding in one step once the booking has landed.
 *
 * Replication: every local bind / rebind / refresh is emitted synchronously to `onBinding`
 * listeners (the mesh publishes them); peers' bindings arrive through `applyReplica()` and merge
 * last-writer-wins on `(sequence, writerId)` with a Lamport clock. Applied bindings are never
 * re-emitted, so two replicas cannot echo a binding back and forth.
 *
 * Beyond the reference (DESIGN "Beyond" 4): `sweep()` re-publishes every binding that still
 * holds local leases once half a TTL has passed since it was last published, so peers keep it
 * alive while a request that outlives the idle TTL is still running here.
 *
 * Refresh coalescing (`refreshCoalesceMs`, issue 13): a refresh only extends idle deadlines, so a
 * refresh of a binding published less than the coalescing window ago is not emitted (and counted
 * through `onRefreshCoalesced`). Binds and rebinds are always emitted, and so is the keepalive.
 */

import { KvmeshError, badRequest } from "./errors.js";
import type { Clock } from "./time.js";
import { compareVersions, compareVersionsWithin, type Version, type VersionHorizon } from "./lamport.js";

export type AffinityMode = "hard" | "soft";

/** `dpRank === null` is a worker-only binding: any rank of the worker satisfies it. */
export interface AffinityTarget {
  readonly workerId: bigint;
  readonly dpRank: number | null;
}

/** Compared lexicographically: sequence first, writerId breaks ties. Both are u64. */
/** A binding's version (lamport.ts): higher wins. */
export type BindingVersion = Version;

export interface SessionBinding {
  readonly sessionId: string;
  readonly target: AffinityTarget;
  readonly version: BindingVersion;
}

/**
 * Why a binding event was emitted. "unbind" (hard mode): a dispatch away from the binding
 * invalidated it here, and peers must drop their copy too (finding F18: they kept it, so the
 * replicas disagreed about the session); the event's version orders it like a bind.
 */
export type BindingReason = "bind" | "rebind" | "refresh" | "unbind";

export type BindingListener = (binding: SessionBinding, reason: BindingReason) => void;

/** Opaque token for one request's hold on a binding; give it back to `release()` exactly once. */
export interface Lease {
  readonly sessionId: string;
  /** The binding version the lease was taken under. */
  readonly version: BindingVersion;
}

export type CommitOutcome =
  | { readonly kind: "bound" | "rebound" | "refreshed"; readonly lease: Lease }
  | { readonly kind: "unpinned" };

export type ApplyOutcome =
  | "inserted"
  | "refreshed"
  | "replaced-newer"
  | "replaced-expired"
  | "ignored-conflict"
  | "ignored-own"
  | "rejected-invalid"
  | "rejected-capacity"
  /** An unbind newer than the binding held here removed it (or recorded it, when none was held). */
  | "unbound";

export interface AffinityEntryView {
  readonly target: AffinityTarget;
  readonly version: BindingVersion;
  readonly leases: number;
  readonly idleDeadlineMs: number;
}

export interface AffinityTableOptions {
  readonly ttlMs: number;
  readonly mode: AffinityMode;
  readonly maxEntries?: number;
  /** Limit on the UTF-8 encoded length of a session id. */
  readonly maxSessionIdBytes?: number;
  readonly writerId: bigint;
  readonly clock: Clock;
  /** First Lamport sequence this table stamps; the core passes wall-clock ns so a restarted
   * writer does not reuse sequences its peers still hold. */
  readonly initialSequence?: bigint;
  /**
   * The service's Lamport clock: sequences past its horizon are never observed, a held one orders
   * below every valid version, and a poisoned next sequence starts again from it (lamport.ts).
   */
  readonly versions?: VersionHorizon;
  /**
   * Refreshes of a binding last published (bound, rebound, refreshed, kept alive, or merged from
   * a peer) less than this long ago are not emitted; capped at TTL / 8 (see
   * `refreshCoalesceWindowMs`). Default 0: every refresh is emitted.
   */
  readonly refreshCoalesceMs?: number;
  /** Called once per refresh left unpublished by coalescing (the service counts them). */
  readonly onRefreshCoalesced?: () => void;
}

export const DEFAULT_AFFINITY_MAX_ENTRIES = 65_536;
export const DEFAULT_MAX_SESSION_ID_BYTES = 256;
export const DEFAULT_INITIAL_SEQUENCE = 1n;
export const MIN_AFFINITY_TTL_MS = 1_000;
/** One year, the reference's upper bound (31 536 000 s). */
export const MAX_AFFINITY_TTL_MS = 31_536_000_000;
/** The reaper period the reference uses is min(TTL, 30 s); the keepalive needs a quarter TTL
 * (see `affinitySweepIntervalMs`). */
export const MAX_AFFINITY_SWEEP_INTERVAL_MS = 30_000;
/** A full table sweeps before refusing a new session, but at most this often: a table full of
 * live bindings would otherwise scan 65 536 entries on every new session. */
export const FULL_TABLE_SWEEP_MIN_INTERVAL_MS = 1_000;
/**
 * A full table evicts its least recently used binding that holds no lease (a request in flight),
 * looking at most this far from the oldest: one client minting session ids can then only push out
 * idle bindings, oldest first, instead of locking every new session out for a TTL (#17 F6: 80,000
 * distinct ids filled the 65,536 entries in 12 s). If the oldest this many all hold leases, the
 * new session routes unpinned (counted), as before.
 */
export const LRU_EVICTION_SCAN = 64;

const U64_MAX = (1n << 64n) - 1n;

/**
 * The coalescing window a table of this TTL uses: the configured one, but at most TTL / 8.
 *
 * Why TTL / 8: a peer's copy of a binding idles out one TTL after the last publication it heard,
 * ours one TTL after the last use here. A use is left unpublished only while the last publication
 * is younger than the window W, so the peer's deadline trails ours by less than W: with W <= TTL/8
 * a peer keeps the binding at least 7/8 of the TTL after the session's last use. At the
 * smallest TTL (1 s) that is W = 125 ms and a peer's copy lives >= 875 ms; at the daemon's default
 * window (1 s) any TTL of 8 s or more uses the full second, so a 300 s TTL loses at most 1 s
 * (0.3%) on peers. Leased bindings are unaffected in the meantime: the keepalive (`sweep()`)
 * republishes them half a TTL after their last publication, whatever coalescing suppressed.
 */
export function refreshCoalesceWindowMs(configuredMs: number, ttlMs: number): number {
  return Math.max(0, Math.min(configuredMs, Math.floor(ttlMs / 8)));
}

/**
 * How often the owner should call `sweep()`. A leased binding is re-published once half a TTL
 * has passed since its last publish; sweeping every quarter TTL means peers hear it at most
 * 0.75 TTL after the previous publish, before their copy idles out.
 */
export function affinitySweepIntervalMs(ttlMs: number): number {
  return Math.max(1, Math.min(Math.floor(ttlMs / 4), MAX_AFFINITY_SWEEP_INTERVAL_MS));
}

export { compareVersions } from "./lamport.js";

const sameTarget = (a: AffinityTarget, b: AffinityTarget): boolean =>
  a.workerId === b.workerId && a.dpRank === b.dpRank;

const isU64 = (v: unknown): v is bigint => typeof v === "bigint" && v >= 0n && v <= U64_MAX;
const isRank = (v: unknown): v is number => typeof v === "number" && Number.isSafeInteger(v) && v >= 0;

/** Mutable per-session state. Leases hold a reference to the entry object so a release after the
 * binding was dropped (and maybe re-created) cannot decrement the wrong incarnation. */
interface Entry {
  target: AffinityTarget;
  version: BindingVersion;
  leases: number;
  idleDeadlineMs: number;
  lastPublishedMs: number;
}

class LeaseToken implements Lease {
  released = false;
  constructor(
    readonly sessionId: string,
    readonly version: BindingVersion,
    readonly entry: Entry,
  ) {}
}

export class AffinityTable {
  readonly ttlMs: number;
  readonly mode: AffinityMode;
  readonly maxEntries: number;
  readonly maxSessionIdBytes: number;
  readonly writerId: bigint;
  /** The effective coalescing window, ms (0 = off): `refreshCoalesceWindowMs` of the option. */
  readonly refreshCoalesceMs: number;
  readonly #clock: Clock;
  readonly #onRefreshCoalesced: (() => void) | undefined;
  readonly #entries = new Map<string, Entry>();
  /**
   * Sessions unbound (hard-mode conflicts, here or at a peer) in the last TTL, with the unbind's
   * version: an older bind of the session that arrives later (a peer's refresh of the copy it
   * held, a snapshot) must not bring it back. In age order (fixed TTL), at most maxEntries.
   */
  readonly #unbound = new Map<string, { readonly target: AffinityTarget; readonly version: BindingVersion; readonly expiresAtMs: number }>();
  #unboundShed = 0;
  readonly #listeners: BindingListener[] = [];
  #nextSequence: bigint;
  readonly #versions: VersionHorizon | undefined;
  #fallbacks = 0;
  #evictions = 0;
  #rebinds = 0;
  #conflicts = 0;
  #lastFullSweepMs = Number.NEGATIVE_INFINITY;

  constructor(options: AffinityTableOptions) {
    const { ttlMs } = options;
    if (!Number.isFinite(ttlMs) || ttlMs < MIN_AFFINITY_TTL_MS || ttlMs > MAX_AFFINITY_TTL_MS) {
      throw badRequest(
        `session_affinity_ttl_secs must be between ${MIN_AFFINITY_TTL_MS / 1000} and ${MAX_AFFINITY_TTL_MS / 1000} (got ${ttlMs / 1000})`,
        "session_affinity_ttl_secs",
      );
    }
    if (options.mode !== "hard" && options.mode !== "soft") {
      throw badRequest(`session_affinity_mode must be "hard" or "soft"`, "session_affinity_mode");
    }
    const maxEntries = options.maxEntries ?? DEFAULT_AFFINITY_MAX_ENTRIES;
    if (!Number.isSafeInteger(maxEntries) || maxEntries < 1) {
      throw badRequest(`affinity max entries must be a positive integer (got ${maxEntries})`, "max_entries");
    }
    const maxSessionIdBytes = options.maxSessionIdBytes ?? DEFAULT_MAX_SESSION_ID_BYTES;
    if (!Number.isSafeInteger(maxSessionIdBytes) || maxSessionIdBytes < 1) {
      throw badRequest(`max session id bytes must be a positive integer (got ${maxSessionIdBytes})`, "max_session_id_bytes");
    }
    if (!isU64(options.writerId)) throw badRequest("writer id must be a u64", "writer_id");
    const refreshCoalesceMs = options.refreshCoalesceMs ?? 0;
    if (!Number.isSafeInteger(refreshCoalesceMs) || refreshCoalesceMs < 0) {
      throw badRequest(`binding refresh coalescing window must be a non-negative integer of ms (got ${refreshCoalesceMs})`, "bindingRefreshCoalesceMs");
    }
    const initialSequence = options.initialSequence ?? DEFAULT_INITIAL_SEQUENCE;
    if (!isU64(initialSequence)) throw badRequest("initial sequence must be a u64", "initial_sequence");
    this.ttlMs = ttlMs;
    this.mode = options.mode;
    this.maxEntries = maxEntries;
    this.maxSessionIdBytes = maxSessionIdBytes;
    this.writerId = options.writerId;
    this.#clock = options.clock;
    this.#nextSequence = initialSequence;
    this.#versions = options.versions;
    this.refreshCoalesceMs = refreshCoalesceWindowMs(refreshCoalesceMs, ttlMs);
    this.#onRefreshCoalesced = options.onRefreshCoalesced;
  }

  /** Entries stored, including idle-expired ones the next sweep will remove. */
  get size(): number {
    return this.#entries.size;
  }

  /** Bindings without a lease evicted, least recently used first, to make room in a full table. */
  get evictions(): number {
    return this.#evictions;
  }

  /** New sessions routed unpinned because the table was full. */
  get fallbacks(): number {
    return this.#fallbacks;
  }

  /** Soft mode: bindings that followed a dispatch to another worker (rank). */
  get rebinds(): number {
    return this.#rebinds;
  }

  /** Hard mode: dispatches away from a live binding, refused with KVMESH_SESSION_CONFLICT. */
  get conflicts(): number {
    return this.#conflicts;
  }

  /** The sequence the next local bind or rebind will carry. */
  get nextSequence(): bigint {
    return this.#nextSequence;
  }

  onBinding(listener: BindingListener): () => void {
    this.#listeners.push(listener);
    return () => {
      const i = this.#listeners.indexOf(listener);
      if (i >= 0) this.#listeners.splice(i, 1);
    };
  }

  /** The live binding of a session, if any. Throws 400 for an empty or over-long id. */
  resolve(sessionId: string): AffinityTarget | undefined {
    this.#checkSessionId(sessionId);
    return this.#live(sessionId, this.#clock.now())?.target;
  }

  /**
   * Records that a booking for `sessionId` landed on `dispatched` and takes a lease for it.
   * Hard mode: dispatching away from a live binding drops the binding and throws
   * KVMESH_SESSION_CONFLICT (the caller frees the booking it just made).
   */
  commit(sessionId: string, dispatched: { readonly workerId: bigint; readonly dpRank: number }): CommitOutcome {
    this.#checkSessionId(sessionId);
    if (!isU64(dispatched.workerId) || !isRank(dispatched.dpRank)) {
      throw badRequest(`dispatched target for session ${JSON.stringify(sessionId)} is not a valid (worker_id, dp_rank)`, "worker_id");
    }
    const now = this.#clock.now();
    const entry = this.#live(sessionId, now);

    if (entry === undefined) {
      if (!this.#makeRoom(now)) {
        this.#fallbacks++;
        return { kind: "unpinned" };
      }
      const created: Entry = {
        target: { workerId: dispatched.workerId, dpRank: dispatched.dpRank },
        version: this.#stamp(),
        leases: 1,
        idleDeadlineMs: now + this.ttlMs,
        lastPublishedMs: now,
      };
      this.#entries.set(sessionId, created);
      this.#emit(sessionId, created, "bind");
      return { kind: "bound", lease: new LeaseToken(sessionId, created.version, created) };
    }

    const bound = entry.target;
    const matches =
      bound.workerId === dispatched.workerId && (bound.dpRank === null || bound.dpRank === dispatched.dpRank);
    if (matches) {
      entry.leases++;
      entry.idleDeadlineMs = now + this.ttlMs;
      this.#refresh(sessionId, entry, now);
      return { kind: "refreshed", lease: new LeaseToken(sessionId, entry.version, entry) };
    }

    if (this.mode === "hard") {
      // Reference 4.9 (selection core): a mismatch invalidates the binding, so the next request
      // of the session binds afresh instead of being refused for as long as leases keep it alive.
      this.#entries.delete(sessionId);
      this.#conflicts++;
      this.#unbind(sessionId, bound, this.#stamp(), now);
      throw new KvmeshError(
        "KVMESH_SESSION_CONFLICT",
        `session ${JSON.stringify(sessionId)} is bound to worker ${describeTarget(bound)} but was dispatched to worker ${describeTarget(dispatched)}`,
        { details: { field: "session_id" } },
      );
    }

    // Soft: follow the dispatch. A worker-only binding keeps its granularity on the new worker.
    entry.target = { workerId: dispatched.workerId, dpRank: bound.dpRank === null ? null : dispatched.dpRank };
    entry.version = this.#stamp();
    entry.leases++;
    entry.idleDeadlineMs = now + this.ttlMs;
    entry.lastPublishedMs = now;
    this.#rebinds++;
    this.#emit(sessionId, entry, "rebind");
    return { kind: "rebound", lease: new LeaseToken(sessionId, entry.version, entry) };
  }

  /** Gives a lease back. A release is a use: it refreshes the idle deadline and is published,
   * unless the binding changed version since the lease was taken. Releasing twice is a no-op. */
  release(lease: Lease): void {
    if (!(lease instanceof LeaseToken) || lease.released) return;
    lease.released = true;
    const entry = lease.entry;
    if (this.#entries.get(lease.sessionId) !== entry) return; // dropped since; nothing to count
    if (entry.leases > 0) entry.leases--;
    this.#touch(lease.sessionId, entry);
    if (compareVersions(entry.version, lease.version) !== 0) return;
    const now = this.#clock.now();
    entry.idleDeadlineMs = now + this.ttlMs;
    this.#refresh(lease.sessionId, entry, now);
  }

  /** A local use of an existing binding: published, unless it was published within the window. */
  #refresh(sessionId: string, entry: Entry, now: number): void {
    if (this.refreshCoalesceMs > 0 && now - entry.lastPublishedMs < this.refreshCoalesceMs) {
      this.#onRefreshCoalesced?.();
      return;
    }
    entry.lastPublishedMs = now;
    this.#emit(sessionId, entry, "refresh");
  }

  /** Removes every binding to a departed worker. */
  dropWorker(workerId: bigint): number {
    let dropped = 0;
    for (const [sessionId, entry] of this.#entries) {
      if (entry.target.workerId === workerId) {
        this.#entries.delete(sessionId);
        dropped++;
      }
    }
    return dropped;
  }

  /** Removes ranked bindings to a removed rank; worker-only bindings survive while the worker does. */
  dropTarget(workerId: bigint, dpRank: number): number {
    let dropped = 0;
    for (const [sessionId, entry] of this.#entries) {
      if (entry.target.workerId === workerId && entry.target.dpRank === dpRank) {
        this.#entries.delete(sessionId);
        dropped++;
      }
    }
    return dropped;
  }

  /** A binding learned from a peer: no local leases, idle TTL from now. */
  #replicaEntry(target: AffinityTarget, version: BindingVersion, now: number): Entry {
    return { target, version, leases: 0, idleDeadlineMs: now + this.ttlMs, lastPublishedMs: now };
  }

  /**
   * Advances the Lamport clock past a sequence seen from a peer, without merging anything (a
   * binding the service parks until its worker registers still orders our next local version).
   */
  observeSequence(sequence: bigint): void {
    if (this.#versions !== undefined && sequence > this.#versions.horizon()) return;
    if (isU64(sequence) && sequence >= this.#nextSequence) {
      this.#nextSequence = sequence < U64_MAX ? sequence + 1n : U64_MAX;
    }
  }

  /**
   * A peer's refresh of a binding this replica wrote: the peer served the session under our
   * version, so the session is in use and our copy must not idle out (otherwise a session served
   * only elsewhere for longer than the TTL would lose its binding here and be rebound once).
   * Only an exact match (same version and target) counts. Never emits.
   */
  refreshOwn(binding: SessionBinding): boolean {
    const entry = this.#entries.get(binding.sessionId);
    if (entry === undefined || binding.version.writerId !== this.writerId) return false;
    const now = this.#clock.now();
    if (this.#idleExpired(entry, now) || compareVersions(binding.version, entry.version) !== 0 || !sameTarget(entry.target, binding.target)) return false;
    entry.idleDeadlineMs = Math.max(entry.idleDeadlineMs, now + this.ttlMs);
    return true;
  }

  /** Merges a peer's binding (the reference's version merge on replica apply: higher (sequence, writer_id) wins). Never emits. */
  applyReplica(binding: SessionBinding): ApplyOutcome {
    const admitted = this.#admitReplica(binding);
    if (typeof admitted === "string") return admitted;
    const { sessionId, now, incoming, adopted } = admitted;
    const entry = this.#entries.get(sessionId);

    if (entry === undefined) {
      if (!this.#makeRoom(now)) return "rejected-capacity";
      this.#entries.set(sessionId, this.#replicaEntry(incoming, adopted, now));
      return "inserted";
    }
    if (this.#idleExpired(entry, now)) {
      // A fresh entry object: no lease can refer to an idle-expired incarnation anyway.
      this.#entries.delete(sessionId);
      this.#entries.set(sessionId, this.#replicaEntry(incoming, adopted, now));
      return "replaced-expired";
    }
    const order = this.#order(adopted, entry.version);
    // A peer's use is a use here too (LRU): a session active elsewhere is not evicted first.
    if (order >= 0) this.#touch(sessionId, entry);
    if (sameTarget(entry.target, incoming) && order >= 0) {
      entry.version = adopted;
      entry.idleDeadlineMs = now + this.ttlMs;
      entry.lastPublishedMs = now;
      return "refreshed";
    }
    if (order > 0) {
      // Local leases stay on the entry: those requests still run and keep the session alive.
      entry.target = incoming;
      entry.version = adopted;
      entry.idleDeadlineMs = now + this.ttlMs;
      entry.lastPublishedMs = now;
      return "replaced-newer";
    }
    return "ignored-conflict";
  }

  /**
   * A peer's unbind (its hard-mode conflict): drops the binding held here if the unbind is newer,
   * and remembers it for a TTL so an older copy arriving later is ignored. Never emits.
   */
  applyReplicaUnbind(binding: SessionBinding): ApplyOutcome {
    const admitted = this.#admitReplica(binding);
    if (typeof admitted === "string") return admitted;
    const { sessionId, now, incoming, adopted } = admitted;
    const entry = this.#entries.get(sessionId);
    // A bind after the unbind (the session's next request bound afresh somewhere) wins.
    if (entry !== undefined && !this.#idleExpired(entry, now) && this.#order(adopted, entry.version) <= 0) return "ignored-conflict";
    // Local leases of a dropped entry release as no-ops (release checks the entry is still held).
    this.#entries.delete(sessionId);
    this.#unbind(sessionId, incoming, adopted, now, false);
    return "unbound";
  }

  /**
   * What every peer binding or unbind goes through first: validation, the sequence observed, our
   * own echo, and an unbind of the session remembered here that is at least as new.
   */
  #admitReplica(binding: SessionBinding): ApplyOutcome | { sessionId: string; now: number; incoming: AffinityTarget; adopted: BindingVersion } {
    const { sessionId, target, version } = binding;
    if (!isU64(version.sequence) || !isU64(version.writerId)) return "rejected-invalid";
    // Observe the sequence before anything can reject the event, so our next local version
    // orders after everything we have seen, applied or not.
    this.observeSequence(version.sequence);
    if (version.writerId === this.writerId) return "ignored-own";
    if (!this.#validSessionId(sessionId) || !isU64(target.workerId) || (target.dpRank !== null && !isRank(target.dpRank))) {
      return "rejected-invalid";
    }
    const now = this.#clock.now();
    const adopted: BindingVersion = { sequence: version.sequence, writerId: version.writerId };
    const unbound = this.#liveUnbind(sessionId, now);
    if (unbound !== undefined && this.#order(adopted, unbound.version) <= 0) return "ignored-conflict";
    return { sessionId, now, incoming: { workerId: target.workerId, dpRank: target.dpRank }, adopted };
  }

  /** Unbinds recorded and not expired yet (snapshots carry them, so a peer that missed one in a gap still learns it). */
  unbinds(): SessionBinding[] {
    const now = this.#clock.now();
    const out: SessionBinding[] = [];
    for (const [sessionId, u] of this.#unbound) if (u.expiresAtMs > now) out.push({ sessionId, target: u.target, version: u.version });
    return out;
  }

  /** Unbinds forgotten before their TTL because maxEntries were recorded. */
  get unbindsShed(): number {
    return this.#unboundShed;
  }

  /**
   * Removes idle-expired entries (no leases, deadline passed) and re-publishes leased bindings
   * last published half a TTL ago or more. Returns the number removed.
   */
  sweep(): number {
    const now = this.#clock.now();
    const keepaliveAfterMs = this.ttlMs / 2;
    let removed = 0;
    for (const [sessionId, u] of this.#unbound) {
      if (u.expiresAtMs > now) break; // age order
      this.#unbound.delete(sessionId);
    }
    for (const [sessionId, entry] of this.#entries) {
      if (this.#idleExpired(entry, now)) {
        this.#entries.delete(sessionId);
        removed++;
      } else if (entry.leases > 0 && now - entry.lastPublishedMs >= keepaliveAfterMs) {
        entry.lastPublishedMs = now;
        this.#emit(sessionId, entry, "refresh");
      }
    }
    return removed;
  }

  /**
   * Live bindings then recent unbinds, one at a time, for a snapshot sent in pages
   * (mesh/binding-cursors.ts): a live iteration of the table, so it holds no copy. An entry present
   * throughout is yielded at least once (one re-inserted by use may be yielded twice: bindings
   * merge last-writer-wins, so a repeat is harmless); one added meanwhile may or may not be.
   */
  *liveBindings(): Generator<SessionBinding & { readonly unbind: boolean }, void, void> {
    for (const [sessionId, entry] of this.#entries) {
      if (!this.#idleExpired(entry, this.#clock.now())) yield { sessionId, target: entry.target, version: entry.version, unbind: false };
    }
    for (const [sessionId, u] of this.#unbound) if (u.expiresAtMs > this.#clock.now()) yield { sessionId, target: u.target, version: u.version, unbind: true };
  }

  /** Live bindings, for mesh snapshots. */
  snapshot(): SessionBinding[] {
    const now = this.#clock.now();
    const out: SessionBinding[] = [];
    for (const [sessionId, entry] of this.#entries) {
      if (!this.#idleExpired(entry, now)) out.push({ sessionId, target: entry.target, version: entry.version });
    }
    return out;
  }

  /** Raw stored state (idle-expired entries included until swept), for tests and inspection. */
  get(sessionId: string): AffinityEntryView | undefined {
    const entry = this.#entries.get(sessionId);
    if (entry === undefined) return undefined;
    return { target: entry.target, version: entry.version, leases: entry.leases, idleDeadlineMs: entry.idleDeadlineMs };
  }

  #idleExpired(entry: Entry, now: number): boolean {
    return entry.leases === 0 && now >= entry.idleDeadlineMs;
  }

  /** The live entry, removing an idle-expired one on the way; a live one counts as used (LRU). */
  #live(sessionId: string, now: number): Entry | undefined {
    const entry = this.#entries.get(sessionId);
    if (entry === undefined) return undefined;
    if (this.#idleExpired(entry, now)) {
      this.#entries.delete(sessionId);
      return undefined;
    }
    this.#touch(sessionId, entry);
    return entry;
  }

  /** Moves a used entry to the end: the Map's order is then least recently used first. */
  #touch(sessionId: string, entry: Entry): void {
    this.#entries.delete(sessionId);
    this.#entries.set(sessionId, entry);
  }

  /** Room for one more entry: a sweep of idle-expired ones (#hasRoom), else the LRU eviction. */
  #makeRoom(now: number): boolean {
    if (this.#hasRoom(now)) return true;
    let scanned = 0;
    for (const [sessionId, entry] of this.#entries) {
      if (++scanned > LRU_EVICTION_SCAN) break;
      if (entry.leases > 0) continue;
      this.#entries.delete(sessionId);
      this.#evictions++;
      return true;
    }
    return false;
  }

  #hasRoom(now: number): boolean {
    if (this.#entries.size < this.maxEntries) return true;
    if (now - this.#lastFullSweepMs < FULL_TABLE_SWEEP_MIN_INTERVAL_MS) return false;
    this.#lastFullSweepMs = now;
    this.sweep();
    return this.#entries.size < this.maxEntries;
  }

  /** compareVersions, with a poisoned version (past the clock's horizon) below every valid one. */
  #order(a: BindingVersion, b: BindingVersion): number {
    return this.#versions === undefined ? compareVersions(a, b) : compareVersionsWithin(a, b, this.#versions.horizon());
  }

  #stamp(): BindingVersion {
    // A poisoned next sequence (past the horizon) starts again from the service's clock.
    if (this.#versions !== undefined && this.#nextSequence > this.#versions.horizon()) this.#nextSequence = this.#versions.peek();
    const version = { sequence: this.#nextSequence, writerId: this.writerId };
    if (this.#nextSequence < U64_MAX) this.#nextSequence++;
    return version;
  }

  /** Records an unbind of `sessionId` at `version` for a TTL and, when it happened here, publishes it. */
  #unbind(sessionId: string, target: AffinityTarget, version: BindingVersion, now: number, publish = true): void {
    this.#unbound.delete(sessionId);
    this.#unbound.set(sessionId, { target, version, expiresAtMs: now + this.ttlMs });
    if (this.#unbound.size > this.maxEntries) {
      const oldest = this.#unbound.keys().next();
      if (oldest.done !== true) {
        this.#unbound.delete(oldest.value);
        this.#unboundShed++;
      }
    }
    if (publish) this.#emit(sessionId, { target, version }, "unbind");
  }

  #liveUnbind(sessionId: string, now: number): { readonly version: BindingVersion } | undefined {
    const u = this.#unbound.get(sessionId);
    return u !== undefined && u.expiresAtMs > now ? u : undefined;
  }

  #emit(sessionId: string, entry: Pick<Entry, "target" | "version">, reason: BindingReason): void {
    if (this.#listeners.length === 0) return;
    const binding: SessionBinding = { sessionId, target: entry.target, version: entry.version };
    // A copy, so a listener that unsubscribes during the call does not skip its neighbour.
    for (const listener of [...this.#listeners]) listener(binding, reason);
  }

  #validSessionId(sessionId: unknown): boolean {
    if (typeof sessionId !== "string" || sessionId.length === 0) return false;
    // A UTF-16 code unit encodes to at most 3 UTF-8 bytes, so short ids skip the byte count.
    if (sessionId.length * 3 <= this.maxSessionIdBytes) return true;
    return Buffer.byteLength(sessionId, "utf8") <= this.maxSessionIdBytes;
  }

  #checkSessionId(sessionId: string): void {
    if (this.#validSessionId(sessionId)) return;
    if ((sessionId as unknown) === "" || typeof (sessionId as unknown) !== "string") {
      throw badRequest("session_id must be a non-empty string", "session_id");
    }
    throw badRequest(
      `session_id is ${Buffer.byteLength(sessionId, "utf8")} bytes long; the limit is ${this.maxSessionIdBytes} bytes (UTF-8)`,
      "session_id",
    );
  }
}

function describeTarget(target: { readonly workerId: bigint; readonly dpRank: number | null }): string {
  return target.dpRank === null ? target.workerId.toString() : `${target.workerId.toString()} (dp rank ${target.dpRank})`;
}
