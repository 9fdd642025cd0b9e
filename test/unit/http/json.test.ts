import { describe, expect, it } from "vitest";

import { JsonDepthError, MAX_JSON_DEPTH, parseJson, parseJsonBytes, stringifyJson } from "../../../src/http/json.js";

const U64_MAX = 18446744073709551615n;

describe("parseJson", () => {
  it("keeps integers above 2^53 exact as bigint and safe integers as numbers", () => {
    const v = parseJson(`{"a":18446744073709551615,"b":9007199254740993,"c":9007199254740991,"d":42,"e":1234567890123456}`);
    expect(v).toEqual({ a: U64_MAX, b: 9007199254740993n, c: 9007199254740991, d: 42, e: 1234567890123456 });
    expect(typeof (v as { c: unknown }).c).toBe("number");
  });

  it("returns negative 64-bit integers as bigint", () => {
    expect(parseJson("[-9223372036854775808,-9007199254740991,-9007199254740992,-0]")).toEqual([-(1n << 63n), -9007199254740991, -9007199254740992n, -0]);
  });

  it("leaves digits inside strings alone, including escaped quotes before them", () => {
    const text = `{"s":"12345678901234567890","t":"say \\"99999999999999999999\\" twice","u":"\\u0041\\n","n":12345678901234567890}`;
    expect(parseJson(text)).toEqual({ s: "12345678901234567890", t: 'say "99999999999999999999" twice', u: "A\n", n: 12345678901234567890n });
  });

  it("finds a 16-digit unsafe integer at every offset (the fast-path probe is strided)", () => {
    for (let pad = 0; pad < 40; pad++) {
      const text = `{"${"k".repeat(pad)}":[1,9007199254740993]}`;
      expect(parseJson(text)).toEqual({ ["k".repeat(pad)]: [1, 9007199254740993n] });
      expect(parseJsonBytes(Buffer.from(text))).toEqual({ ["k".repeat(pad)]: [1, 9007199254740993n] });
    }
  });

  it("decodes UTF-8 and escapes on the exact path like JSON.parse", () => {
    const text = `{"é":"naïve 🚀 \\u00e9\\ud83d\\ude80 \\\\ \\/","h":18446744073709551615}`;
    const expected = { ...(JSON.parse(text.replace("18446744073709551615", "0")) as object), h: U64_MAX };
    expect(parseJson(text)).toEqual(expected);
    expect(parseJsonBytes(Buffer.from(text, "utf8"))).toEqual(expected);
    expect(parseJsonBytes(Buffer.from(`{"a":[1,2,"x"]}`))).toEqual({ a: [1, 2, "x"] });
    expect(() => parseJsonBytes(Buffer.from(`{"a":"\\q","b":18446744073709551615}`))).toThrow(SyntaxError);
  });

  it("keeps non-integer literals as JSON.parse numbers (fractions and exponents)", () => {
    const text = "[12345678901234567.5, 1e300, 12345678901234567890e2, -0.00000000000000000001, 1E+2, 2.5e-3]";
    expect(parseJson(text)).toEqual(JSON.parse(text));
  });

  it("parses nested arrays and objects on the exact path like JSON.parse", () => {
    const text = ` { "x" : [ [1, [2, [true, false, null]]], {"y": {"z": [18446744073709551615]}} ], "e": [], "o": {} } `;
    const v = parseJson(text) as { x: [unknown, { y: { z: bigint[] } }] };
    expect(v.x[1].y.z[0]).toBe(U64_MAX);
    expect(parseJson(text.replace("18446744073709551615", "1"))).toEqual(JSON.parse(text.replace("18446744073709551615", "1")));
  });

  it("treats __proto__ as a plain key, as JSON.parse does", () => {
    const v = parseJson(`{"__proto__":{"polluted":1},"n":18446744073709551615}`) as Record<string, unknown>;
    expect(Object.getPrototypeOf(v)).toBe(Object.prototype);
    expect(Object.keys(v)).toEqual(["__proto__", "n"]);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });

  it.each([
    "[18446744073709551615,]",
    "{18446744073709551615:1}",
    "[01, 18446744073709551615]",
    "[18446744073709551615",
    '{"a" 18446744073709551615}',
    '["abc',
    "[-, 18446744073709551615]",
    "[1., 18446744073709551615]",
    "[1e, 18446744073709551615]",
    "[18446744073709551615] x",
    '["a\u0001", 18446744073709551615]',
    "[tru, 18446744073709551615]",
  ])("rejects malformed text on the exact path: %s", (text) => {
    expect(() => parseJson(text)).toThrow(SyntaxError);
  });

  it("rejects malformed text on the fast path too", () => {
    expect(() => parseJson("{")).toThrow(SyntaxError);
    expect(() => parseJson("")).toThrow(SyntaxError);
  });

  it("bounds nesting on the exact path", () => {
    const ok = "[".repeat(MAX_JSON_DEPTH) + "18446744073709551615" + "]".repeat(MAX_JSON_DEPTH);
    expect(() => parseJson(ok)).not.toThrow();
    const deep = "[".repeat(MAX_JSON_DEPTH + 1) + "18446744073709551615" + "]".repeat(MAX_JSON_DEPTH + 1);
    expect(() => parseJson(deep)).toThrow(JsonDepthError);
    const deeper = "[".repeat(100_000) + "18446744073709551615" + "]".repeat(100_000);
    expect(() => parseJson(deeper)).toThrow(JsonDepthError);
  });

  it("agrees with JSON.parse on random safe documents forced through the exact path", () => {
    let seed = 1;
    const rnd = (): number => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed / 2147483648;
    };
    const gen = (d: number): unknown => {
      const r = rnd();
      if (d > 3 || r < 0.4) return [Math.floor(rnd() * 1e9) - 5e8, rnd() * 1e6, "s\"\\" + String(Math.floor(rnd() * 1e6)), true, null][Math.floor(rnd() * 5)];
      if (r < 0.7) return Array.from({ length: Math.floor(rnd() * 4) }, () => gen(d + 1));
      return Object.fromEntries(Array.from({ length: Math.floor(rnd() * 4) }, (_, i) => [`k${i}`, gen(d + 1)]));
    };
    for (let i = 0; i < 200; i++) {
      const doc = { v: gen(0), big: 18446744073709551615n };
      const text = stringifyJson(doc);
      const expected = JSON.parse(text.replace("18446744073709551615", "0")) as Record<string, unknown>;
      expect(parseJson(text)).toEqual({ ...expected, big: U64_MAX });
    }
  });
});

describe("stringifyJson", () => {
  it("writes bigints as bare integers and matches JSON.stringify otherwise", () => {
    const value = { a: U64_MAX, b: [1n, -5n, undefined, () => 1], c: "x\"\n\u0000", d: undefined, e: null, f: NaN, g: -0, h: { i: true }, j: new Date(0) };
    expect(stringifyJson(value)).toBe(
      `{"a":18446744073709551615,"b":[1,-5,null,null],"c":"x\\"\\n\\u0000","e":null,"f":null,"g":0,"h":{"i":true},"j":"1970-01-01T00:00:00.000Z"}`,
    );
    const plain = { x: [1, 2.5, "s"], y: { z: null }, w: "", u: undefined };
    expect(stringifyJson(plain)).toBe(JSON.stringify(plain));
    expect(stringifyJson(undefined)).toBe("null");
  });

  it("round-trips through parseJson exactly", () => {
    const value = { hashes: [0n, 1n << 63n, U64_MAX, -(1n << 63n)], n: 9007199254740991 };
    // Small bigints come back as numbers (safe integers); the validators widen them again.
    expect(parseJson(stringifyJson(value))).toEqual({ hashes: [0, 1n << 63n, U64_MAX, -(1n << 63n)], n: 9007199254740991 });
  });
});
