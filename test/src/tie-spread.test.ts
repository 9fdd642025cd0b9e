import { describe, expect, it } from "vitest";
import { TieSpreader } from "../../src/tie-spread.js";

const costs = (...c: number[]): Float64Array => Float64Array.from(c);

describe("TieSpreader", () => {
  it("two replicas racing over the same ties never pick the same candidate", () => {
    const c = costs(5, 5, 9, 5, 5.2, 7);
    const a = new TieSpreader(() => ({ index: 0, count: 2 }));
    const b = new TieSpreader(() => ({ index: 1, count: 2 }));
    for (let round = 0; round < 10; round++) {
      const pa = a.pick(c, c.length, 0);
      const pb = b.pick(c, c.length, 0);
      expect(pa).not.toBe(pb);
      expect([0, 1, 3, 4]).toContain(pa); // exact ties and the near-tie within half a block
      expect([0, 1, 3, 4]).toContain(pb);
    }
  });

  it("leaves a clear winner alone and does nothing for a single replica", () => {
    const solo = new TieSpreader(() => ({ index: 0, count: 1 }));
    expect(solo.pick(costs(1, 1, 1), 3, 2)).toBe(2);
    const mesh = new TieSpreader(() => ({ index: 1, count: 3 }));
    expect(mesh.pick(costs(3, 1, 4), 3, 1)).toBe(1);
  });

  it("cycles through its own residue class of the ties", () => {
    const s = new TieSpreader(() => ({ index: 1, count: 2 }));
    const c = costs(0, 0, 0, 0);
    expect([0, 1, 2, 3].map(() => s.pick(c, 4, 0))).toEqual([1, 3, 1, 3]);
  });
});
