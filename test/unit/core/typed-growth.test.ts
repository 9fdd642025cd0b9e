import { describe, expect, it } from "vitest";
import { grownTo } from "../../../src/core/typed-growth.js";

describe("grownTo", () => {
  it("copies into an array of the same type with room for n, doubling at least, the tail zero", () => {
    const a = Int32Array.of(1, -2, 3);
    const b = grownTo(a, 4);
    expect(b).toBeInstanceOf(Int32Array);
    expect(Array.from(b)).toEqual([1, -2, 3, 0, 0, 0]);
    const f = grownTo(Float64Array.of(0.5), 10);
    expect(f).toBeInstanceOf(Float64Array);
    expect(f.length).toBe(10);
    expect(f[0]).toBe(0.5);
    expect(grownTo(new Uint8Array(0), 1).length).toBe(1);
  });
});
