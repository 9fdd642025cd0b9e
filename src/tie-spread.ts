/**
 * Spreads ties (and near-ties) of the argmin differently on each replica of a mesh.
 *
 * Two replicas that pick for new requests in the same instant see the same loads and, with a
 * random tie-break among T equally good workers, choose the same one with probability 1/T
 * before either booking reaches the other (the select-to-book race). Here each replica takes
 * the tied candidates in the same order (candidates are ordered by worker id everywhere) and
 * replica `index` of `count` picks position index, index + count, index + 2*count, ... on its
 * successive selections: two replicas never pick the same tied worker while there are at least
 * `count` of them.
 */

export interface ReplicaSlot {
  /** This replica's position among the live replicas (sorted by replica id). */
  readonly index: number;
  readonly count: number;
}

/** Costs within this many blocks of the minimum count as tied: less than one block of work. */
export const DEFAULT_NEAR_TIE_BLOCKS = 0.5;

export class TieSpreader {
  readonly #slot: () => ReplicaSlot;
  readonly #nearTie: number;
  #turn = 0;
  #tied = new Int32Array(16);

  constructor(slot: () => ReplicaSlot, nearTieBlocks = DEFAULT_NEAR_TIE_BLOCKS) {
    if (!(nearTieBlocks >= 0)) throw new RangeError("nearTieBlocks must be >= 0");
    this.#slot = slot;
    this.#nearTie = nearTieBlocks;
  }

  /** The candidate to use, given the costs of `n` candidates and the argmin's own choice. */
  pick(costs: Float64Array, n: number, chosen: number): number {
    const { index, count } = this.#slot();
    if (count <= 1 || n <= 1) return chosen;
    const limit = (costs[chosen] as number) + this.#nearTie;
    if (this.#tied.length < n) this.#tied = new Int32Array(Math.max(n, this.#tied.length * 2));
    let t = 0;
    for (let i = 0; i < n; i++) if ((costs[i] as number) <= limit) this.#tied[t++] = i;
    if (t <= 1) return chosen;
    const k = (index + this.#turn * count) % t;
    this.#turn++;
    return this.#tied[k] as number;
  }
}
