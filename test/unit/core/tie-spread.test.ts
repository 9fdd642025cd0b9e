import { describe, expect, it } from "vitest";
import { seededRandom } from "../../../src/core/random.js";
import { newPrefixKey, PREFIX_KEY_BLOCKS, spreadKey, TieSpreader } from "../../../src/core/tie-spread.js";

const costs = (...c: number[]): Float64Array => Float64Array.from(c);
const ident = (n: number): number[] => Array.from({ length: n }, (_, i) => i);
/** Keys of workers 1..n, rank i = worker i + 1. */
const keysOf = (n: number): number[] => ident(n).map((i) => spreadKey(BigInt(i + 1), 0));

describe("TieSpreader", () => {
  it("two replicas racing over the same ties never pick the same worker, whatever the tie-break draws", () => {
    const c = costs(5, 5, 9, 5, 5.2, 7, 5, 5);
    const keys = keysOf(c.length);
    const a = new TieSpreader(() => ({ index: 0, count: 2 }), seededRandom(1));
    const b = new TieSpreader(() => ({ index: 1, count: 2 }), seededRandom(2));
    const tiedA = new Set<number>();
    const tiedB = new Set<number>();
    for (let round = 0; round < 50; round++) {
      const pa = a.pick(c, c.length, 0, ident(c.length), keys);
      const pb = b.pick(c, c.length, 0, ident(c.length), keys);
      expect([0, 1, 3, 4, 6, 7]).toContain(pa); // exact ties and the near-tie within half a block
      expect([0, 1, 3, 4, 6, 7]).toContain(pb);
      tiedA.add(pa);
      tiedB.add(pb);
    }
    // Disjoint classes: no worker is ever picked by both.
    expect([...tiedA].filter((w) => tiedB.has(w))).toEqual([]);
    expect(tiedA.size + tiedB.size).toBeGreaterThan(2);
  });

  it("classes stay put when the tied set changes (one worker booked elsewhere)", () => {
    const keys = keysOf(6);
    const s = new TieSpreader(() => ({ index: 1, count: 3 }), seededRandom(3));
    const all = costs(0, 0, 0, 0, 0, 0);
    const mine = new Set(ident(6).filter((i) => (keys[i] as number) % 3 === 1));
    for (let k = 0; k < 30; k++) expect(mine).toContain(s.pick(all, 6, 0, ident(6), keys));
    // Worker 0 no longer tied: the others keep their class.
    const fewer = costs(3, 0, 0, 0, 0, 0);
    for (let k = 0; k < 30; k++) {
      const p = s.pick(fewer, 6, 1, ident(6), keys);
      expect(p === 1 || mine.has(p)).toBe(true);
      expect(p).not.toBe(0);
    }
  });

  it("leaves a clear winner alone, does nothing for a single replica, and falls back when its class has no tie", () => {
    const keys = keysOf(3);
    const solo = new TieSpreader(() => ({ index: 0, count: 1 }), seededRandom(1));
    expect(solo.pick(costs(1, 1, 1), 3, 2, ident(3), keys)).toBe(2);
    const mesh = new TieSpreader(() => ({ index: 1, count: 3 }), seededRandom(1));
    expect(mesh.pick(costs(3, 1, 4), 3, 1, ident(3), keys)).toBe(1);
    // Two tied workers, neither in class 2 of 3: the argmin's own random choice stands.
    const k2 = [0, 1, 2].map((i) => (keys[i] as number) % 3);
    const missing = [0, 1, 2].find((c) => !k2.slice(0, 2).includes(c));
    if (missing !== undefined) {
      const other = new TieSpreader(() => ({ index: missing, count: 3 }), seededRandom(1));
      expect(other.pick(costs(0, 0, 9), 3, 1, ident(3), keys)).toBe(1);
    }
  });

  it("spreads consecutive worker ids evenly over the classes", () => {
    const counts = [0, 0, 0, 0];
    for (let w = 1; w <= 1024; w++) counts[spreadKey(BigInt(w), 0) % 4] = (counts[spreadKey(BigInt(w), 0) % 4] ?? 0) + 1;
    for (const c of counts) expect(c).toBeGreaterThan(200);
    expect(spreadKey(7n, 0)).toBe(spreadKey(7n, 0));
    expect(spreadKey(7n, 0)).not.toBe(spreadKey(7n, 1));
    expect(spreadKey(7n, 0)).not.toBe(spreadKey(7n + (1n << 32n), 0));
  });

  it("a new prefix (cached or in flight nowhere): every replica picks the same tie for the same prompt, without a draw", () => {
    const c = costs(5, 5, 9, 5, 5.2, 7, 5, 5);
    const keys = keysOf(c.length);
    const prompt = Uint32Array.from({ length: 2 * 40 }, (_, i) => (i * 2654435761) >>> 0);
    const key = newPrefixKey(prompt, 0);
    expect(key).not.toBe(0);
    // Prompts that share their first PREFIX_KEY_BLOCKS blocks share the key; one cached somewhere has none.
    const longer = Uint32Array.from({ length: 2 * 60 }, (_, i) => (i < 2 * PREFIX_KEY_BLOCKS ? (prompt[i] as number) : 7));
    expect(newPrefixKey(longer, 0)).toBe(key);
    expect(newPrefixKey(prompt, 3)).toBe(0);
    const picks = new Set<number>();
    for (let index = 0; index < 4; index++) {
      const random = { draws: 0, next(): number { this.draws++; return 0.5; } };
      const t = new TieSpreader(() => ({ index, count: 4 }), random);
      t.setPrefixKey(key);
      const pick = t.pick(c, c.length, 0, ident(c.length), keys);
      expect([0, 1, 3, 4, 6, 7]).toContain(pick);
      expect(random.draws).toBe(0);
      picks.add(pick);
    }
    expect(picks.size).toBe(1);
  });
});
