/**
 * Time and randomness are injected everywhere in the core so tests are deterministic.
 * `Clock.now()` is milliseconds on a monotonic timeline (not wall-clock).
 */
export interface Clock {
  now(): number;
}

export interface Random {
  /** Uniform in [0, 1). */
  next(): number;
}

export const systemClock: Clock = { now: () => performance.now() };

/** Wall-clock time in nanoseconds since the Unix epoch (not monotonic: it can step). */
export type WallClockNs = () => bigint;

const NS_PER_MS = 1_000_000n;

/**
 * Date.now() in ns. It seeds Lamport sequences that must beat the ones a writer issued before a
 * restart or a move to another host; `process.hrtime.bigint()` counts from boot and does not.
 */
export const systemWallClockNs: WallClockNs = () => BigInt(Date.now()) * NS_PER_MS;

export const mathRandom: Random = { next: () => Math.random() };

/** A manual clock for tests and simulators. */
export class ManualClock implements Clock {
  #t: number;
  constructor(startMs = 0) {
    this.#t = startMs;
  }
  now(): number {
    return this.#t;
  }
  advance(ms: number): void {
    this.#t += ms;
  }
  set(ms: number): void {
    this.#t = ms;
  }
}

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
