import { afterEach, describe, expect, it, vi } from "vitest";
import type { Event } from "zeromq";

import { OBSERVER_CLOSE_GRACE_MS, observerCloseFailures, retireObserver, watchEvents, type IteratedObserver as Observer } from "../../../src/util/zmq-observers.js";

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

describe("watchEvents", () => {
  /** Receives `events` in turn, then rejects as a closed observer's pending receive does. */
  function scripted(events: Event[]): Observer {
    let i = 0;
    return {
      closed: false,
      close: () => undefined,
      receive: () => {
        const e = events[i++];
        return e === undefined ? Promise.reject(Object.assign(new Error("Socket operation on non-socket"), { code: "ENOTSOCK" })) : Promise.resolve(e);
      },
    } as unknown as Observer;
  }

  it("ends without rejecting when a receive fails (ENOTSOCK from a close during a pending receive, #29 F1)", async () => {
    const seen: string[] = [];
    await expect(watchEvents(scripted([{ type: "handshake", address: "a" }]), (e) => seen.push(e.type))).resolves.toBeUndefined();
    expect(seen).toEqual(["handshake"]);
  });

  it("keeps watching past a handler that throws, reporting it", async () => {
    const errors: unknown[] = [];
    let n = 0;
    const events = [{ type: "handshake", address: "a" }, { type: "handshake", address: "a" }, { type: "end", address: "a" }] as Event[];
    await watchEvents(
      scripted(events),
      () => {
        if (++n === 1) throw new Error("handler bug");
      },
      (err) => errors.push(err),
    );
    expect(n).toBe(3);
    expect(errors).toHaveLength(1);
  });
});
