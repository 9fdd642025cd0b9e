/**
 * When the warm join's export (index-sync.ts) lets its event loop run: the export is a run of
 * synchronous steps (listing the ranks, then one rank each: its blocks with its stream
 * position), and a slice of them ends *before* a step predicted to carry it past `sliceMs`. A
 * /select arriving during a slice waits for what is left of it, so the slice bounds that wait
 * (a single step longer than the slice excepted: one 4,096-block rank is ~1 ms here).
 *
 * The prediction is the larger of the last step of the same kind and an average of that kind's
 * recent steps (ranks of a fleet are of similar size; listing the ranks costs ~2 ms at 1,024):
 * ending a slice only once past the bound, as before, overran it by up to a rank (measured:
 * loop-delay p99 10 ms with 4 ms slices, bench:warm-join).
 */
import type { Clock } from "../src/core/index.js";

/** Weight of the newest step in a kind's average. */
const STEP_AVERAGE_WEIGHT = 0.25;

export class ExportSlicer {
  readonly #clock: Clock;
  readonly #sliceMs: number;
  readonly #average = new Map<string, number>();
  readonly #last = new Map<string, number>();
  #sliceStart = Number.NaN;
  #stepStart = 0;
  #stepKind = "";

  constructor(clock: Clock, sliceMs: number) {
    this.#clock = clock;
    this.#sliceMs = sliceMs;
  }

  /** The predicted length of a step of `kind`, ms (0 until one has run). */
  predict(kind: string): number {
    return Math.max(this.#average.get(kind) ?? 0, this.#last.get(kind) ?? 0);
  }

  /**
   * Before a step of `kind`: true when the slice should end first (the caller yields its event
   * loop, then calls again). A slice takes at least one step, so the export always moves on.
   */
  yieldBefore(kind: string): boolean {
    const now = this.#clock.now();
    if (Number.isNaN(this.#sliceStart)) this.#sliceStart = now;
    else if (now - this.#sliceStart + this.predict(kind) > this.#sliceMs) {
      this.#sliceStart = Number.NaN;
      return true;
    }
    this.#stepStart = now;
    this.#stepKind = kind;
    return false;
  }

  /** After the step yieldBefore let run: its length goes into its kind's prediction. */
  stepDone(): void {
    const ms = this.#clock.now() - this.#stepStart;
    const avg = this.#average.get(this.#stepKind);
    this.#average.set(this.#stepKind, avg === undefined ? ms : avg + STEP_AVERAGE_WEIGHT * (ms - avg));
    this.#last.set(this.#stepKind, ms);
  }

  /** The export ended (a request answered): the next request starts a slice of its own. */
  reset(): void {
    this.#sliceStart = Number.NaN;
  }
}
