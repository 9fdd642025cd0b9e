import { describe, expect, it } from "vitest";
import { seededRandom } from "../../../src/core/random.js";
import { ActiveBlockIndex, NO_CHANGE, PAIR_CREATED, type RankBlockTotals } from "../../../src/core/active-block-index.js";

/**
 * The index keeps a hash's only holder inline in its slot and moves holders to a pool run when a
 * second rank joins or a weight other than 1 is set, and back inline when one holder at weight 1
 * is left. These tests drive every transition against a naive (hash, rank) -> refs/weight map.
 */
type Pair = { refs: number; weight: number };

class Naive {
  readonly pairs = new Map<string, Map<number, Pair>>();

  holders(key: string): Map<number, Pair> {
    let m = this.pairs.get(key);
    if (m === undefined) {
      m = new Map();
      this.pairs.set(key, m);
    }
    return m;
  }
}

const keyOf = (hi: number, lo: number): string => `${hi >>> 0}:${lo >>> 0}`;

function totalsOf(naive: Naive, rank: number): RankBlockTotals {
  const t: RankBlockTotals = { uniqueBlocks: 0, fractionalCount: 0, fractionalDeficit: 0 };
  for (const m of naive.pairs.values()) {
    const p = m.get(rank);
    if (p === undefined) continue;
    t.uniqueBlocks++;
    if (p.weight < 1) {
      t.fractionalCount++;
      t.fractionalDeficit += 1 - p.weight;
    }
  }
  return t;
}

describe("ActiveBlockIndex", () => {
  it("counts, books and frees like a naive map through inline and run holders, weights included", () => {
    const rng = seededRandom(7);
    const int = (n: number): number => Math.floor(rng.next() * n);
    const RANKS = 6;
    const index = new ActiveBlockIndex(16);
    const naive = new Naive();
    const totals = Array.from({ length: RANKS }, (): RankBlockTotals => ({ uniqueBlocks: 0, fractionalCount: 0, fractionalDeficit: 0 }));
    // Few distinct hashes (two high words, small low words) so pairs are shared, runs grow and
    // shrink, and the table grows and backward-shifts.
    const hashes = Array.from({ length: 40 }, (_, i) => [i % 2 === 0 ? 0 : 0x7eadbeef, 1 + (i >> 1)] as const);
    const listOf = (picks: number[]): Uint32Array => {
      const l = new Uint32Array(picks.length * 2);
      picks.forEach((h, i) => {
        const [hi, lo] = hashes[h] as readonly [number, number];
        l[2 * i] = hi;
        l[2 * i + 1] = lo;
      });
      return l;
    };
    /** Live bookings: rank and hash picks (a hash at most once per booking, as a prompt's chain). */
    const live: { rank: number; picks: number[] }[] = [];

    for (let step = 0; step < 4000; step++) {
      const op = rng.next();
      if (op < 0.45 || live.length === 0) {
        const rank = int(RANKS);
        const picks = [...new Set(Array.from({ length: 1 + int(12) }, () => int(hashes.length)))];
        const list = listOf(picks);
        // Half the bookings follow a selection's countHolders over the same list (touchAll's memo).
        if (rng.next() < 0.5) index.countHolders(list, new Int32Array(RANKS), []);
        index.touchAll(list, rank, totals[rank] as RankBlockTotals);
        for (const h of picks) {
          const [hi, lo] = hashes[h] as readonly [number, number];
          const p = naive.holders(keyOf(hi, lo)).get(rank);
          if (p === undefined) naive.holders(keyOf(hi, lo)).set(rank, { refs: 1, weight: 1 });
          else {
            p.refs++;
            p.weight = 1;
          }
        }
        live.push({ rank, picks });
      } else if (op < 0.85) {
        const [b] = live.splice(int(live.length), 1);
        if (b === undefined) continue;
        index.untouchAll(listOf(b.picks), b.rank, totals[b.rank] as RankBlockTotals);
        for (const h of b.picks) {
          const [hi, lo] = hashes[h] as readonly [number, number];
          const m = naive.holders(keyOf(hi, lo));
          const p = m.get(b.rank) as Pair;
          if (--p.refs === 0) m.delete(b.rank);
        }
      } else if (op < 0.95) {
        // Down-weight a pair (addOutputBlock's decay): only when one reference holds it.
        const h = int(hashes.length);
        const rank = int(RANKS);
        const weight = rng.next() < 0.2 ? 1 : Math.round(rng.next() * 100) / 100;
        const [hi, lo] = hashes[h] as readonly [number, number];
        const p = naive.holders(keyOf(hi, lo)).get(rank);
        const got = index.setWeightIfExclusive(hi, lo, rank, weight);
        if (p === undefined || p.refs !== 1) {
          expect(got).toBe(NO_CHANGE);
        } else {
          expect(got).toBe(p.weight);
          p.weight = weight;
        }
      } else {
        // One pair through touch(): its previous weight, or PAIR_CREATED.
        const h = int(hashes.length);
        const rank = int(RANKS);
        const [hi, lo] = hashes[h] as readonly [number, number];
        const p = naive.holders(keyOf(hi, lo)).get(rank);
        const got = index.touch(hi, lo, rank);
        if (p === undefined) {
          expect(got).toBe(PAIR_CREATED);
          naive.holders(keyOf(hi, lo)).set(rank, { refs: 1, weight: 1 });
        } else {
          expect(got).toBe(p.weight);
          p.refs++;
          p.weight = 1;
        }
        // Book it so a later free returns it.
        live.push({ rank, picks: [h] });
        // touch() leaves the totals to its caller; mirror what touchAll would have done.
        const st = totals[rank] as RankBlockTotals;
        if (got === PAIR_CREATED) st.uniqueBlocks++;
        else if (got < 1) {
          st.fractionalCount--;
          st.fractionalDeficit = st.fractionalCount === 0 ? 0 : st.fractionalDeficit - (1 - got);
        }
      }
      // Weights set through setWeightIfExclusive are the caller's to total (the ledger's): recompute here.
      if (step % 50 === 0 || step === 3999) {
        const query = Array.from({ length: hashes.length }, (_, i) => i);
        const out = new Int32Array(RANKS);
        const touched: number[] = [];
        index.countHolders(listOf(query), out, touched);
        for (let r = 0; r < RANKS; r++) {
          let expected = 0;
          for (const h of query) {
            const [hi, lo] = hashes[h] as readonly [number, number];
            if (naive.pairs.get(keyOf(hi, lo))?.has(r) === true) expected++;
          }
          expect(out[r], `rank ${r} holders at step ${step}`).toBe(expected);
          expect(touched.includes(r)).toBe(expected > 0);
          expect((totals[r] as RankBlockTotals).uniqueBlocks).toBe(totalsOf(naive, r).uniqueBlocks);
        }
        let pairs = 0;
        for (const m of naive.pairs.values()) if (m.size > 0) pairs++;
        expect(index.size).toBe(pairs);
      }
    }
  });

  it("moves a pair between inline and a run as a second rank joins and leaves, refcounts kept", () => {
    const index = new ActiveBlockIndex();
    const st = (): RankBlockTotals => ({ uniqueBlocks: 0, fractionalCount: 0, fractionalDeficit: 0 });
    const [a, b] = [st(), st()];
    const list = new Uint32Array([0xabc, 0x123]);
    const count = (): number[] => {
      const out = new Int32Array(3);
      index.countHolders(list, out, []);
      return [...out];
    };
    index.touchAll(list, 1, a);
    index.touchAll(list, 1, a); // inline, two references
    expect(count()).toEqual([0, 1, 0]);
    index.touchAll(list, 2, b); // a run of two ranks
    expect(count()).toEqual([0, 1, 1]);
    index.untouchAll(list, 2, b); // back inline, rank 1 with its two references
    expect(count()).toEqual([0, 1, 0]);
    index.untouchAll(list, 1, a);
    expect(count()).toEqual([0, 1, 0]);
    index.untouchAll(list, 1, a);
    expect(count()).toEqual([0, 0, 0]);
    expect(index.size).toBe(0);
    expect([a.uniqueBlocks, b.uniqueBlocks]).toEqual([0, 0]);
  });
});
