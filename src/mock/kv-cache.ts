/**
 * A mock engine's paged KV cache, as vLLM's prefix caching behaves where a router can see it:
 *  - a fixed number of blocks, each holding one full block of tokens keyed by its chained
 *    (sequence) hash, so a block is reusable only after the same whole prefix;
 *  - blocks used by a running request are pinned (ref-counted) and never evicted;
 *  - an unpinned block stays cached until a new block needs its room, least recently used first.
 *    A request releases its blocks tail first, so among blocks freed together the leaves go before
 *    the blocks they extend (vLLM's free-queue order), and a prefix outlives its extensions.
 *  - "scratch" blocks (a prompt's partial last block and the decode tokens) take room while the
 *    request runs but are never cached: the mock's decode tokens are not real text to reuse.
 *
 * Hot path (1,024 engines in a few processes): no per-block objects. Hashes are (hi, lo) uint32
 * pairs in typed arrays, the hash -> slot map is a U64Table, the LRU is an intrusive doubly-linked
 * list over Int32Arrays, and evictions are reported through a callback instead of a returned list.
 */
import { hashCount, pairToBigInt, type HashList } from "../core/index.js";
import { U64Table } from "../core/index.js";

const NONE = -1;
/** The U64Table tag of every entry (one namespace). */
const TAG = 0;
/** U64Table's initial size: it grows by doubling, so a big cache does not pay up front. */
const INITIAL_TABLE_SLOTS = 1_024;

export interface PagedKvCacheOptions {
  /** Blocks the cache holds (vLLM's num_gpu_blocks). */
  readonly capacityBlocks: number;
  /** Called for every block evicted, with its sequence hash as (hi, lo). */
  readonly onEvict?: (hi: number, lo: number) => void;
}

/** One cached block, for inspection in tests and debugging (allocates; not for hot paths). */
export interface CachedBlock {
  readonly hash: bigint;
  /** The previous block's sequence hash in the chain, or null for a first block. */
  readonly parent: bigint | null;
  readonly refs: number;
}

export class PagedKvCache {
  readonly #capacity: number;
  readonly #onEvict: ((hi: number, lo: number) => void) | undefined;
  readonly #index = new U64Table(INITIAL_TABLE_SLOTS);
  readonly #hi: Uint32Array;
  readonly #lo: Uint32Array;
  readonly #parentHi: Uint32Array;
  readonly #parentLo: Uint32Array;
  readonly #hasParent: Uint8Array;
  readonly #refs: Int32Array;
  readonly #prev: Int32Array;
  readonly #next: Int32Array;
  /** Stack of slots holding no block. */
  readonly #freeSlots: Int32Array;
  #freeTop: number;
  /** LRU list of cached, unpinned slots: head is evicted first. */
  #lruHead = NONE;
  #lruTail = NONE;
  #lruSize = 0;
  #pinned = 0;
  #scratch = 0;
  #evictions = 0;

  constructor(options: PagedKvCacheOptions) {
    const n = options.capacityBlocks;
    if (!Number.isInteger(n) || n < 1 || n > 0x3fff_ffff) throw new RangeError(`capacityBlocks must be an integer in [1, 2^30), got ${n}`);
    this.#capacity = n;
    this.#onEvict = options.onEvict;
    this.#hi = new Uint32Array(n);
    this.#lo = new Uint32Array(n);
    this.#parentHi = new Uint32Array(n);
    this.#parentLo = new Uint32Array(n);
    this.#hasParent = new Uint8Array(n);
    this.#refs = new Int32Array(n);
    this.#prev = new Int32Array(n).fill(NONE);
    this.#next = new Int32Array(n).fill(NONE);
    this.#freeSlots = new Int32Array(n);
    // Pop order 0, 1, 2, ...: slots fill from the start.
    for (let i = 0; i < n; i++) this.#freeSlots[i] = n - 1 - i;
    this.#freeTop = n;
  }

  get capacityBlocks(): number {
    return this.#capacity;
  }

  /** Blocks holding cached content (pinned or not). */
  get cachedBlocks(): number {
    return this.#capacity - this.#freeTop;
  }

  /** Cached blocks in use by at least one running request. */
  get pinnedBlocks(): number {
    return this.#pinned;
  }

  /** Cached blocks no request uses: the eviction candidates. */
  get evictableBlocks(): number {
    return this.#lruSize;
  }

  get scratchBlocks(): number {
    return this.#scratch;
  }

  /** Blocks holding nothing and reserved by nobody. */
  get freeBlocks(): number {
    return this.#freeTop - this.#scratch;
  }

  /** Blocks a new allocation can get without touching pinned or scratch blocks. */
  get availableBlocks(): number {
    return this.freeBlocks + this.#lruSize;
  }

  get evictions(): number {
    return this.#evictions;
  }

  /** Number of leading blocks of `seqHashes` (sequence hashes) the cache holds, up to `maxBlocks`. */
  match(seqHashes: HashList, maxBlocks: number = hashCount(seqHashes)): number {
    const n = Math.min(maxBlocks, hashCount(seqHashes));
    for (let i = 0; i < n; i++) {
      if (this.#index.get(TAG, seqHashes[2 * i] as number, seqHashes[2 * i + 1] as number) < 0) return i;
    }
    return n;
  }

  contains(hi: number, lo: number): boolean {
    return this.#index.get(TAG, hi, lo) >= 0;
  }

  /** Of blocks [0, count) of `seqHashes`, how many are cached but unpinned (pinning them shrinks availableBlocks). */
  unpinnedAmong(seqHashes: HashList, count: number): number {
    let n = 0;
    for (let i = 0; i < count; i++) {
      const slot = this.#index.get(TAG, seqHashes[2 * i] as number, seqHashes[2 * i + 1] as number);
      if (slot >= 0 && this.#refs[slot] === 0) n++;
    }
    return n;
  }

  /** Pins blocks [from, to) of `seqHashes`, which must all be cached (a prefix hit). */
  pin(seqHashes: HashList, from: number, to: number): void {
    for (let i = from; i < to; i++) {
      const slot = this.#index.get(TAG, seqHashes[2 * i] as number, seqHashes[2 * i + 1] as number);
      if (slot < 0) throw new RangeError(`pin: block ${i} is not cached`);
      this.#ref(slot);
    }
  }

  /**
   * Makes block `i` of `seqHashes` cached and pinned. Returns true when it was newly stored (the
   * engine publishes BlockStored), false when it was already cached (computed by a concurrent
   * request, or an orphan whose prefix had been evicted) and is now pinned. May evict one
   * unpinned block. Throws if every block is pinned or scratch: callers reserve room first.
   */
  store(seqHashes: HashList, i: number): boolean {
    const hi = seqHashes[2 * i] as number;
    const lo = seqHashes[2 * i + 1] as number;
    const existing = this.#index.get(TAG, hi, lo);
    if (existing >= 0) {
      this.#ref(existing);
      return false;
    }
    if (this.freeBlocks <= 0) this.#evictOne();
    const slot = this.#freeSlots[--this.#freeTop] as number;
    this.#hi[slot] = hi;
    this.#lo[slot] = lo;
    if (i > 0) {
      this.#parentHi[slot] = seqHashes[2 * i - 2] as number;
      this.#parentLo[slot] = seqHashes[2 * i - 1] as number;
      this.#hasParent[slot] = 1;
    } else this.#hasParent[slot] = 0;
    this.#refs[slot] = 1;
    this.#pinned++;
    this.#index.set(TAG, hi, lo, slot);
    return true;
  }

  /** Unpins blocks [0, count) of `seqHashes`, last block first (see the file comment). */
  release(seqHashes: HashList, count: number): void {
    for (let i = count - 1; i >= 0; i--) {
      const slot = this.#index.get(TAG, seqHashes[2 * i] as number, seqHashes[2 * i + 1] as number);
      if (slot < 0) throw new RangeError(`release: block ${i} is not cached`);
      const refs = (this.#refs[slot] as number) - 1;
      if (refs < 0) throw new RangeError(`release: block ${i} is not pinned`);
      this.#refs[slot] = refs;
      if (refs === 0) {
        this.#pinned--;
        this.#lruAppend(slot);
      }
    }
  }

  /** Reserves `n` uncached blocks, evicting as needed. Throws if fewer than `n` are available. */
  reserveScratch(n: number): void {
    if (n > this.availableBlocks) throw new RangeError(`reserveScratch: ${n} blocks requested, ${this.availableBlocks} available`);
    while (this.freeBlocks < n) this.#evictOne();
    this.#scratch += n;
  }

  releaseScratch(n: number): void {
    if (n > this.#scratch) throw new RangeError(`releaseScratch: ${n} blocks released, ${this.#scratch} reserved`);
    this.#scratch -= n;
  }

  /** Every cached block (allocates: tests and debugging only). */
  blocks(): CachedBlock[] {
    const out: CachedBlock[] = [];
    this.#index.forEach((_tag, _hi, _lo, slot) => {
      out.push({
        hash: pairToBigInt(this.#hi[slot] as number, this.#lo[slot] as number),
        parent: this.#hasParent[slot] === 1 ? pairToBigInt(this.#parentHi[slot] as number, this.#parentLo[slot] as number) : null,
        refs: this.#refs[slot] as number,
      });
    });
    return out;
  }

  /** Sequence hashes of the unpinned blocks in eviction order (next victim first). Tests only. */
  lruOrder(): bigint[] {
    const out: bigint[] = [];
    for (let s = this.#lruHead; s !== NONE; s = this.#next[s] as number) out.push(pairToBigInt(this.#hi[s] as number, this.#lo[s] as number));
    return out;
  }

  #ref(slot: number): void {
    const refs = this.#refs[slot] as number;
    if (refs === 0) {
      this.#lruRemove(slot);
      this.#pinned++;
    }
    this.#refs[slot] = refs + 1;
  }

  #evictOne(): void {
    const slot = this.#lruHead;
    if (slot === NONE) throw new RangeError("kv cache: no evictable block (every block is pinned or reserved)");
    this.#lruRemove(slot);
    const hi = this.#hi[slot] as number;
    const lo = this.#lo[slot] as number;
    this.#index.delete(TAG, hi, lo);
    this.#freeSlots[this.#freeTop++] = slot;
    this.#evictions++;
    this.#onEvict?.(hi, lo);
  }

  #lruAppend(slot: number): void {
    this.#prev[slot] = this.#lruTail;
    this.#next[slot] = NONE;
    if (this.#lruTail === NONE) this.#lruHead = slot;
    else this.#next[this.#lruTail] = slot;
    this.#lruTail = slot;
    this.#lruSize++;
  }

  #lruRemove(slot: number): void {
    const p = this.#prev[slot] as number;
    const n = this.#next[slot] as number;
    if (p === NONE) this.#lruHead = n;
    else this.#next[p] = n;
    if (n === NONE) this.#lruTail = p;
    else this.#prev[n] = p;
    this.#prev[slot] = NONE;
    this.#next[slot] = NONE;
    this.#lruSize--;
  }
}
