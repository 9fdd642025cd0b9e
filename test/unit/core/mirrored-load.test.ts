import { describe, expect, it } from "vitest";

import { MirroredLoad } from "../../../src/core/mirrored-load.js";

describe("MirroredLoad", () => {
  it("sums origins per rank and replaces an origin's row on each update", () => {
    const m = new MirroredLoad();
    m.set(1n, 3, 100, 10, 1);
    m.set(2n, 3, 50, 5, 2);
    expect([m.prefillTokens(3), m.blocks(3), m.requests(3)]).toEqual([150, 15, 3]);
    m.set(1n, 3, 20, 12, 1); // absolute, not a delta
    expect([m.prefillTokens(3), m.blocks(3), m.requests(3)]).toEqual([70, 17, 3]);
    m.set(1n, 3, 20, 12, 1); // idempotent
    expect(m.requests(3)).toBe(3);
    expect(m.requestsOf(1n)).toBe(1);
    expect(m.requestsOf(2n)).toBe(2);
    expect(m.loadedRanks).toBe(1);
  });

  it("returns to exact zero when the last origin's row goes, whatever float drift the sums had", () => {
    const m = new MirroredLoad();
    m.set(1n, 0, 0.1, 0.7, 1);
    m.set(2n, 0, 0.2, 0.3, 1);
    m.set(1n, 0, 0, 0, 0);
    m.set(2n, 0, 0, 0, 0);
    expect([m.prefillTokens(0), m.blocks(0), m.requests(0)]).toEqual([0, 0, 0]);
    expect(m.loadedRanks).toBe(0);
    expect([...m.origins()]).toEqual([]);
  });

  it("grows past its initial rank bound and reads unknown ranks as zero", () => {
    const m = new MirroredLoad();
    expect(m.blocks(5000)).toBe(0);
    m.set(7n, 5000, 1, 2, 3);
    expect([m.prefillTokens(5000), m.blocks(5000), m.requests(5000)]).toEqual([1, 2, 3]);
    expect(m.requests(4999)).toBe(0);
  });

  it("replaceOrigin installs a snapshot: ranks it omits go to zero, other origins stay", () => {
    const m = new MirroredLoad();
    m.set(1n, 0, 10, 1, 1);
    m.set(1n, 1, 10, 1, 1);
    m.set(2n, 1, 5, 5, 5);
    m.replaceOrigin(1n, [[1, { prefillTokens: 1, blocks: 2, requests: 3 }]]);
    expect(m.requests(0)).toBe(0);
    expect(m.requests(1)).toBe(8);
    expect(m.rowsOf(1n)).toEqual([[1, { prefillTokens: 1, blocks: 2, requests: 3 }]]);
  });

  it("dropOrigin and dropRank remove exactly what they name", () => {
    const m = new MirroredLoad();
    m.set(1n, 0, 10, 1, 2);
    m.set(1n, 1, 10, 1, 4);
    m.set(2n, 1, 5, 5, 5);
    expect(m.dropOrigin(1n)).toBe(6);
    expect(m.requests(0)).toBe(0);
    expect(m.requests(1)).toBe(5);
    m.dropRank(1);
    expect(m.requests(1)).toBe(0);
    expect(m.loadedRanks).toBe(0);
    expect(m.dropOrigin(9n)).toBe(0);
  });
});
