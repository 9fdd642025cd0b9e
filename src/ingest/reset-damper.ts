/**
 * Damping for a KV-event publisher that flaps between resets (#17 F10: 5,000 batches alternating
 * seq 0 and 1 read as 2,506 publisher restarts, and each one cleared the rank's blocks).
 *
 * A real restart reloads the model (tens of seconds at least) and a crash-looping pod is held back
 * 10 s, 20 s, 40 s ... by Kubernetes, so more than MAX_RESETS_PER_WINDOW resets within
 * RESET_DAMPING_WINDOW_MS is no restart: two processes publishing under one address, or a broken
 * publisher. Past that, a reset still restarts the seq numbering, but the rank's blocks are kept
 * (its index bound caps what they can grow to) and the reset is counted as damped. Every reset
 * counts against the window, so damping lasts until the publisher has been steady for a window.
 */
import { badRequest } from "../core/index.js";
import { systemClock, type Clock } from "../core/index.js";

/** Resets acted on within one window. */
export const MAX_RESETS_PER_WINDOW = 4;
/** Sliding window of the reset count, in ms. */
export const RESET_DAMPING_WINDOW_MS = 60_000;

export class ResetDamper {
  readonly #max: number;
  readonly #windowMs: number;
  readonly #clock: Clock;
  /** Times of the last `#max` resets, a ring; `#count` of them are filled. */
  readonly #times: number[];
  #next = 0;
  #count = 0;

  constructor(maxResets: number = MAX_RESETS_PER_WINDOW, windowMs: number = RESET_DAMPING_WINDOW_MS, clock: Clock = systemClock) {
    if (!Number.isInteger(maxResets) || maxResets < 1) throw badRequest(`maxResets must be an integer >= 1, got ${maxResets}`, "maxResets");
    if (!Number.isFinite(windowMs) || windowMs < 0) throw badRequest(`windowMs must be a finite number >= 0, got ${windowMs}`, "windowMs");
    this.#max = maxResets;
    this.#windowMs = windowMs;
    this.#clock = clock;
    this.#times = new Array<number>(maxResets).fill(0);
  }

  /** Records a reset; true when it is to be acted on (clear the rank), false when damped. */
  admit(): boolean {
    const now = this.#clock.now();
    // The oldest of the last `max` resets, overwritten by this one.
    const damped = this.#count === this.#max && now - (this.#times[this.#next] as number) < this.#windowMs;
    this.#times[this.#next] = now;
    this.#next = (this.#next + 1) % this.#max;
    if (this.#count < this.#max) this.#count++;
    return !damped;
  }
}
