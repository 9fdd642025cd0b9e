/**
 * The load ledger of ONE partition: the requests this replica (and its peers) booked onto each
 * worker rank and are still in flight, and what they cost each rank right now.
 *
 * Per rank it tracks the reference's `ActiveSequences` (Dynamo's lib/kv-router/src/sequences/): unique active blocks (a
 * sequence hash shared by several in-flight requests on one rank counts once, optionally
 * down-weighted for long generations), prefill tokens still owed (FIFO, oldest request decaying
 * linearly when a duration hint exists) and the request count.
 *
 * Unlike the reference, which keeps one hash set per rank, the ledger keeps ONE partition-wide
 * index of which ranks hold each hash (refcount and weight each). Selection has to know, for every
 * candidate rank, how many of the prompt's hashes are already active there; per-rank sets make
 * that O(blocks x ranks) (219 x 1,024 = 224 k probes). The index is a prefix tree of the bookings
 * (active-prefix-trie.ts): a list is walked along the nodes it shares with earlier bookings and
 * holders are applied once per node, so a count or a booking costs O(blocks) sequential compares
 * plus one probe per new hash, not one probe per hash.
 */
import { grownTo } from "./typed-growth.js";
import type { Clock } from "./time.js";
import type { Random } from "./random.js";
import { KvmeshError, badRequest } from "./errors.js";
import type { RankBlockTotals } from "./active-block-index.js";
import { ActivePrefixTrie } from "./active-prefix-trie.js";
import type { HashList } from "./hash64.js";
import { MAX_RANK_KEYS } from "./rank-registry.js";

/**
 * A booking not freed within this is force-freed (the reference's 300 s): a client that died
 * mid-request must not hold load forever. The one definition; the service's option defaults to it.
 */
export const DEFAULT_ACTIVE_REQUEST_EXPIRY_MS = 300_000;

/** Rank slots of the per-rank request counts at construction; doubled as ranks appear. */
const INITIAL_RANK_SLOTS = 64;
/** Compact a rank's prefill FIFO once this many dead entries sit before its head. */
const PREFILL_QUEUE_COMPACT_MIN = 64;
const TWO_POW_32 = 4294967296;

export interface LoadLedgerOptions {
  clock: Clock;
  expiryMs?: number;
  random: Random;
  /**
   * The prefill estimate (the ttft cost model's: ttft-cost.ts ttftOwnPrefillMs): the ms a rank
   * spends prefilling a booking of `prefillTokens` uncached tokens of a `promptBlocks`-block
   * prompt. When set, every tracked booking is taken as prefilled once the rank's queue ahead of
   * it and its own time have passed, even before its `prefill_complete` arrives (issue #27: a
   * 90 ms late lifecycle call left 900 trace ms of computed prefill on the ledger, and the
   * estimate moved turns away from their cache). Unset: the reference's decay (only the oldest
   * booking's, and only with a duration hint).
   */
  prefillMs?: ((prefillTokens: number, promptBlocks: number) => number) | undefined;
}

export interface AddRequestOptions {
  /** Effective prefill tokens (prompt tokens not served from cache). */
  prefillTokens: number;
  trackPrefill: boolean;
  expectedPrefillDurationMs?: number | null | undefined;
  expectedOutputTokens?: number | null | undefined;
}

export interface ActiveRequestInfo {
  rank: number;
  startedAtMs: number;
  prefillDone: boolean;
  prefillTokens: number;
  blockCount: number;
}

export interface RankLoad {
  rank: number;
  activePrefillTokens: number;
  activeBlocks: number;
  activeRequests: number;
}

interface ActiveRequest {
  readonly id: string;
  readonly rank: number;
  readonly startedAtMs: number;
  readonly prefillTokens: number;
  readonly expectedPrefillDurationMs: number | null;
  readonly expectedOutputTokens: number | null;
  readonly hashes: Uint32Array;
  /** Placeholder blocks for generated output, interleaved (hi, lo). */
  readonly output: number[];
  prefillDone: boolean;
  inPrefillQueue: boolean;
  /** With the prefill estimate: its own prefill ms, and when the rank is expected to finish it (clock ms). */
  ownPrefillMs: number;
  prefillDueMs: number;
}

interface RankState extends RankBlockTotals {
  readonly requests: Set<ActiveRequest>;
  /** Requests still in prefill, in admission order; entries before `prefillHead` are dead. */
  prefillQueue: ActiveRequest[];
  prefillHead: number;
  prefillSum: number;
  /** When the current head of the prefill FIFO became the oldest request in prefill. */
  prefillAnchorMs: number;
}

const newRankState = (): RankState => ({
  requests: new Set(),
  uniqueBlocks: 0,
  fractionalCount: 0,
  fractionalDeficit: 0,
  prefillQueue: [],
  prefillHead: 0,
  prefillSum: 0,
  prefillAnchorMs: 0,
});

const checkRank = (rank: number): void => {
  if (!Number.isInteger(rank) || rank < 0 || rank >= MAX_RANK_KEYS) {
    throw badRequest(`rank key must be an integer in [0, ${MAX_RANK_KEYS - 1}], got ${String(rank)}`, "rank");
  }
};

const checkOptionalNonNegative = (value: number | null | undefined, field: string): number | null => {
  if (value === undefined || value === null) return null;
  if (!Number.isFinite(value) || value < 0) throw badRequest(`${field} must be a finite number >= 0`, field);
  return value;
};

/** The due time of the rank's last booking still in prefill (prefill estimate), or -Infinity. */
function lastDueMs(st: RankState): number {
  const queue = st.prefillQueue;
  for (let i = queue.length - 1; i >= st.prefillHead; i--) {
    const req = queue[i] as ActiveRequest;
    if (req.inPrefillQueue) return req.prefillDueMs;
  }
  return -Infinity;
}

/**
 * The prefill tokens the rank still owes at `now` by the prefill estimate: bookings past their due
 * time count 0, the one being prefilled its remaining share, the rest whole. Due times rise along
 * the FIFO (each starts when the one before is due), so the walk stops at the first one not due
 * and the rest count whole: O(bookings due), a few while prefill_complete calls lag.
 */
function estimatedPrefill(st: RankState, now: number): number {
  const queue = st.prefillQueue;
  let passed = 0;
  for (let i = st.prefillHead; i < queue.length; i++) {
    const req = queue[i] as ActiveRequest;
    if (!req.inPrefillQueue) continue;
    if (req.prefillDueMs <= now) {
      passed += req.prefillTokens;
      continue;
    }
    const left = req.prefillDueMs - now;
    if (left < req.ownPrefillMs) passed += req.prefillTokens * (1 - left / req.ownPrefillMs);
    // Rounding of the running sums must not take the value below 0, the scan's floor.
    return Math.max(0, st.prefillSum - passed);
  }
  return 0;
}

export class LoadLedger {
  readonly #clock: Clock;
  readonly #random: Random;
  readonly #expiryMs: number;
  readonly #prefillMs: ((prefillTokens: number, promptBlocks: number) => number) | undefined;
  /** Live requests in admission order (Map iteration order), which is also expiry order. */
  readonly #requests = new Map<string, ActiveRequest>();
  /** Indexed by rank key; ranks are dense small integers interned by the caller. */
  readonly #ranks: (RankState | undefined)[] = [];
  /**
   * Live requests per rank key, mirrored from each RankState in one flat array. Selection reads
   * the load of every candidate; at 1,024 ranks, following each rank's state object (and its
   * Set and prefill queue) missed the CPU cache three times per rank, a visible share of a
   * bench:http flow (`npm run bench:http`). Idle ranks, nearly all of them, now cost one
   * typed-array read.
   */
  #requestCounts = new Int32Array(INITIAL_RANK_SLOTS);
  /**
   * Per rank key, kept current by every change: the prefill tokens owed with the oldest request's
   * decay taken as complete (a floor of activePrefillTokens at any time: it only counts the
   * remaining fraction of the head, in [0, 1]), and activeBlocks. The candidate scan
   * (candidate-scan.ts) reads them for every rank of a partition, so they are flat arrays.
   */
  #prefillFloor = new Float64Array(INITIAL_RANK_SLOTS);
  /** 1 where the rank's prefill decays with time (its head has a duration): the floor is then below the value. */
  #prefillDecays = new Uint8Array(INITIAL_RANK_SLOTS);
  #blocks = new Float64Array(INITIAL_RANK_SLOTS);
  /**
   * The ranks with live requests, dense and unordered (#busyRanks[0, #busyCount)), and per rank
   * key its place there + 1 (0: not busy). Kept by #refresh, the one step every change ends with.
   * The candidate scan visits only these (every other rank's load is zero, so its cost is the
   * same for all of them): with bench:http's 16 flows in flight over 1,024 ranks, 16 loads read
   * where a pass over the partition read 1,024.
   */
  #busyRanks = new Int32Array(INITIAL_RANK_SLOTS);
  #busySlot = new Int32Array(INITIAL_RANK_SLOTS);
  #busyCount = 0;
  readonly #index = new ActivePrefixTrie();
  /**
   * Ranks whose load changed since the last `takeChanged` (aggregate replication only: see
   * src/core/mirrored-load.ts). A flag per rank plus the list of flagged ranks, so marking costs
   * one typed-array read on every add/free and taking costs O(changed ranks).
   */
  #changed: Uint8Array | undefined;
  #changedList: number[] = [];

  constructor(options: LoadLedgerOptions) {
    const expiryMs = options.expiryMs ?? DEFAULT_ACTIVE_REQUEST_EXPIRY_MS;
    if (!Number.isFinite(expiryMs) || expiryMs <= 0) throw badRequest("expiryMs must be a finite number > 0", "expiryMs");
    this.#clock = options.clock;
    this.#random = options.random;
    this.#expiryMs = expiryMs;
    this.#prefillMs = options.prefillMs;
  }

  /** Starts recording which ranks' load changes (for `takeChanged`). */
  trackChanges(): void {
    this.#changed ??= new Uint8Array(INITIAL_RANK_SLOTS);
  }

  /** Appends the ranks whose load changed since the last call to `out`, and forgets them. */
  takeChanged(out: number[]): void {
    const flags = this.#changed;
    if (flags === undefined) return;
    for (const rank of this.#changedList) {
      flags[rank] = 0;
      out.push(rank);
    }
    this.#changedList.length = 0;
  }

  /**
   * Whether the rank's prefill estimate is decaying with time right now (its oldest request in
   * prefill has a duration hint and has not run it out): a copy of the value goes stale as it ages.
   */
  prefillDecaying(rank: number): boolean {
    const st = this.#ranks[rank];
    if (st === undefined || st.prefillHead >= st.prefillQueue.length) return false;
    if (this.#prefillMs !== undefined) return this.#clock.now() < lastDueMs(st);
    const duration = (st.prefillQueue[st.prefillHead] as ActiveRequest).expectedPrefillDurationMs;
    return duration !== null && duration > 0 && this.#clock.now() - st.prefillAnchorMs < duration;
  }

  #markChanged(rank: number): void {
    let flags = this.#changed;
    if (flags === undefined) return;
    if (rank >= flags.length) {
      const grown = new Uint8Array(Math.max(rank + 1, flags.length * 2));
      grown.set(flags);
      this.#changed = flags = grown;
    }
    if (flags[rank] === 0) {
      flags[rank] = 1;
      this.#changedList.push(rank);
    }
  }

  /** Brings the rank's flat copies (#requestCounts, #prefillFloor, #blocks) up to date after a change. */
  #refresh(rank: number): void {
    const st = this.#ranks[rank];
    if (st === undefined) {
      this.#requestCounts[rank] = 0;
      this.#prefillFloor[rank] = 0;
      this.#prefillDecays[rank] = 0;
      this.#blocks[rank] = 0;
      this.#setBusy(rank, false);
      return;
    }
    this.#requestCounts[rank] = st.requests.size;
    this.#setBusy(rank, st.requests.size > 0);
    this.#blocks[rank] = st.uniqueBlocks - st.fractionalDeficit;
    let floor = 0;
    let decays = 0;
    if (st.prefillHead < st.prefillQueue.length) {
      const head = st.prefillQueue[st.prefillHead] as ActiveRequest;
      // The same first operation as activePrefillTokens, so rounding keeps floor <= its value.
      // With the prefill estimate every booking runs out with time: the floor is 0.
      if (this.#prefillMs !== undefined) {
        decays = 1;
      } else if (head.expectedPrefillDurationMs === null) {
        floor = st.prefillSum;
      } else {
        floor = st.prefillSum - head.prefillTokens;
        decays = 1;
      }
    }
    this.#prefillFloor[rank] = floor;
    this.#prefillDecays[rank] = decays;
  }

  /** Adds the rank to, or takes it from, the busy ranks (swapping the last one into its place). */
  #setBusy(rank: number, busy: boolean): void {
    if (rank >= this.#busySlot.length) {
      if (!busy) return;
      this.#busySlot = grownTo(this.#busySlot, rank + 1);
      this.#busyRanks = grownTo(this.#busyRanks, this.#busySlot.length);
    }
    const slot = this.#busySlot[rank] as number;
    if (busy === slot > 0) return;
    if (busy) {
      this.#busyRanks[this.#busyCount++] = rank;
      this.#busySlot[rank] = this.#busyCount;
      return;
    }
    const last = this.#busyRanks[--this.#busyCount] as number;
    this.#busyRanks[slot - 1] = last;
    this.#busySlot[last] = slot;
    this.#busySlot[rank] = 0;
  }

  /** Number of live requests in the partition. */
  get size(): number {
    return this.#requests.size;
  }

  /** Booking lists that broke the active blocks' prefix tree (a repeated hash, or one held elsewhere), each handing its state to the per-hash index. */
  get activeBlockFallbacks(): number {
    return this.#index.fallbacks;
  }

  /** Distinct sequence hashes active on at least one rank. */
  get distinctActiveHashes(): number {
    return this.#index.size;
  }

  /** One past the highest rank key ever seen: the length an `out` array for `newBlocksFor` needs. */
  get rankBound(): number {
    return this.#ranks.length;
  }

  add(requestId: string, rank: number, seqHashes: HashList, opts: AddRequestOptions): void {
    if (this.#requests.has(requestId)) {
      throw new KvmeshError("KVMESH_DUPLICATE_ID", `request ${requestId} is already live in the load ledger`, {
        details: { field: "request_id" },
      });
    }
    checkRank(rank);
    if ((seqHashes.length & 1) !== 0) throw badRequest("sequence hash list must hold (hi, lo) pairs", "sequence_hashes");
    if (!Number.isFinite(opts.prefillTokens) || opts.prefillTokens < 0) {
      throw badRequest("prefill_tokens must be a finite number >= 0", "prefill_tokens");
    }
    const expectedPrefillDurationMs = checkOptionalNonNegative(opts.expectedPrefillDurationMs, "expected_prefill_duration_ms");
    const expectedOutputTokens = checkOptionalNonNegative(opts.expectedOutputTokens, "expected_output_tokens");

    const now = this.#clock.now();
    const st = this.#rankState(rank);
    const req: ActiveRequest = {
      id: requestId,
      rank,
      startedAtMs: now,
      prefillTokens: opts.prefillTokens,
      expectedPrefillDurationMs,
      expectedOutputTokens,
      // Copied: callers reuse their hash buffers between selections.
      hashes: seqHashes.slice(),
      output: [],
      prefillDone: !opts.trackPrefill,
      inPrefillQueue: opts.trackPrefill,
      ownPrefillMs: 0,
      prefillDueMs: 0,
    };
    if (opts.trackPrefill && this.#prefillMs !== undefined) {
      // A FIFO engine: it starts this prompt when the bookings ahead of it are expected done.
      const own = expectedPrefillDurationMs ?? this.#prefillMs(opts.prefillTokens, seqHashes.length >>> 1);
      req.ownPrefillMs = Number.isFinite(own) && own > 0 ? own : 0;
      req.prefillDueMs = Math.max(now, lastDueMs(st)) + req.ownPrefillMs;
    }
    this.#requests.set(requestId, req);
    st.requests.add(req);
    this.#requestCounts[rank] = st.requests.size;
    // The copy: the prefix tree keeps the list of a booking that adds hashes (active-prefix-trie.ts).
    this.#index.touchAll(req.hashes, rank, st);
    if (opts.trackPrefill) {
      if (st.prefillHead >= st.prefillQueue.length) st.prefillAnchorMs = now;
      st.prefillQueue.push(req);
      st.prefillSum += req.prefillTokens;
    }
    this.#refresh(rank);
    this.#markChanged(rank);
  }

  /** False if the id is unknown; true (idempotently) otherwise. */
  markPrefillComplete(requestId: string): boolean {
    const req = this.#requests.get(requestId);
    if (req === undefined) return false;
    req.prefillDone = true;
    this.#leavePrefill(req, this.#rankState(req.rank));
    this.#refresh(req.rank);
    this.#markChanged(req.rank);
    return true;
  }

  free(requestId: string): boolean {
    const req = this.#requests.get(requestId);
    if (req === undefined) return false;
    this.#requests.delete(requestId);
    this.#release(req, this.#rankState(req.rank));
    this.#refresh(req.rank);
    this.#markChanged(req.rank);
    return true;
  }

  has(requestId: string): boolean {
    return this.#requests.has(requestId);
  }

  get(requestId: string): ActiveRequestInfo | undefined {
    const req = this.#requests.get(requestId);
    if (req === undefined) return undefined;
    return {
      rank: req.rank,
      startedAtMs: req.startedAtMs,
      prefillDone: req.prefillDone,
      prefillTokens: req.prefillTokens,
      blockCount: (req.hashes.length + req.output.length) >>> 1,
    };
  }

  /**
   * Adds one placeholder block for generated output. With `decayFraction`, every block of the
   * request that no other live request on the rank references is weighted by that fraction, so
   * a long generation stops dominating the rank's block count (the reference's fractional
   * blocks). A block that another request later touches counts fully again.
   */
  addOutputBlock(requestId: string, decayFraction?: number): boolean {
    if (decayFraction !== undefined && !(Number.isFinite(decayFraction) && decayFraction >= 0 && decayFraction <= 1)) {
      throw badRequest(`decay_fraction must be a number in [0, 1], got ${String(decayFraction)}`, "decay_fraction");
    }
    const req = this.#requests.get(requestId);
    if (req === undefined) return false;
    const st = this.#rankState(req.rank);
    const hi = Math.floor(this.#random.next() * TWO_POW_32) >>> 0;
    const lo = Math.floor(this.#random.next() * TWO_POW_32) >>> 0;
    req.output.push(hi, lo);
    this.#index.touchOne(hi, lo, req.rank, st);
    if (decayFraction !== undefined) {
      this.#index.weighExclusive(req.hashes, req.rank, st, decayFraction);
      this.#index.weighExclusiveEach(req.output, req.rank, st, decayFraction);
    }
    this.#refresh(req.rank);
    this.#markChanged(req.rank);
    return true;
  }

  /**
   * Force-frees requests whose age since admission reached the expiry and returns their ids.
   * Only the head of the admission-ordered map is inspected, so a call with nothing due is O(1).
   * (Assumes a monotonic clock: admission order is then age order.)
   */
  expire(): string[] {
    const expired: string[] = [];
    const deadline = this.#clock.now() - this.#expiryMs;
    for (const req of this.#requests.values()) {
      if (req.startedAtMs > deadline) break;
      expired.push(req.id);
    }
    for (const id of expired) this.free(id);
    return expired;
  }

  activePrefillTokens(rank: number): number {
    const st = this.#ranks[rank];
    if (st === undefined || st.prefillHead >= st.prefillQueue.length) return 0;
    if (this.#prefillMs !== undefined) return estimatedPrefill(st, this.#clock.now());
    const head = st.prefillQueue[st.prefillHead] as ActiveRequest;
    const duration = head.expectedPrefillDurationMs;
    if (duration === null) return st.prefillSum;
    const elapsed = this.#clock.now() - st.prefillAnchorMs;
    const remaining = duration <= 0 ? 0 : Math.min(1, Math.max(0, 1 - elapsed / duration));
    return st.prefillSum - head.prefillTokens + head.prefillTokens * remaining;
  }

  /** Unique active blocks on the rank, fractional blocks counted at their weight. */
  activeBlocks(rank: number): number {
    const st = this.#ranks[rank];
    if (st === undefined) return 0;
    return st.uniqueBlocks - st.fractionalDeficit;
  }

  activeRequests(rank: number): number {
    return this.#ranks[rank]?.requests.size ?? 0;
  }

  /**
   * Bulk form of activePrefillTokens / activeBlocks / activeRequests for selection: for each of
   * the first `n` ranks of `candidates`, writes its prefill tokens, its potential decode blocks
   * if a prompt of `promptBlocks` blocks were added (`activeBlocks + promptBlocks - held[rank]`)
   * and its request count at the same index of the outputs. Values equal the accessors'.
   */
  fillCandidateLoads(
    candidates: Int32Array,
    n: number,
    promptBlocks: number,
    held: Int32Array,
    prefillOut: Float64Array,
    decodeOut: Float64Array,
    requestsOut: Float64Array,
  ): void {
    const counts = this.#requestCounts;
    for (let i = 0; i < n; i++) {
      const rank = candidates[i] as number;
      // A rank without live requests holds no blocks and no prefill (each leaves with its request).
      if (rank >= counts.length || counts[rank] === 0) {
        prefillOut[i] = 0;
        decodeOut[i] = promptBlocks - (held[rank] as number);
        requestsOut[i] = 0;
      } else {
        // The flat copies equal the accessors (#refresh); only a decaying prefill reads the clock.
        prefillOut[i] = this.#prefillDecays[rank] === 0 ? (this.#prefillFloor[rank] as number) : this.activePrefillTokens(rank);
        decodeOut[i] = (this.#blocks[rank] as number) + (promptBlocks - (held[rank] as number));
        requestsOut[i] = counts[rank] as number;
      }
    }
  }

  /*
   * The flat per-rank arrays the candidate scan reads (indexed by rank key; a rank past their
   * length has no request): live requests, the prefill floor (see #prefillFloor) and activeBlocks.
   * Views of live state, to read, valid until the ledger next changes (it may replace them).
   */
  get flatRequests(): Int32Array {
    return this.#requestCounts;
  }

  get flatPrefillFloor(): Float64Array {
    return this.#prefillFloor;
  }

  /** 1 where the prefill floor is below the prefill (it decays with time), else the floor is the value. */
  get flatPrefillDecays(): Uint8Array {
    return this.#prefillDecays;
  }

  get flatBlocks(): Float64Array {
    return this.#blocks;
  }

  /** The ranks with live requests are busyRanks[0, busyCount), in no order (a view, as the flat arrays). */
  get busyRanks(): Int32Array {
    return this.#busyRanks;
  }

  get busyCount(): number {
    return this.#busyCount;
  }

  /** Ranks holding at least one live request. */
  loads(): RankLoad[] {
    const out: RankLoad[] = [];
    for (let rank = 0; rank < this.#ranks.length; rank++) {
      const st = this.#ranks[rank];
      if (st === undefined || st.requests.size === 0) continue;
      out.push({
        rank,
        activePrefillTokens: this.activePrefillTokens(rank),
        activeBlocks: this.activeBlocks(rank),
        activeRequests: st.requests.size,
      });
    }
    return out;
  }

  /** Drops every request booked on the rank (worker gone) and returns their ids. */
  removeRank(rank: number): string[] {
    const st = this.#ranks[rank];
    if (st === undefined) return [];
    const ids: string[] = [];
    for (const req of [...st.requests]) {
      ids.push(req.id);
      this.#requests.delete(req.id);
      this.#release(req, st);
    }
    this.#ranks[rank] = undefined;
    this.#refresh(rank);
    return ids;
  }

  /**
   * THE HOT PATH. For every rank that already holds some of `seqHashes` active,
   * `out[rank]` += how many of them it holds (so additional_active_blocks = n - out[rank]) and the
   * rank is appended to `touched` the first time it is written. `out` must be zero at every rank
   * on entry and at least `rankBound` long; the caller resets `out[r]` for r in `touched`.
   * O(blocks + holders per node): the list is walked along the prefix tree (active-prefix-trie.ts).
   */
  newBlocksFor(seqHashes: HashList, out: Int32Array, touched: number[]): void {
    // Nothing in flight, nothing held: skip the 219 probes of an empty table (5.7 us of a 58 us
    // select at 1,024 ranks, `npm run bench:core`). A booking that follows finds no memo and probes.
    if (this.#index.size === 0) return;
    this.#index.countHolders(seqHashes, out, touched);
  }

  #rankState(rank: number): RankState {
    let st = this.#ranks[rank];
    if (st === undefined) {
      while (this.#ranks.length < rank) this.#ranks.push(undefined);
      st = newRankState();
      this.#ranks[rank] = st;
      if (rank >= this.#requestCounts.length) {
        this.#requestCounts = grownTo(this.#requestCounts, rank + 1);
        const n = this.#requestCounts.length;
        this.#prefillFloor = grownTo(this.#prefillFloor, n);
        this.#prefillDecays = grownTo(this.#prefillDecays, n);
        this.#blocks = grownTo(this.#blocks, n);
      }
    }
    return st;
  }

  #release(req: ActiveRequest, st: RankState): void {
    st.requests.delete(req);
    this.#requestCounts[req.rank] = st.requests.size;
    this.#leavePrefill(req, st);
    const { hashes, output, rank } = req;
    this.#index.untouchAll(hashes, rank, st);
    if (output.length > 0) this.#index.untouchEach(Uint32Array.from(output), rank, st);
  }

  #leavePrefill(req: ActiveRequest, st: RankState): void {
    if (!req.inPrefillQueue) return;
    req.inPrefillQueue = false;
    const queue = st.prefillQueue;
    const oldHead = queue[st.prefillHead];
    st.prefillSum -= req.prefillTokens;
    while (st.prefillHead < queue.length && !(queue[st.prefillHead] as ActiveRequest).inPrefillQueue) st.prefillHead++;
    if (st.prefillHead >= queue.length) {
      queue.length = 0;
      st.prefillHead = 0;
      st.prefillSum = 0;
      return;
    }
    if (queue[st.prefillHead] !== oldHead) st.prefillAnchorMs = this.#clock.now();
    if (st.prefillHead >= PREFILL_QUEUE_COMPACT_MIN && st.prefillHead * 2 >= queue.length) {
      queue.copyWithin(0, st.prefillHead);
      queue.length -= st.prefillHead;
      st.prefillHead = 0;
    }
  }
}
