/**
 * Growing the core's per-rank typed arrays (rank keys index them, and ranks are interned as
 * workers register): one copy with room for at least `n` elements, doubling so that a run of
 * registrations costs amortised O(1) per rank. The new tail is zero, as a fresh array's is.
 */
export function grownTo<T extends Int32Array | Uint8Array | Float64Array>(a: T, n: number): T {
  const grown = new (a.constructor as new (length: number) => T)(Math.max(n, 2 * a.length));
  grown.set(a);
  return grown;
}
