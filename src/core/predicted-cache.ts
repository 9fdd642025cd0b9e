/**
 * In-flight prefixes (issue 25 item 3): the blocks of a prompt routed to a rank count as cached on
 * it before the engine reports them, until the engine's BlockStored is seen in the prefix index or
 * a TTL passes. After Dynamo's predict-on-route side indexer (`router_predicted_ttl_secs`,
 * lib/kv-router indexer: routing decisions populate a short-TTL side index, queried beside the
 * event-fed one, per-worker max of the two). The same structure, with a longer TTL, is the whole
 * cache of an engine that publishes no KV events (Dynamo's approximate mode, `router_ttl_secs`).
 *
 * What a prediction holds. A sequence hash chains its whole prefix, so holding the hash of block d
 * of a prompt says the rank holds blocks 0..d: each hit stands alone, no walk from the root is
 * needed. A booking records only checkpoints: every PREDICTED_STRIDE_BLOCKS-th block's hash and the
 * last one's (a 512-block prompt: 33 hashes, 264 bytes). That is what aggregate load replication
 * sends peers per booking (the whole list would be 4 KiB), and what the local booking and an exact
 * peer's add record too, so every replica predicts the same depths for the same bookings. A lookup
 * credits depth to the last checkpoint (at most STRIDE - 1 blocks short) and probes the blocks after
 * the deepest hit for a booking's last block (a session's previous turn ends anywhere): a 512-block
 * prompt costs 32 + 15 hash probes, and nothing when nothing is predicted.
 *
 * Confirmation. A lookup that finds a rank's prefix-index overlap at or past a predicted depth
 * drops those predicted blocks of the rank (counted confirmed: the engine's BlockStored arrived).
 * Predictions never looked up again leave at their TTL (counted expired).
 *
 * Bounds: per rank at most `maxBlocksPerRank` predicted (rank, block) pairs; past it the rank's
 * oldest bookings' predictions are shed first (counted): in approximate mode this is the
 * least-recently-routed-first eviction an engine's LRU also does.
 */
import { badRequest } from "./errors.js";
import { hashCount, type HashList } from "./hash64.js";
import type { MatchResult } from "./prefix-index.js";
import type { ServiceCounters } from "./service-stats.js";
import type { Clock } from "./time.js";
import { grownTo } from "./typed-growth.js";
import { U64Table } from "./u64-table.js";

/** Checkpoint spacing, blocks: 16 blocks (256 tokens at block size 16) is the depth a lookup may fall short by. */
export const PREDICTED_STRIDE_BLOCKS = 16;
/**
 * TTL of a prediction on a rank whose engine publishes KV events, s. The engine stores a prompt's
 * blocks as its prefill runs (well under 10 s for a 32k-token prompt on current GPUs); the TTL only
 * bounds a prediction whose request failed or whose event was lost. Off by default, as the
 * reference's `router_predicted_ttl_secs` (its tests use 2.5 s): with KV events on and no session
 * ids, 10 s lowered the engines' hit ratio on generated sessions (`kvmesh bench --sessions 1000
 * --replicas 4 --workers 64 --no-session-ids`: 42.3% without the predicted cache, 39.4% at 10 s,
 * 43.5% at 0; load 7-9), so it is opt-in (`--predicted-ttl-secs 10`) until that is understood.
 * It is what makes a burst sharing a new prefix land on one worker across replicas (fault
 * scenario 12 runs the approximate cache, which is on by default without KV events).
 */
export const DEFAULT_PREDICTED_TTL_SECS = 0;
/**
 * TTL of a routing decision on a rank without KV events (the approximate cache), s: the reference's
 * `router_ttl_secs` default (120 s).
 */
export const DEFAULT_APPROX_TTL_SECS = 120;
/**
 * Predicted (rank, block) pairs per rank, at most: 65,536 checkpoint pairs stand for ~1 M blocks
 * (16 M tokens at block size 16), past any engine's KV capacity. ~40 bytes a pair (table slot,
 * holder entry, the booking's record): 2.6 MB per rank at the bound.
 */
export const DEFAULT_MAX_PREDICTED_BLOCKS_PER_RANK = 65_536;
/**
 * A prediction younger than this is taken as in flight (its prefill running on the rank), ms: 10 s,
 * well past a 32k-token prefill on current GPUs, and the TTL `--predicted-ttl-secs 10` suggests.
 * With KV events every unconfirmed prediction within it is; without, the approximate cache's older
 * entries are cache, not work in progress.
 */
const INFLIGHT_WINDOW_MS = 10_000;
/** Expired predictions are swept at most this often, ms (lookups ignore expired ones meanwhile). */
const SWEEP_INTERVAL_MS = 1_000;
const MAX_PREDICTED_TTL_SECS = 86_400;

export interface PredictedCacheOptions {
  /** 0: off (nothing is recorded, lookups return the index's match unchanged). */
  readonly ttlMs: number;
  readonly maxBlocksPerRank: number;
}

/** Checks a TTL option in seconds (0 = off) and returns ms. */
export function predictedTtlMs(secs: number, field: string): number {
  if (!Number.isFinite(secs) || secs < 0 || secs > MAX_PREDICTED_TTL_SECS) throw badRequest(`${field} must be a number of seconds in [0, ${MAX_PREDICTED_TTL_SECS}] (0: off)`, field);
  return secs * 1000;
}

/** The checkpoint hashes a booking of `seqHashes` predicts (see the file comment). */
export function predictionOf(seqHashes: HashList): HashList {
  const n = hashCount(seqHashes);
  if (n === 0) return new Uint32Array(0);
  const k = Math.floor(n / PREDICTED_STRIDE_BLOCKS);
  const lastIsCheckpoint = n % PREDICTED_STRIDE_BLOCKS === 0;
  const out = new Uint32Array(2 * (k + (lastIsCheckpoint ? 0 : 1)));
  let j = 0;
  for (let d = PREDICTED_STRIDE_BLOCKS - 1; d < n; d += PREDICTED_STRIDE_BLOCKS) {
    out[j++] = seqHashes[2 * d] as number;
    out[j++] = seqHashes[2 * d + 1] as number;
  }
  if (!lastIsCheckpoint) {
    out[j++] = seqHashes[2 * (n - 1)] as number;
    out[j++] = seqHashes[2 * (n - 1) + 1] as number;
  }
  return out;
}

/** One live record as exportRecords gives it: the rank key, the pairs, and the time left, ms. */
export interface PredictionExport {
  readonly rank: number;
  readonly hashes: HashList;
  readonly ttlMs: number;
}

/** One booking's prediction on one rank, in its rank's FIFO. */
interface PredictionRecord {
  readonly hashes: HashList;
  readonly expiresAt: number;
}

/** A rank's records, oldest first (a head index instead of shift()). */
interface RankQueue {
  records: PredictionRecord[];
  head: number;
  pairs: number;
}

/** The merged match's buffers (the index's MatchResult shape). */
class MergedMatch implements MatchResult {
  count = 0;
  ranks = new Int32Array(16);
  device = new Int32Array(16);
  host = new Int32Array(16);
  disk = new Int32Array(16);

  ensure(n: number): void {
    if (this.ranks.length >= n) return;
    const cap = Math.max(n, this.ranks.length * 2);
    const grow = (a: Int32Array<ArrayBuffer>): Int32Array<ArrayBuffer> => {
      const b = new Int32Array(cap);
      b.set(a.subarray(0, this.count));
      return b;
    };
    this.ranks = grow(this.ranks);
    this.device = grow(this.device);
    this.host = grow(this.host);
    this.disk = grow(this.disk);
  }
}

export class PredictedCache {
  readonly #clock: Clock;
  readonly #counters: ServiceCounters;
  readonly ttlMs: number;
  readonly #maxPerRank: number;
  /** Checkpoint hash -> entry index. */
  readonly #table = new U64Table();
  /** Per entry: holder ranks and, at the same position, each holder's expiry (clock ms). */
  #holders: number[][] = [];
  #expiry: number[][] = [];
  readonly #freeEntries: number[] = [];
  readonly #queues = new Map<number, RankQueue>();
  #pairs = 0;
  #nextSweepMs = 0;
  // Lookup scratch: depth per rank key (0 between calls), ranks touched, hits (entry, depth).
  #depth = new Int32Array(16);
  /** Per rank key: the depth of its predictions still in flight (INFLIGHT_WINDOW_MS), 0 between calls. */
  #inflightDepth = new Int32Array(16);
  readonly #touched: number[] = [];
  readonly #hitEntries: number[] = [];
  readonly #hitDepths: number[] = [];
  readonly #merged = new MergedMatch();

  constructor(clock: Clock, counters: ServiceCounters, options: PredictedCacheOptions) {
    if (!Number.isSafeInteger(options.maxBlocksPerRank) || options.maxBlocksPerRank < 1) throw badRequest("maxBlocksPerRank must be a positive integer", "maxBlocksPerRank");
    this.#clock = clock;
    this.#counters = counters;
    this.ttlMs = options.ttlMs;
    this.#maxPerRank = options.maxBlocksPerRank;
  }

  get enabled(): boolean {
    return this.ttlMs > 0;
  }

  /** Predicted (rank, block) pairs held now (checkpoints). */
  get size(): number {
    return this.#pairs;
  }

  /** A booking of `seqHashes` on `rank` (this replica's, or an exact peer's add). */
  recordBooking(rank: number, seqHashes: HashList): void {
    if (this.ttlMs <= 0 || seqHashes.length === 0) return;
    this.add(rank, predictionOf(seqHashes));
  }

  /**
   * A booking's checkpoint hashes (predictionOf) on `rank`: a local booking or a peer's, as sent.
   * `ttlMs` is the time the prediction has left (a peer's snapshot sends what is left of each; at
   * most this cache's TTL). A pair already held longer keeps its expiry. Returns whether anything
   * was added or held longer (a record that changes nothing is not kept: a snapshot installed twice
   * holds no more than once).
   */
  add(rank: number, hashes: HashList, ttlMs = this.ttlMs): boolean {
    if (this.ttlMs <= 0 || hashes.length === 0 || !(ttlMs > 0)) return false;
    const now = this.#clock.now();
    this.#maybeSweep(now);
    const expiresAt = now + Math.min(ttlMs, this.ttlMs);
    let q = this.#queues.get(rank);
    if (q === undefined) {
      q = { records: [], head: 0, pairs: 0 };
      this.#queues.set(rank, q);
    }
    let changed = false;
    const n = hashCount(hashes);
    for (let i = 0; i < n; i++) {
      const hi = hashes[2 * i] as number;
      const lo = hashes[2 * i + 1] as number;
      let e = this.#table.get(0, hi, lo);
      if (e < 0) {
        e = this.#freeEntries.pop() ?? this.#holders.length;
        if (e === this.#holders.length) {
          this.#holders.push([]);
          this.#expiry.push([]);
        }
        this.#table.set(0, hi, lo, e);
      }
      const holders = this.#holders[e] as number[];
      const expiry = this.#expiry[e] as number[];
      const k = holders.indexOf(rank);
      if (k >= 0) {
        if ((expiry[k] as number) < expiresAt) {
          expiry[k] = expiresAt;
          changed = true;
        }
      } else {
        holders.push(rank);
        expiry.push(expiresAt);
        q.pairs++;
        this.#pairs++;
        this.#counters.predictedBlocksAdded++;
        changed = true;
      }
    }
    if (!changed) {
      // Every pair is held at least as long by other records; an entry made above for nothing
      // cannot exist (a new entry gets this rank as holder, which is a change).
      if (q.head === q.records.length) this.#queues.delete(rank);
      return false;
    }
    this.#enqueue(q, { hashes, expiresAt });
    while (q.pairs > this.#maxPerRank && q.head < q.records.length) {
      this.#counters.predictedBlocksShed += this.#popRecord(rank, q);
    }
    this.#compact(q);
    return true;
  }

  /**
   * Keeps `q` ordered by expiry (the sweep pops from its head, and #popRecord's ownership rule reads
   * a later record as a later expiry): a local booking always goes last; a snapshot's prediction
   * with less time left goes where its expiry puts it.
   */
  #enqueue(q: RankQueue, r: PredictionRecord): void {
    const records = q.records;
    if (q.head === records.length || (records[records.length - 1] as PredictionRecord).expiresAt <= r.expiresAt) {
      records.push(r);
      return;
    }
    let lo = q.head;
    let hi = records.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if ((records[mid] as PredictionRecord).expiresAt <= r.expiresAt) lo = mid + 1;
      else hi = mid;
    }
    records.splice(lo, 0, r);
  }

  /**
   * What this cache holds, for a peer's snapshot: each live record's pairs it still owns (not
   * confirmed, not held longer by a later booking) with the time it has left, newest first, at most
   * `maxPairs` hashes in all. Returns the rows and how many pairs the bound left out.
   */
  exportRecords(maxPairs: number): { rows: PredictionExport[]; left: number } {
    const now = this.#clock.now();
    const live: { rank: number; r: PredictionRecord }[] = [];
    for (const [rank, q] of this.#queues) {
      for (let i = q.head; i < q.records.length; i++) {
        const r = q.records[i] as PredictionRecord;
        if (r.expiresAt > now) live.push({ rank, r });
      }
    }
    live.sort((a, b) => b.r.expiresAt - a.r.expiresAt);
    const rows: PredictionExport[] = [];
    let budget = maxPairs;
    let left = 0;
    for (const { rank, r } of live) {
      const owned = this.#ownedPairs(rank, r);
      const n = hashCount(owned);
      if (n === 0) continue;
      if (n > budget) {
        left += n;
        continue;
      }
      budget -= n;
      rows.push({ rank, hashes: owned, ttlMs: r.expiresAt - now });
    }
    return { rows, left };
  }

  /** The pairs of `r` on `rank` that `r` still owns (see #popRecord): all of them, or a copy of those. */
  #ownedPairs(rank: number, r: PredictionRecord): HashList {
    const n = hashCount(r.hashes);
    const keep: number[] = [];
    for (let i = 0; i < n; i++) {
      const hi = r.hashes[2 * i] as number;
      const lo = r.hashes[2 * i + 1] as number;
      const e = this.#table.get(0, hi, lo);
      if (e < 0) continue;
      const k = (this.#holders[e] as number[]).indexOf(rank);
      if (k >= 0 && (this.#expiry[e] as number[])[k] === r.expiresAt) keep.push(i);
    }
    if (keep.length === n) return r.hashes;
    const out = new Uint32Array(2 * keep.length);
    for (let j = 0; j < keep.length; j++) {
      const i = keep[j] as number;
      out[2 * j] = r.hashes[2 * i] as number;
      out[2 * j + 1] = r.hashes[2 * i + 1] as number;
    }
    return out;
  }

  /**
   * The index's match with the predicted depths merged in (per rank, the deeper of the two; a
   * predicted-only rank is added): `match` itself when nothing is predicted for the prompt. The
   * result is a buffer reused by the next call, as the index's is. `inflight[rank]` (indexed by
   * rank key, sized by the caller) gets the predicted blocks past the index's overlap: blocks in
   * flight there, not yet reported (Partition.fillCandidateLoads reads it; the caller zeroes it).
   */
  merge(match: MatchResult, seqHashes: HashList, inflight?: Int32Array): MatchResult {
    if (this.#pairs === 0) return match;
    const now = this.#clock.now();
    this.#maybeSweep(now);
    const found = this.#lookup(seqHashes, now);
    if (found === 0) return match;
    const depth = this.#depth;
    const out = this.#merged;
    out.count = 0;
    out.ensure(match.count + found);
    for (let j = 0; j < match.count; j++) {
      const rank = match.ranks[j] as number;
      let d = match.device[j] as number;
      let h = match.host[j] as number;
      let k = match.disk[j] as number;
      const p = rank < depth.length ? (depth[rank] as number) : 0;
      if (p > 0) {
        if (d >= p) {
          this.#confirm(rank, d);
        } else {
          // The predicted blocks are on device; the lower tiers extend past them, or not at all.
          const reach = d + h;
          const total = reach + k;
          if (inflight !== undefined) inflight[rank] = Math.max(0, (this.#inflightDepth[rank] as number) - d);
          d = p;
          h = Math.max(0, reach - p);
          k = Math.max(0, total - p - h);
        }
        depth[rank] = 0;
        this.#inflightDepth[rank] = 0;
      }
      out.ranks[out.count] = rank;
      out.device[out.count] = d;
      out.host[out.count] = h;
      out.disk[out.count] = k;
      out.count++;
    }
    for (const rank of this.#touched) {
      const p = depth[rank] as number;
      if (p === 0) continue;
      depth[rank] = 0;
      if (inflight !== undefined) inflight[rank] = this.#inflightDepth[rank] as number;
      this.#inflightDepth[rank] = 0;
      out.ranks[out.count] = rank;
      out.device[out.count] = p;
      out.host[out.count] = 0;
      out.disk[out.count] = 0;
      out.count++;
    }
    this.#touched.length = 0;
    return out;
  }

  /** Forgets every prediction of `rank` (its worker left, or its engine cleared its cache). */
  removeRank(rank: number): void {
    const q = this.#queues.get(rank);
    if (q === undefined) return;
    while (q.head < q.records.length) this.#popRecord(rank, q);
    this.#queues.delete(rank);
  }

  /** Drops expired predictions (lookups already ignore them); runs at most every SWEEP_INTERVAL_MS. */
  #maybeSweep(now: number): void {
    if (now < this.#nextSweepMs) return;
    this.#nextSweepMs = now + SWEEP_INTERVAL_MS;
    for (const [rank, q] of this.#queues) {
      while (q.head < q.records.length && (q.records[q.head] as PredictionRecord).expiresAt <= now) {
        this.#counters.predictedBlocksExpired += this.#popRecord(rank, q);
      }
      if (q.head === q.records.length) this.#queues.delete(rank);
      else this.#compact(q);
    }
  }

  /**
   * Removes the oldest record of `rank`'s queue and the pairs it still owns (a pair refreshed by a
   * later booking expires later and belongs to that one). Returns the pairs removed.
   */
  #popRecord(rank: number, q: RankQueue): number {
    const r = q.records[q.head] as PredictionRecord;
    q.records[q.head] = undefined as unknown as PredictionRecord;
    q.head++;
    let removed = 0;
    const n = hashCount(r.hashes);
    for (let i = 0; i < n; i++) {
      const hi = r.hashes[2 * i] as number;
      const lo = r.hashes[2 * i + 1] as number;
      const e = this.#table.get(0, hi, lo);
      if (e < 0) continue;
      const holders = this.#holders[e] as number[];
      const k = holders.indexOf(rank);
      if (k < 0) {
        // Emptied by confirmations (which keep the entry, see #confirm): it goes with its booking.
        if (holders.length === 0) this.#dropHolder(e, -1, hi, lo);
        continue;
      }
      if (((this.#expiry[e] as number[])[k] as number) > r.expiresAt) continue;
      this.#dropHolder(e, k, hi, lo);
      removed++;
    }
    q.pairs -= removed;
    this.#pairs -= removed;
    return removed;
  }

  /** Removes holder `k` of entry `e` (none when k < 0), and the entry with its last holder. */
  #dropHolder(e: number, k: number, hi: number, lo: number): void {
    const holders = this.#holders[e] as number[];
    if (k >= 0) this.#unhold(e, k);
    if (holders.length === 0) {
      this.#table.delete(0, hi, lo);
      this.#freeEntries.push(e);
    }
  }

  #unhold(e: number, k: number): void {
    const holders = this.#holders[e] as number[];
    const expiry = this.#expiry[e] as number[];
    const last = holders.length - 1;
    holders[k] = holders[last] as number;
    expiry[k] = expiry[last] as number;
    holders.pop();
    expiry.pop();
  }

  #compact(q: RankQueue): void {
    if (q.head > 1024 && q.head * 2 > q.records.length) {
      q.records = q.records.slice(q.head);
      q.head = 0;
    }
  }

  /**
   * Fills #depth[rank] with each rank's predicted depth for the prompt (live predictions only) and
   * #touched with those ranks; returns how many.
   */
  #lookup(seqHashes: HashList, now: number): number {
    const n = hashCount(seqHashes);
    this.#hitEntries.length = 0;
    this.#hitDepths.length = 0;
    let deepest = -1;
    for (let d = PREDICTED_STRIDE_BLOCKS - 1; d < n; d += PREDICTED_STRIDE_BLOCKS) {
      if (this.#probe(seqHashes, d, now)) deepest = d;
    }
    // A booking's last block: after the deepest checkpoint hit, before the next checkpoint.
    const end = Math.min(n - 1, deepest + PREDICTED_STRIDE_BLOCKS - 1);
    for (let d = deepest + 1; d <= end; d++) {
      if ((d + 1) % PREDICTED_STRIDE_BLOCKS !== 0) this.#probe(seqHashes, d, now);
    }
    return this.#touched.length;
  }

  /**
   * Raises the depth of each live holder of the prompt's block `d` to d + 1. Returns whether the
   * block has an entry at all (live or not): the tail probes then follow it, whatever confirmations
   * and expiries did to its holders, so a lookup's reach does not depend on them.
   */
  #probe(seqHashes: HashList, d: number, now: number): boolean {
    const e = this.#table.get(0, seqHashes[2 * d] as number, seqHashes[2 * d + 1] as number);
    if (e < 0) return false;
    const holders = this.#holders[e] as number[];
    const expiry = this.#expiry[e] as number[];
    let live = false;
    for (let k = 0; k < holders.length; k++) {
      if ((expiry[k] as number) <= now) continue;
      live = true;
      const rank = holders[k] as number;
      if (rank >= this.#depth.length) {
        this.#depth = grownTo(this.#depth, rank + 1);
        this.#inflightDepth = grownTo(this.#inflightDepth, this.#depth.length);
      }
      const prev = this.#depth[rank] as number;
      if (prev === 0) this.#touched.push(rank);
      if (d + 1 > prev) this.#depth[rank] = d + 1;
      if ((expiry[k] as number) - now > this.ttlMs - INFLIGHT_WINDOW_MS && d + 1 > (this.#inflightDepth[rank] as number)) this.#inflightDepth[rank] = d + 1;
    }
    if (live) {
      this.#hitEntries.push(e);
      this.#hitDepths.push(d);
    }
    return true;
  }

  /** The index holds `rank`'s first `indexed` blocks of the prompt: its predictions up to there are confirmed. */
  #confirm(rank: number, indexed: number): void {
    const q = this.#queues.get(rank);
    for (let i = 0; i < this.#hitEntries.length; i++) {
      const d = this.#hitDepths[i] as number;
      if (d >= indexed) continue;
      const e = this.#hitEntries[i] as number;
      const k = (this.#holders[e] as number[]).indexOf(rank);
      if (k < 0) continue;
      // The entry stays, even emptied, until its booking's record goes (#popRecord): see #probe.
      this.#unhold(e, k);
      if (q !== undefined) q.pairs--;
      this.#pairs--;
      this.#counters.predictedBlocksConfirmed++;
    }
  }
}
