/**
 * Prefix index (radix tree over per-block local hashes) for ONE partition (the
 * role of Dynamo's lib/kv-router/src/indexer/).
 *
 * Answers: for a request's local block hashes, how many leading blocks does every worker rank hold
 * in its device tier, and how far do its host and disk tiers extend that prefix.
 *
 * Layout (sized for the core benchmark: 1,024 ranks x 4,096 blocks = 4.2 M (rank, block) pairs):
 * - Nodes are int ids over growable typed arrays (parent, key, sibling links, holder count) with ids
 *   recycled on prune; the root is node 0. No object per node.
 * - Children: an intrusive sibling list per node, plus ONE partition-wide U64Table (parentId,
 *   localHi, localLo) -> childId that holds (at least) every child of a node with two or more
 *   children: a lone child is found at the head of its parent's list without the table (#childOf),
 *   so most nodes of a cached chain (one child each) never enter it, and storing or evicting them
 *   costs no random probe into a table of millions of slots (issue 26: #newNode and #maybePrune
 *   were 40% of the main thread's apply, most of it these probes).
 * - Per-rank lookup: one U64Table per rank keyed (tierIndex, seqHi, seqLo) -> nodeId. Per rank rather
 *   than one global table so that Cleared / removeRank / dumpRank touch only that rank's entries
 *   and growth never rehashes millions of other ranks' entries at once.
 * - Device-tier holders per node are kept PREFIX-CLOSED: the set holds the ranks that hold the node
 *   AND every ancestor in the device tier. Sets are therefore nested along any path, so the match
 *   walk never intersects sets: the survivors at depth d ARE node_d's set, and work is only done
 *   where the set shrinks. Sets are sorted Int32Arrays; a single holder is stored inline (most
 *   nodes past a shared prefix have one holder, and a typed array costs ~100 bytes of overhead).
 * - A rank holding a device node whose device ancestor chain is broken (a middle block was evicted)
 *   is "detached" there and re-attached when the gap is stored again. Detached ranks and host/disk
 *   holders live in rarely allocated per-node side sets (NodeAux); lower tiers need no closure.
 *
 * Not thread-safe; the daemon is single-threaded.
 */
import { grownTo } from "./typed-growth.js";
import { DEFAULT_MAX_DETACHED_BLOCKS, DetachedChains, type DetachedChainStats } from "./detached-chains.js";
import { MAX_RANK_KEYS } from "./rank-registry.js";
import type { PrefixTreeImage } from "./prefix-tree-image.js";
import { U64Table } from "./u64-table.js";
import { bigIntHi, bigIntLo, hashCount, pairToBigInt, toU64, type HashList } from "./hash64.js";

export type StorageTier = "device" | "host" | "disk";

/**
 * What applyStoredOrPark did with a stored event: took it, parked it until its parent is known
 * (detached-chains.ts), or refused it (a parent-hash cycle, or parked nothing at a 0 bound).
 */
export type StoreOutcome = "stored" | "parked" | "refused";
export const STORAGE_TIERS: readonly StorageTier[] = ["device", "host", "disk"];

/** Rank keys are interned by the caller (RankRegistry) into [0, MAX_RANK_KEYS). */
export { MAX_RANK_KEYS };

const DEVICE = 0;
const HOST = 1;
const DISK = 2;
const TIER_COUNT = 3;
const ROOT = 0;
const NONE = -1;
const INITIAL_NODE_CAPACITY = 1024;
const INITIAL_RANK_CAPACITY = 64;
const INITIAL_SET_CAPACITY = 4;
/** Below this dropout share, locating dropouts by binary search beats a linear merge (log2(1024) ~ 10). */
const DROPOUT_SEARCH_RATIO = 12;
/** Rough bytes of one NodeAux with small sets (object headers + typed arrays), for approxBytes only. */
const APPROX_AUX_BYTES = 256;
/** Bytes per node slot held in plain JS arrays (#devArr, #aux): one tagged pointer each. */
const JS_SLOT_BYTES = 8;
/** exportRankEntries' marks: a node not numbered yet, and one cut off from the root. */
const UNVISITED = -2;
const CUT = -3;
/** importRankEntries sizes the rank's lookup table at this load (U64Table grows past 0.7). */
const IMPORT_TABLE_LOAD = 0.6;
/** Node ids are Int32Array values, so below 2^31: applyRemoved packs (depth, id) as depth * 2^31 + id. */
const NODE_ID_RANGE = 2 ** 31;

function tierIndex(tier: StorageTier): number {
  switch (tier) {
    case "device":
      return DEVICE;
    case "host":
      return HOST;
    case "disk":
      return DISK;
  }
}

const TIER_BY_INDEX: readonly StorageTier[] = STORAGE_TIERS;

/**
 * Per-rank overlap, as parallel arrays of length >= count. The object and its arrays are an
 * internal buffer REUSED by the next findMatches call: copy what you keep before calling again.
 */
export interface MatchResult {
  readonly count: number;
  readonly ranks: Int32Array;
  /** Consecutive leading request blocks held in the device tier. */
  readonly device: Int32Array;
  /** Consecutive blocks after the device prefix held in host or device (extension). */
  readonly host: Int32Array;
  /** Consecutive blocks after device+host held in disk, host or device (extension). */
  readonly disk: Int32Array;
}

/** One stored event of a dump: replaying a rank's list through applyStored rebuilds its state. */
export interface StoredBlocksRecord {
  tier: StorageTier;
  parentHash: bigint | null;
  blockHashes: bigint[];
  localHashes: bigint[];
}

/**
 * One rank's blocks as flat typed arrays (PrefixIndex.exportRankEntries, importRankEntries): the
 * tree nodes it holds, parents first, and its lookup entries (tier, sequence hash) in node order.
 */
export interface RankEntries {
  /** Per node: its parent's index among these nodes (always smaller), or -1: the root. */
  readonly nodeParent: Int32Array;
  /** Per node: its content (local) hash as [hi, lo] u32 words. */
  readonly nodeKeys: Uint32Array;
  /** Per entry: its storage tier's index in STORAGE_TIERS. */
  readonly entryTier: Uint8Array;
  /** Per entry: the node it names, non-decreasing. */
  readonly entryNode: Int32Array;
  /** Per entry: its sequence hash as [hi, lo] u32 words. */
  readonly entryHashes: Uint32Array;
  /**
   * The rank's lookup table built ahead (withRankLookup, on the warm join's decoding thread):
   * U64Table slots keyed (tier, sequence hash) -> the entry's node index among these nodes, with
   * no repeated key. importRankEntries adopts it instead of inserting entry by entry.
   */
  readonly lookup?: { readonly slots: Int32Array; readonly size: number };
}

export function emptyRankEntries(): RankEntries {
  return { nodeParent: new Int32Array(0), nodeKeys: new Uint32Array(0), entryTier: new Uint8Array(0), entryNode: new Int32Array(0), entryHashes: new Uint32Array(0) };
}

/**
 * `e` with its lookup table built (RankEntries.lookup), for a thread other than the importer's:
 * the hashing and probing of every entry move off the main thread, which then adopts the table
 * and only rewrites its values to its own node ids. An entry whose (tier, hash) repeats an
 * earlier one is dropped here (importRankEntries skips it too: the first one counts).
 */
export function withRankLookup(e: RankEntries): RankEntries {
  const n = e.entryNode.length;
  if (n === 0) return e;
  const table = new U64Table(importTableSlots(n));
  let keep: Uint8Array | null = null;
  for (let i = 0; i < n; i++) {
    const t = e.entryTier[i] as number;
    const hi = e.entryHashes[2 * i] as number;
    const lo = e.entryHashes[2 * i + 1] as number;
    if (table.get(t, hi, lo) >= 0) {
      keep ??= new Uint8Array(n).fill(1);
      keep[i] = 0;
      continue;
    }
    table.set(t, hi, lo, e.entryNode[i] as number);
  }
  const lookup = table.handOver();
  if (keep === null) return { ...e, lookup };
  // Repeats (only a malformed chunk has them: an export comes from a table): drop them.
  const m = lookup.size;
  const entryTier = new Uint8Array(m);
  const entryNode = new Int32Array(m);
  const entryHashes = new Uint32Array(2 * m);
  let k = 0;
  for (let i = 0; i < n; i++) {
    if (keep[i] === 0) continue;
    entryTier[k] = e.entryTier[i] as number;
    entryNode[k] = e.entryNode[i] as number;
    entryHashes[2 * k] = e.entryHashes[2 * i] as number;
    entryHashes[2 * k + 1] = e.entryHashes[2 * i + 1] as number;
    k++;
  }
  return { nodeParent: e.nodeParent, nodeKeys: e.nodeKeys, entryTier, entryNode, entryHashes, lookup };
}

/** Slots of a rank's lookup table sized for `pairs` entries with no rehash (IMPORT_TABLE_LOAD). */
const importTableSlots = (pairs: number): number => Math.ceil(pairs / IMPORT_TABLE_LOAD) + 1;

interface MutableMatchResult {
  count: number;
  ranks: Int32Array;
  device: Int32Array;
  host: Int32Array;
  disk: Int32Array;
}

/** Small sorted set of rank keys. */
class RankSet {
  items = new Int32Array(INITIAL_SET_CAPACITY);
  size = 0;

  #find(r: number): number {
    let lo = 0;
    let hi = this.size;
    const a = this.items;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if ((a[mid] as number) < r) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  has(r: number): boolean {
    const i = this.#find(r);
    return i < this.size && this.items[i] === r;
  }

  add(r: number): boolean {
    const i = this.#find(r);
    if (i < this.size && this.items[i] === r) return false;
    if (this.size === this.items.length) {
      const grown = new Int32Array(this.items.length * 2);
      grown.set(this.items);
      this.items = grown;
    }
    this.items.copyWithin(i + 1, i, this.size);
    this.items[i] = r;
    this.size++;
    return true;
  }

  delete(r: number): boolean {
    const i = this.#find(r);
    if (i >= this.size || this.items[i] !== r) return false;
    this.items.copyWithin(i, i + 1, this.size);
    this.size--;
    return true;
  }
}

/** Rare per-node state: device-detached ranks and lower-tier holders. */
class NodeAux {
  detached: RankSet | null = null;
  host: RankSet | null = null;
  disk: RankSet | null = null;

  get empty(): boolean {
    return (
      (this.detached === null || this.detached.size === 0) &&
      (this.host === null || this.host.size === 0) &&
      (this.disk === null || this.disk.size === 0)
    );
  }
}

function binarySearch(a: Int32Array, size: number, r: number): number {
  let lo = 0;
  let hi = size;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if ((a[mid] as number) < r) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

function checkRank(rank: number): void {
  // Assertion (a programming error, never input): rank keys come from the RankRegistry, in range.
  if (!Number.isInteger(rank) || rank < 0 || rank >= MAX_RANK_KEYS) {
    throw new RangeError(`rank key must be an integer in [0, ${MAX_RANK_KEYS}), got ${rank}`);
  }
}

/**
 * What exporting a rank reads (PrefixIndex.exportViews): the node arrays (parent, key words),
 * indexed by node id, and the rank's lookup slots in U64Table's layout (null: it holds nothing).
 * Live views or copies of them: rankEntriesFromViews only reads.
 */
export interface RankExportViews {
  readonly parent: Int32Array;
  readonly keyHi: Uint32Array;
  readonly keyLo: Uint32Array;
  readonly slots: Int32Array | null;
  readonly size: number;
}

/**
 * The rank's blocks as flat typed arrays (PrefixIndex.exportRankEntries, and the warm join's
 * export thread over a copy of the same views): one pass over the rank's lookup slots, one over
 * its nodes and a counting sort, no object per block. Nodes come parents first; blocks cut off
 * from the root by a gap this rank holds in no tier are left out, as in dumpRank. `mark` is
 * scratch of at least `v.parent.length` zeros, left all zero again.
 */
export function rankEntriesFromViews(v: RankExportViews, mark: Int32Array): RankEntries {
  if (v.slots === null || v.size === 0) return emptyRankEntries();
  // Assertion (a programming error, never input): the caller sizes the scratch to the node arrays.
  if (mark.length < v.parent.length) throw new RangeError(`rankEntriesFromViews: scratch of ${mark.length} for ${v.parent.length} nodes`);
  const n = v.size;
  const tiers = new Uint8Array(n);
  const hashes = new Uint32Array(2 * n);
  const nodeOfEntry = new Int32Array(n);
  // Distinct nodes, numbered in the order met; `mark` maps a node id to its number + 1.
  const nodes = new Int32Array(n);
  let m = 0;
  let k = 0;
  U64Table.forEachSlot(v.slots, (t, hi, lo, node) => {
    tiers[k] = t;
    hashes[2 * k] = hi;
    hashes[2 * k + 1] = lo;
    if (mark[node] === 0) {
      nodes[m] = node;
      mark[node] = ++m;
    }
    nodeOfEntry[k++] = (mark[node] as number) - 1;
  });
  // Parents first: a node is numbered once its held parent is (a walk up the rank's held
  // ancestors, then back down). Each node is read once: the walk is memory-bound at millions
  // of nodes, so it reads no depth and sorts nothing.
  const newIndex = new Int32Array(m).fill(UNVISITED);
  const nodeParent = new Int32Array(m);
  const nodeKeys = new Uint32Array(2 * m);
  const stack: number[] = [];
  let kept = 0;
  for (let j = 0; j < m; j++) {
    if (newIndex[j] !== UNVISITED) continue;
    // Climb while the parent is held here and not numbered yet.
    let local = j;
    let pr = NONE;
    for (;;) {
      const p = v.parent[nodes[local] as number] as number;
      if (p === ROOT) break;
      const pm = (mark[p] as number) - 1;
      if (pm < 0) {
        pr = CUT; // the parent is held in no tier here: cut off from the root
        break;
      }
      const pi = newIndex[pm] as number;
      if (pi !== UNVISITED) {
        pr = pi;
        break;
      }
      stack.push(local);
      local = pm;
    }
    // Number `local` (its parent is resolved as `pr`), then the ones stacked below it.
    for (;;) {
      if (pr === CUT) newIndex[local] = CUT;
      else {
        const node = nodes[local] as number;
        newIndex[local] = kept;
        nodeParent[kept] = pr;
        nodeKeys[2 * kept] = v.keyHi[node] as number;
        nodeKeys[2 * kept + 1] = v.keyLo[node] as number;
        pr = kept++;
      }
      const below = stack.pop();
      if (below === undefined) break;
      local = below;
    }
  }
  for (let j = 0; j < m; j++) mark[nodes[j] as number] = 0;
  // Entries in node order (the importer attaches a node's device holder after its parent's).
  const perNode = new Int32Array(kept + 1);
  let entries = 0;
  for (let i = 0; i < n; i++) {
    const ni = newIndex[nodeOfEntry[i] as number] as number;
    if (ni === CUT) continue;
    perNode[ni + 1] = (perNode[ni + 1] as number) + 1;
    entries++;
  }
  for (let j = 1; j <= kept; j++) perNode[j] = (perNode[j] as number) + (perNode[j - 1] as number);
  const entryTier = new Uint8Array(entries);
  const entryNode = new Int32Array(entries);
  const entryHashes = new Uint32Array(2 * entries);
  for (let i = 0; i < n; i++) {
    const ni = newIndex[nodeOfEntry[i] as number] as number;
    if (ni === CUT) continue;
    const at = perNode[ni] as number;
    perNode[ni] = at + 1;
    entryTier[at] = tiers[i] as number;
    entryNode[at] = ni;
    entryHashes[2 * at] = hashes[2 * i] as number;
    entryHashes[2 * at + 1] = hashes[2 * i + 1] as number;
  }
  return { nodeParent: nodeParent.subarray(0, kept), nodeKeys: nodeKeys.subarray(0, 2 * kept), entryTier, entryNode, entryHashes };
}

export class PrefixIndex {
  // ---- nodes ----
  #nodeCap = 0;
  #nextNode = 1;
  #liveNodes = 0;
  #free: number[] = [];
  #parent = new Int32Array(0);
  #keyHi = new Uint32Array(0);
  #keyLo = new Uint32Array(0);
  #firstChild = new Int32Array(0);
  #nextSib = new Int32Array(0);
  #prevSib = new Int32Array(0);
  /** Lookup entries (any rank, any tier) pointing at the node; 0 with no children => pruned. */
  #holders = new Int32Array(0);
  /** Edges from the root (root 0): an O(1) test that a node cannot be another's ancestor. */
  #depth = new Int32Array(0);
  /** Device set: size; the member itself when size is 1; a sorted array when size >= 2. */
  #devSize = new Int32Array(0);
  #devInline = new Int32Array(0);
  #devArr: (Int32Array | undefined)[] = [];
  #aux: (NodeAux | undefined)[] = [];
  #children = new U64Table(INITIAL_NODE_CAPACITY * 2);
  /** 1 when the node's edge is in #children (then pruning it deletes the entry). */
  #inChildren = new Uint8Array(0);

  // ---- ranks ----
  #rankCap = 0;
  #lookups: (U64Table | undefined)[] = [];
  #detachedCount = new Int32Array(0);
  /** rank -> slot in the current match result, -1 otherwise (reset after each findMatches). */
  #slotOf = new Int32Array(0);

  // ---- counters ----
  #pairs = 0;
  #lowerPairs = 0;
  #devArrBytes = 0;
  #auxCount = 0;
  #shedPairs = 0;
  #cyclesRejected = 0;

  // ---- findMatches scratch ----
  #path = new Int32Array(256);
  readonly #scratchA = new Int32Array(1);
  readonly #scratchB = new Int32Array(1);
  readonly #result: MutableMatchResult = {
    count: 0,
    ranks: new Int32Array(16),
    device: new Int32Array(16),
    host: new Int32Array(16),
    disk: new Int32Array(16),
  };

  /** importRankEntries' scratch: each snapshot node's id here, and whether the rank holds it attached in device. */
  #importMine = new Int32Array(0);
  #importAttached = new Uint8Array(0);

  /** applyRemoved's scratch: the nodes an event's entries named, and their sort keys. */
  #removeNodes = new Int32Array(64);
  #removeKeys = new Float64Array(0);

  /** exportRankEntries' node -> number map, all zero between calls. */
  #scratchMark = new Int32Array(0);

  #detached: DetachedChains<StorageTier>;
  /** Parked chains refused when attached (a parent-hash cycle), since the index was made. */
  #detachedRefused = 0;

  /** `maxDetachedBlocks`: the bound on stored blocks parked until their parent is known (detached-chains.ts). */
  constructor(maxDetachedBlocks = DEFAULT_MAX_DETACHED_BLOCKS) {
    this.#detached = new DetachedChains<StorageTier>(maxDetachedBlocks);
    this.#growNodes(INITIAL_NODE_CAPACITY);
    this.#parent[ROOT] = NONE;
    this.#firstChild[ROOT] = NONE;
    this.#growRanks(INITIAL_RANK_CAPACITY);
  }

  /** Indexed (rank, tier, block) pairs. */
  get size(): number {
    return this.#pairs;
  }

  /** Live tree nodes, root excluded. */
  get nodeCount(): number {
    return this.#liveNodes;
  }

  /** Pairs held by one rank (all tiers). */
  rankSize(rank: number): number {
    checkRank(rank);
    return rank < this.#rankCap ? (this.#lookups[rank]?.size ?? 0) : 0;
  }

  /** New (rank, tier, block) pairs applyStored refused at its maxRankPairs, since the index was made. */
  get shedPairs(): number {
    return this.#shedPairs;
  }

  /** Stored events refused because a block would have been chained below itself (#17 F11), since the index was made. */
  get cyclesRejected(): number {
    return this.#cyclesRejected;
  }

  /** Chains parked until their parent is known: now, and counted since the index was made. */
  get detached(): DetachedChainStats & { readonly refusedChains: number } {
    // Field by field, not a spread of stats: the KV apply reads this twice a batch, and the spread
    // was 2.5% of the main thread's apply (bench:ingest --apply-only profile).
    const d = this.#detached.stats;
    return { blocks: d.blocks, chains: d.chains, parkedBlocks: d.parkedBlocks, attachedBlocks: d.attachedBlocks, shedBlocks: d.shedBlocks, refusedChains: this.#detachedRefused };
  }

  /** Whether `rank` holds the block with sequence hash `hash` in any tier. */
  holds(rank: number, hash: bigint): boolean {
    checkRank(rank);
    const h = toU64(hash);
    return this.#findHeld(rank, DEVICE, bigIntHi(h), bigIntLo(h)) >= 0;
  }

  /** Approximate heap bytes (typed arrays exactly, JS-side objects estimated). */
  get approxBytes(): number {
    let lookupBytes = 0;
    for (const t of this.#lookups) if (t !== undefined) lookupBytes += t.byteSize;
    const nodeBytes =
      this.#parent.byteLength +
      this.#keyHi.byteLength +
      this.#keyLo.byteLength +
      this.#firstChild.byteLength +
      this.#nextSib.byteLength +
      this.#prevSib.byteLength +
      this.#holders.byteLength +
      this.#depth.byteLength +
      this.#devSize.byteLength +
      this.#devInline.byteLength +
      2 * JS_SLOT_BYTES * this.#nodeCap;
    const rankBytes = this.#detachedCount.byteLength + this.#slotOf.byteLength + JS_SLOT_BYTES * this.#rankCap;
    return (
      nodeBytes +
      this.#children.byteSize +
      this.#inChildren.byteLength +
      lookupBytes +
      this.#devArrBytes +
      this.#auxCount * APPROX_AUX_BYTES +
      rankBytes +
      this.#path.byteLength +
      this.#scratchMark.byteLength +
      this.#importMine.byteLength +
      this.#importAttached.byteLength
    );
  }

  // =============================================================== events

  /**
   * A rank stored `blockHashes` (engine sequence hashes) whose content hashes are `localHashes`,
   * chained below the block `parentHash` (null: from the root). Returns false, changing nothing,
   * when this rank does not hold `parentHash` in any tier (out of order / gap: the caller counts
   * a dropped event).
   *
   * Also false when a block would be chained below itself: its hash already names, for this rank
   * and tier, the parent or one of the parent's ancestors (a parent-hash cycle, A -> B -> A).
   * Taking it would move the claim below its own descendants and leave the whole chain counted
   * but unmatchable (#17 F11). The blocks before it stay stored, the rest of the event is refused,
   * and `cyclesRejected` counts it. Chained engine hashes never cycle short of a 64-bit collision.
   *
   * A rank holding `maxRankPairs` pairs (all tiers) takes no new pair: the rest of the event is
   * refused and counted in `shedPairs` (see rank-index-bound.ts). Blocks it already holds pass.
   */
  applyStored(
    rank: number,
    tier: StorageTier,
    parentHash: bigint | null,
    blockHashes: HashList,
    localHashes: HashList,
    maxRankPairs = Infinity,
  ): boolean {
    checkRank(rank);
    const t = tierIndex(tier);
    // Assertion (a programming error, never input): the decoder checked the event's two lists.
    if (blockHashes.length !== localHashes.length || (blockHashes.length & 1) !== 0) {
      throw new RangeError(
        `blockHashes and localHashes must be hash lists of equal length (got ${blockHashes.length} and ${localHashes.length} words)`,
      );
    }
    let cur = ROOT;
    if (parentHash !== null) {
      const p = toU64(parentHash);
      cur = this.#findHeld(rank, t, bigIntHi(p), bigIntLo(p));
      if (cur < 0) return false;
    }
    const n = hashCount(blockHashes);
    if (n === 0) return true;
    if (rank >= this.#rankCap) this.#growRanks(rank + 1);
    let table = this.#lookups[rank];
    if (table === undefined) {
      table = new U64Table();
      this.#lookups[rank] = table;
    }
    for (let i = 0; i < n; i++) {
      const lh = localHashes[2 * i] as number;
      const ll = localHashes[2 * i + 1] as number;
      const bh = blockHashes[2 * i] as number;
      const bl = blockHashes[2 * i + 1] as number;
      const old = table.get(t, bh, bl);
      if (old < 0 && table.size >= maxRankPairs) {
        this.#shedPairs += n - i;
        break;
      }
      if (old >= 0 && this.#parent[old] !== cur && this.#isAncestorOrSelf(old, cur)) {
        this.#cyclesRejected++;
        return false;
      }
      let child = this.#childOf(cur, lh, ll);
      if (child < 0) child = this.#newNode(cur, lh, ll);
      if (old !== child) {
        this.#holders[child] = (this.#holders[child] as number) + 1;
        table.set(t, bh, bl, child);
        if (old >= 0) {
          // The same sequence hash now names different content: drop the old claim first. `old`
          // cannot be `cur` or an ancestor of it being pruned: those have children.
          this.#removeMembership(rank, t, old);
          this.#holders[old] = (this.#holders[old] as number) - 1;
          this.#maybePrune(old);
        } else {
          this.#pairs++;
          if (t !== DEVICE) this.#lowerPairs++;
        }
      }
      this.#addMembership(rank, t, cur, child);
      cur = child;
    }
    return true;
  }

  /**
   * applyStored, except that an event whose parent this rank does not hold is parked (copied,
   * bounded) instead of refused, and attached once the parent is known: when a later event or a
   * replay stores it, or an imported snapshot holds it (attachWaiting). Every block this call
   * stores releases the chains parked below it, recursively.
   */
  applyStoredOrPark(
    rank: number,
    tier: StorageTier,
    parentHash: bigint | null,
    blockHashes: HashList,
    localHashes: HashList,
    maxRankPairs = Infinity,
  ): StoreOutcome {
    if (!this.applyStored(rank, tier, parentHash, blockHashes, localHashes, maxRankPairs)) {
      if (parentHash === null || this.holds(rank, parentHash)) return "refused"; // a cycle
      return this.#detached.park(rank, tier, toU64(parentHash), blockHashes, localHashes) ? "parked" : "refused";
    }
    if (this.#detached.hasRank(rank)) this.#attachBelow(rank, blockHashes, maxRankPairs);
    return "stored";
  }

  /**
   * Attaches every chain of `rank` parked below a block the rank now holds (after an imported
   * snapshot or a replay installed blocks some other way). Returns the chains attached.
   */
  attachWaiting(rank: number, maxRankPairs = Infinity): number {
    checkRank(rank);
    let attached = 0;
    for (const parent of this.#detached.parentsOf(rank)) {
      if (!this.holds(rank, parent)) continue;
      for (const c of this.#detached.take(rank, parent)) {
        attached++;
        if (this.applyStored(rank, c.tier, c.parent, c.blockHashes, c.localHashes, maxRankPairs)) this.#attachBelow(rank, c.blockHashes, maxRankPairs);
        else this.#detachedRefused++;
      }
    }
    return attached;
  }

  /** Releases the chains parked below the blocks just stored, and below theirs, depth first. */
  #attachBelow(rank: number, stored: HashList, maxRankPairs: number): void {
    const work: HashList[] = [stored];
    while (work.length > 0 && this.#detached.hasRank(rank)) {
      const list = work.pop() as HashList;
      const n = hashCount(list);
      for (let i = 0; i < n; i++) {
        for (const c of this.#detached.take(rank, pairToBigInt(list[2 * i] as number, list[2 * i + 1] as number))) {
          if (this.applyStored(rank, c.tier, c.parent, c.blockHashes, c.localHashes, maxRankPairs)) work.push(c.blockHashes);
          else this.#detachedRefused++;
        }
      }
    }
  }

  /** A rank evicted blocks from one tier. Unknown hashes are ignored. Returns blocks removed. */
  applyRemoved(rank: number, tier: StorageTier, blockHashes: HashList): number {
    checkRank(rank);
    if (this.#detached.hasRank(rank)) this.#detached.removeBlocks(rank, tier, blockHashes);
    const t = tierIndex(tier);
    const table = rank < this.#rankCap ? this.#lookups[rank] : undefined;
    if (table === undefined) return 0;
    const n = hashCount(blockHashes);
    // First every entry out of the rank's table, in the event's order; then the claims dropped
    // deepest first. The end state is the same in any order (a rank is attached at a node iff it
    // holds it and every ancestor in device, whatever the order the claims went), but an engine
    // that lists a chain root first (the bench's, and vLLM's per request) made the claim on the
    // root go first: every block below it was detached (a NodeAux and a RankSet each) only to be
    // removed right after, ~12% of the main thread's apply. Deepest first, each is a leaf by then.
    if (this.#removeNodes.length < n) this.#removeNodes = new Int32Array(Math.max(n, 2 * this.#removeNodes.length));
    const nodes = this.#removeNodes;
    const depth = this.#depth;
    let m = 0;
    let ascending = true;
    let descending = true;
    for (let i = 0; i < n; i++) {
      const node = table.take(t, blockHashes[2 * i] as number, blockHashes[2 * i + 1] as number);
      if (node < 0) continue;
      if (m > 0) {
        const d = depth[node] as number;
        const prev = depth[nodes[m - 1] as number] as number;
        if (d < prev) ascending = false;
        else if (d > prev) descending = false;
      }
      nodes[m++] = node;
    }
    this.#pairs -= m;
    if (t !== DEVICE) this.#lowerPairs -= m;
    if (ascending && m > 1) {
      for (let j = m - 1; j >= 0; j--) this.#dropClaim(rank, t, nodes[j] as number);
    } else if (descending || t !== DEVICE) {
      for (let j = 0; j < m; j++) this.#dropClaim(rank, t, nodes[j] as number);
    } else {
      this.#dropClaimsDeepestFirst(rank, nodes, m);
    }
    return m;
  }

  /** One removed entry's claim: its membership, its holder count, and the node if nothing else holds it. */
  #dropClaim(rank: number, t: number, node: number): void {
    this.#removeMembership(rank, t, node);
    this.#holders[node] = (this.#holders[node] as number) - 1;
    this.#maybePrune(node);
  }

  /** Device claims in no depth order: sorted deepest first (depth and node id packed in one double, a native sort). */
  #dropClaimsDeepestFirst(rank: number, nodes: Int32Array, m: number): void {
    if (this.#removeKeys.length < m) this.#removeKeys = new Float64Array(Math.max(m, 2 * this.#removeKeys.length));
    const keys = this.#removeKeys.subarray(0, m);
    // depth < 2^21 and node id < 2^31: exact in a double (< 2^52).
    for (let j = 0; j < m; j++) keys[j] = (this.#depth[nodes[j] as number] as number) * NODE_ID_RANGE + (nodes[j] as number);
    keys.sort();
    for (let j = m - 1; j >= 0; j--) this.#dropClaim(rank, DEVICE, (keys[j] as number) % NODE_ID_RANGE);
  }

  /** The rank dropped everything (all tiers). */
  applyCleared(rank: number): void {
    checkRank(rank);
    this.#detached.dropRank(rank);
    const table = rank < this.#rankCap ? this.#lookups[rank] : undefined;
    if (table === undefined) return;
    // Every membership of this rank goes, so no detach/re-attach walks are needed. Pruning inside
    // the loop is safe: it touches only the tree, and a node still named by a later entry of this
    // table has holders > 0.
    table.forEach((t, _hi, _lo, node) => {
      if (t === DEVICE) {
        if (!this.#devDelete(node, rank)) this.#auxDelete(node, DEVICE, rank);
      } else {
        this.#auxDelete(node, t, rank);
        this.#lowerPairs--;
      }
      this.#holders[node] = (this.#holders[node] as number) - 1;
      this.#pairs--;
      this.#maybePrune(node);
    });
    this.#lookups[rank] = undefined;
    this.#detachedCount[rank] = 0;
  }

  /** Same as applyCleared; used when a worker (rank) is deleted. */
  removeRank(rank: number): void {
    this.applyCleared(rank);
  }

  // =============================================================== matching

  /**
   * Overlap of every rank with the request's local block hashes; only ranks with some overlap are
   * listed. The result is an internal buffer reused by the next call: copy before calling again.
   */
  findMatches(localHashes: HashList): MatchResult {
    const res = this.#result;
    res.count = 0;
    const n = hashCount(localHashes);
    if (n === 0) return res;
    if (this.#path.length < n) this.#path = new Int32Array(Math.max(n, this.#path.length * 2));
    const path = this.#path;
    const lower = this.#lowerPairs > 0;
    const devSize = this.#devSize;

    let k = 0;
    let cur = ROOT;
    for (let d = 0; d < n; d++) {
      const c = this.#childOf(cur, localHashes[2 * d] as number, localHashes[2 * d + 1] as number);
      if (c < 0 || (!lower && devSize[c] === 0)) break;
      path[k++] = c;
      cur = c;
    }
    if (k === 0) return res;

    const first = path[0] as number;
    const s0 = devSize[first] as number;
    if (s0 > 0) {
      this.#ensureResultCapacity(s0);
      const members = this.#devMembers(first, this.#scratchA);
      for (let j = 0; j < s0; j++) this.#pushResult(members[j] as number);
      let prevSize = s0;
      let last = 0;
      let emptied = false;
      for (let d = 1; d < k; d++) {
        const node = path[d] as number;
        const s = devSize[node] as number;
        if (s < prevSize) this.#markDropouts(path[d - 1] as number, prevSize, node, s, d);
        prevSize = s;
        if (s === 0) {
          emptied = true;
          break;
        }
        last = d;
      }
      if (!emptied) {
        const deepest = path[last] as number;
        const m = this.#devMembers(deepest, this.#scratchA);
        const sz = devSize[deepest] as number;
        for (let j = 0; j < sz; j++) res.device[this.#slotOf[m[j] as number] as number] = last + 1;
      }
    }

    if (lower) this.#extendLowerTiers(path, k);

    const slotOf = this.#slotOf;
    for (let j = 0; j < res.count; j++) slotOf[res.ranks[j] as number] = NONE;
    return res;
  }

  #pushResult(rank: number): void {
    const res = this.#result;
    const j = res.count++;
    res.ranks[j] = rank;
    res.device[j] = 0;
    res.host[j] = 0;
    res.disk[j] = 0;
    this.#slotOf[rank] = j;
  }

  /**
   * Ranks in parent's set but not in child's (child's set is a subset, both sorted) dropped out at
   * depth d. Few dropouts out of many members are found by binary search for the first position
   * where the arrays disagree, instead of a merge over the whole parent set.
   */
  #markDropouts(parent: number, sp: number, child: number, sc: number, d: number): void {
    const P = this.#devMembers(parent, this.#scratchA);
    const C = this.#devMembers(child, this.#scratchB);
    const device = this.#result.device;
    const slotOf = this.#slotOf;
    let dropouts = sp - sc;
    if (dropouts * DROPOUT_SEARCH_RATIO < sp) {
      let a = 0;
      let c = 0;
      while (dropouts > 0) {
        // First t with P[a+t] !== C[c+t]; positions before it match one-to-one.
        let lo = 0;
        let hi = sc - c;
        while (lo < hi) {
          const mid = (lo + hi) >>> 1;
          if (P[a + mid] === C[c + mid]) lo = mid + 1;
          else hi = mid;
        }
        device[slotOf[P[a + lo] as number] as number] = d;
        a += lo + 1;
        c += lo;
        dropouts--;
      }
      return;
    }
    let j = 0;
    for (let i = 0; i < sp; i++) {
      const r = P[i] as number;
      if (j < sc && C[j] === r) j++;
      else device[slotOf[r] as number] = d;
    }
  }

  /** Host/disk extension past each rank's device prefix; only runs when lower-tier pairs exist. */
  #extendLowerTiers(path: Int32Array, k: number): void {
    const res = this.#result;
    const firstAux = this.#aux[path[0] as number];
    if (firstAux !== undefined) {
      for (const set of [firstAux.host, firstAux.disk]) {
        if (set === null) continue;
        for (let j = 0; j < set.size; j++) {
          const r = set.items[j] as number;
          if (this.#slotOf[r] === NONE) {
            this.#ensureResultCapacity(res.count + 1);
            this.#pushResult(r);
          }
        }
      }
    }
    const aux = this.#aux;
    for (let j = 0; j < res.count; j++) {
      const r = res.ranks[j] as number;
      const dev = res.device[j] as number;
      // Past its device prefix a rank holds a node in "device" only as detached.
      let x = dev;
      for (; x < k; x++) {
        const a = aux[path[x] as number];
        if (a === undefined || !((a.detached?.has(r) ?? false) || (a.host?.has(r) ?? false))) break;
      }
      let y = x;
      for (; y < k; y++) {
        const a = aux[path[y] as number];
        if (
          a === undefined ||
          !((a.detached?.has(r) ?? false) || (a.host?.has(r) ?? false) || (a.disk?.has(r) ?? false))
        ) {
          break;
        }
      }
      res.host[j] = x - dev;
      res.disk[j] = y - x;
    }
  }

  #ensureResultCapacity(n: number): void {
    const res = this.#result;
    if (res.ranks.length >= n) return;
    const cap = Math.max(n, res.ranks.length * 2);
    for (const key of ["ranks", "device", "host", "disk"] as const) {
      const grown = new Int32Array(cap);
      grown.set(res[key].subarray(0, res.count));
      res[key] = grown;
    }
  }

  // =============================================================== dump

  /**
   * Stored-events that rebuild this rank's state when replayed in order through applyStored into an
   * empty index. Blocks cut off from the root by a gap this rank holds in NO tier are left out: they
   * cannot be chained to a parent this rank knows, and they contribute nothing to matching until
   * the gap is stored again.
   */
  dumpRank(rank: number): StoredBlocksRecord[] {
    const toBig = (w: number[]): bigint[] => {
      const out: bigint[] = [];
      for (let i = 0; i < w.length; i += 2) out.push(pairToBigInt(w[i] as number, w[i + 1] as number));
      return out;
    };
    return this.#dumpWords(rank).map((e) => ({
      tier: e.tier,
      parentHash: e.parent === null ? null : pairToBigInt(e.parent[0] as number, e.parent[1] as number),
      blockHashes: toBig(e.blockHashes),
      localHashes: toBig(e.localHashes),
    }));
  }

  /**
   * The rank's blocks as flat typed arrays, for the warm join's export (index-snapshot.ts):
   * rankEntriesFromViews over this index's arrays as they are now.
   */
  exportRankEntries(rank: number): RankEntries {
    const v = this.exportViews(rank);
    if (this.#scratchMark.length < v.parent.length) this.#scratchMark = new Int32Array(this.#nodeCap);
    return rankEntriesFromViews(v, this.#scratchMark);
  }

  /**
   * What the export of a rank reads, as read-only views into this index's live arrays, valid
   * until the index next changes: the node arrays up to the highest node id in use (parent and
   * key words: 12 bytes a node, ~3 MB at 1,024 x 4,096 with shared prefixes) and the rank's
   * lookup slots (U64Table layout). The warm join's peer copies them in one synchronous step
   * (src/core/index-export-copy.ts) and walks the copy on a thread.
   */
  exportViews(rank: number): RankExportViews {
    checkRank(rank);
    const table = rank < this.#rankCap ? this.#lookups[rank] : undefined;
    const n = this.#nextNode;
    return {
      parent: this.#parent.subarray(0, n),
      keyHi: this.#keyHi.subarray(0, n),
      keyLo: this.#keyLo.subarray(0, n),
      slots: table === undefined || table.size === 0 ? null : table.slotsView(),
      size: table?.size ?? 0,
    };
  }

  /**
   * Replaces the rank's blocks with `e` (a peer's exportRankEntries, checked by the decoder): the
   * warm join's bulk insert. Nodes are found or made parents first and each entry is added with
   * no parent lookup by hash; a device holder attaches below its parent's, so no re-attach walk
   * runs. The rank's parked chains go with its old blocks, as in applyCleared. A rank at
   * `maxRankPairs` takes no more (the rest counted in `shedPairs`); an entry whose (tier, hash)
   * is already taken is skipped. Returns the pairs the rank holds.
   */
  importRankEntries(rank: number, e: RankEntries, maxRankPairs = Infinity): number {
    checkRank(rank);
    this.applyCleared(rank);
    const nodes = e.nodeParent.length;
    const n = e.entryNode.length;
    if (n === 0) return 0;
    if (rank >= this.#rankCap) this.#growRanks(rank + 1);
    // A table built ahead (withRankLookup) is adopted when the whole rank fits the bound;
    // otherwise one sized for the whole import is filled here, with no rehash while it runs.
    const ahead = e.lookup !== undefined && e.lookup.size === n && n <= maxRankPairs ? e.lookup : null;
    const table = ahead === null ? new U64Table(importTableSlots(Math.min(n, maxRankPairs))) : null;
    // Scratch kept between imports (a warm join imports ranks back to back: 20 KB of fresh
    // arrays per 4,096-block rank was ~20 MB of garbage at 1,024 ranks).
    if (this.#importMine.length < nodes) {
      this.#importMine = new Int32Array(nodes);
      this.#importAttached = new Uint8Array(nodes);
    }
    const mine = this.#importMine;
    // Whether the rank holds node i in device, attached (prefix-closed): the rank was just
    // cleared and parents come first, so this is its device set's answer without a search.
    const attached = this.#importAttached;
    attached.fill(0, 0, nodes);
    let ei = 0;
    let made = 0;
    for (let i = 0; i < nodes && ei < n; i++) {
      const pr = e.nodeParent[i] as number;
      // Assertion (a programming error, never input): decodeIndexChunk checks parents come first.
      if (pr >= i) throw new RangeError(`importRankEntries: node ${i} has parent ${pr}, not before it`);
      if (table !== null && table.size >= maxRankPairs) break;
      const parent = pr < 0 ? ROOT : (mine[pr] as number);
      const hi = e.nodeKeys[2 * i] as number;
      const lo = e.nodeKeys[2 * i + 1] as number;
      let node = this.#childOf(parent, hi, lo);
      if (node < 0) node = this.#newNode(parent, hi, lo);
      mine[i] = node;
      made = i + 1;
      for (; ei < n && e.entryNode[ei] === i; ei++) {
        const t = e.entryTier[ei] as number;
        if (table !== null) {
          if (table.size >= maxRankPairs) break;
          const bh = e.entryHashes[2 * ei] as number;
          const bl = e.entryHashes[2 * ei + 1] as number;
          if (table.get(t, bh, bl) >= 0) continue;
          table.set(t, bh, bl, node);
        }
        this.#holders[node] = (this.#holders[node] as number) + 1;
        this.#pairs++;
        if (t !== DEVICE) {
          this.#lowerPairs++;
          this.#auxAdd(node, t, rank);
        } else if (attached[i] === 0) {
          if (pr < 0 || attached[pr] === 1) {
            this.#devAdd(node, rank);
            attached[i] = 1;
          } else if (this.#auxAdd(node, DEVICE, rank)) {
            this.#detachedCount[rank] = (this.#detachedCount[rank] as number) + 1;
          }
        }
      }
    }
    let held: U64Table;
    if (ahead !== null) {
      // Every entry went in (the whole rank fits): the values name the snapshot's nodes, now ours.
      held = U64Table.adopt(ahead.slots, ahead.size);
      held.remapValues(mine);
    } else {
      held = table as U64Table;
      if (ei < n) this.#shedPairs += n - ei;
    }
    this.#lookups[rank] = held;
    // Nodes left with no holder (every entry of theirs a repeat, or shed) go, children first.
    for (let i = made - 1; i >= 0; i--) if (this.#holders[mine[i] as number] === 0) this.#maybePrune(mine[i] as number);
    return held.size;
  }

  /**
   * Adopts a partition's whole tree built elsewhere (PrefixTreeBuilder, on the warm join's
   * decoding thread): the warm join's install in one step instead of rank by rank. The image's
   * ranks replace this index's blocks of those ranks, as importRankEntries would, and their
   * parked chains go; an image rank for which `keepOwn` answers true (a stale snapshot, a rank
   * key that moved) is left out and keeps its own blocks, as does every rank not in the image:
   * those are carried over (exportRankEntries then importRankEntries; blocks cut off from the
   * root by a gap held in no tier are left out, as in a dump). Counters carry on; the image's
   * shed pairs are added.
   *
   * Cost on this thread: O(nodes) to lay out the device sets' views and O(ranks) tables, plus
   * the carried-over ranks' pairs (none when the index was empty: the warm join's common case).
   */
  adoptTree(img: PrefixTreeImage, keepOwn: (rank: number) => boolean = () => false): void {
    const fresh = new PrefixIndex();
    fresh.#load(img);
    const replaced = new Set<number>();
    for (const r of img.ranks) {
      if (keepOwn(r)) fresh.applyCleared(r);
      else replaced.add(r);
    }
    for (let r = 0; r < this.#rankCap; r++) {
      const t = this.#lookups[r];
      if (t === undefined || t.size === 0 || replaced.has(r)) continue;
      fresh.importRankEntries(r, this.exportRankEntries(r));
    }
    for (const r of replaced) this.#detached.dropRank(r);
    fresh.#shedPairs = this.#shedPairs + img.shedPairs;
    fresh.#cyclesRejected = this.#cyclesRejected;
    this.#take(fresh);
  }

  /** An empty index's state from an image (its arrays adopted, not copied). */
  #load(img: PrefixTreeImage): void {
    const cap = img.parent.length;
    this.#nodeCap = cap;
    this.#nextNode = img.nextNode;
    this.#free = Array.from(img.free);
    this.#liveNodes = img.nextNode - 1 - img.free.length;
    this.#parent = img.parent;
    this.#keyHi = img.keyHi;
    this.#keyLo = img.keyLo;
    this.#firstChild = img.firstChild;
    this.#nextSib = img.nextSib;
    this.#prevSib = img.prevSib;
    this.#holders = img.holders;
    this.#depth = img.depth;
    this.#devSize = img.devSize;
    this.#devInline = img.devInline;
    // A set of 2+ is a view into the image's one array, full: the next add grows it into its own.
    // Filled by push, as #growNodes does: `new Array(n)` past ~100 K elements makes a dictionary-
    // mode array in V8, slow on every later read of a node's set.
    const devArr: (Int32Array | undefined)[] = [];
    const auxSets: (NodeAux | undefined)[] = [];
    for (let i = 0; i < cap; i++) {
      devArr.push(undefined);
      auxSets.push(undefined);
    }
    let devArrBytes = 0;
    const members = img.devMembers;
    for (let id = 1; id < img.nextNode; id++) {
      const size = img.devSize[id] as number;
      if (size < 2) continue;
      const start = img.devStart[id] as number;
      const a = members.subarray(start, start + size);
      devArr[id] = a;
      devArrBytes += a.byteLength;
    }
    this.#devArr = devArr;
    this.#devArrBytes = devArrBytes;
    this.#aux = auxSets;
    this.#auxCount = 0;
    // The tables were built by U64Table on the decoding thread (PrefixTreeBuilder), never read
    // from the wire: adopted without counting their slots.
    this.#children = U64Table.adopt(img.children.slots, img.children.size, false);
    // The image's table holds every edge (prefix-tree-builder.ts): each node is in it.
    this.#inChildren = new Uint8Array(cap).fill(1);
    let maxRank = -1;
    for (const r of img.ranks) maxRank = Math.max(maxRank, r);
    if (maxRank >= 0) checkRank(maxRank);
    if (maxRank >= this.#rankCap) this.#growRanks(maxRank + 1);
    img.ranks.forEach((r, i) => {
      const l = img.lookups[i] as { slots: Int32Array; size: number };
      this.#lookups[r] = U64Table.adopt(l.slots, l.size, false);
    });
    const aux = img.aux;
    for (let i = 0; i + 2 < aux.length; i += 3) {
      const node = aux[i] as number;
      const t = aux[i + 1] as number;
      const rank = aux[i + 2] as number;
      if (this.#auxAdd(node, t, rank) && t === DEVICE) this.#detachedCount[rank] = (this.#detachedCount[rank] as number) + 1;
    }
    this.#pairs = img.pairs;
    this.#lowerPairs = img.lowerPairs;
  }

  /** Takes `o`'s tree, ranks and counters (adoptTree); the parked chains and scratch stay this index's. */
  #take(o: PrefixIndex): void {
    this.#nodeCap = o.#nodeCap;
    this.#nextNode = o.#nextNode;
    this.#liveNodes = o.#liveNodes;
    this.#free = o.#free;
    this.#parent = o.#parent;
    this.#keyHi = o.#keyHi;
    this.#keyLo = o.#keyLo;
    this.#firstChild = o.#firstChild;
    this.#nextSib = o.#nextSib;
    this.#prevSib = o.#prevSib;
    this.#holders = o.#holders;
    this.#depth = o.#depth;
    this.#devSize = o.#devSize;
    this.#devInline = o.#devInline;
    this.#devArr = o.#devArr;
    this.#aux = o.#aux;
    this.#children = o.#children;
    this.#inChildren = o.#inChildren;
    this.#rankCap = o.#rankCap;
    this.#lookups = o.#lookups;
    this.#detachedCount = o.#detachedCount;
    this.#slotOf = o.#slotOf;
    this.#pairs = o.#pairs;
    this.#lowerPairs = o.#lowerPairs;
    this.#devArrBytes = o.#devArrBytes;
    this.#auxCount = o.#auxCount;
    this.#shedPairs = o.#shedPairs;
    this.#cyclesRejected = o.#cyclesRejected;
  }

  #dumpWords(rank: number): { tier: StorageTier; parent: number[] | null; blockHashes: number[]; localHashes: number[] }[] {
    checkRank(rank);
    const table = rank < this.#rankCap ? this.#lookups[rank] : undefined;
    if (table === undefined) return [];
    const entriesByNode = new Map<number, number[]>(); // node -> [tier, hi, lo, tier, hi, lo, ...]
    table.forEach((t, hi, lo, node) => {
      const list = entriesByNode.get(node);
      if (list === undefined) entriesByNode.set(node, [t, hi, lo]);
      else list.push(t, hi, lo);
    });
    const heldChildren = new Map<number, number[]>();
    for (const node of entriesByNode.keys()) {
      const p = this.#parent[node] as number;
      if (p !== ROOT && !entriesByNode.has(p)) continue;
      const list = heldChildren.get(p);
      if (list === undefined) heldChildren.set(p, [node]);
      else list.push(node);
    }

    type Words = { tier: StorageTier; parent: number[] | null; blockHashes: number[]; localHashes: number[] };
    const events: Words[] = [];
    const open: ({ event: Words; last: number } | undefined)[] = new Array<undefined>(TIER_COUNT);
    const stack = [...(heldChildren.get(ROOT) ?? [])];
    while (stack.length > 0) {
      const node = stack.pop() as number;
      const p = this.#parent[node] as number;
      const entries = entriesByNode.get(node) ?? [];
      for (let e = 0; e < entries.length; e += 3) {
        const t = entries[e] as number;
        let chain = open[t];
        if (chain === undefined || chain.last !== p) {
          const event: Words = {
            tier: TIER_BY_INDEX[t] as StorageTier,
            parent: p === ROOT ? null : PrefixIndex.#parentEntryWords(entriesByNode.get(p) ?? [], t),
            blockHashes: [],
            localHashes: [],
          };
          events.push(event);
          chain = { event, last: p };
          open[t] = chain;
        }
        chain.event.blockHashes.push(entries[e + 1] as number, entries[e + 2] as number);
        chain.event.localHashes.push(this.#keyHi[node] as number, this.#keyLo[node] as number);
        chain.last = node;
      }
      const kids = heldChildren.get(node);
      if (kids !== undefined) for (let i = kids.length - 1; i >= 0; i--) stack.push(kids[i] as number);
    }
    return events;
  }

  /** The parent's sequence hash to chain from, as [hi, lo]: the same tier's when held there, else any tier's. */
  static #parentEntryWords(entries: number[], tier: number): number[] {
    let pick = 0;
    for (let e = 0; e < entries.length; e += 3) {
      if (entries[e] === tier) {
        pick = e;
        break;
      }
    }
    return [entries[pick + 1] as number, entries[pick + 2] as number];
  }

  // =============================================================== membership

  /** Node this rank holds under sequence hash (hi, lo): the event's own tier first, then any. */
  #findHeld(rank: number, preferredTier: number, hi: number, lo: number): number {
    const table = rank < this.#rankCap ? this.#lookups[rank] : undefined;
    if (table === undefined) return NONE;
    const node = table.get(preferredTier, hi, lo);
    if (node >= 0) return node;
    for (let t = 0; t < TIER_COUNT; t++) {
      if (t === preferredTier) continue;
      const other = table.get(t, hi, lo);
      if (other >= 0) return other;
    }
    return NONE;
  }

  #addMembership(rank: number, t: number, parent: number, node: number): void {
    if (t !== DEVICE) {
      this.#auxAdd(node, t, rank);
      return;
    }
    if (this.#devHas(node, rank)) return;
    if (parent === ROOT || this.#devHas(parent, rank)) this.#attach(rank, node);
    else if (this.#auxAdd(node, DEVICE, rank)) this.#detachedCount[rank] = (this.#detachedCount[rank] as number) + 1;
  }

  /**
   * Drops this rank's claim on the node in one tier. Like the reference, one removed sequence hash
   * drops the claim even if another hash of the same rank and tier still names the node.
   */
  #removeMembership(rank: number, t: number, node: number): void {
    if (t !== DEVICE) {
      this.#auxDelete(node, t, rank);
      return;
    }
    if (this.#devDelete(node, rank)) this.#detachBelow(rank, node);
    else if (this.#auxDelete(node, DEVICE, rank)) this.#detachedCount[rank] = (this.#detachedCount[rank] as number) - 1;
  }

  /** Attaches the rank at node (its parent chain is complete) and re-attaches detached descendants. */
  #attach(rank: number, node: number): void {
    if (this.#auxDelete(node, DEVICE, rank)) this.#detachedCount[rank] = (this.#detachedCount[rank] as number) - 1;
    this.#devAdd(node, rank);
    if (this.#detachedCount[rank] === 0) return;
    const stack = [node];
    while (stack.length > 0) {
      const x = stack.pop() as number;
      for (let c = this.#firstChild[x] as number; c !== NONE; c = this.#nextSib[c] as number) {
        if (this.#aux[c] === undefined || !this.#auxDelete(c, DEVICE, rank)) continue;
        this.#devAdd(c, rank);
        stack.push(c);
        const left = (this.#detachedCount[rank] as number) - 1;
        this.#detachedCount[rank] = left;
        if (left === 0) return;
      }
    }
  }

  /** The rank lost its device chain at node: its attached descendants become detached. */
  #detachBelow(rank: number, node: number): void {
    // A leaf has nothing to detach: most removals reach one (deepest first, applyRemoved).
    if (this.#firstChild[node] === NONE) return;
    const stack = [node];
    while (stack.length > 0) {
      const x = stack.pop() as number;
      for (let c = this.#firstChild[x] as number; c !== NONE; c = this.#nextSib[c] as number) {
        if (!this.#devDelete(c, rank)) continue;
        this.#auxAdd(c, DEVICE, rank);
        this.#detachedCount[rank] = (this.#detachedCount[rank] as number) + 1;
        stack.push(c);
      }
    }
  }

  /** kind: DEVICE means the detached set here. */
  #auxAdd(node: number, kind: number, rank: number): boolean {
    let a = this.#aux[node];
    if (a === undefined) {
      a = new NodeAux();
      this.#aux[node] = a;
      this.#auxCount++;
    }
    let set = kind === DEVICE ? a.detached : kind === HOST ? a.host : a.disk;
    if (set === null) {
      set = new RankSet();
      if (kind === DEVICE) a.detached = set;
      else if (kind === HOST) a.host = set;
      else a.disk = set;
    }
    return set.add(rank);
  }

  #auxDelete(node: number, kind: number, rank: number): boolean {
    const a = this.#aux[node];
    if (a === undefined) return false;
    const set = kind === DEVICE ? a.detached : kind === HOST ? a.host : a.disk;
    if (set === null || !set.delete(rank)) return false;
    if (a.empty) {
      this.#aux[node] = undefined;
      this.#auxCount--;
    }
    return true;
  }

  // ---- device set (sorted; inline when size 1) ----

  #devMembers(node: number, scratch: Int32Array): Int32Array {
    if (this.#devSize[node] === 1) {
      scratch[0] = this.#devInline[node] as number;
      return scratch;
    }
    return this.#devArr[node] ?? scratch;
  }

  #devHas(node: number, rank: number): boolean {
    const s = this.#devSize[node] as number;
    if (s === 0) return false;
    if (s === 1) return this.#devInline[node] === rank;
    const a = this.#devArr[node] as Int32Array;
    const i = binarySearch(a, s, rank);
    return i < s && a[i] === rank;
  }

  #devAdd(node: number, rank: number): void {
    const s = this.#devSize[node] as number;
    if (s === 0) {
      this.#devInline[node] = rank;
      this.#devSize[node] = 1;
      return;
    }
    if (s === 1) {
      const other = this.#devInline[node] as number;
      if (other === rank) return;
      const a = new Int32Array(INITIAL_SET_CAPACITY);
      this.#devArrBytes += a.byteLength;
      a[0] = Math.min(other, rank);
      a[1] = Math.max(other, rank);
      this.#devArr[node] = a;
      this.#devSize[node] = 2;
      return;
    }
    let a = this.#devArr[node] as Int32Array;
    // Ranks are often added in increasing order (a warm join imports rank after rank): append.
    const i = (a[s - 1] as number) < rank ? s : binarySearch(a, s, rank);
    if (i < s && a[i] === rank) return;
    if (s === a.length) {
      const grown = new Int32Array(a.length * 2);
      grown.set(a);
      this.#devArrBytes += grown.byteLength - a.byteLength;
      a = grown;
      this.#devArr[node] = a;
    }
    a.copyWithin(i + 1, i, s);
    a[i] = rank;
    this.#devSize[node] = s + 1;
  }

  #devDelete(node: number, rank: number): boolean {
    const s = this.#devSize[node] as number;
    if (s === 0) return false;
    if (s === 1) {
      if (this.#devInline[node] !== rank) return false;
      this.#devSize[node] = 0;
      return true;
    }
    const a = this.#devArr[node] as Int32Array;
    const i = binarySearch(a, s, rank);
    if (i >= s || a[i] !== rank) return false;
    a.copyWithin(i, i + 1, s);
    if (s === 2) {
      this.#devInline[node] = a[0] as number;
      this.#devArr[node] = undefined;
      this.#devArrBytes -= a.byteLength;
    }
    this.#devSize[node] = s - 1;
    return true;
  }

  // =============================================================== nodes

  /**
   * Whether `a` is `node` or one of its ancestors. Depths rule out most pairs at once; otherwise
   * the walk climbs depth(node) - depth(a) edges. Only a hash that moved to another parent gets
   * here, which chained engine hashes never do.
   */
  #isAncestorOrSelf(a: number, node: number): boolean {
    const target = this.#depth[a] as number;
    let x = node;
    let d = this.#depth[x] as number;
    if (target > d) return false;
    while (d > target) {
      x = this.#parent[x] as number;
      d--;
    }
    return x === a;
  }

  /**
   * Child of `parent` keyed by local hash (hi, lo), or -1. Most nodes along a cached chain have a
   * single child, created right after its parent (adjacent ids, same cache lines), so checking the
   * head of the sibling list first skips the partition-wide table, whose random probes cost a cache
   * miss each with millions of nodes: that miss dominated the match walk (`npm run bench:core`).
   */
  #childOf(parent: number, hi: number, lo: number): number {
    const c = this.#firstChild[parent] as number;
    if (c === NONE) return NONE;
    if (this.#keyLo[c] === lo && this.#keyHi[c] === hi) return c;
    if (this.#nextSib[c] === NONE) return NONE;
    return this.#children.get(parent, hi, lo);
  }

  #newNode(parent: number, hi: number, lo: number): number {
    let id = this.#free.pop();
    if (id === undefined) {
      if (this.#nextNode === this.#nodeCap) this.#growNodes(this.#nodeCap * 2);
      id = this.#nextNode++;
    }
    this.#parent[id] = parent;
    this.#keyHi[id] = hi;
    this.#keyLo[id] = lo;
    this.#firstChild[id] = NONE;
    this.#holders[id] = 0;
    this.#depth[id] = (this.#depth[parent] as number) + 1;
    this.#devSize[id] = 0;
    const head = this.#firstChild[parent] as number;
    this.#nextSib[id] = head;
    this.#prevSib[id] = NONE;
    if (head !== NONE) {
      this.#prevSib[head] = id;
      // The parent now has two or more children: every one of them must be in the table.
      if (this.#inChildren[head] === 0) {
        this.#children.set(parent, this.#keyHi[head] as number, this.#keyLo[head] as number, head);
        this.#inChildren[head] = 1;
      }
      this.#children.set(parent, hi, lo, id);
      this.#inChildren[id] = 1;
    } else {
      this.#inChildren[id] = 0;
    }
    this.#firstChild[parent] = id;
    this.#liveNodes++;
    return id;
  }

  /** Frees the node and then each ancestor left with no holders and no children. */
  #maybePrune(node: number): void {
    let x = node;
    while (x !== ROOT && this.#holders[x] === 0 && this.#firstChild[x] === NONE) {
      const p = this.#parent[x] as number;
      if (this.#inChildren[x] === 1) {
        this.#children.delete(p, this.#keyHi[x] as number, this.#keyLo[x] as number);
        this.#inChildren[x] = 0;
      }
      const prev = this.#prevSib[x] as number;
      const next = this.#nextSib[x] as number;
      if (prev !== NONE) this.#nextSib[prev] = next;
      else this.#firstChild[p] = next;
      if (next !== NONE) this.#prevSib[next] = prev;
      const arr = this.#devArr[x];
      if (arr !== undefined) {
        this.#devArrBytes -= arr.byteLength;
        this.#devArr[x] = undefined;
      }
      if (this.#aux[x] !== undefined) {
        this.#aux[x] = undefined;
        this.#auxCount--;
      }
      this.#devSize[x] = 0;
      this.#parent[x] = NONE;
      this.#free.push(x);
      this.#liveNodes--;
      x = p;
    }
  }

  #growNodes(cap: number): void {
    this.#parent = grownTo(this.#parent, cap);
    this.#keyHi = grownTo(this.#keyHi, cap);
    this.#keyLo = grownTo(this.#keyLo, cap);
    this.#firstChild = grownTo(this.#firstChild, cap);
    this.#nextSib = grownTo(this.#nextSib, cap);
    this.#prevSib = grownTo(this.#prevSib, cap);
    this.#holders = grownTo(this.#holders, cap);
    this.#depth = grownTo(this.#depth, cap);
    this.#devSize = grownTo(this.#devSize, cap);
    this.#devInline = grownTo(this.#devInline, cap);
    this.#inChildren = grownTo(this.#inChildren, cap);
    for (let i = this.#nodeCap; i < cap; i++) {
      this.#devArr.push(undefined);
      this.#aux.push(undefined);
    }
    this.#nodeCap = cap;
  }

  #growRanks(minCap: number): void {
    let cap = Math.max(this.#rankCap, INITIAL_RANK_CAPACITY);
    while (cap < minCap) cap *= 2;
    const detached = new Int32Array(cap);
    detached.set(this.#detachedCount);
    this.#detachedCount = detached;
    const slotOf = new Int32Array(cap).fill(NONE);
    slotOf.set(this.#slotOf);
    this.#slotOf = slotOf;
    for (let i = this.#rankCap; i < cap; i++) this.#lookups.push(undefined);
    this.#rankCap = cap;
  }
}
