/**
 * The warm join's decoding thread merges the ranks of a peer's index into whole partition trees
 * (PrefixTreeBuilder), one per partition, for the main thread to adopt at the end of the pull
 * (PrefixIndex.adoptTree) instead of installing rank by rank.
 *
 * The thread knows this replica's ranks from `targets`, taken when the pull starts: each rank's
 * key here (the rank keys index the device sets, so a tree is built in this replica's numbering)
 * and its index bound (rank-index-bound.ts, from the worker's total_kv_blocks then). A snapshot
 * rank with no target (a worker that registered since, or another block size) is handed back
 * whole, to be installed rank by rank as before. Pure: no I/O, no thread of its own.
 */
import type { IndexRankSnapshot } from "./index-snapshot.js";
import { PrefixTreeBuilder } from "./prefix-tree-builder.js";
import type { PrefixTreeImage } from "./prefix-tree-image.js";
import type { WorkerId } from "./types.js";

/** A rank of this replica the thread may merge: where it lives here and how many pairs it may hold. */
export interface IndexRankTarget extends Omit<IndexRankSnapshot, "entries" | "position"> {
  /** Its rank key in its partition's index. */
  readonly rank: number;
  /** Its index bound (rankIndexBound), pairs. */
  readonly bound: number;
}

/** A snapshot rank merged into its partition's tree: what the main thread needs of it until the tree comes. */
export interface MergedRank extends Omit<IndexRankSnapshot, "entries"> {
  readonly rank: number;
  /** Pairs it holds in the tree (past its bound: the rest counted in the tree's shed pairs). */
  readonly blocks: number;
}

export interface IndexPartitionTree {
  readonly modelName: string;
  readonly routingGroup: string;
  readonly image: PrefixTreeImage;
}

const partitionOf = (modelName: string, routingGroup: string): string => `${modelName}\u0000${routingGroup}`;
const rankOf = (modelName: string, routingGroup: string, workerId: WorkerId, dpRank: number): string => `${partitionOf(modelName, routingGroup)}\u0000${workerId}\u0000${dpRank}`;

export class IndexTreeMerger {
  readonly #targets = new Map<string, IndexRankTarget>();
  readonly #trees = new Map<string, { modelName: string; routingGroup: string; builder: PrefixTreeBuilder }>();

  constructor(targets: readonly IndexRankTarget[]) {
    for (const t of targets) this.#targets.set(rankOf(t.modelName, t.routingGroup, t.workerId, t.dpRank), t);
  }

  /**
   * Merges each rank this replica has a target for into its partition's tree; returns those
   * (without their blocks) and the others, whole. Throws (badRequest) on a rank met twice.
   */
  take(ranks: readonly IndexRankSnapshot[]): { merged: MergedRank[]; rest: IndexRankSnapshot[] } {
    const merged: MergedRank[] = [];
    const rest: IndexRankSnapshot[] = [];
    for (const s of ranks) {
      const t = this.#targets.get(rankOf(s.modelName, s.routingGroup, s.workerId, s.dpRank));
      if (t === undefined || t.blockSize !== s.blockSize) {
        rest.push(s);
        continue;
      }
      const pk = partitionOf(s.modelName, s.routingGroup);
      let tree = this.#trees.get(pk);
      if (tree === undefined) {
        tree = { modelName: s.modelName, routingGroup: s.routingGroup, builder: new PrefixTreeBuilder() };
        this.#trees.set(pk, tree);
      }
      const blocks = tree.builder.add(t.rank, s.entries, t.bound);
      merged.push({ modelName: s.modelName, routingGroup: s.routingGroup, blockSize: s.blockSize, workerId: s.workerId, dpRank: s.dpRank, position: s.position, rank: t.rank, blocks });
    }
    return { merged, rest };
  }

  /** Every partition's tree; the merger is spent afterwards. */
  build(): IndexPartitionTree[] {
    return [...this.#trees.values()].map((t) => ({ modelName: t.modelName, routingGroup: t.routingGroup, image: t.builder.build() }));
  }
}
