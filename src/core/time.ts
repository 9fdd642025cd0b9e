/**
 * The one time module: a monotonic clock, the wall clock, timers, and a manual clock and timers
 * for tests and simulators. Time and timers are injected everywhere (core, mesh, ingest, mock
 * engines), so tests run under a manual clock instead of sleeping. It lives in the core because
 * the core must not import outside itself; the adapters import it from here.
 *
 * `Clock.now()` is milliseconds. The monotonic clock (performance.now) is what deadlines,
 * intervals and ages are computed against: a wall-clock step back of N s must not delay anything
 * by N s. The wall clock (Date.now) is for what crosses processes: a batch's sent-at time, a
 * binding's expiry as seen by a host, the seeds of Lamport versions.
 */
export interface Clock {
  now(): number;
}

/** Monotonic ms (performance.now): deadlines, intervals, ages. */
export const systemClock: Clock = { now: () => performance.now() };

/** Wall-clock ms since the Unix epoch (Date.now; it can step): times that cross processes. */
export const systemWallClock: Clock = { now: () => Date.now() };

/** Wall-clock time in nanoseconds since the Unix epoch (not monotonic: it can step). */
export type WallClockNs = () => bigint;

const NS_PER_MS = 1_000_000n;

/**
 * Date.now() in ns. It seeds Lamport sequences that must beat the ones a writer issued before a
 * restart or a move to another host; `process.hrtime.bigint()` counts from boot and does not.
 */
export const systemWallClockNs: WallClockNs = () => BigInt(Date.now()) * NS_PER_MS;

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

export interface TimerHandle {
  cancel(): void;
}

export interface Timers {
  /** Runs `fn` once after `ms`. */
  setTimeout(fn: () => void, ms: number): TimerHandle;
  /** Runs `fn` every `ms`. */
  setInterval(fn: () => void, ms: number): TimerHandle;
  /** Runs `fn` on the next event-loop turn, after I/O (a burst in one tick shares the turn). */
  setImmediate(fn: () => void): TimerHandle;
}

function nodeTimers(unref: boolean): Timers {
  return {
    setTimeout(fn, ms) {
      const t = setTimeout(fn, ms);
      if (unref) t.unref();
      return {
        cancel: () => {
          clearTimeout(t);
        },
      };
    },
    setInterval(fn, ms) {
      const t = setInterval(fn, ms);
      if (unref) t.unref();
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
}

/** Node's timers, unref'd: a component's sockets, not its timers, keep a daemon running (the mesh). */
export const systemTimers: Timers = nodeTimers(true);

/** Node's timers as they are: a pending one keeps the process running (a mock engine's next step is its work). */
export const keepAliveTimers: Timers = nodeTimers(false);

interface ManualTimer {
  readonly id: number;
  atMs: number;
  readonly everyMs: number | null;
  readonly fn: () => void;
}

/**
 * Timers driven by a ManualClock, for tests and simulators, and a Clock themselves (their clock's
 * time): nothing runs until `advance`, `runNext`, `runAll` or `runImmediates` is called, and then
 * in deadline order (ties: creation order), with the clock set to each deadline, so a callback
 * that schedules a 0 ms timer sees it run within the same advance().
 */
export class ManualTimers implements Timers, Clock {
  readonly clock: ManualClock;
  readonly #timers = new Map<number, ManualTimer>();
  #immediates: { id: number; fn: () => void }[] = [];
  #nextId = 1;

  constructor(clock: ManualClock = new ManualClock()) {
    this.clock = clock;
  }

  now(): number {
    return this.clock.now();
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
      const next = this.#earliest(end);
      if (next === undefined) break;
      this.#fire(next);
    }
    if (end > this.clock.now()) this.clock.set(end);
  }

  /** Runs immediates, then fires the earliest timer (moving the clock to it); false when none is pending. */
  runNext(): boolean {
    this.runImmediates();
    const next = this.#earliest(Infinity);
    if (next === undefined) return false;
    this.#fire(next);
    return true;
  }

  /** Fires timers until none is pending or `maxTimers` have fired (a guard against endless intervals). */
  runAll(maxTimers = 1_000_000): number {
    let fired = 0;
    while (fired < maxTimers && this.runNext()) fired++;
    return fired;
  }

  #earliest(end: number): ManualTimer | undefined {
    let next: ManualTimer | undefined;
    for (const t of this.#timers.values()) if (t.atMs <= end && (next === undefined || t.atMs < next.atMs)) next = t;
    return next;
  }

  #fire(next: ManualTimer): void {
    if (next.atMs > this.clock.now()) this.clock.set(next.atMs);
    if (next.everyMs === null) this.#timers.delete(next.id);
    else next.atMs += next.everyMs;
    next.fn();
    this.runImmediates();
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
