import { describe, expect, it } from "vitest";

import { KvmeshError, seededRandom } from "../../../src/core/index.js";
import { MAX_CHAT_MESSAGES, MAX_JSON_DEPTH } from "../../../src/openai/limits.js";
import { checkOpenAIBody, openAIKindOfPath, parseOpenAIRequest } from "../../../src/openai/parse-request.js";
import type { OpenAIKind } from "../../../src/tokenize/contract.js";

/** The registry error a body gets: its code, status and the field it names. */
function refusal(kind: OpenAIKind, body: unknown, override?: string): { code: string; status: number; field: unknown; message: string } {
  try {
    parseOpenAIRequest(kind, typeof body === "string" ? body : JSON.stringify(body), override === undefined ? {} : { modelOverride: override });
  } catch (e) {
    if (!(e instanceof KvmeshError)) throw e;
    return { code: e.code, status: e.status, field: e.details?.field, message: e.message };
  }
  throw new Error("accepted");
}

const chat = (messages: unknown, extra: Record<string, unknown> = {}): Record<string, unknown> => ({ model: "m", messages, ...extra });

describe("OpenAI body parser", () => {
  it("maps the two paths to their kinds, ignoring the query string", () => {
    expect(openAIKindOfPath("/v1/chat/completions")).toBe("chat");
    expect(openAIKindOfPath("/v1/completions?x=1")).toBe("completions");
    expect(openAIKindOfPath("/v1/models")).toBeUndefined();
    expect(openAIKindOfPath("/v1/completionsX")).toBeUndefined();
  });

  it("accepts a chat body with string and part contents, tools and tool calls", () => {
    const body = chat(
      [
        { role: "system", content: "s" },
        { role: "user", content: [{ type: "text", text: "t" }, { type: "image_url", image_url: { url: "data:," } }] },
        { role: "assistant", content: null, tool_calls: [{ id: "1", type: "function", function: { name: "f", arguments: "{}" } }] },
        { role: "tool", content: "r", tool_call_id: "1" },
      ],
      { tools: [{ type: "function", function: { name: "f", parameters: {} } }], stream: true },
    );
    const bytes = new TextEncoder().encode(JSON.stringify(body));
    const req = parseOpenAIRequest("chat", bytes);
    // The bytes ride along for the engine tokenizer's render call.
    expect(req).toEqual({ kind: "chat", model: "m", body, bytes });
  });

  it("takes a completions prompt as text, or as token ids that skip tokenization", () => {
    expect(checkOpenAIBody("completions", { model: "m", prompt: "hi" }).tokenIds).toBeUndefined();
    expect(checkOpenAIBody("completions", { model: "m", prompt: [1, 2, 3] }).tokenIds).toEqual([1, 2, 3]);
    expect(checkOpenAIBody("completions", { model: "m", prompt: [[4, 5]] }).tokenIds).toEqual([4, 5]);
    expect(checkOpenAIBody("completions", { model: "m", prompt: ["one"] }).tokenIds).toBeUndefined();
  });

  it("uses the gateway's model rewrite over the body's model", () => {
    expect(checkOpenAIBody("chat", chat([{ role: "user", content: "x" }]), { modelOverride: "other" }).model).toBe("other");
    expect(checkOpenAIBody("chat", { messages: [{ role: "user", content: "x" }] }, { modelOverride: "other" }).model).toBe("other");
  });

  it.each([
    ["not JSON", "completions", "{", "KVMESH_MALFORMED_JSON", "body"],
    ["not an object", "completions", "[1]", "KVMESH_BAD_REQUEST", "body"],
    ["no model", "completions", { prompt: "x" }, "KVMESH_BAD_REQUEST", "model"],
    ["model not a string", "chat", { model: 3, messages: [] }, "KVMESH_BAD_REQUEST", "model"],
    ["empty model", "completions", { model: "", prompt: "x" }, "KVMESH_BAD_REQUEST", "model"],
    ["no prompt", "completions", { model: "m" }, "KVMESH_BAD_REQUEST", "prompt"],
    ["empty prompt", "completions", { model: "m", prompt: "" }, "KVMESH_BAD_REQUEST", "prompt"],
    ["a batch of prompts", "completions", { model: "m", prompt: ["a", "b"] }, "KVMESH_BAD_REQUEST", "prompt"],
    ["a batch of id prompts", "completions", { model: "m", prompt: [[1], [2]] }, "KVMESH_BAD_REQUEST", "prompt"],
    ["a negative id", "completions", { model: "m", prompt: [1, -2] }, "KVMESH_BAD_REQUEST", "prompt[1]"],
    ["a fractional id", "completions", { model: "m", prompt: [[1, 2.5]] }, "KVMESH_BAD_REQUEST", "prompt[0][1]"],
    ["an id above u32", "completions", { model: "m", prompt: [4294967296] }, "KVMESH_BAD_REQUEST", "prompt[0]"],
    ["prompt an object", "completions", { model: "m", prompt: { a: 1 } }, "KVMESH_BAD_REQUEST", "prompt"],
    ["no messages", "chat", { model: "m" }, "KVMESH_BAD_REQUEST", "messages"],
    ["empty messages", "chat", chat([]), "KVMESH_BAD_REQUEST", "messages"],
    ["a message not an object", "chat", chat([{ role: "user", content: "x" }, "hi"]), "KVMESH_BAD_REQUEST", "messages[1]"],
    ["a message without role", "chat", chat([{ content: "x" }]), "KVMESH_BAD_REQUEST", "messages[0].role"],
    ["content a number", "chat", chat([{ role: "user", content: "a" }, { role: "user", content: "b" }, { role: "user", content: 7 }]), "KVMESH_BAD_REQUEST", "messages[2].content"],
    ["a part without type", "chat", chat([{ role: "user", content: [{ text: "x" }] }]), "KVMESH_BAD_REQUEST", "messages[0].content[0].type"],
    ["a text part without text", "chat", chat([{ role: "user", content: [{ type: "text", text: "a" }, { type: "text" }] }]), "KVMESH_BAD_REQUEST", "messages[0].content[1].text"],
    ["tool_calls not an array", "chat", chat([{ role: "assistant", tool_calls: {} }]), "KVMESH_BAD_REQUEST", "messages[0].tool_calls"],
    ["a tool call without function", "chat", chat([{ role: "assistant", tool_calls: [{ id: "1" }] }]), "KVMESH_BAD_REQUEST", "messages[0].tool_calls[0].function"],
    ["tools not an array", "chat", chat([{ role: "user", content: "x" }], { tools: {} }), "KVMESH_BAD_REQUEST", "tools"],
    ["a tool of another type", "chat", chat([{ role: "user", content: "x" }], { tools: [{ type: "web", function: { name: "f" } }] }), "KVMESH_BAD_REQUEST", "tools[0].type"],
    ["a tool without name", "chat", chat([{ role: "user", content: "x" }], { tools: [{ type: "function", function: {} }] }), "KVMESH_BAD_REQUEST", "tools[0].function.name"],
    ["add_generation_prompt not a boolean", "chat", chat([{ role: "user", content: "x" }], { add_generation_prompt: "yes" }), "KVMESH_BAD_REQUEST", "add_generation_prompt"],
    ["both generation switches", "chat", chat([{ role: "user", content: "x" }], { add_generation_prompt: true, continue_final_message: true }), "KVMESH_BAD_REQUEST", "continue_final_message"],
    ["chat_template_kwargs a list", "chat", chat([{ role: "user", content: "x" }], { chat_template_kwargs: [] }), "KVMESH_BAD_REQUEST", "chat_template_kwargs"],
  ] as const)("refuses %s, naming the field", (_what, kind, body, code, field) => {
    const r = refusal(kind, body);
    expect(r.code).toBe(code);
    expect(r.status).toBe(400);
    expect(r.field).toBe(field);
    if (code === "KVMESH_BAD_REQUEST") expect(r.message.startsWith(`${field}: `)).toBe(true);
  });

  it("refuses an empty model rewrite naming the header", () => {
    expect(refusal("chat", chat([{ role: "user", content: "x" }]), "").field).toBe("x-gateway-model-name-rewrite");
  });

  it("refuses invalid UTF-8 as malformed", () => {
    expect(() => parseOpenAIRequest("chat", Uint8Array.from([0x7b, 0xff, 0x7d]))).toThrow(expect.objectContaining({ code: "KVMESH_MALFORMED_JSON" }));
  });

  it("bounds message counts and nesting depth", () => {
    const many = Array.from({ length: MAX_CHAT_MESSAGES + 1 }, () => ({ role: "user", content: "x" }));
    expect(refusal("chat", chat(many)).message).toMatch(/^messages: holds 8193 messages/);
    let deep: unknown = {};
    for (let i = 0; i < MAX_JSON_DEPTH + 2; i++) deep = { p: deep };
    const r = refusal("chat", chat([{ role: "user", content: "x" }], { tools: [{ type: "function", function: { name: "f", parameters: deep } }] }));
    expect(r.field).toMatch(/^tools\[0\]\.function\.parameters(\.p)+$/);
    expect(r.message).toContain(`nests deeper than ${MAX_JSON_DEPTH} levels`);
  });

  /** What a body gets: the request (ids as a plain array), or the refusal. */
  function outcome(bytes: Buffer | string): unknown {
    try {
      const r = parseOpenAIRequest("completions", bytes);
      const ids = r.tokenIds === undefined ? undefined : Array.from(r.tokenIds);
      const body = { ...r.body, prompt: ArrayBuffer.isView(r.body.prompt) ? Array.from(r.body.prompt as Uint32Array) : r.body.prompt };
      return { model: r.model, ids, body };
    } catch (e) {
      if (!(e instanceof KvmeshError)) throw e;
      return { code: e.code, field: e.details?.field, message: e.message };
    }
  }

  it("reads a flat id prompt from the bytes into a Uint32Array, with the same result as decoding the whole body", () => {
    const ids = Array.from({ length: 3_000 }, (_, i) => (i * 7_919) % 200_000);
    const text = JSON.stringify({ model: "m", prompt: ids, max_tokens: 16, stream: true });
    const req = parseOpenAIRequest("completions", Buffer.from(text));
    expect(req.tokenIds).toBeInstanceOf(Uint32Array);
    expect(req.body.prompt).toBe(req.tokenIds);
    expect(outcome(Buffer.from(text))).toEqual(outcome(text));
  });

  it("answers every body, and every one-byte corruption of it, as the generic path does (the refusals name the same field)", () => {
    const rnd = seededRandom(7);
    const int = (n: number): number => Math.floor(rnd.next() * n);
    const pick = <T>(xs: readonly T[]): T => xs[int(xs.length)] as T;
    const junk = ["", "]", "[", ",", " ", "0", "-", ".", "e", '"', "{", "}", "\\", "\u00ff"];
    const models = ['"m"', '""', "3", "null"];
    let fast = 0;
    for (let i = 0; i < 300; i++) {
      const n = pick([0, 1, 5, 900]);
      const ids = Array.from({ length: n }, () => String(rnd.next() < 0.02 ? pick(["4294967296", "-1", "1.0", "01", "2.5"]) : int(2 ** 32)));
      const prompt = rnd.next() < 0.1 ? `[[${ids.join(",")}]]` : `[${ids.join(rnd.next() < 0.5 ? "," : " , ")}]`;
      const parts = [`"model":${pick(models)}`, `"prompt":${prompt}`, '"max_tokens":16', '"nested":{"prompt":[1,2]}'];
      if (rnd.next() < 0.1) parts.push(`"prompt":${rnd.next() < 0.5 ? '"text"' : "[9,8]"}`);
      const text = `{${parts.sort(() => rnd.next() - 0.5).join(",")}}`;
      for (const t of [text, ...Array.from({ length: 3 }, () => {
        const at = int(text.length);
        return text.slice(0, at) + pick(junk) + text.slice(at + int(2));
      })]) {
        const bytes = Buffer.from(t);
        const want = outcome(t);
        expect(outcome(bytes)).toEqual(want);
        if (ArrayBuffer.isView(parseOrUndefined(bytes)?.tokenIds)) fast++;
      }
    }
    expect(fast).toBeGreaterThan(20);
  });
});

function parseOrUndefined(bytes: Buffer): ReturnType<typeof parseOpenAIRequest> | undefined {
  try {
    return parseOpenAIRequest("completions", bytes);
  } catch {
    return undefined;
  }
}
