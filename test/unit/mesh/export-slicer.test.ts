import { describe, expect, it } from "vitest";

import { ExportSlicer } from "../../../mesh/export-slicer.js";

/** A clock the test moves by hand. */
function clock() {
  let t = 0;
  return { now: () => t, advance: (ms: number) => (t += ms) };
}

/** Runs steps of the given kinds and lengths; returns where the slicer ended slices (before which step). */
function run(slicer: ExportSlicer, c: ReturnType<typeof clock>, steps: [string, number][]): number[] {
  const cuts: number[] = [];
  steps.forEach(([kind, ms], i) => {
    while (slicer.yieldBefore(kind)) {
      cuts.push(i);
      c.advance(0.5); // other work runs between slices
    }
    c.advance(ms);
    slicer.stepDone();
  });
  return cuts;
}

describe("export slices (the warm join's export on a peer's event loop)", () => {
  it("ends a slice before a step predicted to carry it past the bound, not after", () => {
    const c = clock();
    const s = new ExportSlicer(c, 4);
    // Ranks of 1.5 ms: two fit in 4 ms, a third would end at 4.5 ms.
    expect(run(s, c, [["rank", 1.5], ["rank", 1.5], ["rank", 1.5], ["rank", 1.5], ["rank", 1.5]])).toEqual([2, 4]);
  });

  it("predicts each kind of step from its own history (listing the ranks is not a rank)", () => {
    const c = clock();
    const s = new ExportSlicer(c, 4);
    run(s, c, [["keys", 3], ["rank", 1]]);
    expect(s.predict("keys")).toBe(3);
    expect(s.predict("rank")).toBe(1);
    // The largest of the last step and the average: one long rank is not forgotten at once.
    run(s, c, [["rank", 3]]);
    expect(s.predict("rank")).toBe(3);
    run(s, c, [["rank", 1]]);
    expect(s.predict("rank")).toBeGreaterThan(1);
  });

  it("always lets one step run per slice, even one longer than the bound, so the export moves on", () => {
    const c = clock();
    const s = new ExportSlicer(c, 2);
    expect(run(s, c, [["rank", 5], ["rank", 5], ["rank", 5]])).toEqual([1, 2]);
  });

  it("starts a fresh slice for each request (reset)", () => {
    const c = clock();
    const s = new ExportSlicer(c, 4);
    run(s, c, [["rank", 3]]);
    s.reset();
    expect(run(s, c, [["rank", 3]])).toEqual([]);
  });
});
