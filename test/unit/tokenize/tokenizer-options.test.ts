import { describe, expect, it } from "vitest";

import { createTokenizer } from "../../../src/tokenize/create-tokenizer.js";
import { DEFAULT_TOKENIZER_OPTIONS, resolveTokenizerOptions, TOKENIZER_OPTION_DEFINITIONS } from "../../../src/tokenize/tokenizer-options.js";

const fieldOf = (f: () => unknown): unknown => {
  try {
    f();
  } catch (e) {
    return { code: (e as { code?: unknown }).code, field: (e as { details?: { field?: unknown } }).details?.field };
  }
  return "accepted";
};

describe("tokenizer options", () => {
  it("defaults to the engine tokenizer", () => {
    expect(resolveTokenizerOptions()).toEqual(DEFAULT_TOKENIZER_OPTIONS);
    expect(resolveTokenizerOptions().tokenizer).toBe("engine");
  });

  it("takes --tokenizer-file alone as file mode", () => {
    expect(resolveTokenizerOptions({ tokenizerFile: "/x/tokenizer.json" })).toMatchObject({ tokenizer: "file", tokenizerFile: "/x/tokenizer.json" });
  });

  it.each([
    [{ tokenizer: "file" as const }, "tokenizerFile"],
    [{ tokenizer: "engine" as const, tokenizerFile: "/x" }, "tokenizerFile"],
    [{ tokenizer: "remote" as never }, "tokenizer"],
    [{ tokenizerFile: "" }, "tokenizerFile"],
    [{ tokenizerTimeoutMs: 0 }, "tokenizerTimeoutMs"],
    [{ tokenizerConcurrency: 1.5 }, "tokenizerConcurrency"],
    [{ tokenizerMaxQueued: -1 }, "tokenizerMaxQueued"],
    [{ tokenizerAttempts: 0 }, "tokenizerAttempts"],
    [{ tokenizerCacheEntries: 0 }, "tokenizerCacheEntries"],
    [{ tokenizerCacheTokens: Number.NaN }, "tokenizerCacheTokens"],
  ])("refuses %j naming %s", (input, field) => {
    expect(fieldOf(() => resolveTokenizerOptions(input))).toEqual({ code: "KVMESH_INVALID_OPTION", field });
  });

  it("defines a flag and an environment variable for every option", () => {
    expect(TOKENIZER_OPTION_DEFINITIONS.map((d) => d.field).sort()).toEqual(Object.keys(DEFAULT_TOKENIZER_OPTIONS).sort());
    for (const d of TOKENIZER_OPTION_DEFINITIONS) {
      expect(d.flag).toMatch(/^--tokenizer[a-z-]*( <[a-z]+>)?$/);
      expect(d.env).toMatch(/^KVMESH_TOKENIZER[A-Z_]*$/);
    }
  });

  it("createTokenizer names the file it cannot load as an option error", () => {
    expect(fieldOf(() => createTokenizer({ tokenizerFile: "/nonexistent/tokenizer.json" }, { workerUrls: () => [] }))).toEqual({ code: "KVMESH_INVALID_OPTION", field: "tokenizerFile" });
  });
});
