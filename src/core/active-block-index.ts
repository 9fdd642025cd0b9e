/**
 * A partition-wide reverse index of active blocks: sequence hash -> the ranks holding it in
 * flight, each with a refcount and a weight. It was the load ledger's index; the ledger now keeps
 * its active blocks in a prefix tree (active-prefix-trie.ts), which hands its state to one of
 * these, and forwards to it, only while a booking list that breaks the chain rule is in flight.
 * Its layout is tuned on its own (see the class comment).
 */

/** Slots of a new index (a power of two; grown by doubling). */
const INITIAL_INDEX_CAPACITY = 1024;

/** The per-rank totals the index keeps current as pairs come and go (part of a rank's state). */
export interface RankBlockTotals {
  /** (hash, rank) pairs with refcount > 0. */
  uniqueBlocks: number;
  /** Pairs whose weight is < 1, and the sum of (1 - weight) over them. */
  fractionalCount: number;
  fractionalDeficit: number;
}

/** A pair of weight `weight` < 1 left the rank (freed, or touched again and so whole). */
export function dropFraction(st: RankBlockTotals, weight: number): void {
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

/**
 * Slot layout (int32 words): hi, lo, then either a holder run (its pool offset, then
 * (size class << 24) | holder count, >= 1) or one inline holder (its rank, then -refcount, < 0).
 */
const SLOT_WORDS = 4;
const LEN_BITS = 24;
const LEN_MASK = (1 << LEN_BITS) - 1;
const INITIAL_POOL_ENTRIES = 4096;

/** What `touch` reports for a (hash, rank) pair that was not held before. */
export const PAIR_CREATED = -1;
/** What `untouch` / `setWeightIfExclusive` report when nothing changed a rank's totals. */
export const NO_CHANGE = -1;

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
 * dependent random read of a large table costs several independent ones):
 * - a one-byte tag per slot (SwissTable-style) in its own small array, so a hash no rank holds
 *   (typically half of a prompt) is rejected by touching 1 byte instead of a 16-byte slot 16x
 *   further apart (4 MB vs 64 MB of table at 1.8 M active hashes);
 * - linear-probing slots of 16 bytes (key and holder-run pointer share a cache line);
 * - a hash with one holder at weight 1 (most of them: a prefix lives on the rank its session or
 *   its cache sent it to) keeps that holder inline in its slot, rank and refcount, so a lookup,
 *   a booking and a free touch one line per hash instead of two to three (slot, pool ranks,
 *   pool refcounts). At bench:epp's shape (`npm run bench:ledger -- --ranks 16 --groups 64
 *   --group-ranks 1 --affinity 1 --live 150 --blocks 2300 --prefix 2070`) add, free and
 *   newBlocksFor each fell ~12% (299 -> 264, 279 -> 244, 332 -> 301 us p50, old and new
 *   alternated, load 1.7): the lines are fewer, the table's misses remain;
 * - other hashes' holders as one contiguous run in pooled typed arrays (ranks, refcounts and
 *   weights at the same offset), sized in powers of two and recycled per size class.
 * The first layout (keys in Uint32Arrays, holders as JS arrays) measured several times slower
 * on the same benchmark (`npm run bench:ledger`); BigInt-keyed Maps are slower still per get
 * and are avoided altogether.
 */
export class ActiveBlockIndex {
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
  /**
   * The slots countHolders found for its list (word offsets, -1 when absent): the booking that
   * follows a selection adds the same list (select_and_reserve), and touchAll then reads each
   * slot from here, checked against its key, instead of warming and probing the table again.
   */
  #memoList: Uint32Array | undefined;
  #memoSlots = new Int32Array(256);
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
    if (this.#memoSlots.length < n) this.#memoSlots = new Int32Array(pos.length);
    const memo = this.#memoSlots;
    this.#memoList = list;
    for (let i = 0; i < n; i++) {
      let s = pos[i] as number;
      lens[i] = 0;
      memo[i] = -1;
      if (s < 0) continue;
      const hi = (list[2 * i] as number) | 0;
      const lo = (list[2 * i + 1] as number) | 0;
      const tag = tagOf(mix(hi, lo));
      for (;;) {
        const t = tags[s] as number;
        if (t === 0) break;
        const b = s * SLOT_WORDS;
        if (t === tag && slots[b] === hi && slots[b + 1] === lo) {
          const word = slots[b + 2] as number;
          const meta = slots[b + 3] as number;
          memo[i] = b;
          if (meta < 0) {
            // Inline: one holder, its rank encoded as a negative position.
            pos[i] = ~word;
            lens[i] = 1;
          } else {
            pos[i] = word;
            lens[i] = meta & LEN_MASK;
            sink ^= ranks[word] as number;
          }
          break;
        }
        s = (s + 1) & mask;
      }
    }
    // Pass 4: apply the runs. Consecutive prompt hashes usually have the very same holders in
    // the same order (every request touches a prefix front to back, and frees drop a rank from
    // all of them at once), so an equal run is verified with a sequential compare (cheap per
    // entry) and applied once with a multiplicity instead of one random increment per hit
    // (dearer): 230 ranks sharing a 110-block prefix cost 230 increments, not 25 k.
    // A one-holder run (inline, pos = ~rank, or a pool run of one) compares by its rank.
    let runOff = 0;
    let runLen = 0;
    let runRank = -1;
    let mult = 0;
    for (let i = 0; i < n; i++) {
      const len = lens[i] as number;
      if (len === 0) continue;
      const off = pos[i] as number;
      if (len === 1) {
        const rank = off < 0 ? ~off : (ranks[off] as number);
        if (runLen === 1 && rank === runRank) {
          mult++;
          continue;
        }
        if (mult > 0) this.#addRun(runOff, runLen, runRank, mult, out, touched);
        runOff = off;
        runLen = 1;
        runRank = rank;
        mult = 1;
        continue;
      }
      if (len === runLen && sameRun(ranks, runOff, off, len)) {
        mult++;
        continue;
      }
      if (mult > 0) this.#addRun(runOff, runLen, runRank, mult, out, touched);
      runOff = off;
      runLen = len;
      runRank = -1;
      mult = 1;
    }
    if (mult > 0) this.#addRun(runOff, runLen, runRank, mult, out, touched);
    // Kept so the warming reads above are not optimised away.
    this.warmDigest = sink;
  }

  /** countHolders' run of `len` holders at pool `off` (or the one holder `rank`) counted `mult` times. */
  #addRun(off: number, len: number, rank: number, mult: number, out: Int32Array, touched: number[]): void {
    if (len !== 1) {
      addRun(this.#poolRanks, off, len, mult, out, touched);
      return;
    }
    const prev = out[rank] as number;
    if (prev === 0) touched.push(rank);
    out[rank] = prev + mult;
  }

  /**
   * Takes one reference on (hash, rank) for every pair of `list` and updates the rank's totals
   * (`add`'s path): one warming pass, then the per-pair updates with the table's arrays held in
   * locals. Consecutive hashes of a chain usually list their holders in the same order, so the
   * rank's position in the previous hash's run is tried before scanning (a prefix held by 200
   * ranks would otherwise cost ~100 compares per hash). A new hash takes the one-pair path.
   */
  touchAll(list: Uint32Array, rank: number, st: RankBlockTotals): void {
    const n = list.length >>> 1;
    if (n === 0) return;
    // The selection just probed this very list (countHolders): its slots are cached.
    const memo = this.#memoList === list ? this.#memoSlots : undefined;
    this.#memoList = undefined;
    if (memo === undefined) this.#warm(list, n);
    let slots = this.#slots;
    let ranks = this.#poolRanks;
    let refs = this.#poolRefs;
    let hint = 0;
    for (let i = 0; i < n; i++) {
      const hi = (list[2 * i] as number) | 0;
      const lo = (list[2 * i + 1] as number) | 0;
      let b = memo === undefined ? -1 : (memo[i] as number);
      // A memo entry is used only if its slot still holds the key (an insert since then may have
      // grown the table, a removal shifted slots): otherwise, or when absent then, probe.
      if (b < 0 || this.#tags[b / SLOT_WORDS] === 0 || slots[b] !== hi || slots[b + 1] !== lo) b = this.#find(hi, lo);
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
      if (meta < 0) {
        // Inline holder (weight 1): the same rank takes one more reference, another makes a run.
        if (off === rank) {
          slots[b + 3] = meta - 1;
        } else {
          this.#inlineToRun(b, rank);
          ranks = this.#poolRanks;
          refs = this.#poolRefs;
          hint = 1;
          st.uniqueBlocks++;
        }
        continue;
      }
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
  untouchAll(list: Uint32Array, rank: number, st: RankBlockTotals): void {
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
      if (meta < 0) {
        if (off !== rank) continue;
        if (meta < -1) {
          slots[b + 3] = meta + 1;
        } else {
          this.#deleteSlot(b / SLOT_WORDS);
          st.uniqueBlocks--;
        }
        continue;
      }
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
      const slots = this.#slots;
      slots[b] = hi;
      slots[b + 1] = lo;
      slots[b + 2] = rank;
      slots[b + 3] = -1; // inline, one reference
      this.#size++;
      return PAIR_CREATED;
    }
    const slots = this.#slots;
    const off = slots[b + 2] as number;
    const meta = slots[b + 3] as number;
    if (meta < 0) {
      if (off === rank) {
        slots[b + 3] = meta - 1;
        return 1;
      }
      this.#inlineToRun(b, rank);
      return PAIR_CREATED;
    }
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
   * Installs the pair (hash, rank), not held before, with `refs` references at `weight`: the
   * prefix tree handing its state over (active-prefix-trie.ts).
   */
  restore(hi: number, lo: number, rank: number, refs: number, weight: number): void {
    this.touch(hi, lo, rank);
    if (weight !== 1) this.setWeightIfExclusive(hi, lo, rank, weight);
    const b = this.#find(hi | 0, lo | 0);
    const off = this.#slots[b + 2] as number;
    const meta = this.#slots[b + 3] as number;
    if (meta < 0) {
      this.#slots[b + 3] = -refs;
      return;
    }
    const k = rankPosition(this.#poolRanks, off, meta & LEN_MASK, 0, rank);
    this.#poolRefs[k] = refs;
  }

  /**
   * Sets the weight of (hash, rank) when exactly one reference holds it. Returns the previous
   * weight when it was set, NO_CHANGE otherwise.
   */
  setWeightIfExclusive(hi: number, lo: number, rank: number, weight: number): number {
    const b = this.#find(hi | 0, lo | 0);
    if (b < 0) return NO_CHANGE;
    const meta = this.#slots[b + 3] as number;
    if (meta < 0) {
      if (this.#slots[b + 2] !== rank || meta !== -1) return NO_CHANGE;
      if (weight === 1) return 1;
      // A weight other than 1 lives in the pool: the holder leaves its slot for a run of one.
      const off = this.#allocRun(0);
      this.#poolRanks[off] = rank;
      this.#poolRefs[off] = 1;
      this.#poolWeights[off] = weight;
      this.#weightedPairs++;
      this.#slots[b + 2] = off;
      this.#slots[b + 3] = 1; // class 0, one holder
      return 1;
    }
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
   * each home slot's holder run in a second pass measured slower, not faster, in `npm run bench:ledger`.)
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

  /** A second rank joins the inline holder of the slot at word offset `b`: both move to a pool run (class 1). */
  #inlineToRun(b: number, rank: number): void {
    const slots = this.#slots;
    const first = slots[b + 2] as number;
    const refs = -(slots[b + 3] as number);
    const off = this.#allocRun(1);
    // Free pool entries keep weight 1, and an inline holder has weight 1: no weight to copy.
    this.#poolRanks[off] = first;
    this.#poolRefs[off] = refs;
    this.#poolRanks[off + 1] = rank;
    this.#poolRefs[off + 1] = 1;
    slots[b + 2] = off;
    slots[b + 3] = (1 << LEN_BITS) | 2;
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
    } else if (len === 2 && this.#poolWeights[off] === 1) {
      // One holder left at weight 1: back inline (its entry keeps weight 1, as free entries do).
      this.#slots[b + 2] = this.#poolRanks[off] as number;
      this.#slots[b + 3] = -(this.#poolRefs[off] as number);
      this.#freeRun(off, meta >>> LEN_BITS);
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
