/**
 * Peers' load on ONE partition's ranks, as per-(origin, rank) aggregates: what each peer replica
 * has booked on each rank (prefill tokens still owed, unique active blocks, requests), summed
 * per rank for the selector.
 *
 * Why aggregates instead of each peer's bookings (the exact mode): mirroring a booking means
 * decoding its sequence hashes (hundreds for a long prompt) and indexing them, plus a message's
 * overhead, per replicated request, so 4 replicas routed well under 4x one (`npm run bench:scale
 * -- --load-replication exact` against the default). An origin instead publishes, at most once per aggregation interval, the
 * absolute totals of the ranks that changed; a peer's cost then follows the interval, not the
 * request rate. Absolute values (not deltas) make an update idempotent and let a lost one be
 * repaired by the next update or a snapshot.
 *
 * The price: a prefix that two replicas booked on the same rank counts once in each origin's
 * total, so twice in the sum (the exact ledger counts it once). See docs/benchmarks.md
 * (Scale-out figures) for what that measured to cost in decisions.
 */

/** One rank's totals from one origin. */
export interface RankAggregate {
  prefillTokens: number;
  blocks: number;
  requests: number;
}

/** Values this close to zero are zero: float sums of decayed prefill must not leave 1e-13 ghosts. */
const EPSILON = 1e-9;
const INITIAL_RANKS = 64;

export class MirroredLoad {
  /** origin -> rank -> its last published totals for that rank. */
  readonly #byOrigin = new Map<bigint, Map<number, RankAggregate>>();
  #prefill = new Float64Array(INITIAL_RANKS);
  #blocks = new Float64Array(INITIAL_RANKS);
  #requests = new Float64Array(INITIAL_RANKS);
  /** Per rank: how many origins hold a non-zero row (all gone: the sums reset to exact zero). */
  #holders = new Int32Array(INITIAL_RANKS);
  /** Ranks with any peer load: lets callers skip the sums for an idle fleet. */
  #loadedRanks = 0;

  get loadedRanks(): number {
    return this.#loadedRanks;
  }

  /** Sets `origin`'s totals on `rank` (all zero removes its row). */
  set(origin: bigint, rank: number, prefillTokens: number, blocks: number, requests: number): void {
    let rows = this.#byOrigin.get(origin);
    const prev = rows?.get(rank);
    const zero = requests <= 0 && Math.abs(blocks) < EPSILON && Math.abs(prefillTokens) < EPSILON;
    if (prev === undefined && zero) return;
    this.#ensure(rank);
    if (prev !== undefined) {
      this.#prefill[rank] = (this.#prefill[rank] as number) - prev.prefillTokens;
      this.#blocks[rank] = (this.#blocks[rank] as number) - prev.blocks;
      this.#requests[rank] = (this.#requests[rank] as number) - prev.requests;
    }
    if (zero) {
      rows?.delete(rank);
      if (rows?.size === 0) this.#byOrigin.delete(origin);
      this.#release(rank);
      return;
    }
    if (rows === undefined) {
      rows = new Map();
      this.#byOrigin.set(origin, rows);
    }
    if (prev === undefined) {
      rows.set(rank, { prefillTokens, blocks, requests });
      if ((this.#holders[rank] as number) === 0) this.#loadedRanks++;
      this.#holders[rank] = (this.#holders[rank] as number) + 1;
    } else {
      prev.prefillTokens = prefillTokens;
      prev.blocks = blocks;
      prev.requests = requests;
    }
    this.#prefill[rank] = (this.#prefill[rank] as number) + prefillTokens;
    this.#blocks[rank] = (this.#blocks[rank] as number) + blocks;
    this.#requests[rank] = (this.#requests[rank] as number) + requests;
  }

  /** Replaces everything `origin` holds with `rows` (a snapshot): ranks it omits go to zero. */
  replaceOrigin(origin: bigint, rows: Iterable<readonly [rank: number, agg: RankAggregate]>): void {
    const keep = new Set<number>();
    for (const [rank, a] of rows) {
      keep.add(rank);
      this.set(origin, rank, a.prefillTokens, a.blocks, a.requests);
    }
    const held = this.#byOrigin.get(origin);
    if (held === undefined) return;
    for (const rank of [...held.keys()]) if (!keep.has(rank)) this.set(origin, rank, 0, 0, 0);
  }

  /** Forgets `origin` entirely (a deregistered or long-silent peer); returns the requests it held. */
  dropOrigin(origin: bigint): number {
    const held = this.#byOrigin.get(origin);
    if (held === undefined) return 0;
    let requests = 0;
    for (const [rank, a] of [...held]) {
      requests += a.requests;
      this.set(origin, rank, 0, 0, 0);
    }
    return requests;
  }

  /** A rank left the partition (its worker was removed): every origin's row for it goes. */
  dropRank(rank: number): void {
    if (rank >= this.#holders.length || this.#holders[rank] === 0) return;
    for (const origin of [...this.#byOrigin.keys()]) this.set(origin, rank, 0, 0, 0);
  }

  prefillTokens(rank: number): number {
    return rank < this.#prefill.length ? (this.#prefill[rank] as number) : 0;
  }

  blocks(rank: number): number {
    return rank < this.#blocks.length ? (this.#blocks[rank] as number) : 0;
  }

  requests(rank: number): number {
    return rank < this.#requests.length ? (this.#requests[rank] as number) : 0;
  }

  /** Live requests `origin` reports across this partition (the heartbeat divergence check). */
  requestsOf(origin: bigint): number {
    let n = 0;
    for (const a of this.#byOrigin.get(origin)?.values() ?? []) n += a.requests;
    return n;
  }

  /** `origin`'s row on one rank, if it has one. */
  rowOf(origin: bigint, rank: number): Readonly<RankAggregate> | undefined {
    return this.#byOrigin.get(origin)?.get(rank);
  }

  /** `origin`'s rows, for snapshots and diagnostics. */
  rowsOf(origin: bigint): [number, RankAggregate][] {
    return [...(this.#byOrigin.get(origin) ?? [])].map(([rank, a]) => [rank, { ...a }]);
  }

  origins(): IterableIterator<bigint> {
    return this.#byOrigin.keys();
  }

  #release(rank: number): void {
    const n = (this.#holders[rank] as number) - 1;
    this.#holders[rank] = n;
    if (n === 0) {
      this.#loadedRanks--;
      this.#prefill[rank] = 0;
      this.#blocks[rank] = 0;
      this.#requests[rank] = 0;
    }
  }

  #ensure(rank: number): void {
    if (rank < this.#holders.length) return;
    let size = this.#holders.length;
    while (size <= rank) size *= 2;
    const grow = <T extends Float64Array | Int32Array>(a: T, make: (n: number) => T): T => {
      const b = make(size);
      b.set(a);
      return b;
    };
    this.#prefill = grow(this.#prefill, (n) => new Float64Array(n));
    this.#blocks = grow(this.#blocks, (n) => new Float64Array(n));
    this.#requests = grow(this.#requests, (n) => new Float64Array(n));
    this.#holders = grow(this.#holders, (n) => new Int32Array(n));
  }
}
