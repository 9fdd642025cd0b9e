/**
 * Spreads ties (and near-ties) of the argmin differently on each replica of a mesh.
 *
 * Two replicas that pick for new requests in the same instant see the same loads and, with a
 * random tie-break among T equally good workers, choose the same one with probability 1/T
 * before either booking reaches the other (the select-to-book race). Here every worker rank
 * belongs to one of `count` classes by a hash of its (worker id, dp rank), the same on every
 * replica, and replica `index` picks at random among the tied candidates of class `index`:
 * two replicas racing over the same ties never pick the same worker while each has a tied
 * candidate in its class. Outside its class it falls back to the plain random tie-break.
 *
 * Why classes by id and not by position in the tied list (the first version): positions shift
 * as soon as one booking makes a worker untied, so racing replicas' "own" positions collided
 * systematically: `npm run bench:mesh` counts new sessions placed on the same worker by two
 * replicas within 50 ms, which position classes made far more frequent than the plain random
 * tie-break (--no-replica-tie-spread), and id classes do not.
 * With 1,024 idle workers random ties rarely collide; classes matter when few workers tie (a hot
 * prefix cached on 3 workers collides 1 time in 3 per racing pair with a random tie-break).
 */
import { badRequest } from "./errors.js";
import type { Random } from "./random.js";

export interface ReplicaSlot {
  /** This replica's position among the live replicas (sorted by replica id). */
  readonly index: number;
  readonly count: number;
}

/** Costs within this many blocks of the minimum count as tied: less than one block of work. */
export const DEFAULT_NEAR_TIE_BLOCKS = 0.5;

/** murmur3's 32-bit finalizer (fmix32): a 32-bit avalanche. */
function fmix32(x: number): number {
  let h = x;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** A rank's key: consecutive worker ids land in unrelated classes. */
export function spreadKey(workerId: bigint, dpRank: number): number {
  return fmix32(Number(BigInt.asUintN(32, workerId)) ^ Math.imul(Number(BigInt.asUintN(32, workerId >> 32n)), 0x85ebca6b) ^ Math.imul(dpRank + 1, 0x9e3779b1));
}

/**
 * The key of a prompt no rank has cached or in flight (`deepest` = 0, the deepest overlap over
 * every rank, predictions included): the hash of its block PREFIX_KEY_BLOCKS - 1 (or its last), 0
 * otherwise. Replicas racing over such a prompt pick among its ties by this key (see pick), so the
 * same new prefix goes to the same worker from every replica, which classes would spread apart:
 * 32 requests sharing a new 8k-token prefix over 4 replicas landed on 4 workers before issue 25.
 */
export function newPrefixKey(seqHashes: ArrayLike<number>, deepest: number): number {
  const n = seqHashes.length >>> 1;
  if (deepest > 0 || n === 0) return 0;
  const d = Math.min(n, PREFIX_KEY_BLOCKS) - 1;
  return ((seqHashes[2 * d] as number) ^ Math.imul(seqHashes[2 * d + 1] as number, 0x9e3779b1)) >>> 0 || 1;
}

/** Blocks of a new prompt its tie-break key covers: 16 (256 tokens at block size 16), the predicted cache's checkpoint spacing. */
export const PREFIX_KEY_BLOCKS = 16;

export class TieSpreader {
  readonly #slot: () => ReplicaSlot;
  readonly #random: Random;
  readonly #nearTie: number;
  #tied = new Int32Array(16);
  /** The selection in progress' newPrefixKey (0: none; the replica's class decides). */
  #prefixKey = 0;

  constructor(slot: () => ReplicaSlot, random: Random, nearTieBlocks = DEFAULT_NEAR_TIE_BLOCKS) {
    if (!(nearTieBlocks >= 0)) throw badRequest("nearTieBlocks must be >= 0", "nearTieBlocks");
    this.#slot = slot;
    this.#random = random;
    this.#nearTie = nearTieBlocks;
  }

  /** Set by the chooser for each selection (newPrefixKey). */
  setPrefixKey(key: number): void {
    this.#prefixKey = key;
  }

  /** Costs within this of the argmin's count as tied (candidate-scan.ts scores every rank that close). */
  get nearTieBlocks(): number {
    return this.#nearTie;
  }

  /**
   * The candidate to use, given the costs of `n` candidates, the argmin's own choice, and each
   * candidate's spread key (`keys[candidates[i]]`, see spreadKey). `eligible`: how many candidates
   * the request had, when the `n` given are only those that can tie (candidate-scan.ts): a lone
   * eligible candidate is kept without a draw, and the draw must not depend on how many were scored.
   */
  pick(costs: Float64Array, n: number, chosen: number, candidates: ArrayLike<number>, keys: ArrayLike<number>, eligible = n): number {
    if (eligible <= 1) return chosen;
    const limit = (costs[chosen] as number) + this.#nearTie;
    const prefix = this.#prefixKey;
    // Before the slot: a replica that has not counted its peers yet must still agree with them.
    if (prefix !== 0) {
      // A new prefix: the tie with the highest rendezvous weight, the same on every replica (no draw).
      let best = chosen;
      let bestWeight = -1;
      for (let i = 0; i < n; i++) {
        if (!((costs[i] as number) <= limit)) continue;
        const w = rendezvous(keys[candidates[i] as number] as number, prefix);
        if (w > bestWeight) {
          bestWeight = w;
          best = i;
        }
      }
      return best;
    }
    const { index, count } = this.#slot();
    if (count <= 1) return chosen;
    if (this.#tied.length < n) this.#tied = new Int32Array(Math.max(n, this.#tied.length * 2));
    let t = 0;
    for (let i = 0; i < n; i++) {
      if ((costs[i] as number) <= limit && (keys[candidates[i] as number] as number) % count === index) this.#tied[t++] = i;
    }
    if (t === 0) return chosen;
    return this.#tied[Math.floor(this.#random.next() * t)] as number;
  }
}

/** Highest-random-weight hashing of (worker rank, prompt): fmix32 of the two keys mixed. */
function rendezvous(rankKey: number, prefixKey: number): number {
  return fmix32((rankKey ^ Math.imul(prefixKey, 0x85ebca6b)) >>> 0);
}
