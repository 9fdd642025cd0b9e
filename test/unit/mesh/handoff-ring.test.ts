import { describe, expect, it } from "vitest";

import { MeshOptionError } from "../../../mesh/errors.js";

import { createHandoffRingBuffer, DEFAULT_HANDOFF_RING_BYTES, HandoffRing } from "../../../mesh/handoff-ring.js";

const bytes = (n: number, fill: number): Uint8Array => new Uint8Array(n).fill(fill);

describe("HandoffRing", () => {
  it("hands records over in order, each once, between two views of one buffer", () => {
    const sab = createHandoffRingBuffer();
    expect(sab.byteLength).toBe(16 + DEFAULT_HANDOFF_RING_BYTES);
    const writer = new HandoffRing(sab);
    const reader = new HandoffRing(sab);
    expect(reader.read()).toBeUndefined();
    expect(writer.write(bytes(3, 1))).toBe(true);
    expect(writer.write(new Uint8Array(0))).toBe(true);
    expect(writer.write(bytes(5, 2))).toBe(true);
    expect(reader.used).toBe(4 + 3 + 4 + 0 + 4 + 5);
    expect([...(reader.read() ?? [])]).toEqual([1, 1, 1]);
    expect(reader.read()).toEqual(new Uint8Array(0));
    expect([...(reader.read() ?? [])]).toEqual([2, 2, 2, 2, 2]);
    expect(reader.read()).toBeUndefined();
    expect(reader.used).toBe(0);
  });

  it("refuses a record that does not fit until the reader frees room, and never one larger than the ring", () => {
    const ring = new HandoffRing(createHandoffRingBuffer(64));
    expect(ring.write(bytes(40, 7))).toBe(true);
    // 44 bytes held, 20 free: a 17-byte record needs 21.
    expect(ring.write(bytes(17, 8))).toBe(false);
    expect(ring.write(bytes(16, 8))).toBe(true);
    expect(ring.used).toBe(64);
    expect(ring.write(new Uint8Array(0))).toBe(false);
    expect(ring.read()?.length).toBe(40);
    expect(ring.write(bytes(17, 9))).toBe(true);
    expect(ring.write(bytes(61, 0))).toBe(false);
    expect(new HandoffRing(createHandoffRingBuffer(64)).write(bytes(61, 0))).toBe(false);
    expect(() => createHandoffRingBuffer(8)).toThrow(MeshOptionError);
  });

  it("wraps records and their length prefixes around the end of the buffer", () => {
    const ring = new HandoffRing(createHandoffRingBuffer(64));
    const seen: number[] = [];
    // Odd sizes walk every offset, so prefixes and payloads both split at the end many times.
    for (let i = 0; i < 500; i++) {
      const n = (i * 7) % 23;
      expect(ring.write(bytes(n, i % 251))).toBe(true);
      if (i % 2 === 1) {
        for (let r = ring.read(); r !== undefined; r = ring.read()) seen.push(r.length === 0 ? -1 : (r[0] as number), r.length);
      }
    }
    const want: number[] = [];
    for (let i = 0; i < 500; i++) {
      const n = (i * 7) % 23;
      want.push(n === 0 ? -1 : i % 251, n);
    }
    expect(seen).toEqual(want);
  });
});
