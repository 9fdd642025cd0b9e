import { afterEach, describe, expect, it, vi } from "vitest";
import type { Observer } from "zeromq";

import { OBSERVER_CLOSE_GRACE_MS, observerCloseFailures, retireObserver } from "../../../src/util/zmq-observers.js";

/** An observer as retireObserver sees it: `closed`, and a close() that may throw. */
function fakeObserver(close: () => void): Observer & { closes: number } {
  const o = {
    closed: false,
    closes: 0,
    close(): void {
      o.closes++;
      close();
      o.closed = true;
    },
  };
  return o as unknown as Observer & { closes: number };
}

describe("retireObserver", () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it("closes a still-open observer after the grace period, and never one that ended by itself", () => {
    vi.useFakeTimers();
    const open = fakeObserver(() => undefined);
    const ended = fakeObserver(() => undefined);
    retireObserver(open, 0);
    retireObserver(ended, 0);
    (ended as { closed: boolean }).closed = true;
    vi.advanceTimersByTime(OBSERVER_CLOSE_GRACE_MS - 1);
    expect(open.closes).toBe(0);
    vi.advanceTimersByTime(1);
    expect(open.closes).toBe(1);
    expect(ended.closes).toBe(0);
  });

  it("does not let a close that throws (ENOTSOCK after a half-failed socket) escape its timer", () => {
    vi.useFakeTimers();
    const warn = vi.spyOn(process, "emitWarning").mockImplementation(() => undefined);
    const before = observerCloseFailures();
    const broken = fakeObserver(() => {
      throw Object.assign(new Error("Socket operation on non-socket"), { code: "ENOTSOCK" });
    });
    retireObserver(broken, 0);
    // Before the fix this threw out of the timer: an uncaught exception that ended the daemon.
    expect(() => vi.advanceTimersByTime(OBSERVER_CLOSE_GRACE_MS)).not.toThrow();
    expect(broken.closes).toBe(1);
    expect(observerCloseFailures()).toBe(before + 1);
    if (before === 0) expect(warn).toHaveBeenCalledTimes(1);
  });
});
