import { readFileSync } from "node:fs";

import { describe, expect, it } from "vitest";

import { seededRandom } from "../../../src/core/index.js";
import { parseJsonBytes } from "../../../src/http/json.js";
import { parseJsonBytesWithTokenIds } from "../../../src/http/token-ids.js";
import { WASM_MIN_BYTES, WasmU32ArrayParser } from "../../../src/http/u32-array-parser.js";
import { assembleU32ArrayWat, renderWasmModule, U32_ARRAY_WASM_TS_PATH, U32_ARRAY_WAT_PATH } from "../../../scripts/lib/wasm-assemble.js";

/**
 * An independent oracle for "the array's tokens, or undefined when not all canonical u32
 * literals": a regular expression over JSON's own grammar, then the range check.
 */
function oracle(arrayText: string): number[] | undefined {
  const ws = "[ \\t\\n\\r]*";
  const lit = "(?:0|[1-9][0-9]*)";
  if (!new RegExp(`^\\[${ws}(?:${lit}${ws}(?:,${ws}${lit}${ws})*)?\\]$`).test(arrayText)) return undefined;
  const values = (arrayText.match(/[0-9]+/g) ?? []).map((d) => (d.length > 10 ? Infinity : Number(d)));
  return values.every((v) => v <= 0xffff_ffff) ? values : undefined;
}

const parser = WasmU32ArrayParser.create();

function viaWasm(arrayText: string, lead = ""): number[] | undefined {
  // The array inside a larger buffer, at an odd offset, with bytes after its `]`.
  const b = Buffer.from(`${lead}${arrayText},"tail":[7]}`);
  const start = lead.length;
  const end = b.indexOf(0x5d, start + 1);
  const got = (parser as WasmU32ArrayParser).parse(b, start, end);
  return got === undefined ? undefined : Array.from(got);
}

describe("the WebAssembly token_ids loop", () => {
  it("is the committed module assembled from its .wat source", async () => {
    const bytes = await assembleU32ArrayWat(readFileSync(U32_ARRAY_WAT_PATH, "utf8"));
    expect(readFileSync(U32_ARRAY_WASM_TS_PATH, "utf8")).toBe(renderWasmModule(bytes));
  });

  it("loads on this (little-endian) host", () => {
    expect(parser).toBeInstanceOf(WasmU32ArrayParser);
  });

  it("agrees with a regular-expression oracle on random arrays and their one-byte corruptions", () => {
    const rnd = seededRandom(4_294_967_295);
    const int = (n: number): number => Math.floor(rnd.next() * n);
    const pick = <T>(xs: readonly T[]): T => xs[int(xs.length)] as T;
    const literal = (): string =>
      pick(["0", "7", "42", "4294967295", "4294967296", "9999999999", "10000000000", "00", "01", "-1", "1.0", "1e3", String(int(150_000)), String(int(2 ** 32))]);
    const ws = (): string => pick(["", "", "", " ", "\n", "\t", "\r\n ", "\u000b"]);
    const junk = ["", "]", "[", ",", " ", "0", "9", "-", ".", "e", "a", '"', "\u0000", "\u00ff"];
    let parsed = 0;
    for (let i = 0; i < 300; i++) {
      const n = int(40);
      const canonical = rnd.next() < 0.7;
      const elems = Array.from({ length: n }, () => (canonical ? String(int(rnd.next() < 0.1 ? 2 ** 32 : 200_000)) : literal()));
      const text = `[${ws()}${elems.join(`${ws()},${ws()}`)}${ws()}]`;
      for (const t of [text, ...Array.from({ length: 4 }, () => {
        const at = 1 + int(Math.max(0, text.length - 1));
        return text.slice(0, at) + pick(junk) + text.slice(at + (rnd.next() < 0.5 ? 1 : 0));
      })]) {
        const first = t.indexOf("]");
        if (first < 0) continue;
        // The parser is handed the array up to its first `]`, as the JS scanner finds it.
        const arr = t.slice(0, first + 1);
        const want = oracle(arr);
        expect(viaWasm(arr, pick(["", "{\"token_ids\":", "xx"])), arr).toEqual(want);
        if (want !== undefined) parsed++;
      }
    }
    expect(parsed).toBeGreaterThan(200);
  });

  it("agrees with the oracle on long compact arrays (the 16-byte path) and their corruptions at any byte", () => {
    const rnd = seededRandom(99);
    const int = (n: number): number => Math.floor(rnd.next() * n);
    const junk = ["", " ", ",", "]", "0", "00", "-", "a", "\n", "9999999999", "4294967296"];
    let parsed = 0;
    for (let i = 0; i < 200; i++) {
      // Every digit count 1..10, with leading-zero and out-of-range elements mixed in.
      const elems = Array.from({ length: 50 + int(400) }, () => String(int(10 ** (1 + int(10))) % 2 ** 32));
      const text = `[${elems.join(",")}]`;
      const variants = [text, ...Array.from({ length: 5 }, () => {
        const at = 1 + int(text.length - 1);
        return text.slice(0, at) + (junk[int(junk.length)] as string) + text.slice(at + int(2));
      })];
      for (const t of variants) {
        const first = t.indexOf("]");
        if (first < 0) continue;
        const arr = t.slice(0, first + 1);
        const want = oracle(arr);
        expect(viaWasm(arr), arr.slice(0, 80)).toEqual(want);
        if (want !== undefined) parsed++;
      }
    }
    expect(parsed).toBeGreaterThan(200);
  });

  it("grows its memory for a long array and parses short ones after it", () => {
    const long = Array.from({ length: 60_000 }, (_, i) => (i * 2_654_435_761) % 2 ** 32);
    for (const n of [10, 60_000, 3, 1_000]) {
      const text = `[${long.slice(0, n).join(",")}]`;
      expect(viaWasm(text)).toEqual(long.slice(0, n));
    }
  });

  it("serves parseJsonBytesWithTokenIds for long arrays with the generic parser's answers", () => {
    const toks = Array.from({ length: 2_000 }, (_, i) => (i * 7_919) % 150_000);
    const good = `{"token_ids":[${toks.join(", ")}],"selection_id":"s"}`;
    expect(good.length).toBeGreaterThan(WASM_MIN_BYTES);
    const got = parseJsonBytesWithTokenIds(Buffer.from(good)) as { token_ids: Uint32Array; selection_id: string };
    expect(got.token_ids).toBeInstanceOf(Uint32Array);
    expect(Array.from(got.token_ids)).toEqual(toks);
    expect(got.selection_id).toBe("s");
    // A non-canonical literal deep in a long array falls back to the generic parser (number[]).
    const fallback = good.replace(`, ${toks[1_500]},`, `, ${toks[1_500]}.0,`);
    expect(fallback).not.toBe(good);
    expect(parseJsonBytesWithTokenIds(Buffer.from(fallback))).toEqual(parseJsonBytes(Buffer.from(fallback)));
  });
});
