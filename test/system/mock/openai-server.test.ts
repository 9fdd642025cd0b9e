/**
 * The mock engines' OpenAI HTTP API over real loopback HTTP: vLLM's shapes, and a request served
 * through the same MockEngine.submit path (same ids into the same KV cache and KV events).
 */
import { afterEach, describe, expect, it } from "vitest";

import { descriptorsToWorkerRequests, MockEngineFleet } from "../../../src/mock/engine-fleet.js";
import type { MockKvEvent } from "../../../src/mock/kv-event-publisher.js";
import { MockEngine } from "../../../src/mock/mock-engine.js";
import { mockTokenize, renderMockChat } from "../../../src/mock/mock-tokenizer.js";
import { MockOpenAIServer } from "../../../src/mock/openai-server.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const FAST = { blockSize: 16, kvBlocks: 4_096, prefillMsPerToken: 0.001, decodeMsPerToken: 1, speedup: 100 } as const;

async function start(opts: { render?: boolean } = {}): Promise<{ url: string; server: MockOpenAIServer; events: MockKvEvent[] }> {
  const events: MockKvEvent[] = [];
  const engine = new MockEngine({
    workerId: 1n,
    ...FAST,
    events: {
      publish: (batch) => {
        events.push(...batch);
        return undefined;
      },
    },
  });
  const server = await MockOpenAIServer.start({ engine, model: "mock-model", ...opts });
  cleanups.push(() => { engine.close(); });
  cleanups.push(() => server.close());
  return { url: server.url, server, events };
}

async function post(url: string, body: unknown): Promise<{ status: number; json: unknown; text: string; type: string | null }> {
  const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: typeof body === "string" ? body : JSON.stringify(body) });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json, text, type: res.headers.get("content-type") };
}

const conversation = {
  model: "mock-model",
  messages: [
    { role: "system", content: "You are a mock." },
    { role: "user", content: `Tell me about ${"caching ".repeat(40)}please.` },
  ],
};

describe("mock engine OpenAI HTTP API", () => {
  it("binds 127.0.0.1 on an ephemeral port and answers /health and /v1/models", async () => {
    const { url } = await start();
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect((await fetch(`${url}/health`)).status).toBe(200);
    const models = (await (await fetch(`${url}/v1/models`)).json()) as { object: string; data: { id: string; object: string; max_model_len: number }[] };
    expect(models.object).toBe("list");
    expect(models.data).toEqual([expect.objectContaining({ id: "mock-model", object: "model", max_model_len: 131_072 })]);
  });

  it("renders and tokenizes a chat body as /v1/chat/completions/render and /tokenize, with the same ids", async () => {
    const { url, server } = await start();
    const expected = Array.from(mockTokenize(renderMockChat(conversation)));
    const render = await post(`${url}/v1/chat/completions/render`, conversation);
    expect(render.status).toBe(200);
    expect(render.json).toMatchObject({ token_ids: expected, model: "mock-model", features: null, sampling_params: { max_tokens: 16 } });
    const tok = await post(`${url}/tokenize`, { model: "mock-model", messages: conversation.messages });
    expect(tok.json).toEqual({ count: expected.length, max_model_len: 131_072, tokens: expected });
    const comp = await post(`${url}/v1/completions/render`, { model: "mock-model", prompt: "plain words here" });
    expect(comp.json).toEqual([expect.objectContaining({ token_ids: Array.from(mockTokenize("plain words here")) })]);
    expect(await post(`${url}/tokenize`, { prompt: "plain words here" })).toMatchObject({ json: { count: 3 } });
    expect(server.counts).toMatchObject({ chatRender: 1, completionsRender: 1, tokenize: 2 });
  });

  it("answers 404 on the render endpoints when built without them (an older vLLM)", async () => {
    const { url } = await start({ render: false });
    expect((await post(`${url}/v1/chat/completions/render`, conversation)).status).toBe(404);
    expect((await post(`${url}/tokenize`, conversation)).status).toBe(200);
  });

  it("serves a chat completion through the engine: usage, the engine's measured cache hit, KV events of the same ids", async () => {
    const { url, events } = await start();
    const ids = Array.from(mockTokenize(renderMockChat(conversation)));
    const first = await post(`${url}/v1/chat/completions`, { ...conversation, max_tokens: 4 });
    expect(first.status).toBe(200);
    expect(first.json).toMatchObject({
      object: "chat.completion",
      model: "mock-model",
      choices: [{ index: 0, message: { role: "assistant", content: "tok0 tok1 tok2 tok3" }, finish_reason: "length" }],
      usage: { prompt_tokens: ids.length, completion_tokens: 4, total_tokens: ids.length + 4, prompt_tokens_details: { cached_tokens: 0 } },
    });
    // The KV events carry the prompt's own ids, block by block.
    const stored = events.filter((e) => e.type === "stored").flatMap((e) => e.tokenIds as number[]);
    const fullBlocks = Math.floor(ids.length / 16) * 16;
    expect(stored).toEqual(ids.slice(0, fullBlocks));
    // The same prompt again hits the engine's prefix cache (vLLM recomputes the last token).
    const second = await post(`${url}/v1/chat/completions`, { ...conversation, max_tokens: 4 });
    expect((second.json as { usage: { prompt_tokens_details: { cached_tokens: number } } }).usage.prompt_tokens_details.cached_tokens).toBe(Math.floor((ids.length - 1) / 16) * 16);
  });

  it("streams a chat completion as SSE: the first token, the rest, the finish, usage, [DONE]", async () => {
    const { url } = await start();
    const res = await post(`${url}/v1/chat/completions`, { ...conversation, max_tokens: 3, stream: true, stream_options: { include_usage: true } });
    expect(res.status).toBe(200);
    expect(res.type).toMatch(/^text\/event-stream/);
    const events = res.text.split("\n\n").filter((e) => e.length > 0);
    expect(events.at(-1)).toBe("data: [DONE]");
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.replace(/^data: /, "")) as { object: string; choices: { delta: { content?: string }; finish_reason: string | null }[]; usage?: { completion_tokens: number } });
    for (const c of chunks) expect(c.object).toBe("chat.completion.chunk");
    const text = chunks.flatMap((c) => c.choices.map((x) => x.delta.content ?? "")).join("");
    expect(text).toBe("tok0 tok1 tok2");
    expect(chunks.at(-2)?.choices[0]?.finish_reason).toBe("length");
    expect(chunks.at(-1)).toMatchObject({ choices: [], usage: { completion_tokens: 3 } });
  });

  it("serves a completions prompt given as token ids as they are, and streams text_completion chunks", async () => {
    const { url } = await start();
    const r = await post(`${url}/v1/completions`, { model: "mock-model", prompt: [5, 6, 7, 8], max_tokens: 2 });
    expect(r.json).toMatchObject({ object: "text_completion", choices: [{ text: "tok0 tok1" }], usage: { prompt_tokens: 4, completion_tokens: 2 } });
    const s = await post(`${url}/v1/completions`, { model: "mock-model", prompt: "hello there", max_tokens: 2, stream: true });
    expect(s.text).toContain('"object":"text_completion"');
    expect(s.text.endsWith("data: [DONE]\n\n")).toBe(true);
    expect(s.text).not.toContain('"usage"');
  });

  it("answers errors in vLLM's ErrorResponse shape, naming the field", async () => {
    const { url } = await start();
    expect(await post(`${url}/v1/chat/completions`, { ...conversation, model: "other" })).toMatchObject({ status: 404, json: { error: { type: "NotFoundError", param: "model", code: 404 } } });
    expect(await post(`${url}/v1/chat/completions`, { model: "mock-model", messages: [{ role: "user", content: 3 }] })).toMatchObject({ status: 400, json: { error: { param: "messages[0].content", code: 400 } } });
    expect(await post(`${url}/v1/completions`, { model: "mock-model", prompt: "x", max_tokens: 0 })).toMatchObject({ status: 400, json: { error: { param: "max_tokens" } } });
    expect(await post(`${url}/v1/completions`, "{not json")).toMatchObject({ status: 400 });
    expect((await fetch(`${url}/v1/completions`)).status).toBe(405);
    expect((await fetch(`${url}/nope`)).status).toBe(404);
  });

  it("a fleet serves the API on every rank and registers it as the worker's endpoint", async () => {
    const fleet = await MockEngineFleet.start({ engines: 2, ...FAST, openai: { model: "m" } });
    cleanups.push(() => fleet.close());
    const urls = fleet.descriptors.map((d) => d.httpEndpoint);
    for (const u of urls) expect(u).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(new Set(urls).size).toBe(2);
    expect(descriptorsToWorkerRequests(fleet.descriptors).map((r) => r.endpoint)).toEqual(urls);
    const r = await post(`${urls[1] as string}/v1/completions`, { model: "m", prompt: [1, 2, 3], max_tokens: 1 });
    expect(r.status).toBe(200);
    expect(fleet.stats().engines.map((s) => s.requests)).toEqual([0, 1]);
  });
});
