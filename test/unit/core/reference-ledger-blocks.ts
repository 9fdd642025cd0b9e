/**
 * The load ledger's active blocks as they were before the prefix tree (active-prefix-trie.ts):
 * the per-hash reverse index (ActiveBlockIndex, unchanged) driven exactly as LoadLedger drove
 * it, so an oracle test can feed it the ledger's operations and compare every count and total.
 */
import { ActiveBlockIndex, dropFraction, NO_CHANGE, PAIR_CREATED, type RankBlockTotals } from "../../../src/core/active-block-index.js";
import type { Random } from "../../../src/core/random.js";

const TWO_POW_32 = 4294967296;

interface Booking {
  rank: number;
  hashes: Uint32Array;
  output: number[];
}

export class ReferenceLedgerBlocks {
  readonly #index = new ActiveBlockIndex();
  readonly #bookings = new Map<string, Booking>();
  readonly #totals = new Map<number, RankBlockTotals>();
  readonly #random: Random;

  /** `random`: seeded as the ledger's, which draws an output block's hash from it (and nothing else). */
  constructor(random: Random) {
    this.#random = random;
  }

  get distinctActiveHashes(): number {
    return this.#index.size;
  }

  #st(rank: number): RankBlockTotals {
    let st = this.#totals.get(rank);
    if (st === undefined) {
      st = { uniqueBlocks: 0, fractionalCount: 0, fractionalDeficit: 0 };
      this.#totals.set(rank, st);
    }
    return st;
  }

  activeBlocks(rank: number): number {
    const st = this.#totals.get(rank);
    return st === undefined ? 0 : st.uniqueBlocks - st.fractionalDeficit;
  }

  add(id: string, rank: number, hashes: Uint32Array): void {
    const b: Booking = { rank, hashes: hashes.slice(), output: [] };
    this.#bookings.set(id, b);
    this.#index.touchAll(hashes, rank, this.#st(rank));
  }

  free(id: string): void {
    const b = this.#bookings.get(id);
    if (b === undefined) return;
    this.#bookings.delete(id);
    const st = this.#st(b.rank);
    this.#index.untouchAll(b.hashes, b.rank, st);
    if (b.output.length > 0) this.#index.untouchAll(Uint32Array.from(b.output), b.rank, st);
  }

  removeRank(rank: number): void {
    for (const [id, b] of [...this.#bookings]) if (b.rank === rank) this.free(id);
    this.#totals.delete(rank);
  }

  addOutputBlock(id: string, decayFraction?: number): void {
    const b = this.#bookings.get(id);
    if (b === undefined) return;
    const st = this.#st(b.rank);
    const hi = Math.floor(this.#random.next() * TWO_POW_32) >>> 0;
    const lo = Math.floor(this.#random.next() * TWO_POW_32) >>> 0;
    b.output.push(hi, lo);
    const previous = this.#index.touch(hi, lo, b.rank);
    if (previous === PAIR_CREATED) st.uniqueBlocks++;
    else if (previous < 1) dropFraction(st, previous);
    if (decayFraction !== undefined) {
      this.#weigh(b.hashes, b.rank, st, decayFraction);
      this.#weigh(b.output, b.rank, st, decayFraction);
    }
  }

  #weigh(pairs: ArrayLike<number>, rank: number, st: RankBlockTotals, weight: number): void {
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

  newBlocksFor(hashes: Uint32Array, out: Int32Array, touched: number[]): void {
    if (this.#index.size === 0) return;
    this.#index.countHolders(hashes, out, touched);
  }
}
