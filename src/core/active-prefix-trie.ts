/**
 * The load ledger's active blocks as a prefix tree of the in-flight bookings: each node is a run
 * of consecutive sequence hashes that the same bookings hold, with those bookings' ranks
 * (refcount and weight each). LoadLedger owns one per partition and is its only user.
 *
 * Why a tree: a sequence hash names its whole prefix, so the bookings of one system prompt or
 * one session's turns share their first hashes and part at one point. The per-hash reverse index
 * (active-block-index.ts) probed its table for every hash of every booking, free and count
 * (1,960 hashes per bench:epp prompt, ~100 ns each: 200 us an add, as much again a free and a
 * count). Here a list is walked along the tree: inside a node the next hash is compared in
 * place (sequential reads of the node's own list), the table is asked only where a node ends
 * with several children, where the list leaves the tree, and for the hashes after that (new
 * ones: a booking inserts them as one new node, a count finds them absent); holders are applied
 * once per node, not per hash. See docs/benchmarks.md ("The booking's active blocks: a prefix tree") for the figures.
 *
 * Exactness: every count and every rank total equals the per-hash index's (the oracle test
 * test/unit/core/active-prefix-trie.test.ts drives both). That holds because each hash lives in
 * at most one node and each booking covers whole nodes along one path from the root, so a node's
 * holders are exactly the holders of each of its hashes, and a count may still look up any hash
 * (a list that jumps around the tree is counted hash by hash). A booking list that would break
 * that (a hash already held elsewhere in the tree, a hash repeated: never the case for chained
 * sequence hashes, but a client may send any `sequence_hashes`) hands the whole state over to the
 * per-hash index, which serves everything until the partition has nothing in flight again.
 */
import { ActiveBlockIndex, dropFraction, NO_CHANGE, type RankBlockTotals } from "./active-block-index.js";
import { U64Table } from "./u64-table.js";
import { PresenceFilter } from "./presence-filter.js";

/**
 * A node with at most this many children is searched by comparing their first hashes; past it
 * the table is asked (one probe). A node's children are the prompts branching after it: a few
 * for a session's turns, one per user for a shared system prompt.
 */
const CHILD_SCAN_MAX = 8;
/** Table slots at construction (grown by doubling). */
const INITIAL_TABLE_SLOTS = 1024;
/**
 * The table grows past half full (U64Table's default is 0.7): every booking of a new prompt
 * inserts its hashes and its free deletes them, and at 0.7 a miss or a backward shift walks ~6
 * slots where at 0.5 it walks ~2.5.
 */
const TABLE_MAX_LOAD = 0.5;
/** The table's tag word: one kind of key. */
const TAG = 0;
/*
 * Hash words go to the table and the filter as int32 (`| 0`; both take them so): a list's words
 * are uint32, and one of 2^31 or more passed to a call not inlined is a heap number. A free of a
 * 128,000-token prompt's new node allocated 32 KB that way (bench:core, V8 heap sampling).
 */

/** Hashes [from, to) of `list` (pairs) that the same bookings hold. */
class TrieNode {
  constructor(
    public id: number,
    /** The list of the booking that created it (the ledger's copy, never changed), or an output block's pair. */
    readonly list: Uint32Array,
    public from: number,
    public to: number,
    public parent: TrieNode | undefined,
  ) {}
  children: TrieNode[] = [];
  /** The holders: rank, its bookings through here, and the weight of its pairs (1 unless decayed). */
  ranks: number[] = [];
  refs: number[] = [];
  weights: number[] = [];
}

const startsWith = (node: TrieNode, hi: number, lo: number): boolean =>
  node.list[2 * node.from] === hi && node.list[2 * node.from + 1] === lo;

export class ActivePrefixTrie {
  /** Hash -> id of the node holding it. */
  #table = new U64Table(INITIAL_TABLE_SLOTS, TABLE_MAX_LOAD);
  /** Every key of the table, to reject an absent hash before probing the table. */
  #filter = new PresenceFilter();
  readonly #nodes: (TrieNode | undefined)[] = [];
  readonly #freeIds: number[] = [];
  /** The per-hash index, while a list that breaks the tree's rule is in flight (see the file comment). */
  #fallback: ActiveBlockIndex | undefined;
  /** Scratch: the nodes a walk covered, in list order. */
  readonly #path: TrieNode[] = [];
  readonly #emptied: TrieNode[] = [];
  /** Lists that broke the tree's rule (handed to the per-hash index), for the ledger's stats. */
  fallbacks = 0;

  /** Distinct hashes held by at least one rank. */
  get size(): number {
    return this.#fallback === undefined ? this.#table.size : this.#fallback.size;
  }

  /** Whether the per-hash index serves now. */
  get perHash(): boolean {
    return this.#fallback !== undefined;
  }

  /**
   * Adds `out[rank] += 1` for every rank holding each hash of `list` (as ActiveBlockIndex.countHolders):
   * once per node for a run of hashes in the same node.
   */
  countHolders(list: Uint32Array, out: Int32Array, touched: number[]): void {
    if (this.#fallback !== undefined) {
      this.#fallback.countHolders(list, out, touched);
      return;
    }
    const n = list.length >>> 1;
    let node: TrieNode | undefined;
    let pos = 0;
    let run: TrieNode | undefined;
    let mult = 0;
    for (let i = 0; i < n; i++) {
      const hi = list[2 * i] as number;
      const lo = list[2 * i + 1] as number;
      let hit: TrieNode | undefined;
      if (node !== undefined) {
        if (pos < node.to) {
          if (node.list[2 * pos] === hi && node.list[2 * pos + 1] === lo) {
            hit = node;
            pos++;
          }
        } else if (node.children.length <= CHILD_SCAN_MAX) {
          for (const c of node.children) {
            if (startsWith(c, hi, lo)) {
              hit = node = c;
              pos = c.from + 1;
              break;
            }
          }
        }
      }
      if (hit === undefined) {
        // Off the expected path (the root, a branch, or the list left the tree): any node may hold it.
        const id = this.#filter.mayHave(hi | 0, lo | 0) ? this.#table.get(TAG, hi | 0, lo | 0) : -1;
        if (id < 0) {
          node = undefined;
          continue;
        }
        const found = this.#nodes[id] as TrieNode;
        hit = found;
        if (startsWith(found, hi, lo)) {
          node = found;
          pos = found.from + 1;
        } else {
          node = undefined;
        }
      }
      if (hit === run) {
        mult++;
        continue;
      }
      if (run !== undefined) addHolders(run, mult, out, touched);
      run = hit;
      mult = 1;
    }
    if (run !== undefined) addHolders(run, mult, out, touched);
  }

  /** Takes one reference on (hash, rank) for every hash of the booking list `list` (kept: never change it). */
  touchAll(list: Uint32Array, rank: number, st: RankBlockTotals): void {
    if (this.#fallback !== undefined) {
      this.#fallback.touchAll(list, rank, st);
      return;
    }
    const n = list.length >>> 1;
    if (n === 0) return;
    const path = this.#path;
    path.length = 0;
    const { node, pos, matched } = this.#walk(list, n, path);
    if (matched < n) {
      // The rest is new: one node under where the walk stopped, unless some hash of it is held
      // elsewhere or repeats (#insertKeys undoes its keys then).
      const leaf = this.#newNode(list, matched, n, undefined);
      if (!this.#insertKeys(leaf)) {
        this.#releaseId(leaf);
        this.#toFallback();
        (this.#fallback as ActiveBlockIndex | undefined)?.touchAll(list, rank, st);
        return;
      }
      let parent = node;
      if (node !== undefined && pos < node.to) parent = this.#split(node, pos, path);
      leaf.parent = parent;
      parent?.children.push(leaf);
      path.push(leaf);
    } else if (node !== undefined && pos < node.to) {
      this.#split(node, pos, path);
    }
    for (const p of path) addRank(p, rank, st);
  }

  /** Drops one reference on (hash, rank) for every hash of a booking list touchAll took. */
  untouchAll(list: Uint32Array, rank: number, st: RankBlockTotals): void {
    const fallback = this.#fallback;
    if (fallback !== undefined) {
      fallback.untouchAll(list, rank, st);
      if (fallback.size === 0) this.#fallback = undefined;
      return;
    }
    const n = list.length >>> 1;
    if (n === 0) return;
    const path = this.#path;
    path.length = 0;
    this.#walk(list, n, path);
    const emptied = this.#emptied;
    emptied.length = 0;
    for (const p of path) if (dropRank(p, rank, st)) emptied.push(p);
    for (const p of emptied) this.#deleteNode(p);
  }

  /** touchAll for one hash (an output block's placeholder). */
  touchOne(hi: number, lo: number, rank: number, st: RankBlockTotals): void {
    this.touchAll(Uint32Array.of(hi, lo), rank, st);
  }

  /** untouchAll for every hash of `pairs` on its own (output blocks, each its own node). */
  untouchEach(pairs: Uint32Array, rank: number, st: RankBlockTotals): void {
    if (this.#fallback !== undefined) {
      this.untouchAll(pairs, rank, st);
      return;
    }
    for (let i = 0; i < pairs.length; i += 2) this.untouchAll(pairs.subarray(i, i + 2), rank, st);
  }

  /**
   * Sets the weight of every (hash, rank) pair of the booking list `list` that exactly one
   * reference holds and updates the rank's totals, pair by pair in list order as the ledger did
   * with ActiveBlockIndex.setWeightIfExclusive (so the float sums are the same to the bit).
   */
  weighExclusive(list: Uint32Array, rank: number, st: RankBlockTotals, weight: number): void {
    if (this.#fallback !== undefined) {
      this.#weighEachPerHash(this.#fallback, list, rank, st, weight);
      return;
    }
    const path = this.#path;
    path.length = 0;
    this.#walk(list, list.length >>> 1, path);
    this.#weighNodes(path, rank, st, weight);
  }

  /** weighExclusive for every pair of `pairs` on its own (output blocks, each its own node). */
  weighExclusiveEach(pairs: ArrayLike<number>, rank: number, st: RankBlockTotals, weight: number): void {
    if (this.#fallback !== undefined) {
      this.#weighEachPerHash(this.#fallback, pairs, rank, st, weight);
      return;
    }
    const path = this.#path;
    path.length = 0;
    for (let i = 0; i < pairs.length; i += 2) {
      const id = this.#table.get(TAG, (pairs[i] as number) | 0, (pairs[i + 1] as number) | 0);
      if (id >= 0) path.push(this.#nodes[id] as TrieNode);
    }
    this.#weighNodes(path, rank, st, weight);
  }

  #weighEachPerHash(index: ActiveBlockIndex, pairs: ArrayLike<number>, rank: number, st: RankBlockTotals, weight: number): void {
    for (let i = 0; i < pairs.length; i += 2) {
      const old = index.setWeightIfExclusive(pairs[i] as number, pairs[i + 1] as number, rank, weight);
      if (old !== NO_CHANGE) weighPair(st, old, weight);
    }
  }

  #weighNodes(path: TrieNode[], rank: number, st: RankBlockTotals, weight: number): void {
    for (const p of path) {
      const k = p.ranks.indexOf(rank);
      if (k < 0 || p.refs[k] !== 1) continue;
      const old = p.weights[k] as number;
      p.weights[k] = weight;
      for (let j = p.from; j < p.to; j++) weighPair(st, old, weight);
    }
  }

  /**
   * Follows `list` from the root as far as the tree has it, pushing the nodes it enters onto
   * `path`; returns the last node (undefined: none), the position after the last hash matched
   * in it, and how many hashes matched.
   */
  #walk(list: Uint32Array, n: number, path: TrieNode[]): { node: TrieNode | undefined; pos: number; matched: number } {
    let node: TrieNode | undefined;
    let pos = 0;
    let i = 0;
    for (; i < n; i++) {
      const hi = list[2 * i] as number;
      const lo = list[2 * i + 1] as number;
      if (node !== undefined && pos < node.to) {
        if (node.list[2 * pos] !== hi || node.list[2 * pos + 1] !== lo) break;
        pos++;
        continue;
      }
      const child = this.#child(node, hi, lo);
      if (child === undefined) break;
      node = child;
      pos = child.from + 1;
      path.push(child);
    }
    return { node, pos, matched: i };
  }

  /** The child of `node` (undefined: the root) that starts with the hash, if any. */
  #child(node: TrieNode | undefined, hi: number, lo: number): TrieNode | undefined {
    if (node !== undefined && node.children.length <= CHILD_SCAN_MAX) {
      for (const c of node.children) if (startsWith(c, hi, lo)) return c;
      return undefined;
    }
    const id = this.#filter.mayHave(hi | 0, lo | 0) ? this.#table.get(TAG, hi | 0, lo | 0) : -1;
    if (id < 0) return undefined;
    const c = this.#nodes[id] as TrieNode;
    return c.parent === node && startsWith(c, hi, lo) ? c : undefined;
  }

  /** Maps each hash of a new node to it; false (and no key left) if one is already held or repeats. */
  #insertKeys(node: TrieNode): boolean {
    const table = this.#table;
    const filter = this.#filter;
    const list = node.list;
    if (!filter.fits(table.size + node.to - node.from)) this.#rebuildFilter(table.size + node.to - node.from, node);
    for (let j = node.from; j < node.to; j++) {
      const hi = (list[2 * j] as number) | 0;
      const lo = (list[2 * j + 1] as number) | 0;
      if (table.setIfAbsent(TAG, hi, lo, node.id) >= 0) {
        for (let k = node.from; k < j; k++) {
          table.delete(TAG, (list[2 * k] as number) | 0, (list[2 * k + 1] as number) | 0);
          filter.remove((list[2 * k] as number) | 0, (list[2 * k + 1] as number) | 0);
        }
        return false;
      }
      filter.add(hi, lo);
    }
    return true;
  }

  /**
   * Splits `node` before position `at` into two nodes with the same holders and returns the
   * first (replacing `node` in `path` if the first is the new one). The shorter part gets the
   * new id, so re-pointing its hashes in the table costs at most half the node.
   */
  #split(node: TrieNode, at: number, path: TrieNode[]): TrieNode {
    if (at - node.from >= node.to - at) {
      const tail = this.#newNode(node.list, at, node.to, node);
      tail.children = node.children;
      for (const c of tail.children) c.parent = tail;
      node.children = [tail];
      node.to = at;
      copyHolders(node, tail);
      this.#repoint(tail);
      return node;
    }
    const head = this.#newNode(node.list, node.from, at, node.parent);
    const parent = node.parent;
    if (parent !== undefined) parent.children[parent.children.indexOf(node)] = head;
    head.children = [node];
    node.parent = head;
    node.from = at;
    copyHolders(node, head);
    this.#repoint(head);
    const k = path.lastIndexOf(node);
    if (k >= 0) path[k] = head;
    return head;
  }

  #repoint(node: TrieNode): void {
    const list = node.list;
    for (let j = node.from; j < node.to; j++) this.#table.set(TAG, (list[2 * j] as number) | 0, (list[2 * j + 1] as number) | 0, node.id);
  }

  #newNode(list: Uint32Array, from: number, to: number, parent: TrieNode | undefined): TrieNode {
    const id = this.#freeIds.pop() ?? this.#nodes.length;
    const node = new TrieNode(id, list, from, to, parent);
    this.#nodes[id] = node;
    return node;
  }

  #releaseId(node: TrieNode): void {
    this.#nodes[node.id] = undefined;
    this.#freeIds.push(node.id);
  }

  /** Removes a node no booking holds any more: its keys, its place under its parent. */
  #deleteNode(node: TrieNode): void {
    const list = node.list;
    for (let j = node.from; j < node.to; j++) {
      const hi = (list[2 * j] as number) | 0;
      const lo = (list[2 * j + 1] as number) | 0;
      this.#table.delete(TAG, hi, lo);
      this.#filter.remove(hi, lo);
    }
    const parent = node.parent;
    if (parent !== undefined) {
      const k = parent.children.indexOf(node);
      if (k >= 0) {
        parent.children[k] = parent.children[parent.children.length - 1] as TrieNode;
        parent.children.pop();
      }
    }
    this.#releaseId(node);
  }

  /**
   * Sizes the filter for `keys` keys and adds every key held but `pending`'s (not inserted yet):
   * the filter doubles as the tree grows, so this is amortised over the inserts that grew it.
   */
  #rebuildFilter(keys: number, pending: TrieNode): void {
    const filter = this.#filter;
    filter.rebuild(keys);
    for (const node of this.#nodes) {
      if (node === undefined || node === pending) continue;
      for (let j = node.from; j < node.to; j++) filter.add((node.list[2 * j] as number) | 0, (node.list[2 * j + 1] as number) | 0);
    }
  }

  /** Hands every (hash, rank) pair to a per-hash index, which serves from now on; empties the tree. */
  #toFallback(): void {
    this.fallbacks++;
    const index = new ActiveBlockIndex();
    for (const node of this.#nodes) {
      if (node === undefined) continue;
      const list = node.list;
      for (let j = node.from; j < node.to; j++) {
        for (let k = 0; k < node.ranks.length; k++) {
          index.restore(list[2 * j] as number, list[2 * j + 1] as number, node.ranks[k] as number, node.refs[k] as number, node.weights[k] as number);
        }
      }
    }
    this.#fallback = index;
    this.#table = new U64Table(INITIAL_TABLE_SLOTS, TABLE_MAX_LOAD);
    this.#filter = new PresenceFilter();
    this.#nodes.length = 0;
    this.#freeIds.length = 0;
  }
}

/** `out[rank] += mult` for every holder of the node. */
function addHolders(node: TrieNode, mult: number, out: Int32Array, touched: number[]): void {
  const ranks = node.ranks;
  for (let k = 0; k < ranks.length; k++) {
    const rank = ranks[k] as number;
    const prev = out[rank] as number;
    if (prev === 0) touched.push(rank);
    out[rank] = prev + mult;
  }
}

/** One more booking of `rank` covers the node: its pairs count whole again (as ActiveBlockIndex.touch). */
function addRank(node: TrieNode, rank: number, st: RankBlockTotals): void {
  const k = node.ranks.indexOf(rank);
  const len = node.to - node.from;
  if (k < 0) {
    node.ranks.push(rank);
    node.refs.push(1);
    node.weights.push(1);
    st.uniqueBlocks += len;
    return;
  }
  node.refs[k] = (node.refs[k] as number) + 1;
  const w = node.weights[k] as number;
  if (w === 1) return;
  node.weights[k] = 1;
  // Pair by pair, as the per-hash index did, so the float sum is the same to the bit.
  for (let j = 0; j < len; j++) dropFraction(st, w);
}

/** One booking of `rank` leaves the node; true when no holder is left. */
function dropRank(node: TrieNode, rank: number, st: RankBlockTotals): boolean {
  const k = node.ranks.indexOf(rank);
  if (k < 0) return false;
  const left = (node.refs[k] as number) - 1;
  if (left > 0) {
    node.refs[k] = left;
    return false;
  }
  const w = node.weights[k] as number;
  const last = node.ranks.length - 1;
  node.ranks[k] = node.ranks[last] as number;
  node.refs[k] = node.refs[last] as number;
  node.weights[k] = node.weights[last] as number;
  node.ranks.pop();
  node.refs.pop();
  node.weights.pop();
  const len = node.to - node.from;
  st.uniqueBlocks -= len;
  if (w < 1) for (let j = 0; j < len; j++) dropFraction(st, w);
  return node.ranks.length === 0;
}

function copyHolders(from: TrieNode, to: TrieNode): void {
  to.ranks = from.ranks.slice();
  to.refs = from.refs.slice();
  to.weights = from.weights.slice();
}

/** A pair's weight went from `old` to `weight` (the ledger's decay of exclusive blocks). */
function weighPair(st: RankBlockTotals, old: number, weight: number): void {
  if (old < 1) dropFraction(st, old);
  if (weight < 1) {
    st.fractionalCount++;
    st.fractionalDeficit += 1 - weight;
  }
}
