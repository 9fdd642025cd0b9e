/**
 * Per-origin receive state (the ZeroMQ Guide's Clone pattern, chapter 5): which batches
 * of a peer to apply, buffer or drop, when to ask that peer for a snapshot, and what to replay
 * once it arrives. Pure: no sockets, the clock is injected.
 *
 * Contract with the receive glue:
 *  - `onBatch` -> "apply": apply the batch's events now (lastAppliedSeq already advanced);
 *    "buffer": held here until the snapshot; "drop-stale": a duplicate or a dead epoch's batch;
 *    "resync": the origin's mirror is out of date; send it a snapshot request now and call
 *    `snapshotRequested`. The batch that triggered it is buffered. One resync per sync episode;
 *    a buffer overflow returns resync ("gap") again, since the snapshot in flight is too old.
 *  - Ask `snapshotDue(now)` (or `MeshReceiver.snapshotsDue`) on a timer, ~every 100 ms: it is
 *    true when a request was never sent, or timed out (1 s, doubling per attempt, capped at
 *    16 s), or the buffer overflowed (dropped, counted, a newer snapshot is due at once).
 *  - `onSnapshot`: replace everything mirrored of that origin with the snapshot, then apply the
 *    returned batches in order. If the buffer does not continue the snapshot (a batch was lost
 *    in between) the tracker stays "syncing" and `snapshotDue` turns true again.
 *  - A late duplicate reply is still correct to install: it only rewinds lastAppliedSeq, the
 *    next batch shows a gap and a fresh snapshot follows. `wantsSnapshot` lets the glue skip it
 *    and save the work.
 *
 * First contact always snapshots, even on seq 1 of a fresh epoch: over PUB/SUB a slow joiner
 * may have missed earlier batches and cannot tell (a SUB connected just before a burst lost 81 of
 * the first 1,000 frames, measured with zeromq 6.8).
 */
import { MeshOptionError } from "./errors.js";
import type { Clock } from "../src/core/index.js";
import type { Heartbeat, MeshBatch, Snapshot } from "./types.js";

export const DEFAULT_SNAPSHOT_TIMEOUT_MS = 1_000;
/** Backoff cap: a 100k-booking snapshot is 189 MB and may take seconds to build and ship. */
export const DEFAULT_SNAPSHOT_TIMEOUT_MAX_MS = 16_000;
/** Batches held per origin while its snapshot is awaited (at 1 000 batches/s: ~2 s). */
export const DEFAULT_RESYNC_BUFFER_MAX_BATCHES = 2_048;
/** Lag samples kept per origin for p50/p99. */
export const DEFAULT_LAG_SAMPLES = 1_024;
/** Epochs of an origin remembered as dead, so a late batch of one is dropped, not re-synced. */
export const DEFAULT_RETIRED_EPOCHS = 8;
/**
 * Origins tracked at once. A mesh has tens of replicas, and each restart adds an origin (a new
 * replica id at the same endpoint) that then goes silent for good, so 1 024 is years of restarts.
 * The bound is what keeps frames with forged origin ids (any peer on the SUB can send them, and a
 * heartbeat's control endpoint makes us open a socket) from growing this table, the peer-health
 * table and the control-endpoint table without limit: past it, a new origin evicts the least
 * recently heard evictable one (see DEFAULT_ORIGIN_EVICT_IDLE_MS), or is refused and counted.
 */
export const DEFAULT_MAX_TRACKED_ORIGINS = 1_024;
/**
 * A tracked origin may be evicted to make room once it never installed a snapshot (never proved
 * it answers on a control endpoint: forged ids stay here) or has been silent this long (a peer is
 * `down` after 10 s, and its mirrored state dropped then), ms.
 */
export const DEFAULT_ORIGIN_EVICT_IDLE_MS = 60_000;
/**
 * Upper bounds (ms) of the Prometheus lag histogram buckets; +Inf is implied. 20 ms is the
 * scale-out target for lag p99, so it is a bound of its own.
 */
export const LAG_BUCKETS_MS: readonly number[] = Object.freeze([1, 2, 5, 10, 20, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000]);

export type ResyncReason = "gap" | "new-epoch" | "first-contact";
/** "refused": a new origin with the origin table full of live ones (MeshReceiver only): ignore the message. */
export type BatchAction = { action: "apply" } | { action: "buffer" } | { action: "drop-stale" } | { action: "resync"; reason: ResyncReason } | { action: "refused" };
export type HeartbeatAction = { action: "ok" } | { action: "drop-stale" } | { action: "resync"; reason: ResyncReason } | { action: "refused" };
export type OriginState = "syncing" | "live";

const MS_PER_SECOND = 1_000;
const APPLY: BatchAction = Object.freeze({ action: "apply" });
const BUFFER: BatchAction = Object.freeze({ action: "buffer" });
const DROP_STALE = Object.freeze({ action: "drop-stale" } as const);
const HB_OK: HeartbeatAction = Object.freeze({ action: "ok" });
const REFUSED = Object.freeze({ action: "refused" } as const);

/**
 * Where lag observations go: the mesh's Prometheus histograms (mesh-metrics.ts), or a test's
 * recorder. Kept to strings and seconds so this file needs no metrics library.
 */
export interface LagObserver {
  /** A batch or heartbeat of `origin` (decimal id) arrived `seconds` after it was sent (>= 0). */
  observe(origin: string, seconds: number): void;
  /** `origin` is no longer tracked (forgotten or evicted): its per-origin series ends. */
  forget(origin: string): void;
}

/** The last N lag samples in a ring; percentiles sort a copy (1 024 samples: ~20 us). */
export class LagReservoir {
  readonly #samples: Float64Array;
  #next = 0;
  #filled = 0;

  constructor(size = DEFAULT_LAG_SAMPLES) {
    if (!Number.isInteger(size) || size < 1) throw new MeshOptionError("lagSamples", `must be a positive integer, got ${size}`);
    this.#samples = new Float64Array(size);
  }

  add(ms: number): void {
    this.#samples[this.#next] = ms;
    this.#next = (this.#next + 1) % this.#samples.length;
    if (this.#filled < this.#samples.length) this.#filled++;
  }

  get size(): number {
    return this.#filled;
  }

  /** Nearest-rank percentile (p in [0, 100]) of the samples held; null when there are none. */
  percentile(p: number): number | null {
    if (this.#filled === 0) return null;
    const sorted = this.#samples.slice(0, this.#filled).sort();
    const rank = Math.min(this.#filled - 1, Math.max(0, Math.ceil((p / 100) * this.#filled) - 1));
    return sorted[rank] ?? null;
  }
}

export interface OriginTrackerOptions {
  /** Wall clock, ms since the Unix epoch: lag is measured against the publisher's sentAtMs. */
  readonly clock: Clock;
  /**
   * Monotonic clock, ms: when an origin was last heard (eviction by idleness). Default `clock`;
   * the mesh passes a monotonic one, so a wall-clock step does not make live origins look idle.
   */
  readonly idleClock?: Clock;
  readonly snapshotTimeoutMs?: number;
  readonly snapshotTimeoutMaxMs?: number;
  readonly resyncBufferMaxBatches?: number;
  readonly lagSamples?: number;
  readonly retiredEpochs?: number;
}

export interface OriginStats {
  readonly origin: bigint;
  readonly state: OriginState;
  readonly epoch: bigint | null;
  readonly lastAppliedSeq: number;
  /** Gaps detected (by a batch or a heartbeat), new epochs not included. */
  readonly gaps: number;
  readonly newEpochs: number;
  /** Snapshots installed. */
  readonly snapshots: number;
  readonly snapshotRequests: number;
  /** Requests re-sent after a timeout. */
  readonly snapshotRetries: number;
  readonly buffered: number;
  /** Times the resync buffer filled up and was dropped (each also re-requests). */
  readonly bufferOverflows: number;
  /** Batches dropped as duplicates or from a dead epoch, and those discarded by a snapshot. */
  readonly staleDropped: number;
  readonly lagP50Ms: number | null;
  readonly lagP99Ms: number | null;
}

interface Resolved {
  readonly clock: Clock;
  readonly idleClock: Clock;
  readonly snapshotTimeoutMs: number;
  readonly snapshotTimeoutMaxMs: number;
  readonly resyncBufferMaxBatches: number;
  readonly lagSamples: number;
  readonly retiredEpochs: number;
}

function resolve(o: OriginTrackerOptions): Resolved {
  const r: Resolved = {
    clock: o.clock,
    idleClock: o.idleClock ?? o.clock,
    snapshotTimeoutMs: o.snapshotTimeoutMs ?? DEFAULT_SNAPSHOT_TIMEOUT_MS,
    snapshotTimeoutMaxMs: o.snapshotTimeoutMaxMs ?? DEFAULT_SNAPSHOT_TIMEOUT_MAX_MS,
    resyncBufferMaxBatches: o.resyncBufferMaxBatches ?? DEFAULT_RESYNC_BUFFER_MAX_BATCHES,
    lagSamples: o.lagSamples ?? DEFAULT_LAG_SAMPLES,
    retiredEpochs: o.retiredEpochs ?? DEFAULT_RETIRED_EPOCHS,
  };
  if (!(r.snapshotTimeoutMs > 0)) throw new MeshOptionError("snapshotTimeoutMs", `must be positive, got ${r.snapshotTimeoutMs}`);
  if (!(r.snapshotTimeoutMaxMs >= r.snapshotTimeoutMs)) throw new MeshOptionError("snapshotTimeoutMaxMs", "must be >= snapshotTimeoutMs");
  if (!Number.isInteger(r.resyncBufferMaxBatches) || r.resyncBufferMaxBatches < 1) throw new MeshOptionError("resyncBufferMaxBatches", "must be a positive integer");
  if (!Number.isInteger(r.retiredEpochs) || r.retiredEpochs < 0) throw new MeshOptionError("retiredEpochs", "must be a non-negative integer");
  return r;
}

export class OriginTracker {
  readonly origin: bigint;
  readonly #o: Resolved;
  readonly #lag: LagReservoir;
  readonly #lagObserver: LagObserver | undefined;
  /** `origin` in decimal, the label the observer gets (made once, not per message). */
  readonly #label: string;
  #state: OriginState = "syncing";
  /** Why the current sync began, and whether the glue was told (one resync action per episode). */
  #reason: ResyncReason = "first-contact";
  #announced = false;
  /** Epoch of the snapshot installed last (null before the first). */
  #epoch: bigint | null = null;
  /** Epoch of the last batch or heartbeat heard: the origin's current process. */
  #latestSeenEpoch: bigint | null = null;
  #lastAppliedSeq = 0;
  /** Dead epochs, oldest first. */
  readonly #retired: bigint[] = [];
  #buffer: MeshBatch[] = [];
  /** Time of the latest snapshot request, null while one is due but not sent. */
  #requestSentAtMs: number | null = null;
  /** Requests sent since syncing began; sets the timeout (backoff) of the latest. */
  #attempts = 0;
  /** Requests sent and not yet answered (replies carry no request id, so this is a count). */
  #outstanding = 0;
  #gaps = 0;
  #newEpochs = 0;
  #snapshots = 0;
  #snapshotRequests = 0;
  #snapshotRetries = 0;
  #bufferOverflows = 0;
  #staleDropped = 0;
  /** idleClock time of the last batch, heartbeat or snapshot of this origin (eviction order). */
  #lastHeardMs: number;

  constructor(origin: bigint, options: OriginTrackerOptions, lagObserver?: LagObserver) {
    this.origin = origin;
    this.#o = resolve(options);
    this.#lag = new LagReservoir(this.#o.lagSamples);
    this.#lagObserver = lagObserver;
    this.#label = origin.toString();
    this.#lastHeardMs = this.#o.idleClock.now();
  }

  /** When this origin was last heard from (clock ms). */
  get lastHeardMs(): number {
    return this.#lastHeardMs;
  }

  /** Whether a snapshot of this origin was ever installed (it answered on a control endpoint). */
  get synced(): boolean {
    return this.#snapshots > 0;
  }

  get state(): OriginState {
    return this.#state;
  }
  get epoch(): bigint | null {
    return this.#epoch;
  }
  get lastAppliedSeq(): number {
    return this.#lastAppliedSeq;
  }
  get buffered(): number {
    return this.#buffer.length;
  }
  /** Gaps detected so far (as in stats(), without computing the lag percentiles). */
  get gaps(): number {
    return this.#gaps;
  }

  /**
   * `lagsMs`: publish-to-receive lags measured where the batch was received (the receive thread,
   * one per batch merged into this one); without them the lag is taken now from `sentAtMs`.
   */
  onBatch(batch: MeshBatch, lagsMs?: readonly number[]): BatchAction {
    this.#checkOrigin(batch.origin);
    this.#lastHeardMs = this.#o.idleClock.now();
    if (lagsMs === undefined) this.#recordLag(batch.sentAtMs);
    else for (const lag of lagsMs) this.#observeLag(lag);
    if (this.#retired.includes(batch.epoch)) return this.#stale();
    this.#latestSeenEpoch = batch.epoch;
    if (this.#state === "syncing") {
      const overflowed = this.#bufferBatch(batch);
      if (!this.#announced) return this.#announce();
      return overflowed ? { action: "resync", reason: "gap" } : BUFFER;
    }
    if (batch.epoch !== this.#epoch) {
      this.#newEpochs++;
      this.#startSync("new-epoch");
      this.#bufferBatch(batch);
      return this.#announce();
    }
    if (batch.seq <= this.#lastAppliedSeq) return this.#stale();
    // A merged batch (firstSeq..seq) that overlaps what was applied re-applies the overlap, idempotently.
    if ((batch.firstSeq ?? batch.seq) <= this.#lastAppliedSeq + 1) {
      this.#lastAppliedSeq = batch.seq;
      return APPLY;
    }
    this.#gaps++;
    this.#startSync("gap");
    this.#bufferBatch(batch);
    return this.#announce();
  }

  /** A heartbeat's seq is the last batch published: ahead of what was applied means a loss. */
  /** `lagMs` as onBatch's `lagsMs`. */
  onHeartbeat(hb: Heartbeat, lagMs?: number): HeartbeatAction {
    this.#checkOrigin(hb.origin);
    this.#lastHeardMs = this.#o.idleClock.now();
    if (lagMs === undefined) this.#recordLag(hb.sentAtMs);
    else this.#observeLag(lagMs);
    if (this.#retired.includes(hb.epoch)) {
      this.#staleDropped++;
      return DROP_STALE;
    }
    this.#latestSeenEpoch = hb.epoch;
    if (this.#state === "syncing") return this.#announced ? HB_OK : this.#announce();
    if (hb.epoch !== this.#epoch) {
      this.#newEpochs++;
      this.#startSync("new-epoch");
      return this.#announce();
    }
    if (hb.seq > this.#lastAppliedSeq) {
      this.#gaps++;
      this.#startSync("gap");
      return this.#announce();
    }
    return HB_OK;
  }

  /** The glue sent a snapshot request to this origin at `nowMs`. */
  snapshotRequested(nowMs: number): void {
    if (this.#attempts > 0 && this.#requestSentAtMs !== null) this.#snapshotRetries++;
    this.#attempts++;
    this.#outstanding++;
    this.#snapshotRequests++;
    this.#requestSentAtMs = nowMs;
    this.#announced = true;
  }

  /** Whether a snapshot request should be sent now (first one, a timed-out one, or after overflow). */
  snapshotDue(nowMs: number): boolean {
    if (this.#state !== "syncing") return false;
    if (this.#requestSentAtMs === null) return true;
    return nowMs - this.#requestSentAtMs >= this.#currentTimeoutMs();
  }

  /**
   * False for a reply that is not worth installing: a dead epoch, an epoch other than the one
   * this origin was last heard with (a late reply from a previous process), or one older than
   * what is applied while live.
   */
  wantsSnapshot(s: Snapshot): boolean {
    if (this.#retired.includes(s.epoch)) return false;
    if (this.#latestSeenEpoch !== null && s.epoch !== this.#latestSeenEpoch) return false;
    if (this.#state === "live" && s.epoch === this.#epoch && s.seq <= this.#lastAppliedSeq) return false;
    return true;
  }

  /**
   * The glue replaces what it mirrors of this origin with `s`; returns the buffered batches to
   * apply after it, in seq order (those with seq <= s.seq, or of an older epoch, are discarded).
   */
  onSnapshot(s: Snapshot): MeshBatch[] {
    this.#checkOrigin(s.origin);
    this.#lastHeardMs = this.#o.idleClock.now();
    this.#snapshots++;
    if (this.#outstanding > 0) this.#outstanding--;
    const confirmed = !this.#retired.includes(s.epoch) && (this.#latestSeenEpoch === null || s.epoch === this.#latestSeenEpoch);
    if (!confirmed) {
      // Installed anyway by the glue, so record it, but only a snapshot of the epoch the
      // origin is heard with now may end the sync. Nothing is retired on its word.
      this.#epoch = s.epoch;
      this.#lastAppliedSeq = s.seq;
      this.#state = "syncing";
      if (this.#outstanding === 0) this.#requestSentAtMs = null;
      return [];
    }
    // The origin was last heard with s.epoch, so every other epoch buffered or installed is older.
    if (this.#epoch !== null && this.#epoch !== s.epoch) this.#retire(this.#epoch);
    this.#latestSeenEpoch = s.epoch;
    this.#epoch = s.epoch;
    this.#lastAppliedSeq = s.seq;

    const replay: MeshBatch[] = [];
    const keep: MeshBatch[] = [];
    for (const b of this.#buffer.sort((a, b) => a.seq - b.seq)) {
      if (b.epoch !== s.epoch) {
        this.#retire(b.epoch);
        this.#staleDropped++;
      } else if (b.seq <= this.#lastAppliedSeq) {
        this.#staleDropped++;
      } else if ((b.firstSeq ?? b.seq) <= this.#lastAppliedSeq + 1 && keep.length === 0) {
        replay.push(b);
        this.#lastAppliedSeq = b.seq;
      } else {
        keep.push(b);
      }
    }
    this.#buffer = keep;
    if (keep.length === 0) {
      this.#state = "live";
      this.#requestSentAtMs = null;
      this.#attempts = 0;
      this.#outstanding = 0;
      return replay;
    }
    // A hole between the snapshot (plus what continues it) and the rest: keep the rest for a
    // newer snapshot, and ask for one unless a later request is still in flight.
    this.#gaps++;
    this.#state = "syncing";
    if (this.#outstanding === 0) this.#requestSentAtMs = null;
    return replay;
  }

  stats(): OriginStats {
    return {
      origin: this.origin,
      state: this.#state,
      epoch: this.#epoch,
      lastAppliedSeq: this.#lastAppliedSeq,
      gaps: this.#gaps,
      newEpochs: this.#newEpochs,
      snapshots: this.#snapshots,
      snapshotRequests: this.#snapshotRequests,
      snapshotRetries: this.#snapshotRetries,
      buffered: this.#buffer.length,
      bufferOverflows: this.#bufferOverflows,
      staleDropped: this.#staleDropped,
      lagP50Ms: this.#lag.percentile(50),
      lagP99Ms: this.#lag.percentile(99),
    };
  }

  #checkOrigin(origin: bigint): void {
    // Assertion (a programming error, never input): the receiver routes each message to its origin's tracker.
    if (origin !== this.origin) throw new RangeError(`tracker of origin ${this.origin} got a message from ${origin}`);
  }

  #stale(): BatchAction {
    this.#staleDropped++;
    return DROP_STALE;
  }

  #recordLag(sentAtMs: number): void {
    // Clock skew between hosts can make this negative; count it as no lag rather than lose it.
    this.#observeLag(Math.max(0, this.#o.clock.now() - sentAtMs));
  }

  #observeLag(lag: number): void {
    this.#lag.add(lag);
    this.#lagObserver?.observe(this.#label, lag / MS_PER_SECOND);
  }

  #startSync(reason: ResyncReason): void {
    this.#state = "syncing";
    this.#reason = reason;
    this.#announced = false;
    this.#requestSentAtMs = null;
    this.#attempts = 0;
    this.#outstanding = 0;
    this.#buffer = [];
  }

  /** The first resync action of a sync episode; later messages are just buffered. */
  #announce(): { action: "resync"; reason: ResyncReason } {
    this.#announced = true;
    return { action: "resync", reason: this.#reason };
  }

  /** Buffers `batch`; true when the buffer overflowed first (dropped, a newer snapshot is due). */
  #bufferBatch(batch: MeshBatch): boolean {
    let overflowed = false;
    if (this.#buffer.length >= this.#o.resyncBufferMaxBatches) {
      overflowed = true;
      // The snapshot in flight is now too old to be continued by what arrives next: drop the
      // buffer and ask for a newer one (taken after this batch, so buffering it stays useful).
      this.#bufferOverflows++;
      this.#staleDropped += this.#buffer.length;
      this.#buffer = [];
      this.#requestSentAtMs = null;
      this.#outstanding = 0;
    }
    this.#buffer.push(batch);
    return overflowed;
  }

  #retire(epoch: bigint): void {
    if (this.#o.retiredEpochs === 0 || this.#retired.includes(epoch)) return;
    this.#retired.push(epoch);
    if (this.#retired.length > this.#o.retiredEpochs) this.#retired.shift();
  }

  #currentTimeoutMs(): number {
    const doublings = Math.min(Math.max(this.#attempts - 1, 0), 30);
    return Math.min(this.#o.snapshotTimeoutMs * 2 ** doublings, this.#o.snapshotTimeoutMaxMs);
  }
}

export interface MeshReceiverOptions extends OriginTrackerOptions {
  /** Origins tracked at once (default DEFAULT_MAX_TRACKED_ORIGINS). */
  readonly maxOrigins?: number;
  /** Silence after which a synced origin may be evicted for a new one, ms (default DEFAULT_ORIGIN_EVICT_IDLE_MS). */
  readonly evictIdleMs?: number;
  /** An origin was evicted to make room: the glue drops what it keeps per origin. */
  readonly onEvict?: (origin: bigint) => void;
  /** Receives every lag sample (per origin), and each origin forgotten or evicted. */
  readonly lagObserver?: LagObserver;
}

/** One tracker per origin, created on first contact, at most `maxOrigins` of them. */
export class MeshReceiver {
  readonly #options: OriginTrackerOptions;
  readonly #trackers = new Map<bigint, OriginTracker>();
  readonly #maxOrigins: number;
  readonly #evictIdleMs: number;
  readonly #onEvict: ((origin: bigint) => void) | undefined;
  readonly #lagObserver: LagObserver | undefined;
  #refused = 0;
  #evicted = 0;

  constructor(options: MeshReceiverOptions) {
    resolve(options);
    this.#options = options;
    this.#maxOrigins = options.maxOrigins ?? DEFAULT_MAX_TRACKED_ORIGINS;
    this.#evictIdleMs = options.evictIdleMs ?? DEFAULT_ORIGIN_EVICT_IDLE_MS;
    this.#onEvict = options.onEvict;
    this.#lagObserver = options.lagObserver;
    if (!Number.isInteger(this.#maxOrigins) || this.#maxOrigins < 1) throw new MeshOptionError("maxOrigins", `must be a positive integer, got ${this.#maxOrigins}`);
    if (!(this.#evictIdleMs >= 0)) throw new MeshOptionError("evictIdleMs", `must be >= 0, got ${this.#evictIdleMs}`);
  }

  onBatch(batch: MeshBatch, lagsMs?: readonly number[]): BatchAction {
    return this.#get(batch.origin)?.onBatch(batch, lagsMs) ?? REFUSED;
  }

  onHeartbeat(hb: Heartbeat, lagMs?: number): HeartbeatAction {
    return this.#get(hb.origin)?.onHeartbeat(hb, lagMs) ?? REFUSED;
  }

  /** See OriginTracker.onSnapshot; an origin not tracked yet (or forgotten) starts from it ([] if refused). */
  onSnapshot(s: Snapshot): MeshBatch[] {
    return this.#get(s.origin)?.onSnapshot(s) ?? [];
  }

  /** New origins refused because every tracked one was live and recently heard. */
  get refused(): number {
    return this.#refused;
  }

  /** Tracked origins evicted to make room for new ones. */
  get evicted(): number {
    return this.#evicted;
  }

  get size(): number {
    return this.#trackers.size;
  }

  /** False for unknown origins (nobody asked) and for replies that would only rewind one. */
  wantsSnapshot(s: Snapshot): boolean {
    return this.#trackers.get(s.origin)?.wantsSnapshot(s) ?? false;
  }

  snapshotRequested(origin: bigint, nowMs: number): void {
    this.#trackers.get(origin)?.snapshotRequested(nowMs);
  }

  /** Origins a snapshot request should be sent to now. */
  snapshotsDue(nowMs: number): bigint[] {
    const out: bigint[] = [];
    for (const [origin, t] of this.#trackers) if (t.snapshotDue(nowMs)) out.push(origin);
    return out;
  }

  tracker(origin: bigint): OriginTracker | undefined {
    return this.#trackers.get(origin);
  }

  /** Drops an origin's state (deregistered, or down and expired); it starts over on next contact. */
  forget(origin: bigint): boolean {
    if (!this.#trackers.delete(origin)) return false;
    this.#lagObserver?.forget(origin.toString());
    return true;
  }

  origins(): bigint[] {
    return [...this.#trackers.keys()];
  }

  stats(): OriginStats[] {
    return [...this.#trackers.values()].map((t) => t.stats());
  }

  #get(origin: bigint): OriginTracker | undefined {
    let t = this.#trackers.get(origin);
    if (t === undefined) {
      if (this.#trackers.size >= this.#maxOrigins && !this.#evictOne()) {
        this.#refused++;
        return undefined;
      }
      t = new OriginTracker(origin, this.#options, this.#lagObserver);
      this.#trackers.set(origin, t);
    }
    return t;
  }

  /** Evicts the least recently heard origin that never synced or is idle; false if none may go. */
  #evictOne(): boolean {
    const now = (this.#options.idleClock ?? this.#options.clock).now();
    let victim: OriginTracker | undefined;
    for (const t of this.#trackers.values()) {
      if (t.synced && now - t.lastHeardMs < this.#evictIdleMs) continue;
      if (victim === undefined || t.lastHeardMs < victim.lastHeardMs) victim = t;
    }
    if (victim === undefined) return false;
    this.#trackers.delete(victim.origin);
    this.#lagObserver?.forget(victim.origin.toString());
    this.#evicted++;
    this.#onEvict?.(victim.origin);
    return true;
  }
}
