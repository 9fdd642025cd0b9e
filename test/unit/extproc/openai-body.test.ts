/** The picker's minimal OpenAI body parser (a seam src/openai/ replaces): fields named in errors. */
import { describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/errors.js";
import { openAIKindOf, parseOpenAIBody } from "../../../src/extproc/openai-body.js";

const b = (v: unknown): Buffer => Buffer.from(JSON.stringify(v));
const fieldOf = (f: () => unknown): unknown => {
  try {
    f();
  } catch (err) {
    return err instanceof KvmeshError ? [err.status, err.details?.["field"]] : err;
  }
  return undefined;
};

describe("OpenAI body parser (picker seam)", () => {
  it("maps the OpenAI paths and nothing else", () => {
    expect(openAIKindOf("/v1/completions")).toBe("completions");
    expect(openAIKindOf("/v1/chat/completions?x=1")).toBe("chat");
    expect(openAIKindOf("/v1/models")).toBeUndefined();
    expect(openAIKindOf(undefined)).toBeUndefined();
  });

  it("reads token ids from a completions prompt array, not from a string prompt", () => {
    expect(parseOpenAIBody("completions", b({ model: "m", prompt: [1, 2, 3] })).tokenIds).toEqual([1, 2, 3]);
    expect(parseOpenAIBody("completions", b({ model: "m", prompt: "hi" })).tokenIds).toBeUndefined();
    expect(parseOpenAIBody("chat", b({ model: "m", messages: [] })).kind).toBe("chat");
  });

  it("applies the model rewrite to the request and its body", () => {
    const r = parseOpenAIBody("completions", b({ model: "m", prompt: [1] }), "m2");
    expect(r.model).toBe("m2");
    expect(r.body["model"]).toBe("m2");
  });

  it("names the field of a bad body", () => {
    expect(fieldOf(() => parseOpenAIBody("completions", Buffer.from("[")))).toEqual([400, "body"]);
    expect(fieldOf(() => parseOpenAIBody("completions", b([1])))).toEqual([400, "body"]);
    expect(fieldOf(() => parseOpenAIBody("completions", b({ prompt: [1] })))).toEqual([400, "model"]);
    expect(fieldOf(() => parseOpenAIBody("completions", b({ model: "m" })))).toEqual([400, "prompt"]);
    expect(fieldOf(() => parseOpenAIBody("completions", b({ model: "m", prompt: [1, 2.5] })))).toEqual([400, "prompt[1]"]);
    expect(fieldOf(() => parseOpenAIBody("chat", b({ model: "m" })))).toEqual([400, "messages"]);
  });
});
