import { describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/errors.js";
import { seededRandom } from "../../../src/core/random.js";
import { hashListFromBigInts, hashListToBigInts, hashListToSignedBigInts, toU64, u64ToI64 } from "../../../src/core/hash64.js";

describe("hash64", () => {
  it("round-trips 64-bit values exactly, above 2^53 too", () => {
    const values = [0n, 1n, (1n << 53n) + 1n, (1n << 64n) - 1n, 0x8000000000000000n, 0x123456789abcdef0n];
    expect(hashListToBigInts(hashListFromBigInts(values))).toEqual(values);
  });

  it("converts lists of any length exactly, longer than its scratch and after a longer one", () => {
    const rnd = seededRandom(64);
    const u32 = (): number => Math.floor(rnd.next() * 0x1_0000_0000);
    for (const n of [0, 1, 219, 300, 1_000, 3]) {
      const list = Uint32Array.from({ length: 2 * n }, u32);
      if (n > 1) list.set([0, 0, 0xffffffff, 0xffffffff], 0);
      const want = Array.from({ length: n }, (_, i) => (BigInt(list[2 * i] as number) << 32n) | BigInt(list[2 * i + 1] as number));
      expect(hashListToBigInts(list)).toEqual(want);
    }
  });

  it("converts lists to signed 64-bit values (two's complement), any length, both sides of 2^63", () => {
    // The reference returns hashes over HTTP as `hash as i64` (services/selection/core/run.rs).
    const values = [0n, 1n, (1n << 63n) - 1n, 1n << 63n, (1n << 64n) - 1n, 16863443419780771464n];
    expect(hashListToSignedBigInts(hashListFromBigInts(values))).toEqual([
      0n,
      1n,
      (1n << 63n) - 1n,
      -(1n << 63n),
      -1n,
      16863443419780771464n - (1n << 64n),
    ]);
    const rnd = seededRandom(63);
    const u32 = (): number => Math.floor(rnd.next() * 0x1_0000_0000);
    for (const n of [0, 2, 700, 5]) {
      const list = Uint32Array.from({ length: 2 * n }, u32);
      expect(hashListToSignedBigInts(list)).toEqual(hashListToBigInts(list).map(u64ToI64));
      expect(hashListFromBigInts(hashListToSignedBigInts(list))).toEqual(list);
    }
  });

  it("reinterprets signed 64-bit values as unsigned and back", () => {
    expect(toU64(-1n)).toBe((1n << 64n) - 1n);
    expect(toU64(-(1n << 63n))).toBe(1n << 63n);
    expect(u64ToI64((1n << 64n) - 1n)).toBe(-1n);
    expect(u64ToI64(5n)).toBe(5n);
  });

  it("gives the words of toU64, by shift and mask, for random signed and unsigned values, edges included", () => {
    // The BigUint64Array store must reduce exactly as toU64 does (signed -> two's complement).
    const rnd = seededRandom(65);
    const u64 = (): bigint => (BigInt(Math.floor(rnd.next() * 0x1_0000_0000)) << 32n) | BigInt(Math.floor(rnd.next() * 0x1_0000_0000));
    const edges = [0n, 1n, -1n, (1n << 32n) - 1n, 1n << 32n, (1n << 63n) - 1n, 1n << 63n, -(1n << 63n), (1n << 64n) - 1n, -(1n << 32n)];
    const values = [...edges, ...Array.from({ length: 500 }, () => (rnd.next() < 0.5 ? u64() : u64ToI64(u64())))];
    const want = new Uint32Array(2 * values.length);
    values.forEach((v, i) => {
      const u = toU64(v);
      want[2 * i] = Number(u >> 32n);
      want[2 * i + 1] = Number(u & 0xffffffffn);
    });
    expect(hashListFromBigInts(values)).toEqual(want);
  });

  it("rejects values outside the 64-bit range", () => {
    expect(() => hashListFromBigInts([1n, -(1n << 63n) - 1n])).toThrow(/outside the 64-bit range/);
    expect(() => hashListFromBigInts([1n << 64n])).toThrow(/outside the 64-bit range/);
    expect(() => toU64(1n << 64n)).toThrow(/outside the 64-bit range/);
    expect(() => toU64(-(1n << 63n) - 1n)).toThrow(/outside the 64-bit range/);
    expect(() => hashListFromBigInts([1n, 1n << 70n])).toThrow(KvmeshError);
  });
});
