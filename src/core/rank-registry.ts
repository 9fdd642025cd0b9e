/**
 * Interns `(worker_id, dp_rank)` pairs of one partition as small integers ("rank keys"), so the
 * hot structures (prefix index, load ledger, candidate buffers) index typed arrays instead of
 * hashing bigints. Released keys are reused, keeping arrays dense.
 */
import type { WorkerId } from "./types.js";
import { spreadKey } from "./tie-spread.js";

/**
 * Rank keys live in [0, MAX_RANK_KEYS) (exclusive bound): 2^20 ranks, far past any fleet, keeps
 * the per-rank typed arrays of the prefix index and the load ledger addressable by small ints.
 */
export const MAX_RANK_KEYS = 1 << 20;

export class RankRegistry {
  readonly #byPair = new Map<string, number>();
  readonly #worker: WorkerId[] = [];
  readonly #dpRank: number[] = [];
  /** Per rank, its class key for spreading ties across replicas (src/core/tie-spread.ts). */
  readonly spreadKeys: number[] = [];
  readonly #live: boolean[] = [];
  readonly #free: number[] = [];

  static pairKey(workerId: WorkerId, dpRank: number): string {
    return `${workerId}/${dpRank}`;
  }

  /** Upper bound (exclusive) of rank keys ever handed out: the size typed buffers need. */
  get capacity(): number {
    return this.#worker.length;
  }

  get(workerId: WorkerId, dpRank: number): number | undefined {
    return this.#byPair.get(RankRegistry.pairKey(workerId, dpRank));
  }

  intern(workerId: WorkerId, dpRank: number): number {
    const k = RankRegistry.pairKey(workerId, dpRank);
    const existing = this.#byPair.get(k);
    if (existing !== undefined) return existing;
    const rank = this.#free.pop() ?? this.#worker.length;
    this.#worker[rank] = workerId;
    this.#dpRank[rank] = dpRank;
    this.spreadKeys[rank] = spreadKey(workerId, dpRank);
    this.#live[rank] = true;
    this.#byPair.set(k, rank);
    return rank;
  }

  release(rank: number): void {
    if (this.#live[rank] !== true) return;
    this.#byPair.delete(RankRegistry.pairKey(this.workerOf(rank), this.dpRankOf(rank)));
    this.#live[rank] = false;
    this.#free.push(rank);
  }

  workerOf(rank: number): WorkerId {
    const w = this.#worker[rank];
    // Assertion (a programming error, never input): callers hold rank keys this registry issued.
    if (w === undefined) throw new RangeError(`rank key ${rank} was never interned`);
    return w;
  }

  dpRankOf(rank: number): number {
    return this.#dpRank[rank] ?? 0;
  }
}
