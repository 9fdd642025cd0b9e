/**
 * A partition's prefix tree as flat arrays in PrefixIndex's own layout: what PrefixTreeBuilder
 * (the warm join's decoding thread) hands over and PrefixIndex.adoptTree takes as it is. Its own
 * file so that neither of the two imports the other.
 */
/** A partition's tree in PrefixIndex's layout (node arrays all of one capacity; node 0 is the root). */
export interface PrefixTreeImage {
  /** Node ids in use are below this (freed ones listed in `free`). */
  readonly nextNode: number;
  readonly parent: Int32Array<ArrayBuffer>;
  readonly keyHi: Uint32Array<ArrayBuffer>;
  readonly keyLo: Uint32Array<ArrayBuffer>;
  readonly firstChild: Int32Array<ArrayBuffer>;
  readonly nextSib: Int32Array<ArrayBuffer>;
  readonly prevSib: Int32Array<ArrayBuffer>;
  readonly holders: Int32Array<ArrayBuffer>;
  readonly depth: Int32Array<ArrayBuffer>;
  /** Device holders (attached, prefix-closed): count; the member when 1; else `devStart` into `devMembers`. */
  readonly devSize: Int32Array<ArrayBuffer>;
  readonly devInline: Int32Array<ArrayBuffer>;
  readonly devStart: Int32Array<ArrayBuffer>;
  /** Every set of 2 or more members, each sorted, back to back. */
  readonly devMembers: Int32Array<ArrayBuffer>;
  /** Node ids left with no holder and pruned (PrefixIndex's free list). */
  readonly free: Int32Array<ArrayBuffer>;
  /** (parent, key hi, key lo) -> child, U64Table slots. */
  readonly children: { readonly slots: Int32Array; readonly size: number };
  /** Ranks (keys) with blocks, and each one's lookup table: (tier, sequence hash) -> node. */
  readonly ranks: Int32Array<ArrayBuffer>;
  readonly lookups: readonly { readonly slots: Int32Array; readonly size: number }[];
  /** Side-set memberships as (node, tier index, rank) triples: tier 0 a detached device holder, 1 host, 2 disk. */
  readonly aux: Int32Array<ArrayBuffer>;
  readonly pairs: number;
  readonly lowerPairs: number;
  /** Pairs refused at a rank's bound. */
  readonly shedPairs: number;
}

/** The typed arrays of an image, for a transfer list. */
export function prefixTreeBuffers(t: PrefixTreeImage): ArrayBuffer[] {
  const arrays = [t.parent, t.keyHi, t.keyLo, t.firstChild, t.nextSib, t.prevSib, t.holders, t.depth, t.devSize, t.devInline, t.devStart, t.devMembers, t.free, t.aux, t.children.slots, ...t.lookups.map((l) => l.slots)];
  return [...new Set(arrays.map((a) => a.buffer as ArrayBuffer))];
}

