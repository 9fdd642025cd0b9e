import { describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/index.js";

import { ManualClock } from "../../../src/core/index.js";
import { MAX_RESETS_PER_WINDOW, RESET_DAMPING_WINDOW_MS, ResetDamper } from "../../../src/ingest/reset-damper.js";

describe("ResetDamper (#17 F10)", () => {
  it("acts on the first resets of a window, damps the rest while the flapping goes on", () => {
    const clock = new ManualClock(0);
    const d = new ResetDamper(MAX_RESETS_PER_WINDOW, RESET_DAMPING_WINDOW_MS, clock);
    const admitted = Array.from({ length: 2_500 }, () => {
      clock.advance(1);
      return d.admit();
    });
    expect(admitted.filter(Boolean)).toHaveLength(MAX_RESETS_PER_WINDOW);
    expect(admitted.slice(0, MAX_RESETS_PER_WINDOW).every(Boolean)).toBe(true);
  });

  it("acts again once the publisher was steady for a window", () => {
    const clock = new ManualClock(0);
    const d = new ResetDamper(2, 1_000, clock);
    expect([d.admit(), d.admit(), d.admit()]).toEqual([true, true, false]);
    clock.advance(999);
    expect(d.admit()).toBe(false);
    clock.advance(1_000);
    expect([d.admit(), d.admit(), d.admit()]).toEqual([true, true, false]);
  });

  it("never damps resets spaced wider than window / max", () => {
    const clock = new ManualClock(0);
    const d = new ResetDamper(4, 60_000, clock);
    for (let i = 0; i < 100; i++) {
      clock.advance(15_000);
      expect(d.admit()).toBe(true);
    }
  });

  it("refuses nonsense settings", () => {
    expect(() => new ResetDamper(0)).toThrow(KvmeshError);
    expect(() => new ResetDamper(2, -1)).toThrow(KvmeshError);
  });
});
