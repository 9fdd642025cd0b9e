/**
 * Timers injected into the mock engines, so tests (and offline simulations) drive the scheduler
 * with a manual clock instead of sleeping.
 */
import type { Clock } from "../core/clock.js";

/** Node's Timeout object, or ManualTimers' numeric id. */
export type TimerHandle = object | number;

export interface Timers {
  setTimeout(fn: () => void, ms: number): TimerHandle;
  clearTimeout(handle: TimerHandle): void;
}

export const systemTimers: Timers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (handle) => {
    clearTimeout(handle as ReturnType<typeof setTimeout>);
  },
};

interface ManualTimer {
  readonly id: number;
  readonly due: number;
  readonly fn: () => void;
}

/**
 * A clock and timers in one, advanced by hand. Timers fire in due order (ties: creation order),
 * each with the clock set to its due time, so a callback that schedules a 0 ms timer sees it run
 * within the same advance().
 */
export class ManualTimers implements Timers, Clock {
  #now: number;
  #nextId = 1;
  #timers: ManualTimer[] = [];

  constructor(startMs = 0) {
    this.#now = startMs;
  }

  now(): number {
    return this.#now;
  }

  /** Timers not yet fired or cleared. */
  get pending(): number {
    return this.#timers.length;
  }

  setTimeout(fn: () => void, ms: number): TimerHandle {
    const id = this.#nextId++;
    const timer = { id, due: this.#now + Math.max(0, ms), fn };
    // Keep the list sorted by (due, id): insertion after every timer due no later.
    let i = this.#timers.length;
    while (i > 0 && (this.#timers[i - 1] as ManualTimer).due > timer.due) i--;
    this.#timers.splice(i, 0, timer);
    return id;
  }

  clearTimeout(handle: TimerHandle): void {
    const i = this.#timers.findIndex((t) => t.id === handle);
    if (i >= 0) this.#timers.splice(i, 1);
  }

  /** Moves time forward by `ms`, firing every timer that falls due on the way. */
  advance(ms: number): void {
    const target = this.#now + ms;
    for (;;) {
      const next = this.#timers[0];
      if (next === undefined || next.due > target) break;
      this.#timers.shift();
      this.#now = Math.max(this.#now, next.due);
      next.fn();
    }
    this.#now = target;
  }

  /** Fires the earliest timer (moving time to it); false when none is pending. */
  runNext(): boolean {
    const next = this.#timers.shift();
    if (next === undefined) return false;
    this.#now = Math.max(this.#now, next.due);
    next.fn();
    return true;
  }

  /** Fires timers until none is pending or `maxTimers` have fired (a guard against endless loops). */
  runAll(maxTimers = 1_000_000): number {
    let fired = 0;
    while (fired < maxTimers && this.runNext()) fired++;
    return fired;
  }
}
