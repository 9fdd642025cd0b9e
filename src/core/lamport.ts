/**
 * Versions of replicated state that merges last-writer-wins (session bindings, catalogue entries):
 * `(sequence, writer_id)`, the sequence a Lamport clock seeded from wall-clock ns, so versions
 * roughly follow real time across replicas yet a writer whose clock stepped back still supersedes
 * everything it has seen.
 *
 * A version more than a bounded skew ahead of the local wall clock is not a version (#29 G3/G4):
 * one binding or catalogue event at 2^64-1 saturated every clock that heard it, and each later
 * write tied or lost against it, for good. So versions past the horizon (wall clock + skew) are
 * refused where they enter (the callers count and log them) and never move a clock. A clock or an
 * entry that holds one already (taken before this bound existed, or the wall clock stepped back
 * by more than the skew) recovers: the clock issues from the wall clock again, and such an entry
 * orders below every version within the horizon (compareVersionsWithin), so the next write wins.
 * The cost: a replica whose wall clock runs more than the skew ahead of a peer's has its versions
 * refused by that peer (counted) until NTP brings them together.
 */
import type { WallClockNs } from "./time.js";

const U64_MAX = (1n << 64n) - 1n;
const NS_PER_SECOND = 1_000_000_000n;

/** How far ahead of the local wall clock a version may be: 5 minutes, far past NTP's error, in ns. */
export const DEFAULT_MAX_VERSION_SKEW_NS = 300n * NS_PER_SECOND;

export interface Version {
  readonly sequence: bigint;
  readonly writerId: bigint;
}

/** <0, 0, >0 as `a` is older than, the same as, or newer than `b`; ties on sequence go to the greater writer id. */
export function compareVersions(a: Version, b: Version): number {
  if (a.sequence !== b.sequence) return a.sequence < b.sequence ? -1 : 1;
  if (a.writerId !== b.writerId) return a.writerId < b.writerId ? -1 : 1;
  return 0;
}

/**
 * compareVersions, except that a version past `horizon` (a poisoned one already held) orders below
 * every version within it.
 */
export function compareVersionsWithin(a: Version, b: Version, horizon: bigint): number {
  const aOut = a.sequence > horizon;
  if (aOut !== b.sequence > horizon) return aOut ? -1 : 1;
  return compareVersions(a, b);
}

/** A version refused where it entered (the service tells the daemon, which logs it, throttled). */
export interface VersionRefusal {
  readonly kind: "binding" | "catalog";
  readonly writerId: bigint;
  readonly sequence: bigint;
  /** A catalogue event on this origin's stream that it did not write. */
  readonly origin?: bigint;
}

/** What a table needs to recover from a poisoned sequence: the horizon, and a fresh floor. */
export interface VersionHorizon {
  /** The latest admissible sequence now: wall-clock ns plus the skew. */
  horizon(): bigint;
  /** The next sequence this clock would issue (within the horizon). */
  peek(): bigint;
}

/** The floor of a writer's next sequence: the highest issued or seen here. */
export class LamportClock implements VersionHorizon {
  readonly #wallClockNs: WallClockNs;
  readonly #maxSkewNs: bigint;
  #highest = 0n;

  constructor(wallClockNs: WallClockNs, maxSkewNs: bigint = DEFAULT_MAX_VERSION_SKEW_NS) {
    this.#wallClockNs = wallClockNs;
    this.#maxSkewNs = maxSkewNs;
  }

  horizon(): bigint {
    return this.#wallClockNs() + this.#maxSkewNs;
  }

  /** Whether a peer's or client's sequence may be taken: within the horizon. */
  admits(sequence: bigint): boolean {
    return sequence <= this.horizon();
  }

  /** Wall-clock ns, but above every sequence issued or seen here (unless that is past the horizon: then recovered); does not issue it. */
  peek(): bigint {
    const wall = this.#wallClockNs();
    // Poisoned (a sequence past the horizon taken before the bound, or the wall clock stepped
    // back by more than the skew): start again from the wall clock.
    if (this.#highest > wall + this.#maxSkewNs) this.#highest = 0n;
    const floor = this.#highest < U64_MAX ? this.#highest + 1n : U64_MAX;
    return wall > floor ? wall : floor;
  }

  /** Issues the next sequence. */
  next(): bigint {
    const sequence = this.peek();
    this.#highest = sequence;
    return sequence;
  }

  /** A sequence issued elsewhere (applied or not): later ones here order after it. One past the horizon is ignored. */
  observe(sequence: unknown): void {
    if (typeof sequence === "bigint" && sequence > this.#highest && sequence <= U64_MAX && this.admits(sequence)) this.#highest = sequence;
  }
}
