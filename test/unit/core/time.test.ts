import { describe, expect, it } from "vitest";

import { ManualClock, ManualTimers } from "../../../src/core/time.js";

describe("ManualTimers", () => {
  it("fires timeouts in deadline order, ties in creation order, with the clock at each deadline", () => {
    const timers = new ManualTimers(new ManualClock(100));
    const seen: string[] = [];
    timers.setTimeout(() => seen.push(`b@${timers.now()}`), 20);
    timers.setTimeout(() => seen.push(`a@${timers.now()}`), 10);
    timers.setTimeout(() => seen.push(`c@${timers.now()}`), 20);
    timers.advance(15);
    expect(seen).toEqual(["a@110"]);
    expect(timers.now()).toBe(115);
    timers.advance(100);
    expect(seen).toEqual(["a@110", "b@120", "c@120"]);
    expect(timers.now()).toBe(215);
    expect(timers.pending).toBe(0);
  });

  it("runs a 0 ms timer scheduled by a callback within the same advance, and immediates after each timer", () => {
    const timers = new ManualTimers();
    const seen: string[] = [];
    timers.setTimeout(() => {
      seen.push("outer");
      timers.setImmediate(() => seen.push("immediate"));
      timers.setTimeout(() => seen.push("inner"), 0);
    }, 5);
    timers.advance(5);
    expect(seen).toEqual(["outer", "immediate", "inner"]);
  });

  it("repeats intervals until cancelled; a cancelled timeout never runs", () => {
    const timers = new ManualTimers();
    let ticks = 0;
    const every = timers.setInterval(() => ticks++, 10);
    const never = timers.setTimeout(() => {
      throw new Error("cancelled timer ran");
    }, 15);
    never.cancel();
    timers.advance(35);
    expect(ticks).toBe(3);
    every.cancel();
    timers.advance(100);
    expect(ticks).toBe(3);
  });

  it("runNext moves the clock to the earliest timer; runAll stops at its guard on an endless interval", () => {
    const timers = new ManualTimers();
    const seen: number[] = [];
    timers.setTimeout(() => seen.push(timers.now()), 40);
    timers.setTimeout(() => seen.push(timers.now()), 7);
    expect(timers.runNext()).toBe(true);
    expect(seen).toEqual([7]);
    expect(timers.runAll()).toBe(1);
    expect(seen).toEqual([7, 40]);
    expect(timers.runNext()).toBe(false);
    timers.setInterval(() => undefined, 1);
    expect(timers.runAll(50)).toBe(50);
    expect(timers.now()).toBe(90);
  });
});
