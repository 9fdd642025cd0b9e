/**
 * Stored blocks whose parent a rank's prefix index does not know yet (issue 25, "never blind for
 * good"), kept per partition until the parent becomes known and then attached.
 *
 * Why: a replica that starts (or restarts) after an engine has stored a chain's first blocks
 * asks the engine for a replay from seq 0, but an engine keeps a bounded history, so the replay
 * runs short. Every later BlockStored then chains to a parent it never saw (a shared system
 * prompt's blocks stay cached and are never stored again), and refusing each one kept the index
 * empty for good. Kept here instead, such a chain is attached as soon as its parent is known:
 * from a peer's index snapshot (index-snapshot.ts), a replay, or a later event that stores it.
 *
 * Bounded by blocks (all ranks of the partition together); past the bound the OLDEST chains are
 * shed first (a recent chain is the likelier to be matched), and the shed blocks are counted.
 * A parked block that the engine evicts is cut out of its chain: the blocks after it wait for it
 * to be stored again. A rank's chains go with the rank (cleared, removed, publisher reset).
 *
 * Pure data: no clock, no I/O. Not thread-safe; the daemon is single-threaded.
 */
import { hashCount, pairToBigInt, type HashList } from "./hash64.js";

/**
 * Default bound on parked blocks per partition, blocks. A restarted replica parks the chains its
 * engines store until a peer's snapshot arrives (seconds): 65,536 blocks is 16 s of new-prefix
 * stores at 4,096 blocks/s. Each parked block holds 32 bytes of hash words plus its owner-map
 * entry (a BigInt key): an estimate of a few MiB at the bound, not measured yet.
 */
export const DEFAULT_MAX_DETACHED_BLOCKS = 65_536;

/** One stored event waiting for its parent: `rank` chained `blockHashes` below `parent`. */
export interface DetachedChain<Tier extends string = string> {
  readonly rank: number;
  readonly tier: Tier;
  /** The parent's sequence hash (u64). */
  parent: bigint;
  blockHashes: HashList;
  localHashes: HashList;
}

export interface DetachedChainStats {
  /** Blocks parked now. */
  readonly blocks: number;
  /** Chains parked now. */
  readonly chains: number;
  /** Blocks ever parked. */
  readonly parkedBlocks: number;
  /** Blocks taken out to be attached (their parent became known). */
  readonly attachedBlocks: number;
  /** Blocks shed at the bound, oldest chains first. */
  readonly shedBlocks: number;
}

/** `Tier`: the index's storage tiers (prefix-index.ts StorageTier; generic here to keep the import one-way). */
export class DetachedChains<Tier extends string = string> {
  readonly #maxBlocks: number;
  /** rank -> parent hash -> chains waiting for it. */
  readonly #byParent = new Map<number, Map<bigint, DetachedChain<Tier>[]>>();
  /** rank -> parked block hash -> its chain (to cut an evicted block out). */
  readonly #owner = new Map<number, Map<bigint, DetachedChain<Tier>>>();
  /** Every parked chain in parking order: the oldest is shed first. */
  readonly #order = new Set<DetachedChain<Tier>>();
  #blocks = 0;
  #parked = 0;
  #attached = 0;
  #shed = 0;

  /** `maxBlocks` 0 parks nothing (every orphan is refused, as before issue 25). */
  constructor(maxBlocks = DEFAULT_MAX_DETACHED_BLOCKS) {
    // Assertion (a programming error, never input): service-options.ts checks the option.
    if (!Number.isInteger(maxBlocks) || maxBlocks < 0) throw new RangeError(`maxBlocks must be a non-negative integer, got ${maxBlocks}`);
    this.#maxBlocks = maxBlocks;
  }

  get stats(): DetachedChainStats {
    return { blocks: this.#blocks, chains: this.#order.size, parkedBlocks: this.#parked, attachedBlocks: this.#attached, shedBlocks: this.#shed };
  }

  get size(): number {
    return this.#blocks;
  }

  /** Whether any chain of `rank` is parked (a cheap test before per-block lookups). */
  hasRank(rank: number): boolean {
    return this.#byParent.has(rank);
  }

  /**
   * Parks a copy of the event. Returns false (nothing kept) when the bound is 0 or the chain alone
   * is over it; older chains are shed to make room otherwise.
   */
  park(rank: number, tier: Tier, parent: bigint, blockHashes: HashList, localHashes: HashList): boolean {
    const n = hashCount(blockHashes);
    if (n === 0) return true;
    if (n > this.#maxBlocks) {
      this.#shed += n;
      return false;
    }
    while (this.#blocks + n > this.#maxBlocks) {
      const oldest = this.#order.values().next().value as DetachedChain<Tier>;
      this.#shed += hashCount(oldest.blockHashes);
      this.#unlink(oldest);
    }
    this.#link({ rank, tier, parent, blockHashes: blockHashes.slice(), localHashes: localHashes.slice() });
    this.#parked += n;
    return true;
  }

  /** Takes out (for attaching) the chains of `rank` waiting for `parent`; empty when none. */
  take(rank: number, parent: bigint): DetachedChain<Tier>[] {
    const chains = this.#byParent.get(rank)?.get(parent);
    if (chains === undefined) return [];
    const out = [...chains];
    for (const c of out) {
      this.#attached += hashCount(c.blockHashes);
      this.#unlink(c);
    }
    return out;
  }

  /** The parent hashes `rank`'s chains wait for (a snapshot of them). */
  parentsOf(rank: number): bigint[] {
    const m = this.#byParent.get(rank);
    return m === undefined ? [] : [...m.keys()];
  }

  /**
   * `rank` evicted these blocks from `tier`: each one parked is cut out of its chain. The blocks
   * before it stay parked under the chain's parent; the blocks after it now wait for it.
   * Returns the blocks cut out.
   */
  removeBlocks(rank: number, tier: Tier, blockHashes: HashList): number {
    const owners = this.#owner.get(rank);
    if (owners === undefined) return 0;
    let cut = 0;
    const n = hashCount(blockHashes);
    for (let i = 0; i < n; i++) {
      const h = pairToBigInt(blockHashes[2 * i] as number, blockHashes[2 * i + 1] as number);
      const c = owners.get(h);
      if (c === undefined || c.tier !== tier) continue;
      const at = indexOf(c.blockHashes, h);
      // Assertion (a programming error, never input): #owner only names chains holding the block.
      if (at < 0) throw new Error("Assertion: a detached chain's owner entry names a block it does not hold");
      this.#unlink(c);
      const len = hashCount(c.blockHashes);
      if (at > 0) this.#link({ rank, tier, parent: c.parent, blockHashes: c.blockHashes.slice(0, 2 * at), localHashes: c.localHashes.slice(0, 2 * at) });
      if (at + 1 < len) this.#link({ rank, tier, parent: h, blockHashes: c.blockHashes.slice(2 * at + 2), localHashes: c.localHashes.slice(2 * at + 2) });
      cut++;
    }
    return cut;
  }

  /** Drops every chain of `rank` (cleared, removed, its publisher restarted). Returns blocks dropped. */
  dropRank(rank: number): number {
    const m = this.#byParent.get(rank);
    if (m === undefined) return 0;
    let dropped = 0;
    for (const chains of [...m.values()]) {
      for (const c of chains) {
        dropped += hashCount(c.blockHashes);
        this.#order.delete(c);
      }
    }
    this.#blocks -= dropped;
    this.#byParent.delete(rank);
    this.#owner.delete(rank);
    return dropped;
  }

  #link(c: DetachedChain<Tier>): void {
    let m = this.#byParent.get(c.rank);
    if (m === undefined) {
      m = new Map();
      this.#byParent.set(c.rank, m);
    }
    const list = m.get(c.parent);
    if (list === undefined) m.set(c.parent, [c]);
    else list.push(c);
    let owners = this.#owner.get(c.rank);
    if (owners === undefined) {
      owners = new Map();
      this.#owner.set(c.rank, owners);
    }
    const n = hashCount(c.blockHashes);
    for (let i = 0; i < n; i++) owners.set(pairToBigInt(c.blockHashes[2 * i] as number, c.blockHashes[2 * i + 1] as number), c);
    this.#order.add(c);
    this.#blocks += n;
  }

  #unlink(c: DetachedChain<Tier>): void {
    const m = this.#byParent.get(c.rank);
    const list = m?.get(c.parent);
    if (m === undefined || list === undefined) return;
    const i = list.indexOf(c);
    if (i < 0) return;
    list.splice(i, 1);
    if (list.length === 0) m.delete(c.parent);
    if (m.size === 0) this.#byParent.delete(c.rank);
    const owners = this.#owner.get(c.rank);
    const n = hashCount(c.blockHashes);
    if (owners !== undefined) {
      for (let k = 0; k < n; k++) {
        const h = pairToBigInt(c.blockHashes[2 * k] as number, c.blockHashes[2 * k + 1] as number);
        if (owners.get(h) === c) owners.delete(h);
      }
      if (owners.size === 0) this.#owner.delete(c.rank);
    }
    this.#order.delete(c);
    this.#blocks -= n;
  }
}

function indexOf(list: HashList, h: bigint): number {
  const n = hashCount(list);
  for (let i = 0; i < n; i++) if (pairToBigInt(list[2 * i] as number, list[2 * i + 1] as number) === h) return i;
  return -1;
}
