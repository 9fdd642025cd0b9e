/**
 * Growing the core's typed arrays (per rank: rank keys index them, and ranks are interned as
 * workers register; per prefix-tree node: the index's and the warm join's tree builder's): one copy with room for at least `n` elements, doubling so that a run of
 * registrations costs amortised O(1) per rank. The new tail is zero, as a fresh array's is.
 */
export function grownTo<T extends Int32Array | Uint32Array | Uint8Array | Float64Array>(a: T, n: number): T {
  const grown = new (a.constructor as new (length: number) => T)(Math.max(n, 2 * a.length));
  grown.set(a);
  return grown;
}
