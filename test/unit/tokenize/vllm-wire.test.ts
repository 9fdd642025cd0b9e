import { describe, expect, it } from "vitest";

import { parseRenderResponse, parseTokenizeResponse, renderAnswerIds, tokenizeAnswerIds } from "../../../src/tokenize/vllm-wire.js";

/** What the engine tokenizer answered before it read bytes: res.json() (UTF-8 decode, BOM dropped, JSON.parse), then the json-level parser. */
function reference(text: Buffer, fromJson: (json: unknown) => Uint32Array | string): unknown {
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder().decode(text));
  } catch (err) {
    return `answer is not JSON (${(err as Error).message})`;
  }
  return norm(fromJson(json));
}

const norm = (r: Uint32Array | string): unknown => (typeof r === "string" ? r : Array.from(r));

/** A seeded xorshift32 (deterministic cases). */
function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 2 ** 32;
  };
}

const generate = (ids: readonly unknown[], extra: Record<string, unknown> = {}): Record<string, unknown> => ({ request_id: "r-1", token_ids: ids, features: null, sampling_params: { max_tokens: 16 }, model: "m", stream: false, ...extra });

function checkRender(text: string | Buffer): void {
  const bytes = Buffer.isBuffer(text) ? text : Buffer.from(text);
  expect(norm(renderAnswerIds("chat", bytes)), bytes.toString().slice(0, 120)).toEqual(reference(bytes, (j) => parseRenderResponse("chat", j)));
  expect(norm(renderAnswerIds("completions", bytes))).toEqual(reference(bytes, (j) => parseRenderResponse("completions", j)));
  expect(norm(tokenizeAnswerIds(bytes))).toEqual(reference(bytes, parseTokenizeResponse));
}

describe("reading token ids from an engine's answer bytes", () => {
  it("reads a render answer's ids as JSON.parse does, short arrays and ones long enough for the WebAssembly loop", () => {
    const next = rng(7);
    for (const n of [1, 2, 10, 500, 31_000]) {
      const ids = Array.from({ length: n }, () => Math.floor(next() * 2 ** 32));
      ids[0] = 0;
      if (n > 1) ids[1] = 0xffff_ffff;
      const render = Buffer.from(JSON.stringify(generate(ids)));
      expect(Array.from(renderAnswerIds("chat", render) as Uint32Array)).toEqual(ids);
      checkRender(render);
      const tokenize = Buffer.from(JSON.stringify({ count: n, max_model_len: 4096, tokens: ids }));
      expect(Array.from(tokenizeAnswerIds(tokenize) as Uint32Array)).toEqual(ids);
      checkRender(tokenize);
      // Pretty-printed (Python's json.dumps(indent=2) style) reads the same.
      checkRender(JSON.stringify(generate(ids.slice(0, 50)), null, 2));
      checkRender(JSON.stringify([generate(ids)]));
    }
  });

  it("gives the generic path's result and reason for every shape the byte reader does not take", () => {
    const cases = [
      '{"token_ids": [1.0, 2, 3e0]}', // integer-valued literals: accepted, as JSON.parse reads them
      '{"token_ids": [1, -2]}',
      '{"token_ids": [1, 4294967296]}',
      '{"token_ids": [01]}',
      '{"token_ids": ["x"]}',
      '{"token_ids": []}',
      '{"token_ids": [ ]}',
      '{"token_ids": null}',
      '{"token_ids": "1,2"}',
      '{"token_ids": [[1, 2]]}',
      '{"token\\u005fids": [1, 2]}', // an escaped key decodes to token_ids
      '{"token_ids": [1, 2], "token_ids": [3]}', // the last duplicate wins
      '{"token_ids": [1, 2], "token_ids": "x"}',
      '{"token_ids": "x", "token_ids": [4, 5]}',
      '{"nested": {"token_ids": [9]}, "token_ids": [1]}',
      '{"nested": {"token_ids": [9]}}',
      '{"note": "\\"token_ids\\": [9]", "token_ids": [7]}',
      '\uFEFF{"token_ids": [1, 2]}', // a BOM: fetch's decoding drops it
      '{"token_ids": [1, 2],}', // malformed after the array
      '{"token_ids": [1, 2] "model": "m"}',
      '{"token_ids": [1, 2]',
      '{"token_ids": [1, 2]}x',
      '{"token_ids": [1, 2]}e5',
      '{"token_ids": [1 2]}',
      '{"token_ids": [1,,2]}',
      '{"tokens": [5, 6], "count": 2}',
      '{"tokens": [], "count": 0}',
      "[1, 2]",
      '[{"token_ids": [1, 2]}]',
      '[{"token_ids": [1, 2]}, {"token_ids": [3]}]',
      "",
      "null",
      "not json",
      "{}",
    ];
    for (const c of cases) checkRender(c);
    checkRender(Buffer.from([0x7b, 0x22, 0x74, 0xff, 0x22, 0x3a, 0x31, 0x7d])); // invalid UTF-8: replaced, as fetch decodes
  });

  it("agrees with JSON.parse on random corruptions of real answers", () => {
    const next = rng(42);
    const base = JSON.stringify(generate(Array.from({ length: 40 }, (_, i) => i * 977)));
    const alphabet = '{}[],:"\\ 0123456789-.eEnul\n';
    for (let k = 0; k < 3_000; k++) {
      const chars = Array.from(base); // ASCII only
      const edits = 1 + Math.floor(next() * 3);
      for (let e = 0; e < edits; e++) {
        const at = Math.floor(next() * chars.length);
        const op = next();
        const ch = alphabet[Math.floor(next() * alphabet.length)] as string;
        if (op < 0.4) chars[at] = ch;
        else if (op < 0.7) chars.splice(at, 1);
        else chars.splice(at, 0, ch);
      }
      checkRender(chars.join(""));
    }
  });

  it("hands each answer its own ids (no shared scratch between answers)", () => {
    const a = renderAnswerIds("chat", Buffer.from(JSON.stringify(generate([1, 2, 3])))) as Uint32Array;
    const b = renderAnswerIds("chat", Buffer.from(JSON.stringify(generate([4, 5, 6])))) as Uint32Array;
    expect([Array.from(a), Array.from(b)]).toEqual([
      [1, 2, 3],
      [4, 5, 6],
    ]);
  });
});
