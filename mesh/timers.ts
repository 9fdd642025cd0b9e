/**
 * Timers for the mesh, injected like its clocks (src/core/clock.ts), so flush pacing, heartbeats,
 * housekeeping (snapshot retries, peer health, redial) and debounces run under a manual clock in
 * tests. Deadlines are computed against the monotonic Clock the mesh is given, never wall time: a
 * wall-clock step back of N s must not delay anything by N s.
 */
import { ManualClock } from "../src/core/clock.js";

export interface TimerHandle {
  cancel(): void;
}

export interface Timers {
  /** Runs `fn` once after `ms`. The handle does not keep the process alive. */
  setTimeout(fn: () => void, ms: number): TimerHandle;
  /** Runs `fn` every `ms`. The handle does not keep the process alive. */
  setInterval(fn: () => void, ms: number): TimerHandle;
  /** Runs `fn` on the next event-loop turn, after I/O (a burst in one tick shares the turn). */
  setImmediate(fn: () => void): TimerHandle;
}

/** Node's timers, unref'd: the mesh's sockets, not its timers, keep a daemon running. */
export const systemTimers: Timers = {
  setTimeout(fn, ms) {
    const t = setTimeout(fn, ms);
    t.unref();
    return {
      cancel: () => {
        clearTimeout(t);
      },
    };
  },
  setInterval(fn, ms) {
    const t = setInterval(fn, ms);
    t.unref();
    return {
      cancel: () => {
        clearInterval(t);
      },
    };
  },
  setImmediate(fn) {
    const t = setImmediate(fn);
    return {
      cancel: () => {
        clearImmediate(t);
      },
    };
  },
};

interface ManualTimer {
  readonly id: number;
  atMs: number;
  readonly everyMs: number | null;
  readonly fn: () => void;
}

/**
 * Timers driven by a ManualClock, for tests and simulators: nothing runs until `advance` (or
 * `runImmediates`) is called, and then in deadline order, with the clock set to each deadline.
 */
export class ManualTimers implements Timers {
  readonly clock: ManualClock;
  readonly #timers = new Map<number, ManualTimer>();
  #immediates: { id: number; fn: () => void }[] = [];
  #nextId = 1;

  constructor(clock: ManualClock = new ManualClock()) {
    this.clock = clock;
  }

  setTimeout(fn: () => void, ms: number): TimerHandle {
    return this.#add(fn, Math.max(0, ms), null);
  }

  setInterval(fn: () => void, ms: number): TimerHandle {
    // Node runs a 0 ms interval every 1 ms; so does this, so advance() terminates.
    return this.#add(fn, Math.max(1, ms), Math.max(1, ms));
  }

  setImmediate(fn: () => void): TimerHandle {
    const id = this.#nextId++;
    this.#immediates.push({ id, fn });
    return {
      cancel: () => {
        this.#immediates = this.#immediates.filter((i) => i.id !== id);
      },
    };
  }

  /** Timers and immediates waiting to run. */
  get pending(): number {
    return this.#timers.size + this.#immediates.length;
  }

  /** Runs the immediates queued now (not those they queue in turn). */
  runImmediates(): number {
    const now = this.#immediates;
    this.#immediates = [];
    for (const i of now) i.fn();
    return now.length;
  }

  /** Runs immediates, then every timer due within `ms`, in deadline order; the clock ends `ms` later. */
  advance(ms: number): void {
    const end = this.clock.now() + ms;
    this.runImmediates();
    for (;;) {
      let next: ManualTimer | undefined;
      for (const t of this.#timers.values()) if (t.atMs <= end && (next === undefined || t.atMs < next.atMs)) next = t;
      if (next === undefined) break;
      if (next.atMs > this.clock.now()) this.clock.set(next.atMs);
      if (next.everyMs === null) this.#timers.delete(next.id);
      else next.atMs += next.everyMs;
      next.fn();
      this.runImmediates();
    }
    if (end > this.clock.now()) this.clock.set(end);
  }

  #add(fn: () => void, ms: number, everyMs: number | null): TimerHandle {
    const id = this.#nextId++;
    this.#timers.set(id, { id, atMs: this.clock.now() + ms, everyMs, fn });
    return {
      cancel: () => {
        this.#timers.delete(id);
      },
    };
  }
}
