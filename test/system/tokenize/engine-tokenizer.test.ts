/**
 * --tokenizer engine against real mock engines over loopback HTTP (vLLM's render and /tokenize
 * shapes), plus plain HTTP servers that fail, hang or answer garbage.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";

import { createMetricsRegistry } from "../../../src/metrics/registry.js";
import { MockEngine } from "../../../src/mock/mock-engine.js";
import { mockTokenize, renderMockChat } from "../../../src/mock/mock-tokenizer.js";
import { MockOpenAIServer } from "../../../src/mock/openai-server.js";
import { checkOpenAIBody, parseOpenAIRequest } from "../../../src/openai/parse-request.js";
import { createTokenizer } from "../../../src/tokenize/create-tokenizer.js";
import { EngineTokenizer } from "../../../src/tokenize/engine-tokenizer.js";
import { isTokenizerUnavailable } from "../../../src/tokenize/tokenizer-errors.js";
import { waitFor } from "../../helpers/wait.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function mockWorker(render = true): Promise<MockOpenAIServer> {
  const engine = new MockEngine({ workerId: 1n, blockSize: 16, kvBlocks: 1_024, prefillMsPerToken: 0.001, decodeMsPerToken: 1, speedup: 100 });
  const server = await MockOpenAIServer.start({ engine, model: "m", render });
  cleanups.push(() => { engine.close(); });
  cleanups.push(() => server.close());
  return server;
}

/** A plain server whose handler the test writes (failing, hanging, slow). */
async function rawServer(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<string> {
  const server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      handler(req, res);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  cleanups.push(
    () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => {
          r();
        });
      }),
  );
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

const body = { model: "m", messages: [{ role: "system", content: "sys" }, { role: "user", content: "what is in the cache today?" }] };
const req = checkOpenAIBody("chat", body);
const expected = Array.from(mockTokenize(renderMockChat(body)));

describe("engine tokenizer", () => {
  it("asks a worker's /v1/chat/completions/render and returns its ids", async () => {
    const w = await mockWorker();
    const tok = new EngineTokenizer({ workerUrls: () => [w.url] });
    const r = await tok.tokenize(req);
    expect(r.source).toBe("engine");
    expect(Array.from(r.tokenIds)).toEqual(expected);
    expect(w.counts).toMatchObject({ chatRender: 1, tokenize: 0 });
    const c = await tok.tokenize(checkOpenAIBody("completions", { model: "m", prompt: "one two three" }));
    expect(Array.from(c.tokenIds)).toEqual(Array.from(mockTokenize("one two three")));
    expect(w.counts.completionsRender).toBe(1);
  });

  it("sends render the client's own bytes (the model rewritten when the gateway rewrote it), numbers as the client wrote them", async () => {
    const seen: string[] = [];
    const server = createServer((q, res) => {
      const chunks: Buffer[] = [];
      q.on("data", (c: Buffer) => chunks.push(c));
      q.on("end", () => {
        seen.push(Buffer.concat(chunks).toString());
        res.writeHead(200, { "content-type": "application/json" }).end('{"token_ids": [7, 8, 9], "model": "m"}');
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    cleanups.push(() => new Promise<void>((r) => server.close(() => { r(); })));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const tok = new EngineTokenizer({ workerUrls: () => [url] });
    const text = '{"model":"m","messages":[{"role":"user","content":"hi"}],"seed":18446744073709551615,"temperature":1.0}';
    expect(Array.from((await tok.tokenize(parseOpenAIRequest("chat", Buffer.from(text)))).tokenIds)).toEqual([7, 8, 9]);
    expect(Array.from((await tok.tokenize(parseOpenAIRequest("chat", Buffer.from(text), { modelOverride: "big" }))).tokenIds)).toEqual([7, 8, 9]);
    // A request without bytes (checked from a decoded body) is serialised, as before.
    await tok.tokenize(checkOpenAIBody("chat", { model: "m", messages: [{ role: "user", content: "hi" }] }, { modelOverride: "big" }));
    expect(seen).toEqual([text, text.replace('"model":"m"', '"model":"big"'), '{"model":"big","messages":[{"role":"user","content":"hi"}]}']);
  });

  it("falls back to /tokenize when render answers 404, and remembers the worker lacks it", async () => {
    const w = await mockWorker(false);
    const tok = new EngineTokenizer({ workerUrls: () => [w.url] });
    expect(Array.from((await tok.tokenize(req)).tokenIds)).toEqual(expected);
    expect(Array.from((await tok.tokenize(req)).tokenIds)).toEqual(expected);
    expect(tok.counters.engineCalls).toEqual({ render: 1, tokenize: 2 });
    expect(w.counts.tokenize).toBe(2);
  });

  it("moves on to another worker when one fails, times out or answers garbage, counting each", async () => {
    const good = await mockWorker();
    const failing = await rawServer((_q, res) => res.writeHead(500).end("boom"));
    const hanging = await rawServer(() => undefined);
    const garbage = await rawServer((_q, res) => res.writeHead(200, { "content-type": "application/json" }).end('{"token_ids": ["x"]}'));
    // Valid ids, but not JSON after them: the byte reader's path refuses it too.
    const trailing = await rawServer((_q, res) => res.writeHead(200, { "content-type": "application/json" }).end('{"token_ids": [1, 2], "model": }'));
    const empty = await rawServer((_q, res) => res.writeHead(200, { "content-type": "application/json" }).end('{"token_ids": []}'));
    for (const [bad, reason] of [
      [failing, "http"],
      [hanging, "timeout"],
      [garbage, "malformed"],
      [trailing, "malformed"],
      [empty, "malformed"],
    ] as const) {
      const tok = new EngineTokenizer({ workerUrls: () => [bad, good.url] }, { timeoutMs: 200 });
      const r = await tok.tokenize(req);
      expect(Array.from(r.tokenIds), reason).toEqual(expected);
      expect(tok.counters.engineAttemptFailures[reason], reason).toBe(1);
    }
  });

  it("rejects with the registry's tokenizer-unavailable error when every worker fails, or none is ready", async () => {
    const failing = await rawServer((_q, res) => {
      res.writeHead(503).end();
    });
    const failing2 = await rawServer((_q, res) => {
      res.writeHead(500).end();
    });
    // The same server listed twice (two ranks behind one endpoint) is asked once.
    const tok = new EngineTokenizer({ workerUrls: () => [failing, `${failing}/v1/`, failing2] }, { maxAttempts: 3 });
    const err: unknown = await tok.tokenize(req).catch((e: unknown) => e);
    expect(isTokenizerUnavailable(err)).toBe(true);
    expect(err).toMatchObject({ code: "KVMESH_NOT_READY", status: 503, message: expect.stringContaining("2 worker(s) failed") as unknown });
    expect(tok.counters.failures.exhausted).toBe(1);
    expect(tok.counters.engineAttemptFailures.http).toBe(2);

    const none = new EngineTokenizer({ workerUrls: () => [] });
    expect(isTokenizerUnavailable(await none.tokenize(req).catch((e: unknown) => e))).toBe(true);
    expect(none.counters.failures.no_workers).toBe(1);
    // A refused connection is a network failure.
    const closed = await rawServer(() => undefined);
    await cleanups.pop()?.();
    const gone = new EngineTokenizer({ workerUrls: () => [closed, "mock://worker-9"] });
    expect(await gone.tokenize(req).catch((e: unknown) => e)).toMatchObject({ message: expect.stringContaining("ECONNREFUSED") as unknown });
    expect(gone.counters.engineAttemptFailures.network).toBe(1);
  });

  it("keeps at most `concurrency` calls in flight, queues up to maxQueued and sheds the rest", async () => {
    let inFlight = 0;
    let maxInFlight = 0;
    const held: ServerResponse[] = [];
    const slow = await rawServer((_q, res) => {
      inFlight++;
      maxInFlight = Math.max(maxInFlight, inFlight);
      held.push(res);
    });
    const release = (): void => {
      for (const res of held.splice(0)) {
        inFlight--;
        res.writeHead(200, { "content-type": "application/json" }).end('{"token_ids": [1, 2, 3]}');
      }
    };
    const tok = new EngineTokenizer({ workerUrls: () => [slow] }, { concurrency: 2, maxQueued: 3, timeoutMs: 10_000 });
    const pending = Array.from({ length: 5 }, () => tok.tokenize(req));
    await waitFor(() => held.length === 2);
    expect(tok.inFlight).toEqual({ running: 2, queued: 3 });
    const shed: unknown = await tok.tokenize(req).catch((e: unknown) => e);
    expect(isTokenizerUnavailable(shed)).toBe(true);
    expect(tok.counters.failures.shed).toBe(1);
    const done = Promise.all(pending);
    while (tok.inFlight.running + tok.inFlight.queued > 0 || held.length > 0) {
      release();
      await new Promise((r) => setTimeout(r, 10));
    }
    expect((await done).map((r) => Array.from(r.tokenIds))).toEqual(Array.from({ length: 5 }, () => [1, 2, 3]));
    expect(maxInFlight).toBe(2);
  });

  it("gives up at once when the caller's signal aborts (the stream ended)", async () => {
    const hanging = await rawServer(() => undefined);
    const tok = new EngineTokenizer({ workerUrls: () => [hanging] }, { timeoutMs: 10_000 });
    const ac = new AbortController();
    const p = tok.tokenize(req, { signal: ac.signal });
    ac.abort(new Error("stream reset"));
    await expect(p).rejects.toThrow("stream reset");
    expect(tok.counters.failures.aborted).toBe(1);
  });

  it("skips tokenization for ids in the body", async () => {
    const tok = new EngineTokenizer({ workerUrls: () => [] });
    expect(await tok.tokenize(checkOpenAIBody("completions", { model: "m", prompt: [9, 8] }))).toEqual({ tokenIds: Uint32Array.from([9, 8]), source: "body" });
  });

  it("createTokenizer builds the engine tokenizer by default and registers its series", async () => {
    const w = await mockWorker();
    const metrics = createMetricsRegistry();
    const tok = createTokenizer({}, { workerUrls: (model) => (model === "m" ? [w.url] : []), metrics });
    await tok.tokenize(req);
    await tok.tokenize(checkOpenAIBody("chat", { ...body, model: "unknown" })).catch(() => undefined);
    const text = await metrics.metrics();
    expect(text).toContain('kvmesh_tokenize_requests_total{source="engine"} 1');
    expect(text).toContain('kvmesh_tokenize_failures_total{reason="no_workers"} 1');
    expect(text).toContain('kvmesh_tokenizer_engine_calls_total{endpoint="render"} 1');
    await tok.close();
  });
});
