import { describe, expect, it } from "vitest";

import { randomUuid } from "../../../src/core/request-ids.js";
import { seededRandom } from "../../../src/core/random.js";

/** The id spelled out from its 16 drawn bytes, as RFC 4122 lays out a version 4 UUID. */
function expectedUuid(draws: readonly number[]): string {
  const b = draws.map((d) => Math.floor(d * 256));
  b[6] = ((b[6] as number) & 0x0f) | 0x40;
  b[8] = ((b[8] as number) & 0x3f) | 0x80;
  const h = b.map((x) => x.toString(16).padStart(2, "0")).join("");
  return [h.slice(0, 8), h.slice(8, 12), h.slice(12, 16), h.slice(16, 20), h.slice(20)].join("-");
}

describe("randomUuid", () => {
  it("lays out the 16 drawn bytes as an RFC 4122 version 4 UUID", () => {
    const draws = seededRandom(7);
    const replay = seededRandom(7);
    for (let n = 0; n < 500; n++) {
      const id = randomUuid(draws);
      expect(id).toBe(expectedUuid(Array.from({ length: 16 }, () => replay.next())));
      expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    }
  });

  it("spells the extreme bytes (0x00 and 0xff draws) with two digits each", () => {
    expect(randomUuid({ next: () => 0 })).toBe("00000000-0000-4000-8000-000000000000");
    expect(randomUuid({ next: () => 0.999_999 })).toBe("ffffffff-ffff-4fff-bfff-ffffffffffff");
  });
});
