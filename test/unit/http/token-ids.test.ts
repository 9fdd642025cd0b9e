import { describe, expect, it } from "vitest";

import { seededRandom } from "../../../src/core/index.js";
import { KvmeshError } from "../../../src/core/index.js";
import { parseJsonBytes } from "../../../src/http/json.js";
import { parseSelectRequest } from "../../../src/http/schemas.js";
import { parseJsonBytesWithTokenIds } from "../../../src/http/token-ids.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";

const fast = (text: string): unknown => parseJsonBytesWithTokenIds(Buffer.from(text, "utf8"));
const generic = (text: string): unknown => parseJsonBytes(Buffer.from(text, "utf8"));
const tokenIdsOf = (v: unknown): unknown => (v as Record<string, unknown>).token_ids;

/** The fast result with a Uint32Array token_ids turned into the number[] the generic parser gives. */
function asGeneric(v: unknown): unknown {
  const t = tokenIdsOf(v);
  return t instanceof Uint32Array ? { ...(v as object), token_ids: Array.from(t) } : v;
}

/** Either both parsers return equal values, or both throw the same error. */
function expectSameAsGeneric(text: string): unknown {
  let expected: unknown;
  let expectedError: unknown;
  try {
    expected = generic(text);
  } catch (e) {
    expectedError = e;
  }
  if (expectedError !== undefined) {
    expect(() => fast(text)).toThrow(expectedError);
    return undefined;
  }
  const got = fast(text);
  expect(asGeneric(got)).toEqual(expected);
  // Key order (which field an error names first) is kept too.
  expect(Object.keys(got as object)).toEqual(Object.keys(expected as object));
  return got;
}

function validationError(text: string): KvmeshError {
  return kvmeshErrorOf(() => parseSelectRequest(fast(text), ""));
}

describe("parseJsonBytesWithTokenIds", () => {
  it("parses a top-level token_ids array into a Uint32Array and the rest exactly", () => {
    const v = expectSameAsGeneric(`{"token_ids":[0,1,42,4294967295],"selection_id":"s","allowed_worker_ids":[18446744073709551615]}`);
    const t = tokenIdsOf(v);
    expect(t).toBeInstanceOf(Uint32Array);
    expect(Array.from(t as Uint32Array)).toEqual([0, 1, 42, 4294967295]);
    expect((v as Record<string, unknown>).allowed_worker_ids).toEqual([18446744073709551615n]);
  });

  it("accepts whitespace anywhere JSON allows it", () => {
    for (const text of [
      ` \n{ "token_ids" \t: [ 1 , 2\r\n,3 ] , "selection_id" : "x" } \n`,
      `{"selection_id":"x",\n\t"token_ids":\n[\n1,\n2,\n3\n]\n}`,
      `{"token_ids":[1,2,3]}`,
    ]) {
      const v = expectSameAsGeneric(text);
      expect(tokenIdsOf(v)).toBeInstanceOf(Uint32Array);
      expect(Array.from(tokenIdsOf(v) as Uint32Array)).toEqual([1, 2, 3]);
    }
  });

  it("returns an empty Uint32Array for an empty array, and rejects stray commas like JSON.parse", () => {
    for (const text of [`{"token_ids":[]}`, `{"token_ids":[ \n ]}`]) {
      const t = tokenIdsOf(expectSameAsGeneric(text));
      expect(t).toBeInstanceOf(Uint32Array);
      expect((t as Uint32Array).length).toBe(0);
    }
    for (const text of [`{"token_ids":[,]}`, `{"token_ids":[1,]}`, `{"token_ids":[,1]}`, `{"token_ids":[1 2]}`, `{"token_ids":[1,,2]}`, `{"token_ids":[1`]) {
      expect(() => fast(text)).toThrow(SyntaxError);
      expectSameAsGeneric(text);
    }
  });

  it("never takes a token_ids inside a string or a nested object", () => {
    const cases: [string, unknown][] = [
      [`{"a":"\\"token_ids\\":[9]","token_ids":[1]}`, [1]],
      [`{"a":"x\\\\","token_ids":[1]}`, [1]],
      [`{"a":"token_ids","b":[7]}`, undefined],
      [`{"session_context":{"session_id":"s","token_ids":[5]},"token_ids":[1]}`, [1]],
      [`{"o":{"token_ids":[5]}}`, undefined],
      [`{"a":[{"token_ids":[5]}],"token_ids":[2]}`, [2]],
      [`{"a":[[["token_ids"]]],"token_ids":[3]}`, [3]],
      [`{"a":"}]}","token_ids":[4]}`, [4]],
    ];
    for (const [text, expected] of cases) {
      const v = expectSameAsGeneric(text);
      const t = tokenIdsOf(v);
      if (expected === undefined) expect(t).toBeUndefined();
      else {
        expect(t).toBeInstanceOf(Uint32Array);
        expect(Array.from(t as Uint32Array)).toEqual(expected);
      }
    }
    // The nested copies stay ordinary JSON values.
    const nested = fast(`{"o":{"token_ids":[5]},"token_ids":[1]}`) as { o: { token_ids: unknown } };
    expect(nested.o.token_ids).toEqual([5]);
    expect(Array.isArray(nested.o.token_ids)).toBe(true);
  });

  it("leaves bodies without token_ids (or not objects) to the generic parser, 64-bit values exact", () => {
    for (const text of [
      `{"block_hashes":[18446744073709551615,-1],"sequence_hashes":[1,2],"isl_tokens":8}`,
      `[1,2,3]`,
      `"token_ids"`,
      `{}`,
      `{"token_idsx":[1],"xtoken_ids":[2],"token_id":[3]}`,
    ]) {
      const v = expectSameAsGeneric(text);
      if (typeof v === "object" && v !== null) expect(tokenIdsOf(v)).toBeUndefined();
    }
    expect(fast(`{"block_hashes":[18446744073709551615]}`)).toEqual({ block_hashes: [18446744073709551615n] });
  });

  it("rejects out-of-range and non-canonical ids with a 422 naming token_ids[i]", () => {
    const message = "must be an integer in [0, 4294967295]";
    for (const [bad, index] of [
      ["4294967296", 1],
      ["9999999999", 1],
      ["99999999999", 1],
      ["18446744073709551615", 1],
      ["123456789012345678901234567890", 1],
      ["-1", 1],
      ["1.5", 1],
      ["2e-1", 1],
      ["1e10", 1],
      ['"7"', 1],
      ["null", 1],
      ["[1]", 1],
      ["true", 1],
    ] as const) {
      const e = validationError(`{"token_ids":[0,${bad},2]}`);
      expect(e.status).toBe(422);
      expect(e.message).toBe(`token_ids[${index}]: ${message}`);
      expect(e.details).toEqual({ field: `token_ids[${index}]` });
    }
    // Leading zeros and a bare minus are not JSON at all: malformed, as on the generic path.
    for (const bad of ["01", "00", "-", "+1", "0x10", "1_000"]) expect(() => fast(`{"token_ids":[${bad}]}`)).toThrow(SyntaxError);
  });

  it("keeps integer-valued fraction and exponent literals as JSON.parse reads them (the generic path's semantics)", () => {
    const v = expectSameAsGeneric(`{"token_ids":[1.0,1e3,25E-1,0]}`);
    expect(tokenIdsOf(v)).toEqual([1, 1000, 2.5, 0]);
    expect(validationError(`{"token_ids":[1.0,1e3,25E-1,0]}`).message).toBe("token_ids[2]: must be an integer in [0, 4294967295]");
    expect(parseSelectRequest(fast(`{"token_ids":[1.0,1e3]}`), "")).toEqual({ token_ids: [1, 1000] });
  });

  it("follows JSON.parse on duplicate top-level token_ids: the last one wins", () => {
    const last = expectSameAsGeneric(`{"token_ids":[1],"selection_id":"s","token_ids":[2,3]}`);
    expect(tokenIdsOf(last)).toBeInstanceOf(Uint32Array);
    expect(Array.from(tokenIdsOf(last) as Uint32Array)).toEqual([2, 3]);
    // An invalid earlier copy is discarded, as JSON.parse discards it.
    expect(asGeneric(expectSameAsGeneric(`{"token_ids":["x",-1],"token_ids":[4]}`))).toEqual({ token_ids: [4] });
    // An invalid last copy is the one validated.
    expect(validationError(`{"token_ids":[4],"token_ids":[5,-1]}`).message).toBe("token_ids[1]: must be an integer in [0, 4294967295]");
    // A key spelt with escapes is the same key: the generic path decides, with the same last-wins rule.
    expect(fast(`{"token_ids":[1],"token\\u005fids":[2]}`)).toEqual({ token_ids: [2] });
    expect(fast(`{"token\\u005fids":[1],"token_ids":[2]}`)).toEqual({ token_ids: [2] });
  });

  it("reports malformed JSON elsewhere exactly as the generic parser does, offsets included", () => {
    for (const text of [
      `{"token_ids":[1,2],"x":}`,
      `{"token_ids":[1,2]e5}`,
      `{"token_ids":[1,2].5}`,
      `{"token_ids":[1,2]5}`,
      `{"token_ids":[1,2]} x`,
      `{"token_ids":[1,2]}}`,
      `{"token_ids":[1,2],"n":18446744073709551615,}`,
      `{"a":"unterminated,"token_ids":[1]}`,
      `{"token_ids" [1]}`,
      `{"token_ids":[1],"s":"tab\tinside"}`,
      `\uFEFF{"token_ids":[1]}`,
    ]) {
      expect(() => fast(text)).toThrow(SyntaxError);
      expectSameAsGeneric(text);
    }
  });

  it("returns independent arrays across calls, also past the reusable scratch size", () => {
    const big = Array.from({ length: 300_000 }, (_, i) => (i * 2_654_435_761) % 4_294_967_296);
    const a = fast(`{"token_ids":[${big.join(",")}]}`);
    const b = fast(`{"token_ids":[7,8]}`);
    expect(Array.from(tokenIdsOf(a) as Uint32Array)).toEqual(big);
    expect(Array.from(tokenIdsOf(b) as Uint32Array)).toEqual([7, 8]);
    const c = fast(`{"token_ids":[${big.slice(0, 50_000).join(",")}]}`);
    expect(Array.from(tokenIdsOf(c) as Uint32Array)).toEqual(big.slice(0, 50_000));
    expect(Array.from(tokenIdsOf(a) as Uint32Array).slice(0, 3)).toEqual(big.slice(0, 3));
  });

  it("agrees with the generic parser on random bodies and on every one-byte corruption of them", () => {
    const rnd = seededRandom(20240611);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd.next() * xs.length)] as T;
    const ws = (): string => pick(["", "", " ", "\n", "\t ", "\r\n"]);
    const token = (): string => pick(["0", "7", "42", "4294967295", String(Math.floor(rnd.next() * 1e6)), "4294967296", "-3", "1.5", "1e2", '"t"']);
    const other = (): string =>
      pick([`"selection_id":${ws()}"s\\"token_ids\\":[1]"`, `"o":{"token_ids":[9],"x":[{}]}`, `"n":18446744073709551615`, `"l":[[],{"a":"]"}]`, `"b":true`, `"z":null`]);
    const bodies: string[] = [];
    for (let i = 0; i < 150; i++) {
      const arr = `[${ws()}${Array.from({ length: Math.floor(rnd.next() * 6) }, () => (rnd.next() < 0.9 ? token().replace(/[^0-9]/g, "") || "0" : token())).join(`${ws()},${ws()}`)}${ws()}]`;
      const members = Array.from({ length: Math.floor(rnd.next() * 3) }, other);
      members.splice(Math.floor(rnd.next() * (members.length + 1)), 0, `"token_ids"${ws()}:${ws()}${arr}`);
      if (rnd.next() < 0.1) members.push(`"token_ids":[${token()}]`);
      bodies.push(`${ws()}{${ws()}${members.join(`${ws()},${ws()}`)}${ws()}}${ws()}`);
    }
    const junk = ["", "]", "[", "}", "{", ",", ":", '"', "\\", "0", "9", "-", ".", "e", " ", "n"];
    for (const body of bodies) {
      expectSameAsGeneric(body);
      for (let k = 0; k < 8; k++) {
        const at = Math.floor(rnd.next() * (body.length + 1));
        const cut = rnd.next() < 0.5 ? 1 : 0;
        expectSameAsGeneric(body.slice(0, at) + pick(junk) + body.slice(at + cut));
      }
    }
  });
});

describe("token_ids validation of a Uint32Array", () => {
  it("accepts it without a copy", () => {
    const ids = new Uint32Array([1, 2, 4294967295]);
    expect(parseSelectRequest({ token_ids: ids }, "").token_ids).toBe(ids);
  });

  it("still checks a number[] element by element", () => {
    expect(() => parseSelectRequest({ token_ids: [1, 2 ** 32] }, "")).toThrow("token_ids[1]: must be an integer in [0, 4294967295]");
    expect(() => parseSelectRequest({ token_ids: new Int32Array([1]) }, "")).toThrow("token_ids: must be an array of integers");
  });
});
