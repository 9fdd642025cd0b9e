/**
 * Versions of replicated state that merges last-writer-wins (session bindings, catalogue entries):
 * `(sequence, writer_id)`, the sequence a Lamport clock seeded from wall-clock ns, so versions
 * roughly follow real time across replicas yet a writer whose clock stepped back still supersedes
 * everything it has seen.
 */
import type { WallClockNs } from "./time.js";

const U64_MAX = (1n << 64n) - 1n;

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

/** The floor of a writer's next sequence: the highest issued or seen here. */
export class LamportClock {
  readonly #wallClockNs: WallClockNs;
  #highest = 0n;

  constructor(wallClockNs: WallClockNs) {
    this.#wallClockNs = wallClockNs;
  }

  /** Wall-clock ns, but above every sequence issued or seen here; does not issue it. */
  peek(): bigint {
    const wall = this.#wallClockNs();
    const floor = this.#highest < U64_MAX ? this.#highest + 1n : U64_MAX;
    return wall > floor ? wall : floor;
  }

  /** Issues the next sequence. */
  next(): bigint {
    const sequence = this.peek();
    this.#highest = sequence;
    return sequence;
  }

  /** A sequence issued elsewhere (applied or not): later ones here order after it. */
  observe(sequence: unknown): void {
    if (typeof sequence === "bigint" && sequence > this.#highest && sequence <= U64_MAX) this.#highest = sequence;
  }
}
