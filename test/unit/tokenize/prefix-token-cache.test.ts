import { describe, expect, it } from "vitest";

import { PrefixTokenCache } from "../../../src/tokenize/prefix-token-cache.js";

describe("prefix token cache", () => {
  const text = "<a>one<a>two<a>three";
  const boundaries = [6, 12];

  it("finds the deepest cached boundary and hands back the ids before it", () => {
    const cache = new PrefixTokenCache();
    const keys = PrefixTokenCache.keys(text, boundaries);
    expect(cache.lookup(keys, boundaries)).toBeUndefined();
    const ids = Uint32Array.from([1, 2, 1, 3, 1, 4]);
    cache.store(keys, [2, 4], ids);
    const longer = "<a>one<a>two<a>three<a>four";
    const lb = [6, 12, 20];
    const hit = cache.lookup(PrefixTokenCache.keys(longer, lb), lb);
    expect(hit && { ids: Array.from(hit.ids), offset: hit.offset }).toEqual({ ids: [1, 2, 1, 3], offset: 12 });
    // A different second segment matches only the first boundary.
    const other = "<a>one<a>TWO<a>three";
    const oh = cache.lookup(PrefixTokenCache.keys(other, boundaries), boundaries);
    expect(oh && { ids: Array.from(oh.ids), offset: oh.offset }).toEqual({ ids: [1, 2], offset: 6 });
  });

  it("evicts least recently used entries at its entry bound, counting each", () => {
    let evicted = 0;
    const cache = new PrefixTokenCache({
      maxEntries: 2,
      onEvict: () => {
        evicted++;
      },
    });
    const ids = Uint32Array.from([1, 2, 3]);
    cache.store([1n, 2n, 3n], [1, 2, 3], ids);
    expect(cache.size).toBe(2);
    expect(evicted).toBe(1);
    expect(cache.lookup([1n], [1])).toBeUndefined();
    expect(cache.lookup([2n], [1])).toBeDefined();
  });

  it("bounds the token ids it keeps alive, counting an array once however many entries point into it", () => {
    let evicted = 0;
    const cache = new PrefixTokenCache({
      maxTokens: 10,
      onEvict: () => {
        evicted++;
      },
    });
    cache.store([1n, 2n], [2, 4], new Uint32Array(6));
    expect(cache.tokens).toBe(6);
    cache.store([3n, 4n], [2, 4], new Uint32Array(6));
    // 12 > 10: the first array's two entries went, and with them its 6 ids.
    expect(cache.tokens).toBe(6);
    expect(evicted).toBe(2);
    // An array larger than the whole bound is not stored.
    cache.store([5n], [1], new Uint32Array(11));
    expect(cache.lookup([5n], [1])).toBeUndefined();
  });
});
