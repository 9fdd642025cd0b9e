/** Randomness, injected like time (src/core/time.ts) so tests and simulations are deterministic. */
export interface Random {
  /** Uniform in [0, 1). */
  next(): number;
}

export const mathRandom: Random = { next: () => Math.random() };

/** Small, fast, seedable PRNG (mulberry32). Good enough for tie-breaking and sampling. */
export function seededRandom(seed: number): Random {
  let a = seed >>> 0;
  return {
    next(): number {
      a = (a + 0x6d2b79f5) >>> 0;
      let t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    },
  };
}
