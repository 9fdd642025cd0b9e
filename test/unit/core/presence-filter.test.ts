import { describe, expect, it } from "vitest";
import { PresenceFilter } from "../../../src/core/presence-filter.js";
import { seededRandom } from "../../../src/core/random.js";

describe("PresenceFilter", () => {
  it("never calls a key it holds absent, through adds, removes, saturation and rebuilds", () => {
    const rng = seededRandom(3);
    const f = new PresenceFilter();
    const held = new Map<string, [number, number, number]>();
    const key = (): [number, number] => [Math.floor(rng.next() * 4) >>> 0, Math.floor(rng.next() * 64) >>> 0];
    for (let i = 0; i < 6_000; i++) {
      const [hi, lo] = key();
      const k = `${hi}:${lo}`;
      const h = held.get(k);
      if (rng.next() < 0.55) {
        f.add(hi, lo);
        held.set(k, [hi, lo, (h?.[2] ?? 0) + 1]);
      } else if (h !== undefined) {
        f.remove(hi, lo);
        if (h[2] === 1) held.delete(k);
        else h[2]--;
      }
      if (i % 2_000 === 1_999) {
        // The owner's rebuild: resize, then add every key held again.
        f.rebuild(held.size);
        for (const [hi2, lo2, n] of held.values()) for (let c = 0; c < n; c++) f.add(hi2, lo2);
      }
      if (i % 50 === 0) {
        let missed = 0;
        for (const [hi2, lo2] of held.values()) if (!f.mayHave(hi2, lo2)) missed++;
        expect(missed).toBe(0);
      }
    }
  });

  it("says absent for keys never added, and again once every add is removed", () => {
    const f = new PresenceFilter();
    expect(f.mayHave(1, 2)).toBe(false);
    f.add(1, 2);
    f.add(1, 2);
    expect(f.mayHave(1, 2)).toBe(true);
    f.remove(1, 2);
    expect(f.mayHave(1, 2)).toBe(true);
    f.remove(1, 2);
    expect(f.mayHave(1, 2)).toBe(false);
    expect(f.fits(100)).toBe(true);
    expect(f.fits(1_000_000)).toBe(false);
  });

  it("keeps a saturated cell at 'maybe' for good (a count it lost could otherwise say absent)", () => {
    const f = new PresenceFilter();
    for (let i = 0; i < 300; i++) f.add(5, 6);
    for (let i = 0; i < 300; i++) f.remove(5, 6);
    expect(f.mayHave(5, 6)).toBe(true);
  });
});
