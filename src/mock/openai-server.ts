/**
 * A mock engine rank's HTTP front: the part of vLLM's OpenAI-compatible server a gateway and a
 * router talk to, over node:http on 127.0.0.1 (an ephemeral port unless one is given).
 *
 *   GET  /health                        200, empty (vLLM: engine alive)
 *   GET  /v1/models                     {object: "list", data: [{id, object: "model", max_model_len, ...}]}
 *   POST /tokenize                      {prompt, add_special_tokens} or {messages, tools, ...} -> {count, max_model_len, tokens}
 *   POST /v1/chat/completions/render    chat body -> GenerateRequest {request_id, token_ids, sampling_params, model, ...}
 *   POST /v1/completions/render         completions body -> [GenerateRequest]
 *   POST /v1/completions                text completion, SSE when `stream`, `usage` always (stream: with stream_options.include_usage)
 *   POST /v1/chat/completions           chat completion, likewise
 *
 * Shapes follow vLLM's serve/render, serve/tokenize and openai protocol modules; errors are
 * vLLM's ErrorResponse `{error: {message, type, param, code}}`. Prompts are tokenized by the
 * mock tokenizer (mock-tokenizer.ts), or taken as given (`prompt` as token ids), and served by
 * the rank's MockEngine through the same submit() the benchmarks use: the same ids reach the
 * same paged KV cache and go out in the same KV events, so the hit ratio the engines measure
 * means the same over HTTP. `usage.prompt_tokens_details.cached_tokens` is the engine's
 * measured hit for the request.
 *
 * Streaming: the engine reports the first token (prefill done) and completion, not each token,
 * so a stream sends its first chunk at the first token and the rest of the text at completion.
 * A client that leaves mid-request does not abort the engine's work (vLLM aborts it): the
 * request runs to completion and its KV blocks stay cached as if it had been read.
 */
import { randomUUID } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

import { isKvmeshError } from "../core/index.js";
import { checkOpenAIBody, decodeJsonObject } from "../openai/parse-request.js";
import type { OpenAIRequest } from "../tokenize/contract.js";
import type { EngineRequest, EngineResult } from "./mock-engine.js";
import { mockCompletionText, mockTokenize, renderMockChat } from "./mock-tokenizer.js";

/** What the server needs of an engine. */
export interface MockEngineSubmitter {
  submit(req: EngineRequest): Promise<EngineResult>;
}

export interface MockOpenAIServerOptions {
  readonly engine: MockEngineSubmitter;
  /** The served model name (`/v1/models`; a body naming another model gets 404). */
  readonly model: string;
  /** Default 127.0.0.1. */
  readonly host?: string;
  /** Default 0 (ephemeral). */
  readonly port?: number;
  readonly maxModelLen?: number;
  /** false: the render endpoints answer 404, as a vLLM without them does (the /tokenize fallback). */
  readonly render?: boolean;
  /** Output tokens when the body sets neither max_tokens nor max_completion_tokens. */
  readonly defaultMaxTokens?: number;
  readonly maxBodyBytes?: number;
}

/** vLLM's default for a model without max_position_embeddings overrides is the model's; 128 Ki here. */
export const DEFAULT_MOCK_MAX_MODEL_LEN = 131_072;
/** Output tokens of a request that names none (vLLM would fill the context; a mock keeps it short). */
export const DEFAULT_MOCK_MAX_TOKENS = 16;
/** The mock's body limit, bytes (the picker's default). */
export const DEFAULT_MOCK_MAX_BODY_BYTES = 16 * 1024 * 1024;

/** Requests served per endpoint (tests check which path a tokenizer took). */
export interface MockOpenAICounts {
  tokenize: number;
  chatRender: number;
  completionsRender: number;
  completions: number;
  chatCompletions: number;
  errors: number;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

const ERROR_TYPES: Readonly<Record<number, string>> = { 400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed", 413: "BadRequestError", 500: "InternalServerError" };

export class MockOpenAIServer {
  readonly counts: MockOpenAICounts = { tokenize: 0, chatRender: 0, completionsRender: 0, completions: 0, chatCompletions: 0, errors: 0 };
  readonly #server: Server;
  readonly #opts: Required<Omit<MockOpenAIServerOptions, "host" | "port">>;
  #seq = 0;

  private constructor(server: Server, opts: MockOpenAIServerOptions) {
    this.#server = server;
    this.#opts = {
      engine: opts.engine,
      model: opts.model,
      maxModelLen: opts.maxModelLen ?? DEFAULT_MOCK_MAX_MODEL_LEN,
      render: opts.render ?? true,
      defaultMaxTokens: opts.defaultMaxTokens ?? DEFAULT_MOCK_MAX_TOKENS,
      maxBodyBytes: opts.maxBodyBytes ?? DEFAULT_MOCK_MAX_BODY_BYTES,
    };
  }

  static async start(opts: MockOpenAIServerOptions): Promise<MockOpenAIServer> {
    const server = createServer();
    const self = new MockOpenAIServer(server, opts);
    server.on("request", (req, res) => {
      self.#handle(req, res).catch((err: unknown) => {
        self.#fail(res, err);
      });
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(opts.port ?? 0, opts.host ?? "127.0.0.1", () => {
        server.off("error", reject);
        resolve();
      });
    });
    return self;
  }

  /** `http://127.0.0.1:PORT` */
  get url(): string {
    const a = this.#server.address() as AddressInfo;
    const host = a.family === "IPv6" ? `[${a.address}]` : a.address;
    return `http://${host}:${a.port}`;
  }

  async close(): Promise<void> {
    await new Promise<void>((resolve) => {
      this.#server.close(() => {
        resolve();
      });
      this.#server.closeAllConnections();
    });
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? "/").split("?")[0] ?? "/";
    const get = req.method === "GET" || req.method === "HEAD";
    if (path === "/health" && get) {
      res.writeHead(200).end();
      return;
    }
    if (path === "/v1/models" && get) {
      sendJson(res, 200, { object: "list", data: [{ id: this.#opts.model, object: "model", created: 0, owned_by: "kvmesh-mock", root: this.#opts.model, parent: null, max_model_len: this.#opts.maxModelLen }] });
      return;
    }
    const routes: Readonly<Record<string, (body: Record<string, unknown>, res: ServerResponse) => Promise<void> | void>> = {
      "/tokenize": (b, r) => {
        this.#tokenize(b, r);
      },
      "/v1/chat/completions/render": (b, r) => {
        this.#render("chat", b, r);
      },
      "/v1/completions/render": (b, r) => {
        this.#render("completions", b, r);
      },
      "/v1/completions": (b, r) => this.#complete("completions", b, r),
      "/v1/chat/completions": (b, r) => this.#complete("chat", b, r),
    };
    const route = Object.hasOwn(routes, path) ? routes[path] : undefined;
    if (route === undefined || (!this.#opts.render && path.endsWith("/render"))) throw new HttpError(404, "Not Found");
    if (req.method !== "POST") throw new HttpError(405, "Method Not Allowed");
    const body = decodeJsonObject(await readBody(req, this.#opts.maxBodyBytes));
    await route(body, res);
  }

  #checkModel(body: Record<string, unknown>): void {
    if (body.model !== undefined && body.model !== null && body.model !== this.#opts.model) {
      throw new HttpError(404, `The model \`${JSON.stringify(body.model)}\` does not exist.`, "model");
    }
  }

  /** The prompt's ids: given, or the mock template and tokenizer's. */
  #promptIds(req: OpenAIRequest): Uint32Array {
    if (req.tokenIds !== undefined) return Uint32Array.from(req.tokenIds);
    if (req.kind === "chat") return mockTokenize(renderMockChat(req.body));
    const p = req.body.prompt;
    return mockTokenize(typeof p === "string" ? p : String((p as unknown[])[0]));
  }

  #parse(kind: OpenAIRequest["kind"], body: Record<string, unknown>): OpenAIRequest {
    this.#checkModel(body);
    return checkOpenAIBody(kind, body, { modelOverride: this.#opts.model });
  }

  #tokenize(body: Record<string, unknown>, res: ServerResponse): void {
    this.counts.tokenize++;
    // vLLM's TokenizeRequest is a chat request when it has `messages`; its add_generation_prompt defaults to true.
    const req = this.#parse(body.messages !== undefined ? "chat" : "completions", body);
    const tokens = this.#promptIds(req);
    sendJson(res, 200, { count: tokens.length, max_model_len: this.#opts.maxModelLen, tokens: Array.from(tokens) });
  }

  #render(kind: OpenAIRequest["kind"], body: Record<string, unknown>, res: ServerResponse): void {
    if (kind === "chat") this.counts.chatRender++;
    else this.counts.completionsRender++;
    const req = this.#parse(kind, body);
    const generate = {
      request_id: randomUUID(),
      token_ids: Array.from(this.#promptIds(req)),
      features: null,
      sampling_params: { max_tokens: this.#maxTokens(body) },
      model: this.#opts.model,
      stream: body.stream === true,
      stream_options: null,
      cache_salt: typeof body.cache_salt === "string" ? body.cache_salt : null,
      priority: 0,
      kv_transfer_params: null,
    };
    sendJson(res, 200, kind === "chat" ? generate : [generate]);
  }

  #maxTokens(body: Record<string, unknown>): number {
    for (const key of ["max_completion_tokens", "max_tokens"] as const) {
      const v = body[key];
      if (v === undefined || v === null) continue;
      if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 1) throw new HttpError(400, `${key}: must be a positive integer`, key);
      return v;
    }
    return this.#opts.defaultMaxTokens;
  }

  async #complete(kind: OpenAIRequest["kind"], body: Record<string, unknown>, res: ServerResponse): Promise<void> {
    if (kind === "chat") this.counts.chatCompletions++;
    else this.counts.completions++;
    const req = this.#parse(kind, body);
    const tokens = this.#promptIds(req);
    const outputTokens = this.#maxTokens(body);
    if (tokens.length + outputTokens > this.#opts.maxModelLen) {
      throw new HttpError(400, `This model's maximum context length is ${this.#opts.maxModelLen} tokens. However, you requested ${tokens.length + outputTokens} tokens.`, kind === "chat" ? "messages" : "prompt");
    }
    const id = `${kind === "chat" ? "chatcmpl" : "cmpl"}-${randomUUID().replaceAll("-", "")}`;
    const created = Math.floor(Date.now() / 1000);
    const object = kind === "chat" ? "chat.completion" : "text_completion";
    const model = this.#opts.model;
    const stream = body.stream === true;
    const so = body.stream_options;
    const includeUsage = typeof so === "object" && so !== null && (so as Record<string, unknown>).include_usage === true;

    const piece = (text: string, finish: string | null): Record<string, unknown> =>
      kind === "chat" ? { index: 0, delta: finish === null ? { role: "assistant", content: text } : {}, logprobs: null, finish_reason: finish } : { index: 0, text, logprobs: null, finish_reason: finish };
    const chunk = (choices: unknown[], usage?: unknown): string =>
      `data: ${JSON.stringify({ id, object: kind === "chat" ? "chat.completion.chunk" : "text_completion", created, model, choices, ...(usage === undefined ? {} : { usage }) })}\n\n`;

    let firstSent = false;
    if (stream) {
      res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache" });
      res.flushHeaders();
    }
    const result = await this.#opts.engine.submit({
      requestId: `${id}-${this.#seq++}`,
      tokens,
      outputTokens,
      onFirstToken: stream
        ? () => {
            firstSent = true;
            if (!res.destroyed) res.write(chunk([piece(mockCompletionText(1), null)]));
          }
        : undefined,
    });
    const usage = {
      prompt_tokens: result.promptTokens,
      completion_tokens: result.outputTokens,
      total_tokens: result.promptTokens + result.outputTokens,
      prompt_tokens_details: { cached_tokens: result.cachedTokens },
    };
    if (!stream) {
      const text = mockCompletionText(result.outputTokens);
      const choice = kind === "chat" ? { index: 0, message: { role: "assistant", content: text }, logprobs: null, finish_reason: "length" } : { index: 0, text, logprobs: null, finish_reason: "length" };
      sendJson(res, 200, { id, object, created, model, choices: [choice], usage });
      return;
    }
    if (res.destroyed) return;
    const from = firstSent ? 1 : 0;
    if (result.outputTokens > from) res.write(chunk([piece((from > 0 ? " " : "") + mockCompletionText(result.outputTokens - from, from), null)]));
    res.write(chunk([piece("", "length")]));
    if (includeUsage) res.write(chunk([], usage));
    res.end("data: [DONE]\n\n");
  }

  #fail(res: ServerResponse, err: unknown): void {
    this.counts.errors++;
    let status = 500;
    let message = err instanceof Error ? err.message : String(err);
    let param: string | null = null;
    if (err instanceof HttpError) {
      status = err.status;
      param = err.param;
    } else if (isKvmeshError(err)) {
      status = err.status === 422 ? 400 : err.status;
      const field = err.details?.field;
      param = typeof field === "string" ? field : null;
      message = err.message;
    }
    if (res.headersSent) {
      // A stream already started: vLLM sends an error event, then ends.
      if (!res.destroyed) res.end(`data: ${JSON.stringify({ error: { message, type: ERROR_TYPES[status] ?? "InternalServerError", param, code: status } })}\n\ndata: [DONE]\n\n`);
      return;
    }
    sendJson(res, status, { error: { message, type: ERROR_TYPES[status] ?? "InternalServerError", param, code: status } });
  }
}

function sendJson(res: ServerResponse, status: number, value: unknown): void {
  const body = JSON.stringify(value);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) }).end(body);
}

async function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const c of req) {
    const b = c as Buffer;
    n += b.length;
    if (n > limit) throw new HttpError(413, `body exceeds ${limit} bytes`);
    chunks.push(b);
  }
  return Buffer.concat(chunks);
}
