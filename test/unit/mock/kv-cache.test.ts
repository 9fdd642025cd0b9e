import { describe, expect, it } from "vitest";

import { hashListFromBigInts } from "../../../src/core/index.js";
import { PagedKvCache } from "../../../src/mock/kv-cache.js";

const chain = (...hashes: number[]): Uint32Array => hashListFromBigInts(hashes.map(BigInt));
const big = (...hashes: number[]): bigint[] => hashes.map(BigInt);

/** Stores blocks [0, n) of `seq` as one request would, returning which were new. */
function storeAll(cache: PagedKvCache, seq: Uint32Array, n = seq.length / 2): boolean[] {
  const fresh: boolean[] = [];
  for (let i = 0; i < n; i++) fresh.push(cache.store(seq, i));
  return fresh;
}

function recordingCache(capacityBlocks: number): { cache: PagedKvCache; evicted: bigint[] } {
  const evicted: bigint[] = [];
  const cache = new PagedKvCache({ capacityBlocks, onEvict: (hi, lo) => evicted.push((BigInt(hi) << 32n) | BigInt(lo)) });
  return { cache, evicted };
}

describe("PagedKvCache", () => {
  it("matches leading cached blocks only, and a block already cached is pinned instead of stored again", () => {
    const { cache } = recordingCache(8);
    const a = chain(1, 2, 3);
    expect(storeAll(cache, a)).toEqual([true, true, true]);
    expect(cache.match(chain(1, 2, 3, 4))).toBe(3);
    expect(cache.match(chain(1, 9, 3))).toBe(1);
    expect(cache.match(chain(7, 2, 3))).toBe(0);
    expect(cache.match(chain(1, 2, 3), 2)).toBe(2);
    // A second request over the same prefix finds the blocks: no new block, refs go up.
    expect(storeAll(cache, chain(1, 2, 5))).toEqual([false, false, true]);
    expect(cache.cachedBlocks).toBe(4);
    expect(cache.blocks().find((b) => b.hash === 2n)).toEqual({ hash: 2n, parent: 1n, refs: 2 });
    expect(cache.blocks().find((b) => b.hash === 1n)?.parent).toBeNull();
    expect(cache.pinnedBlocks).toBe(4);
    expect(cache.evictableBlocks).toBe(0);
  });

  it("evicts least recently used first, leaves before the prefix they extend, and a hit refreshes a block", () => {
    const { cache, evicted } = recordingCache(4);
    const a = chain(10, 11);
    const b = chain(20, 21);
    storeAll(cache, a);
    cache.release(a, 2);
    storeAll(cache, b);
    cache.release(b, 2);
    // Released tail first: the leaf is the next victim, the root of each chain outlives it.
    expect(cache.lruOrder()).toEqual(big(11, 10, 21, 20));
    // A prefix hit on 10 moves it to the most-recently-used end.
    cache.pin(a, 0, 1);
    cache.release(a, 1);
    expect(cache.lruOrder()).toEqual(big(11, 21, 20, 10));

    const c = chain(30, 31);
    expect(storeAll(cache, c)).toEqual([true, true]);
    expect(evicted).toEqual(big(11, 21));
    expect(cache.evictions).toBe(2);
    expect(cache.match(chain(10, 11))).toBe(1);
    expect(cache.match(chain(20, 21))).toBe(1);
    expect(cache.cachedBlocks).toBe(4);
  });

  it("never evicts a pinned block: with everything pinned, allocation fails loudly instead", () => {
    const { cache, evicted } = recordingCache(3);
    const a = chain(1, 2, 3);
    storeAll(cache, a);
    expect(cache.availableBlocks).toBe(0);
    expect(() => cache.store(chain(9), 0)).toThrow(/no evictable block/);
    expect(() => {
      cache.reserveScratch(1);
    }).toThrow(/1 blocks requested, 0 available/);
    expect(evicted).toEqual([]);
    expect(cache.match(a)).toBe(3);

    // Partly released: only the unpinned block can go.
    cache.release(a, 3);
    cache.pin(a, 0, 2);
    expect(cache.store(chain(9), 0)).toBe(true);
    expect(evicted).toEqual(big(3));
    expect(cache.match(a)).toBe(2);
  });

  it("holds at most its capacity across churn and reports every eviction once", () => {
    const { cache, evicted } = recordingCache(16);
    let stored = 0;
    for (let r = 0; r < 50; r++) {
      const seq = chain(...Array.from({ length: 5 }, (_, i) => 1_000 * r + i));
      stored += storeAll(cache, seq).filter(Boolean).length;
      expect(cache.cachedBlocks).toBeLessThanOrEqual(16);
      cache.release(seq, 5);
    }
    expect(stored).toBe(250);
    expect(cache.cachedBlocks).toBe(16);
    expect(evicted).toHaveLength(250 - 16);
    expect(new Set(evicted).size).toBe(evicted.length);
    // What is left is exactly what was never evicted.
    const left = new Set(cache.blocks().map((b) => b.hash));
    for (const h of evicted) expect(left.has(h)).toBe(false);
    expect(left.size).toBe(16);
  });

  it("reserves scratch room by evicting unpinned blocks, and checks its bookkeeping", () => {
    const { cache, evicted } = recordingCache(4);
    const a = chain(1, 2, 3);
    storeAll(cache, a);
    cache.release(a, 3);
    expect(cache.freeBlocks).toBe(1);
    cache.reserveScratch(2);
    expect(evicted).toEqual(big(3));
    expect(cache.scratchBlocks).toBe(2);
    expect(cache.freeBlocks).toBe(0);
    expect(cache.availableBlocks).toBe(2);
    expect(() => {
      cache.reserveScratch(3);
    }).toThrow(RangeError);
    expect(() => {
      cache.releaseScratch(3);
    }).toThrow(/3 blocks released, 2 reserved/);
    cache.releaseScratch(2);
    expect(cache.freeBlocks).toBe(2);
    expect(() => {
      cache.release(a, 1);
    }).toThrow(/not pinned/);
    expect(() => {
      cache.pin(chain(42), 0, 1);
    }).toThrow(/not cached/);
    expect(() => new PagedKvCache({ capacityBlocks: 0 })).toThrow(RangeError);
  });
});
