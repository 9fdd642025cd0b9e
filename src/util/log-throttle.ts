/**
 * Rate limit for log lines about events a remote party controls (rejected handshakes, requests
 * without a valid token): a scanner or a misconfigured replica retrying every 100 ms must not
 * flood the log. The first occurrence is logged at once; later ones at most once per interval,
 * with the number suppressed in between. Counters in /metrics stay exact.
 */
import { badRequest } from "../core/index.js";
import { systemClock, type Clock } from "../core/index.js";

/** One line per this many ms at most, per throttle. */
export const DEFAULT_LOG_THROTTLE_INTERVAL_MS = 10_000;

export class LogThrottle {
  readonly #intervalMs: number;
  readonly #clock: Clock;
  #lastAtMs = -Infinity;
  #suppressed = 0;

  constructor(intervalMs: number = DEFAULT_LOG_THROTTLE_INTERVAL_MS, clock: Clock = systemClock) {
    if (!Number.isFinite(intervalMs) || intervalMs < 0) throw badRequest(`intervalMs must be a finite number >= 0, got ${intervalMs}`, "intervalMs");
    this.#intervalMs = intervalMs;
    this.#clock = clock;
  }

  /**
   * Calls `log(suppressed)` (how many occurrences were skipped since the last line) when a line
   * is due, else counts this occurrence as suppressed. Returns whether it logged.
   */
  hit(log: (suppressed: number) => void): boolean {
    const now = this.#clock.now();
    if (now - this.#lastAtMs < this.#intervalMs) {
      this.#suppressed++;
      return false;
    }
    const suppressed = this.#suppressed;
    this.#lastAtMs = now;
    this.#suppressed = 0;
    log(suppressed);
    return true;
  }
}
