/**
 * The load ledger of ONE partition: the requests this replica (and its peers) booked onto each
 * worker rank and are still in flight, and what they cost each rank right now.
 *
 * Per rank it tracks the reference's `ActiveSequences` (section 3.5): unique active blocks (a
 * sequence hash shared by several in-flight requests on one rank counts once, optionally
 * down-weighted for long generations), prefill tokens still owed (FIFO, oldest request decaying
 * linearly when a duration hint exists) and the request count.
 *
 * Unlike the reference, which keeps one hash set per rank, the ledger keeps ONE partition-wide
 * reverse index `sequence hash -> [(rank, refcount, weight)]`. Selection has to know, for every
 * candidate rank, how many of the prompt's hashes are already active there; per-rank sets make
 * that O(blocks x ranks) (219 x 1,024 = 224 k probes), the reverse index makes it
 * O(blocks + hits).
 */
import type { Clock, Random } from "./clock.js";
import { KvmeshError, badRequest } from "./errors.js";
import type { HashList } from "./hash64.js";

export const DEFAULT_ACTIVE_REQUEST_EXPIRY_MS = 300_000;
/** Rank keys are interned by the caller into a dense range; this bound keeps per-rank arrays small. */
export const MAX_RANK_KEY = (1 << 20) - 1;

const INITIAL_INDEX_CAPACITY = 1024;
/** Rank slots of the per-rank request counts at construction; doubled as ranks appear. */
const INITIAL_RANK_SLOTS = 64;
/** Compact a rank's prefill FIFO once this many dead entries sit before its head. */
const PREFILL_QUEUE_COMPACT_MIN = 64;
const TWO_POW_32 = 4294967296;

export interface LoadLedgerOptions {
  clock: Clock;
  expiryMs?: number;
  random: Random;
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
}

interface RankState {
  readonly requests: Set<ActiveRequest>;
  /** (hash, rank) pairs with refcount > 0. */
  uniqueBlocks: number;
  /** Pairs whose weight is < 1, and the sum of (1 - weight) over them. */
  fractionalCount: number;
  fractionalDeficit: number;
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

/** A pair of weight `weight` < 1 left the rank (freed, or touched again and so whole). */
function dropFraction(st: RankState, weight: number): void {
  st.fractionalCount--;
  // Reset rather than subtract the last one, so float drift cannot leave a phantom 1e-16 block.
  st.fractionalDeficit = st.fractionalCount === 0 ? 0 : st.fractionalDeficit - (1 - weight);
}

/**
 * Sequence hashes are XXH3 output, already uniform; the mix only guards against structured
 * test inputs (e.g. small consecutive integers) clustering in the linear probe. The low bits
 * pick the home slot, the top byte is the slot's tag.
 */
const mix = (hi: number, lo: number): number => {
  let h = Math.imul(hi ^ Math.imul(lo, 0x9e3779b1), 0x85ebca6b);
  h ^= h >>> 15;
  h = Math.imul(h ^ lo, 0xc2b2ae35);
  return h ^ (h >>> 13);
};
/** Non-zero 8-bit tag (0 marks an empty slot). */
const tagOf = (h: number): number => h >>> 24 || 1;

/** Slot layout (int32 words): hi, lo, holder-run offset, (size class << 24) | holder count. */
const SLOT_WORDS = 4;
const LEN_BITS = 24;
const LEN_MASK = (1 << LEN_BITS) - 1;
const INITIAL_POOL_ENTRIES = 4096;

/** What `touch` reports for a (hash, rank) pair that was not held before. */
const PAIR_CREATED = -1;
/** What `untouch` / `setWeightIfExclusive` report when nothing changed a rank's totals. */
const NO_CHANGE = -1;

function sameRun(ranks: Int32Array, a: number, b: number, len: number): boolean {
  for (let k = 0; k < len; k++) if (ranks[a + k] !== ranks[b + k]) return false;
  return true;
}

function addRun(ranks: Int32Array, off: number, len: number, mult: number, out: Int32Array, touched: number[]): void {
  const end = off + len;
  for (let k = off; k < end; k++) {
    const rank = ranks[k] as number;
    const prev = out[rank] as number;
    if (prev === 0) touched.push(rank);
    out[rank] = prev + mult;
  }
}

/**
 * Partition-wide reverse index: 64-bit hash (as a uint32 pair) -> the ranks holding it active,
 * each with a refcount and a weight.
 *
 * Layout is chosen for the selection hot path, which is bound by cache and TLB misses here (a
 * dependent random read of a 64 MB table measured ~260 ns, independent ones ~70 ns):
 * - a one-byte tag per slot (SwissTable-style) in its own small array, so a hash no rank holds
 *   (typically half of a prompt) is rejected by touching 1 byte instead of a 16-byte slot 16x
 *   further apart (4 MB vs 64 MB of table at 1.8 M active hashes);
 * - linear-probing slots of 16 bytes (key and holder-run pointer share a cache line);
 * - each hash's holders as one contiguous run in pooled typed arrays (ranks, refcounts and
 *   weights at the same offset), sized in powers of two and recycled per size class.
 * The first layout (keys in Uint32Arrays, holders as JS arrays) measured ~5x slower on the same
 * benchmark (97 us vs ~19 us for a 219-block prompt over 1,024 ranks and 1.8 M active hashes);
 * BigInt-keyed Maps measured ~435 ns per get here and are avoided altogether.
 */
class ActiveBlockIndex {
  #tags: Uint8Array;
  #slots: Int32Array;
  #mask: number;
  #size = 0;
  #poolRanks = new Int32Array(INITIAL_POOL_ENTRIES);
  #poolRefs = new Int32Array(INITIAL_POOL_ENTRIES);
  /**
   * Weight of every pair; 1 except for pairs down-weighted by addOutputBlock's decay. Free
   * entries are kept at 1 too, so while no pair is down-weighted (`#weightedPairs === 0`, the
   * common case) add and free never touch this array (one miss per pair less).
   */
  #poolWeights = new Float64Array(INITIAL_POOL_ENTRIES).fill(1);
  #weightedPairs = 0;
  #poolTop = 0;
  /** Free runs per size class (class k = 2^k entries). */
  readonly #freeRuns: number[][] = [];
  /** Per prompt hash: probe position, then run offset; and run length (countHolders passes). */
  #scratchPos = new Int32Array(256);
  #scratchLen = new Int32Array(256);
  /** Result of the warming reads, stored only so the engine cannot drop them as dead code. */
  warmDigest = 0;

  constructor(capacity = INITIAL_INDEX_CAPACITY) {
    this.#tags = new Uint8Array(capacity);
    this.#slots = new Int32Array(capacity * SLOT_WORDS);
    this.#mask = capacity - 1;
  }

  get size(): number {
    return this.#size;
  }

  /**
   * Adds `out[rank] += 1` for every rank holding each hash; see LoadLedger.newBlocksFor.
   *
   * Split into passes so the misses of different hashes overlap instead of queueing behind one
   * another: each pass only issues reads whose addresses are already known (no branch on data
   * still in flight), so the CPU keeps several misses outstanding.
   */
  countHolders(list: Uint32Array, out: Int32Array, touched: number[]): void {
    const n = list.length >>> 1;
    if (this.#scratchPos.length < n) {
      this.#scratchPos = new Int32Array(Math.max(n, this.#scratchPos.length * 2));
      this.#scratchLen = new Int32Array(this.#scratchPos.length);
    }
    const pos = this.#scratchPos;
    const lens = this.#scratchLen;
    const tags = this.#tags;
    const slots = this.#slots;
    const ranks = this.#poolRanks;
    const mask = this.#mask;
    let sink = 0;
    // Pass 1: home positions; touch their tags.
    for (let i = 0; i < n; i++) {
      const s = mix((list[2 * i] as number) | 0, (list[2 * i + 1] as number) | 0) & mask;
      pos[i] = s;
      sink ^= tags[s] as number;
    }
    // Pass 2: walk the (now cached) tags to the first tag match, or mark absent; touch that slot.
    for (let i = 0; i < n; i++) {
      const h = mix((list[2 * i] as number) | 0, (list[2 * i + 1] as number) | 0);
      const tag = tagOf(h);
      let s = pos[i] as number;
      let t = tags[s] as number;
      while (t !== 0 && t !== tag) {
        s = (s + 1) & mask;
        t = tags[s] as number;
      }
      if (t === 0) {
        pos[i] = -1;
      } else {
        pos[i] = s;
        sink ^= slots[s * SLOT_WORDS] as number;
      }
    }
    // Pass 3: confirm keys (cached now; a tag collision continues the probe), touch each run.
    for (let i = 0; i < n; i++) {
      let s = pos[i] as number;
      lens[i] = 0;
      if (s < 0) continue;
      const hi = (list[2 * i] as number) | 0;
      const lo = (list[2 * i + 1] as number) | 0;
      const tag = tagOf(mix(hi, lo));
      for (;;) {
        const t = tags[s] as number;
        if (t === 0) break;
        const b = s * SLOT_WORDS;
        if (t === tag && slots[b] === hi && slots[b + 1] === lo) {
          const off = slots[b + 2] as number;
          pos[i] = off;
          lens[i] = (slots[b + 3] as number) & LEN_MASK;
          sink ^= ranks[off] as number;
          break;
        }
        s = (s + 1) & mask;
      }
    }
    // Pass 4: apply the runs. Consecutive prompt hashes usually have the very same holders in
    // the same order (every request touches a prefix front to back, and frees drop a rank from
    // all of them at once), so an equal run is verified with a sequential compare (~1 ns per
    // entry) and applied once with a multiplicity instead of one random increment per hit
    // (~4 ns here): 230 ranks sharing a 110-block prefix cost 230 increments, not 25 k.
    let runOff = 0;
    let runLen = 0;
    let mult = 0;
    for (let i = 0; i < n; i++) {
      const len = lens[i] as number;
      if (len === 0) continue;
      const off = pos[i] as number;
      if (len === runLen && sameRun(ranks, runOff, off, len)) {
        mult++;
        continue;
      }
      if (mult > 0) addRun(ranks, runOff, runLen, mult, out, touched);
      runOff = off;
      runLen = len;
      mult = 1;
    }
    if (mult > 0) addRun(ranks, runOff, runLen, mult, out, touched);
    // Kept so the warming reads above are not optimised away.
    this.warmDigest = sink;
  }

  /**
   * Takes one reference on (hash, rank) for every pair of `list` and updates the rank's totals
   * (`add`'s path): one warming pass, then the per-pair updates with the table's arrays held in
   * locals. Consecutive hashes of a chain usually list their holders in the same order, so the
   * rank's position in the previous hash's run is tried before scanning (a prefix held by 200
   * ranks would otherwise cost ~100 compares per hash). A new hash takes the one-pair path.
   */
  touchAll(list: Uint32Array, rank: number, st: RankState): void {
    const n = list.length >>> 1;
    if (n === 0) return;
    this.#warm(list, n);
    let slots = this.#slots;
    let ranks = this.#poolRanks;
    let refs = this.#poolRefs;
    let hint = 0;
    for (let i = 0; i < n; i++) {
      const b = this.#find((list[2 * i] as number) | 0, (list[2 * i + 1] as number) | 0);
      if (b < 0) {
        const previous = this.touch(list[2 * i] as number, list[2 * i + 1] as number, rank);
        if (previous === PAIR_CREATED) st.uniqueBlocks++;
        else if (previous < 1) dropFraction(st, previous);
        slots = this.#slots;
        ranks = this.#poolRanks;
        refs = this.#poolRefs;
        continue;
      }
      const off = slots[b + 2] as number;
      const meta = slots[b + 3] as number;
      const len = meta & LEN_MASK;
      const k = rankPosition(ranks, off, len, hint, rank);
      if (k >= 0) {
        refs[k] = (refs[k] as number) + 1;
        hint = k - off;
        if (this.#weightedPairs > 0) {
          const w = this.#poolWeights[k] as number;
          if (w !== 1) {
            this.#poolWeights[k] = 1;
            this.#weightedPairs--;
            dropFraction(st, w);
          }
        }
        continue;
      }
      this.#appendHolder(b, off, meta, rank);
      ranks = this.#poolRanks;
      refs = this.#poolRefs;
      hint = len;
      st.uniqueBlocks++;
    }
  }

  /**
   * Drops one reference on (hash, rank) for every pair of `list` and updates the rank's totals
   * (`free`'s path), like touchAll. Each slot is found afresh (from cache after the warming
   * pass) because deleting a hash's last holder backward-shifts later slots.
   */
  untouchAll(list: Uint32Array, rank: number, st: RankState): void {
    const n = list.length >>> 1;
    if (n === 0) return;
    this.#warm(list, n);
    const slots = this.#slots;
    const ranks = this.#poolRanks;
    const refs = this.#poolRefs;
    let hint = 0;
    for (let i = 0; i < n; i++) {
      const hi = (list[2 * i] as number) | 0;
      const lo = (list[2 * i + 1] as number) | 0;
      const b = this.#find(hi, lo);
      if (b < 0) continue;
      const off = slots[b + 2] as number;
      const meta = slots[b + 3] as number;
      const len = meta & LEN_MASK;
      const k = rankPosition(ranks, off, len, hint, rank);
      if (k < 0) continue;
      hint = k - off;
      const left = (refs[k] as number) - 1;
      if (left > 0) {
        refs[k] = left;
        continue;
      }
      const w = this.#removeHolder(b, off, meta, k);
      st.uniqueBlocks--;
      if (w < 1) dropFraction(st, w);
    }
  }

  /**
   * Takes one reference on (hash, rank). Returns PAIR_CREATED for a new pair, otherwise the
   * pair's weight before the call (the weight is reset to 1: a block another request touches
   * counts fully again).
   */
  touch(hi: number, lo: number, rank: number): number {
    hi |= 0;
    lo |= 0;
    let b = this.#find(hi, lo);
    if (b < 0) {
      if ((this.#size + 1) * 2 > this.#mask + 1) this.#grow();
      b = this.#claimSlot(hi, lo);
      const off = this.#allocRun(0);
      const slots = this.#slots;
      slots[b] = hi;
      slots[b + 1] = lo;
      slots[b + 2] = off;
      slots[b + 3] = 1; // class 0, one holder
      this.#size++;
      this.#poolRanks[off] = rank;
      this.#poolRefs[off] = 1;
      return PAIR_CREATED;
    }
    const slots = this.#slots;
    const off = slots[b + 2] as number;
    const meta = slots[b + 3] as number;
    const end = off + (meta & LEN_MASK);
    for (let k = off; k < end; k++) {
      if (this.#poolRanks[k] !== rank) continue;
      this.#poolRefs[k] = (this.#poolRefs[k] as number) + 1;
      const w = this.#poolWeights[k] as number;
      if (w !== 1) {
        this.#poolWeights[k] = 1;
        this.#weightedPairs--;
      }
      return w;
    }
    this.#appendHolder(b, off, meta, rank);
    return PAIR_CREATED;
  }

  /**
   * Sets the weight of (hash, rank) when exactly one reference holds it. Returns the previous
   * weight when it was set, NO_CHANGE otherwise.
   */
  setWeightIfExclusive(hi: number, lo: number, rank: number, weight: number): number {
    const b = this.#find(hi | 0, lo | 0);
    if (b < 0) return NO_CHANGE;
    const off = this.#slots[b + 2] as number;
    const end = off + ((this.#slots[b + 3] as number) & LEN_MASK);
    for (let k = off; k < end; k++) {
      if (this.#poolRanks[k] !== rank) continue;
      if (this.#poolRefs[k] !== 1) return NO_CHANGE;
      const old = this.#poolWeights[k] as number;
      this.#poolWeights[k] = weight;
      if (old !== 1) this.#weightedPairs--;
      if (weight !== 1) this.#weightedPairs++;
      return old;
    }
    return NO_CHANGE;
  }

  /**
   * Reads the home tag and slot of every hash (no branch on the loaded data) so the misses
   * overlap before the dependent per-hash update loop of touchAll / untouchAll. (Also touching
   * each home slot's holder run in a second pass measured slower, not faster, in bench-ledger.)
   */
  #warm(list: Uint32Array, n: number): void {
    const tags = this.#tags;
    const slots = this.#slots;
    const mask = this.#mask;
    let sink = 0;
    for (let i = 0; i < n; i++) {
      const s = mix((list[2 * i] as number) | 0, (list[2 * i + 1] as number) | 0) & mask;
      sink ^= (tags[s] as number) ^ (slots[s * SLOT_WORDS] as number);
    }
    this.warmDigest = sink;
  }

  /** Appends a holder to the run of the slot at word offset `b`, moving the run up a size class when full. */
  #appendHolder(b: number, off: number, meta: number, rank: number): void {
    const len = meta & LEN_MASK;
    let cls = meta >>> LEN_BITS;
    if (len === 1 << cls) {
      const next = this.#allocRun(cls + 1);
      const end = off + len;
      this.#poolRanks.copyWithin(next, off, end);
      this.#poolRefs.copyWithin(next, off, end);
      if (this.#weightedPairs > 0) {
        this.#poolWeights.copyWithin(next, off, end);
        this.#poolWeights.fill(1, off, end);
      }
      this.#freeRun(off, cls);
      off = next;
      cls++;
      this.#slots[b + 2] = off;
    }
    this.#poolRanks[off + len] = rank;
    this.#poolRefs[off + len] = 1;
    this.#slots[b + 3] = (cls << LEN_BITS) | (len + 1);
  }

  /**
   * Removes the holder at pool entry `k` from the run of the slot at word offset `b` (deleting
   * the slot with its last holder) and returns the pair's weight.
   */
  #removeHolder(b: number, off: number, meta: number, k: number): number {
    const len = meta & LEN_MASK;
    const last = off + len - 1;
    // Moving the last holder into the hole keeps runs dense; every hash of a shared prefix
    // sees the same sequence of moves, so their runs stay equal for countHolders' fast path.
    if (k !== last) {
      this.#poolRanks[k] = this.#poolRanks[last] as number;
      this.#poolRefs[k] = this.#poolRefs[last] as number;
    }
    let w = 1;
    if (this.#weightedPairs > 0) {
      const weights = this.#poolWeights;
      w = weights[k] as number;
      if (w !== 1) this.#weightedPairs--;
      if (k !== last) weights[k] = weights[last] as number;
      weights[last] = 1;
    }
    if (len === 1) {
      this.#freeRun(off, meta >>> LEN_BITS);
      this.#deleteSlot(b / SLOT_WORDS);
    } else {
      this.#slots[b + 3] = meta - 1;
    }
    return w;
  }

  /** Word offset of the hash's slot, or -1. */
  #find(hi: number, lo: number): number {
    const tags = this.#tags;
    const slots = this.#slots;
    const mask = this.#mask;
    const h = mix(hi, lo);
    const tag = tagOf(h);
    let s = h & mask;
    for (;;) {
      const t = tags[s] as number;
      if (t === 0) return -1;
      const b = s * SLOT_WORDS;
      if (t === tag && slots[b] === hi && slots[b + 1] === lo) return b;
      s = (s + 1) & mask;
    }
  }

  /** Tags the first empty slot of the hash's probe run and returns its word offset. */
  #claimSlot(hi: number, lo: number): number {
    const tags = this.#tags;
    const mask = this.#mask;
    const h = mix(hi, lo);
    let s = h & mask;
    while (tags[s] !== 0) s = (s + 1) & mask;
    tags[s] = tagOf(h);
    return s * SLOT_WORDS;
  }

  /** Backward-shift deletion: later members of the probe run move into the hole, so no tombstones. */
  #deleteSlot(slot: number): void {
    const tags = this.#tags;
    const slots = this.#slots;
    const mask = this.#mask;
    let i = slot;
    tags[i] = 0;
    this.#size--;
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      if (tags[j] === 0) return;
      const bj = j * SLOT_WORDS;
      const home = mix(slots[bj] as number, slots[bj + 1] as number) & mask;
      const stays = i <= j ? home > i && home <= j : home > i || home <= j;
      if (stays) continue;
      slots.copyWithin(i * SLOT_WORDS, bj, bj + SLOT_WORDS);
      tags[i] = tags[j] as number;
      tags[j] = 0;
      i = j;
    }
  }

  #grow(): void {
    const oldTags = this.#tags;
    const old = this.#slots;
    const capacity = oldTags.length * 2;
    const tags = new Uint8Array(capacity);
    const slots = new Int32Array(capacity * SLOT_WORDS);
    const mask = capacity - 1;
    for (let k = 0; k < oldTags.length; k++) {
      if (oldTags[k] === 0) continue;
      const b = k * SLOT_WORDS;
      let s = mix(old[b] as number, old[b + 1] as number) & mask;
      while (tags[s] !== 0) s = (s + 1) & mask;
      tags[s] = oldTags[k] as number;
      slots.set(old.subarray(b, b + SLOT_WORDS), s * SLOT_WORDS);
    }
    this.#tags = tags;
    this.#slots = slots;
    this.#mask = mask;
  }

  #allocRun(cls: number): number {
    const recycled = this.#freeRuns[cls]?.pop();
    if (recycled !== undefined) return recycled;
    const need = this.#poolTop + (1 << cls);
    if (need > this.#poolRanks.length) {
      const capacity = Math.max(need, this.#poolRanks.length * 2);
      const ranks = new Int32Array(capacity);
      ranks.set(this.#poolRanks);
      const refs = new Int32Array(capacity);
      refs.set(this.#poolRefs);
      const weights = new Float64Array(capacity);
      weights.set(this.#poolWeights);
      weights.fill(1, this.#poolWeights.length);
      this.#poolRanks = ranks;
      this.#poolRefs = refs;
      this.#poolWeights = weights;
    }
    const off = this.#poolTop;
    this.#poolTop = need;
    return off;
  }

  #freeRun(off: number, cls: number): void {
    let list = this.#freeRuns[cls];
    if (list === undefined) {
      list = [];
      this.#freeRuns[cls] = list;
    }
    list.push(off);
  }
}

const checkRank = (rank: number): void => {
  if (!Number.isInteger(rank) || rank < 0 || rank > MAX_RANK_KEY) {
    throw badRequest(`rank key must be an integer in [0, ${MAX_RANK_KEY}], got ${String(rank)}`, "rank");
  }
};

const checkOptionalNonNegative = (value: number | null | undefined, field: string): number | null => {
  if (value === undefined || value === null) return null;
  if (!Number.isFinite(value) || value < 0) throw badRequest(`${field} must be a finite number >= 0`, field);
  return value;
};

export class LoadLedger {
  readonly #clock: Clock;
  readonly #random: Random;
  readonly #expiryMs: number;
  /** Live requests in admission order (Map iteration order), which is also expiry order. */
  readonly #requests = new Map<string, ActiveRequest>();
  /** Indexed by rank key; ranks are dense small integers interned by the caller. */
  readonly #ranks: (RankState | undefined)[] = [];
  /**
   * Live requests per rank key, mirrored from each RankState in one flat array. Selection reads
   * the load of every candidate; at 1,024 ranks, following each rank's state object (and its
   * Set and prefill queue) missed the CPU cache three times per rank, ~140 us of a ~1.3 ms
   * bench:http flow. Idle ranks, nearly all of them, now cost one typed-array read.
   */
  #requestCounts = new Int32Array(INITIAL_RANK_SLOTS);
  readonly #index = new ActiveBlockIndex();

  constructor(options: LoadLedgerOptions) {
    const expiryMs = options.expiryMs ?? DEFAULT_ACTIVE_REQUEST_EXPIRY_MS;
    if (!Number.isFinite(expiryMs) || expiryMs <= 0) throw badRequest("expiryMs must be a finite number > 0", "expiryMs");
    this.#clock = options.clock;
    this.#random = options.random;
    this.#expiryMs = expiryMs;
  }

  /** Number of live requests in the partition. */
  get size(): number {
    return this.#requests.size;
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
    };
    this.#requests.set(requestId, req);
    st.requests.add(req);
    this.#requestCounts[rank] = st.requests.size;
    this.#index.touchAll(req.hashes, rank, st);
    if (opts.trackPrefill) {
      if (st.prefillHead >= st.prefillQueue.length) st.prefillAnchorMs = now;
      st.prefillQueue.push(req);
      st.prefillSum += req.prefillTokens;
    }
  }

  /** False if the id is unknown; true (idempotently) otherwise. */
  markPrefillComplete(requestId: string): boolean {
    const req = this.#requests.get(requestId);
    if (req === undefined) return false;
    req.prefillDone = true;
    this.#leavePrefill(req, this.#rankState(req.rank));
    return true;
  }

  free(requestId: string): boolean {
    const req = this.#requests.get(requestId);
    if (req === undefined) return false;
    this.#requests.delete(requestId);
    this.#release(req, this.#rankState(req.rank));
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
    this.#touch(hi, lo, req.rank, st);
    if (decayFraction !== undefined) {
      this.#weighExclusive(req.hashes, req.rank, st, decayFraction);
      this.#weighExclusive(req.output, req.rank, st, decayFraction);
    }
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
        prefillOut[i] = this.activePrefillTokens(rank);
        decodeOut[i] = this.activeBlocks(rank) + (promptBlocks - (held[rank] as number));
        requestsOut[i] = counts[rank] as number;
      }
    }
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
    return ids;
  }

  /**
   * THE HOT PATH. For every rank that already holds some of `seqHashes` active,
   * `out[rank]` += how many of them it holds (so additional_active_blocks = n - out[rank]) and the
   * rank is appended to `touched` the first time it is written. `out` must be zero at every rank
   * on entry and at least `rankBound` long; the caller resets `out[r]` for r in `touched`.
   * O(blocks + hits): one probe per hash, then one step per rank holding it.
   */
  newBlocksFor(seqHashes: HashList, out: Int32Array, touched: number[]): void {
    this.#index.countHolders(seqHashes, out, touched);
  }

  #rankState(rank: number): RankState {
    let st = this.#ranks[rank];
    if (st === undefined) {
      while (this.#ranks.length < rank) this.#ranks.push(undefined);
      st = newRankState();
      this.#ranks[rank] = st;
      if (rank >= this.#requestCounts.length) {
        const grown = new Int32Array(Math.max(rank + 1, 2 * this.#requestCounts.length));
        grown.set(this.#requestCounts);
        this.#requestCounts = grown;
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
    if (output.length > 0) this.#index.untouchAll(Uint32Array.from(output), rank, st);
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

  #touch(hi: number, lo: number, rank: number, st: RankState): void {
    const previous = this.#index.touch(hi, lo, rank);
    if (previous === PAIR_CREATED) st.uniqueBlocks++;
    else if (previous < 1) dropFraction(st, previous);
  }

  #weighExclusive(pairs: ArrayLike<number>, rank: number, st: RankState, weight: number): void {
    for (let i = 0; i < pairs.length; i += 2) {
      const old = this.#index.setWeightIfExclusive(pairs[i] as number, pairs[i + 1] as number, rank, weight);
      if (old === NO_CHANGE) continue;
      if (old < 1) dropFraction(st, old);
      if (weight < 1) {
        st.fractionalCount++;
        st.fractionalDeficit += 1 - weight;
      }
    }
  }
}

/**
 * Where `rank` sits in a hash's rank list `ranks[off, off + len)`, or -1. Along a shared prefix
 * consecutive hashes list their ranks in the same order, so the previous hash's position
 * (`hint`) is tried first and the scan is the rare case.
 */
function rankPosition(ranks: Int32Array, off: number, len: number, hint: number, rank: number): number {
  if (hint < len && ranks[off + hint] === rank) return off + hint;
  for (let j = off, end = off + len; j < end; j++) if (ranks[j] === rank) return j;
  return -1;
}
