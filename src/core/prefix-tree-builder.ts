/**
 * A partition's whole prefix tree built from ranks' flat exports (RankEntries), as flat typed
 * arrays in PrefixIndex's own layout, for the warm join's decoding thread: the main thread then
 * adopts it (PrefixIndex.adoptTree) in one step per partition instead of finding or making the
 * nodes and adding the device holders pair by pair (~0.5 us a pair of main-thread CPU, 4.2 M
 * pairs at 1,024 ranks x 4,096 blocks: 4-5 s of the join's wall time on a shared 2-core host).
 *
 * Why it is cheaper here and not only elsewhere: ranks share their prefixes (a node is held by
 * ~20 of 1,024 ranks in bench:warm-join), so a rank's pairs only append to flat per-rank lists;
 * the device sets are laid out once, at the end, by a counting sort into one array (ranks taken
 * in increasing key order, so every set comes out sorted), instead of growing ~0.2 M small
 * arrays one member at a time.
 *
 * Each rank is added exactly as PrefixIndex.importRankEntries would install it into an empty
 * index (the same bound, the same repeats skipped, the same device attachment below a parent
 * held attached): the unit tests check that adoption and per-rank imports answer alike.
 */
import { grownTo } from "./typed-growth.js";
import { badRequest } from "./errors.js";
import type { RankEntries } from "./prefix-index.js";
import type { PrefixTreeImage } from "./prefix-tree-image.js";
import { U64Table } from "./u64-table.js";

const ROOT = 0;
const NONE = -1;
const DEVICE = 0;
const INITIAL_NODE_CAPACITY = 1024;
/** A rank's lookup table is sized at this load when built here (U64Table grows past 0.7). */
const TABLE_LOAD = 0.6;

interface RankBuild {
  readonly rank: number;
  readonly lookup: { readonly slots: Int32Array; readonly size: number };
  /** The nodes it holds attached in device, distinct. */
  readonly devNodes: Int32Array;
}

export class PrefixTreeBuilder {
  #cap = 0;
  #next = 1;
  #parent = new Int32Array(0);
  #keyHi = new Uint32Array(0);
  #keyLo = new Uint32Array(0);
  #firstChild = new Int32Array(0);
  #nextSib = new Int32Array(0);
  #prevSib = new Int32Array(0);
  #holders = new Int32Array(0);
  #depth = new Int32Array(0);
  readonly #children = new U64Table(INITIAL_NODE_CAPACITY * 2);
  readonly #ranks: RankBuild[] = [];
  readonly #seen = new Set<number>();
  #aux: number[] = [];
  #pairs = 0;
  #lowerPairs = 0;
  #shedPairs = 0;
  #mine = new Int32Array(0);
  #attached = new Uint8Array(0);
  #built = false;

  constructor() {
    this.#grow(INITIAL_NODE_CAPACITY);
    this.#parent[ROOT] = NONE;
    this.#firstChild[ROOT] = NONE;
  }

  get ranks(): number {
    return this.#ranks.length;
  }

  /**
   * Adds rank `rank`'s blocks (a peer's export, checked by decodeIndexChunk; with or without its
   * lookup built ahead by withRankLookup), at most `maxRankPairs` of them (the rest counted in
   * shedPairs). A rank added twice is refused (badRequest): a chunk names each rank once.
   * Returns the pairs the rank holds in the tree.
   */
  add(rank: number, e: RankEntries, maxRankPairs = Infinity): number {
    if (this.#built) throw new Error("Assertion: PrefixTreeBuilder.add after build()");
    if (this.#seen.has(rank)) throw badRequest(`rank ${rank} is in the index snapshot twice`, "rank");
    this.#seen.add(rank);
    const nodes = e.nodeParent.length;
    const n = e.entryNode.length;
    if (n === 0) return 0;
    const ahead = e.lookup !== undefined && e.lookup.size === n && n <= maxRankPairs ? e.lookup : null;
    const table = ahead === null ? new U64Table(Math.ceil(Math.min(n, maxRankPairs) / TABLE_LOAD) + 1) : null;
    if (this.#mine.length < nodes) {
      this.#mine = new Int32Array(nodes);
      this.#attached = new Uint8Array(nodes);
    }
    const mine = this.#mine;
    const attached = this.#attached;
    attached.fill(0, 0, nodes);
    const devNodes = new Int32Array(nodes);
    let devCount = 0;
    let kept = 0;
    let ei = 0;
    for (let i = 0; i < nodes && ei < n; i++) {
      const pr = e.nodeParent[i] as number;
      // Assertion (a programming error, never input): decodeIndexChunk checks parents come first.
      if (pr >= i) throw new RangeError(`PrefixTreeBuilder: node ${i} has parent ${pr}, not before it`);
      if (kept >= maxRankPairs) break;
      const parent = pr < 0 ? ROOT : (mine[pr] as number);
      const hi = e.nodeKeys[2 * i] as number;
      const lo = e.nodeKeys[2 * i + 1] as number;
      let node = this.#childOf(parent, hi, lo);
      if (node < 0) node = this.#newNode(parent, hi, lo);
      mine[i] = node;
      for (; ei < n && e.entryNode[ei] === i; ei++) {
        const t = e.entryTier[ei] as number;
        if (table !== null) {
          if (kept >= maxRankPairs) break;
          const bh = e.entryHashes[2 * ei] as number;
          const bl = e.entryHashes[2 * ei + 1] as number;
          if (table.setIfAbsent(t, bh, bl, node) >= 0) continue;
        }
        kept++;
        this.#holders[node] = (this.#holders[node] as number) + 1;
        this.#pairs++;
        if (t !== DEVICE) {
          this.#lowerPairs++;
          this.#aux.push(node, t, rank);
        } else if (attached[i] === 0) {
          if (pr < 0 || attached[pr] === 1) {
            devNodes[devCount++] = node;
            attached[i] = 1;
          } else this.#aux.push(node, DEVICE, rank);
        }
      }
    }
    if (ei < n) this.#shedPairs += n - ei;
    let lookup: { slots: Int32Array; size: number };
    if (ahead !== null) {
      // Every entry went in: the values name the snapshot's nodes, rewritten to this tree's.
      const t = U64Table.adopt(ahead.slots, ahead.size);
      t.remapValues(mine);
      lookup = t.handOver();
    } else lookup = (table as U64Table).handOver();
    if (lookup.size > 0) this.#ranks.push({ rank, lookup, devNodes: devNodes.subarray(0, devCount) });
    return lookup.size;
  }

  /** The tree as PrefixIndex adopts it. The builder is spent afterwards. */
  build(): PrefixTreeImage {
    this.#built = true;
    // Nodes no entry names (every entry of theirs a repeat, or past a bound) go, children first:
    // a node's id is above its parent's, so one pass down the ids prunes whole chains.
    const free: number[] = [];
    for (let id = this.#next - 1; id > ROOT; id--) {
      if (this.#holders[id] !== 0 || this.#firstChild[id] !== NONE) continue;
      const p = this.#parent[id] as number;
      this.#children.delete(p, this.#keyHi[id] as number, this.#keyLo[id] as number);
      const prev = this.#prevSib[id] as number;
      const next = this.#nextSib[id] as number;
      if (prev !== NONE) this.#nextSib[prev] = next;
      else this.#firstChild[p] = next;
      if (next !== NONE) this.#prevSib[next] = prev;
      this.#parent[id] = NONE;
      free.push(id);
    }
    // Device sets: sizes, then each set of 2+ a range of one array, filled rank by rank in
    // increasing key order so that every set comes out sorted.
    const cap = this.#cap;
    const devSize = new Int32Array(cap);
    const ranks = [...this.#ranks].sort((a, b) => a.rank - b.rank);
    for (const r of ranks) {
      const nodes = r.devNodes;
      for (let j = 0; j < nodes.length; j++) devSize[nodes[j] as number] = (devSize[nodes[j] as number] as number) + 1;
    }
    const devStart = new Int32Array(cap);
    let members = 0;
    for (let id = 1; id < this.#next; id++) {
      const s = devSize[id] as number;
      if (s < 2) continue;
      devStart[id] = members;
      members += s;
    }
    const devMembers = new Int32Array(members);
    const devInline = new Int32Array(cap);
    const filled = new Int32Array(cap);
    for (const r of ranks) {
      const nodes = r.devNodes;
      for (let j = 0; j < nodes.length; j++) {
        const node = nodes[j] as number;
        if (devSize[node] === 1) devInline[node] = r.rank;
        else {
          const f = filled[node] as number;
          devMembers[(devStart[node] as number) + f] = r.rank;
          filled[node] = f + 1;
        }
      }
    }
    return {
      nextNode: this.#next,
      parent: this.#parent,
      keyHi: this.#keyHi,
      keyLo: this.#keyLo,
      firstChild: this.#firstChild,
      nextSib: this.#nextSib,
      prevSib: this.#prevSib,
      holders: this.#holders,
      depth: this.#depth,
      devSize,
      devInline,
      devStart,
      devMembers,
      free: Int32Array.from(free),
      children: this.#children.handOver(),
      ranks: Int32Array.from(ranks, (r) => r.rank),
      lookups: ranks.map((r) => r.lookup),
      aux: Int32Array.from(this.#aux),
      pairs: this.#pairs,
      lowerPairs: this.#lowerPairs,
      shedPairs: this.#shedPairs,
    };
  }

  /** Child of `parent` keyed (hi, lo), or -1: the first child first (most chains have one), then the table. */
  #childOf(parent: number, hi: number, lo: number): number {
    const c = this.#firstChild[parent] as number;
    if (c === NONE) return NONE;
    if (this.#keyLo[c] === lo && this.#keyHi[c] === hi) return c;
    if (this.#nextSib[c] === NONE) return NONE;
    return this.#children.get(parent, hi, lo);
  }

  #newNode(parent: number, hi: number, lo: number): number {
    if (this.#next === this.#cap) this.#grow(this.#cap * 2);
    const id = this.#next++;
    this.#parent[id] = parent;
    this.#keyHi[id] = hi;
    this.#keyLo[id] = lo;
    this.#firstChild[id] = NONE;
    this.#depth[id] = (this.#depth[parent] as number) + 1;
    const head = this.#firstChild[parent] as number;
    this.#nextSib[id] = head;
    this.#prevSib[id] = NONE;
    if (head !== NONE) this.#prevSib[head] = id;
    this.#firstChild[parent] = id;
    this.#children.set(parent, hi, lo, id);
    return id;
  }

  #grow(cap: number): void {
    this.#parent = grownTo(this.#parent, cap);
    this.#keyHi = grownTo(this.#keyHi, cap);
    this.#keyLo = grownTo(this.#keyLo, cap);
    this.#firstChild = grownTo(this.#firstChild, cap);
    this.#nextSib = grownTo(this.#nextSib, cap);
    this.#prevSib = grownTo(this.#prevSib, cap);
    this.#holders = grownTo(this.#holders, cap);
    this.#depth = grownTo(this.#depth, cap);
    this.#cap = cap;
  }
}
