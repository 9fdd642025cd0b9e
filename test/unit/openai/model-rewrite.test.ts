import { describe, expect, it } from "vitest";

import { rewriteModel } from "../../../src/openai/model-rewrite.js";

const enc = (s: string): Uint8Array => new TextEncoder().encode(s);
const dec = (b: Uint8Array): string => new TextDecoder().decode(b);

describe("model rewrite", () => {
  it("replaces the top-level model and leaves every other byte as it was", () => {
    const body = '{ "seed": 18446744073709551615, "model" : "a", "x": 1.0, "messages": [{"model": "inner", "content": "\\"model\\": \\"no\\" é"}] }';
    const out = dec(rewriteModel(enc(body), "b/c\"d"));
    expect(out).toBe(body.replace('"model" : "a"', '"model" : "b/c\\"d"'));
    expect((JSON.parse(out) as { model: string }).model).toBe('b/c"d');
  });

  it("replaces every top-level duplicate, whichever the engine keeps", () => {
    const out = dec(rewriteModel(enc('{"model":"a","n":{"model":"keep"},"model":"z"}'), "new"));
    expect(out).toBe('{"model":"new","n":{"model":"keep"},"model":"new"}');
  });

  it("replaces a non-string model value too", () => {
    expect(dec(rewriteModel(enc('{"model": null, "prompt": [1,2]}'), "m"))).toBe('{"model": "m", "prompt": [1,2]}');
  });

  it("adds model to a body without one", () => {
    expect(JSON.parse(dec(rewriteModel(enc(' {"prompt":"x"}'), "m")))).toEqual({ model: "m", prompt: "x" });
    expect(JSON.parse(dec(rewriteModel(enc("{}"), "m")))).toEqual({ model: "m" });
  });

  it("refuses a body that is not a JSON object, naming body", () => {
    expect(() => rewriteModel(enc("[1]"), "m")).toThrow(expect.objectContaining({ status: 400, details: { field: "body" } }));
    expect(() => rewriteModel(enc('{"model": "a'), "m")).toThrow(/unterminated string/);
  });
});
