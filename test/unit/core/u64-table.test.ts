import { describe, it, expect } from "vitest";

import { KvmeshError } from "../../../src/core/errors.js";
import { U64Table } from "../../../src/core/u64-table.js";
import { seededRandom } from "../../../src/core/random.js";

const keyOf = (tag: number, hi: number, lo: number): string => `${tag}:${hi}:${lo}`;

describe("U64Table", () => {
  it("gets what was set, -1 when absent, and overwrites", () => {
    const t = new U64Table();
    expect(t.get(1, 2, 3)).toBe(-1);
    t.set(1, 2, 3, 42);
    expect(t.get(1, 2, 3)).toBe(42);
    expect(t.get(1, 2, 4)).toBe(-1);
    expect(t.get(0, 2, 3)).toBe(-1);
    expect(t.get(1, 3, 3)).toBe(-1);
    t.set(1, 2, 3, 7);
    expect(t.get(1, 2, 3)).toBe(7);
    expect(t.size).toBe(1);
    expect(t.has(1, 2, 3)).toBe(true);
  });

  it("keeps full 32-bit key words distinct (sign bit, zero, max)", () => {
    const t = new U64Table();
    t.set(0xffffffff, 0x80000000, 0, 1);
    t.set(0x7fffffff, 0x80000000, 0, 2);
    t.set(0xffffffff, 0, 0x80000000, 3);
    t.set(0, 0, 0, 4);
    expect(t.get(0xffffffff, 0x80000000, 0)).toBe(1);
    expect(t.get(0x7fffffff, 0x80000000, 0)).toBe(2);
    expect(t.get(0xffffffff, 0, 0x80000000)).toBe(3);
    expect(t.get(0, 0, 0)).toBe(4);
    const seen: string[] = [];
    t.forEach((tag, hi, lo, v) => seen.push(`${keyOf(tag, hi, lo)}=${v}`));
    expect(seen.sort()).toEqual(
      [`${keyOf(0xffffffff, 0x80000000, 0)}=1`, `${keyOf(0x7fffffff, 0x80000000, 0)}=2`, `${keyOf(0xffffffff, 0, 0x80000000)}=3`, `${keyOf(0, 0, 0)}=4`].sort(),
    );
  });

  it("rejects values outside [0, 2^31)", () => {
    const t = new U64Table();
    expect(() => { t.set(1, 1, 1, -1); }).toThrow(RangeError);
    expect(() => { t.set(1, 1, 1, 2 ** 31); }).toThrow(RangeError);
    expect(() => { t.set(1, 1, 1, 1.5); }).toThrow(RangeError);
    expect(t.size).toBe(0);
    expect(() => new U64Table(0)).toThrow(KvmeshError);
  });

  it("delete reports presence and keeps colliding keys reachable", () => {
    const t = new U64Table(8);
    for (let i = 0; i < 5; i++) t.set(0, 0, i, i);
    expect(t.delete(0, 0, 2)).toBe(true);
    expect(t.delete(0, 0, 2)).toBe(false);
    expect(t.delete(9, 9, 9)).toBe(false);
    expect(t.size).toBe(4);
    for (const i of [0, 1, 3, 4]) expect(t.get(0, 0, i)).toBe(i);
    expect(t.get(0, 0, 2)).toBe(-1);
  });

  it("take returns the removed value (-1 when absent) and keeps colliding keys reachable", () => {
    const t = new U64Table(8);
    for (let i = 0; i < 5; i++) t.set(0, 0, i, 10 + i);
    expect(t.take(0, 0, 1)).toBe(11);
    expect(t.take(0, 0, 1)).toBe(-1);
    expect(t.size).toBe(4);
    for (const i of [0, 2, 3, 4]) expect(t.get(0, 0, i)).toBe(10 + i);
  });

  it("grows past 0.7 load and clear() returns to the initial size", () => {
    const t = new U64Table(16);
    const initialBytes = t.byteSize;
    expect(initialBytes).toBe(16 * 16);
    for (let i = 0; i < 12; i++) t.set(i, i, i, i);
    expect(t.capacity).toBe(32); // 12 > 0.7 * 16
    for (let i = 0; i < 1000; i++) t.set(i, i, i, i);
    expect(t.size).toBe(1000);
    expect(t.size / t.capacity).toBeLessThanOrEqual(0.7);
    expect(t.byteSize).toBe(t.capacity * 16);
    t.clear();
    expect(t.size).toBe(0);
    expect(t.byteSize).toBe(initialBytes);
    expect(t.get(5, 5, 5)).toBe(-1);
  });

  it("setIfAbsent inserts an absent key (-1) and leaves a present one as it is (its value)", () => {
    const t = new U64Table(8);
    expect(t.setIfAbsent(0, 1, 2, 5)).toBe(-1);
    expect(t.setIfAbsent(0, 1, 2, 9)).toBe(5);
    expect(t.get(0, 1, 2)).toBe(5);
    expect(t.size).toBe(1);
    for (let i = 0; i < 100; i++) expect(t.setIfAbsent(0, 7, i, i)).toBe(-1);
    for (let i = 0; i < 100; i++) expect(t.get(0, 7, i)).toBe(i);
    expect(() => t.setIfAbsent(0, 0, 0, -1)).toThrow(RangeError);
  });

  it("grows past a lower maxLoad when given one, and rejects one outside (0, 0.7]", () => {
    const t = new U64Table(16, 0.5);
    for (let i = 0; i < 8; i++) t.set(0, 0, i, i);
    expect(t.capacity).toBe(16);
    t.set(0, 0, 8, 8);
    expect(t.capacity).toBe(32); // the 9th past 0.5 * 16
    for (let i = 0; i < 1000; i++) t.setIfAbsent(0, 1, i, i);
    expect(t.size / t.capacity).toBeLessThanOrEqual(0.5);
    t.clear();
    for (let i = 0; i < 9; i++) t.set(0, 0, i, i);
    expect(t.capacity).toBe(32);
    for (const bad of [0, 0.71, Number.NaN]) expect(() => new U64Table(16, bad)).toThrow(KvmeshError);
  });

  it("matches a reference Map under 60,000 seeded random set/setIfAbsent/delete/get operations", () => {
    const rnd = seededRandom(12345);
    const t = new U64Table(8);
    const ref = new Map<string, number>();
    // Small key space so deletes and overwrites hit live keys often; hi/lo drawn from a few
    // values including high-bit ones so probe runs wrap and collide.
    const words = [0, 1, 2, 0x7fffffff, 0x80000000, 0xffffffff, 12345, 0xdeadbeef];
    const pick = (): number => words[Math.floor(rnd.next() * words.length)] as number;
    let checks = 0;
    // Plain comparisons in the loop (an expect() per op costs more than the ops); the first
    // mismatch is reported with its op number.
    const mismatches: string[] = [];
    const check = (op: number, what: string, got: unknown, want: unknown): void => {
      if (got !== want && mismatches.length < 5) mismatches.push(`op ${op} ${what}: got ${String(got)}, want ${String(want)}`);
    };
    for (let op = 0; op < 60_000; op++) {
      const tag = Math.floor(rnd.next() * 40);
      const hi = pick();
      const lo = rnd.next() < 0.5 ? pick() : Math.floor(rnd.next() * 50);
      const k = keyOf(tag, hi, lo);
      const r = rnd.next();
      if (r < 0.35) {
        const v = Math.floor(rnd.next() * 2 ** 31);
        t.set(tag, hi, lo, v);
        ref.set(k, v);
      } else if (r < 0.45) {
        const v = Math.floor(rnd.next() * 2 ** 31);
        check(op, `setIfAbsent ${k}`, t.setIfAbsent(tag, hi, lo, v), ref.get(k) ?? -1);
        if (!ref.has(k)) ref.set(k, v);
      } else if (r < 0.8) {
        check(op, `delete ${k}`, t.delete(tag, hi, lo), ref.delete(k));
      } else {
        check(op, `get ${k}`, t.get(tag, hi, lo), ref.get(k) ?? -1);
        checks++;
      }
      check(op, "size", t.size, ref.size);
    }
    expect(mismatches).toEqual([]);
    expect(checks).toBeGreaterThan(10_000);
    // Full comparison at the end, both directions.
    const seen = new Map<string, number>();
    t.forEach((tag, hi, lo, v) => seen.set(keyOf(tag, hi, lo), v));
    expect(seen).toEqual(ref);
    for (const [k, v] of ref) {
      const [tag, hi, lo] = k.split(":").map(Number) as [number, number, number];
      expect(t.get(tag, hi, lo)).toBe(v);
    }
  });

  it("hands its slots over to a table adopting them, which remaps its values in one pass", () => {
    const t = new U64Table();
    for (let i = 0; i < 100; i++) t.set(i % 3, i * 7, -i, i);
    const { slots, size } = t.handOver();
    expect(t.size).toBe(0);
    expect(t.get(0, 0, 0)).toBe(-1);
    const a = U64Table.adopt(slots, size);
    expect(a.size).toBe(100);
    for (let i = 0; i < 100; i++) expect(a.get(i % 3, i * 7, -i)).toBe(i);
    a.remapValues(Int32Array.from({ length: 100 }, (_, i) => 1000 + i));
    for (let i = 0; i < 100; i++) expect(a.get(i % 3, i * 7, -i)).toBe(1000 + i);
    a.set(9, 9, 9, 1);
    expect(a.size).toBe(101);
    expect(a.take(0, 0, 0)).toBe(1000);
  });

  it("adopt refuses slots of another shape or a size that does not match them", () => {
    const t = new U64Table(16);
    t.set(1, 2, 3, 4);
    const { slots } = t.handOver();
    expect(() => U64Table.adopt(slots, 2)).toThrow(/hold 1 entries/);
    expect(() => U64Table.adopt(slots.subarray(0, 12), 0)).toThrow(/power-of-two/);
    expect(() => U64Table.adopt(new Int32Array(4 * 24).fill(-1), 0)).toThrow(/power-of-two/);
    const one = U64Table.adopt(slots, 1);
    expect(() => {
      one.remapValues(new Int32Array(2));
    }).toThrow(RangeError);
  });
});
