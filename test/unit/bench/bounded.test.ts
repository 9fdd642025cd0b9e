import { describe, expect, it } from "vitest";

import { mapLimited } from "../../../src/bench/bounded.js";

const tick = (): Promise<void> => new Promise((r) => setImmediate(r));

describe("mapLimited", () => {
  it("runs at most `limit` calls at once and returns the results in item order", async () => {
    let running = 0;
    let peak = 0;
    const out = await mapLimited([1, 2, 3, 4, 5, 6, 7], 3, async (x) => {
      running++;
      peak = Math.max(peak, running);
      for (let i = 0; i < x % 3; i++) await tick();
      running--;
      return x * 10;
    });
    expect(out).toEqual([10, 20, 30, 40, 50, 60, 70]);
    expect(peak).toBe(3);
  });

  it("rejects with the first failure", async () => {
    await expect(
      mapLimited([1, 2, 3], 2, async (x) => {
        await tick();
        if (x === 2) throw new Error("two failed");
        return x;
      }),
    ).rejects.toThrow("two failed");
  });
});
