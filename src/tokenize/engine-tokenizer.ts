/**
 * `--tokenizer engine`: a worker of the model renders and tokenizes the prompt, as Dynamo's EPP
 * does with vLLM, so the ids are exactly the engine's (its chat template, its tokenizer version,
 * its special tokens) with nothing to keep in sync here.
 *
 * - First `POST /v1/chat/completions/render` (or `/v1/completions/render`); a worker that
 *   answers 404, 405 or 501 has no render endpoint and is asked `POST /tokenize` instead, and is
 *   remembered as such for RENDER_RETRY_AFTER_MS (a restarted, upgraded worker gets render again).
 * - Workers come from `workerUrls(model)` (ready workers' endpoints, from the catalogue). The
 *   first worker asked rotates per request, spreading the render cost; a failure (timeout,
 *   network, HTTP status, malformed answer) moves on to the next, up to `maxAttempts` workers.
 * - At most `concurrency` requests are in flight; up to `maxQueued` more wait, and past that a
 *   request is shed at once (counted), as every bounded queue here does.
 * - Every call has its own timeout; the caller's signal (the stream ended) aborts everything.
 * - When no worker could answer: tokenizerUnavailable (503; the picker by default routes by
 *   session and load alone instead).
 *
 * No multi-turn cache on this path: rendering the full conversation is one call whatever was
 * cached, and splitting it would need the template here, which is what this mode avoids.
 *
 * HTTP client: Node's built-in fetch (undici inside, keep-alive pooled per origin). undici 8's
 * own package needs Node 22.
 */
import PQueue from "p-queue";

import { systemClock, type Clock } from "../core/index.js";
import type { OpenAIRequest, PromptTokenizer, TokenizeOptions, TokenizeResult } from "./contract.js";
import { tokenIdsFromBody } from "./body-token-ids.js";
import { TokenizerCounters, type EngineAttemptFailure } from "./tokenizer-counters.js";
import { tokenizerUnavailable } from "./tokenizer-errors.js";
import { workerBaseUrl } from "./worker-base-url.js";
import { RENDER_PATHS, renderAnswerIds, renderRequestBody, TOKENIZE_PATH, tokenizeAnswerIds, tokenizeRequestBody } from "./vllm-wire.js";

import { DEFAULT_ENGINE_TOKENIZE_ATTEMPTS, DEFAULT_ENGINE_TOKENIZE_CONCURRENCY, DEFAULT_ENGINE_TOKENIZE_MAX_QUEUED, DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MS } from "./defaults.js";

export { DEFAULT_ENGINE_TOKENIZE_ATTEMPTS, DEFAULT_ENGINE_TOKENIZE_CONCURRENCY, DEFAULT_ENGINE_TOKENIZE_MAX_QUEUED, DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MS };
/** How long a worker without render endpoints is asked /tokenize directly, ms. */
export const RENDER_RETRY_AFTER_MS = 300_000;
/** Workers remembered per map (base URLs, lacking render); past it the oldest (or all, for base URLs) are forgotten. */
const MAX_REMEMBERED_WORKERS = 4_096;
/** Statuses meaning "no such endpoint here" (FastAPI 404/405; vLLM's NotImplementedError is 501). */
const NO_ENDPOINT_STATUSES = new Set([404, 405, 501]);

export interface EngineTokenizerOptions {
  readonly timeoutMs?: number;
  readonly concurrency?: number;
  readonly maxQueued?: number;
  readonly maxAttempts?: number;
}

export interface EngineTokenizerDeps {
  /** Ready workers' endpoints serving `model` (catalogue `endpoint`: normalised by workerBaseUrl; non-HTTP ones are skipped). */
  readonly workerUrls: (model: string) => readonly string[];
  readonly fetch?: typeof globalThis.fetch;
  readonly clock?: Clock;
  readonly counters?: TokenizerCounters;
}

/** fetch's own message is "fetch failed"; the cause (ECONNREFUSED, ...) is what helps. */
function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const cause: unknown = err.cause;
  return cause instanceof Error ? `${err.message}: ${cause.message}` : err.message;
}

/** AbortSignal.timeout's reason, which fetch and body reads reject with. */
const isTimeout = (err: unknown): boolean => err instanceof Error && err.name === "TimeoutError";

class AttemptError extends Error {
  constructor(
    readonly reason: EngineAttemptFailure,
    message: string,
  ) {
    super(message);
  }
}

export class EngineTokenizer implements PromptTokenizer {
  readonly counters: TokenizerCounters;
  readonly #deps: EngineTokenizerDeps;
  readonly #fetch: typeof globalThis.fetch;
  readonly #clock: Clock;
  readonly #queue: PQueue;
  readonly #timeoutMs: number;
  readonly #maxQueued: number;
  readonly #maxAttempts: number;
  /** Catalogue endpoint -> base URL (null: not HTTP), so a request parses no URL. */
  readonly #baseUrls = new Map<string, string | null>();
  /** Base URL -> clock ms until which it is asked /tokenize directly. */
  readonly #noRender = new Map<string, number>();
  #next = 0;

  constructor(deps: EngineTokenizerDeps, options: EngineTokenizerOptions = {}) {
    this.#deps = deps;
    this.#fetch = deps.fetch ?? globalThis.fetch;
    this.#clock = deps.clock ?? systemClock;
    this.counters = deps.counters ?? new TokenizerCounters();
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MS;
    this.#maxQueued = options.maxQueued ?? DEFAULT_ENGINE_TOKENIZE_MAX_QUEUED;
    this.#maxAttempts = options.maxAttempts ?? DEFAULT_ENGINE_TOKENIZE_ATTEMPTS;
    this.#queue = new PQueue({ concurrency: options.concurrency ?? DEFAULT_ENGINE_TOKENIZE_CONCURRENCY });
  }

  /** Requests in flight and waiting (tests, the status page). */
  get inFlight(): { running: number; queued: number } {
    return { running: this.#queue.pending, queued: this.#queue.size };
  }

  async tokenize(req: OpenAIRequest, options: TokenizeOptions = {}): Promise<TokenizeResult> {
    const given = tokenIdsFromBody(req);
    if (given !== undefined) {
      this.counters.bySource.body++;
      return given;
    }
    // Distinct base URLs: data-parallel ranks behind one endpoint are one server to ask.
    const distinct = new Set<string>();
    for (const e of this.#deps.workerUrls(req.model)) {
      const u = this.#baseUrl(e);
      if (u !== null) distinct.add(u);
    }
    const urls = [...distinct];
    if (urls.length === 0) {
      this.counters.failures.no_workers++;
      throw tokenizerUnavailable(req.model, "no ready worker serves it");
    }
    if (this.#queue.size >= this.#maxQueued) {
      this.counters.failures.shed++;
      throw tokenizerUnavailable(req.model, `${this.#queue.size} requests already wait for a tokenizer slot (the limit)`);
    }
    const signal = options.signal;
    const start = this.#next++ % urls.length;
    try {
      const tokenIds = await this.#queue.add(() => this.#attempts(req, urls, start, signal), signal === undefined ? {} : { signal });
      this.counters.bySource.engine++;
      return { tokenIds, source: "engine" };
    } catch (err) {
      if (signal?.aborted === true) this.counters.failures.aborted++;
      throw err;
    }
  }

  #baseUrl(endpoint: string): string | null {
    let u = this.#baseUrls.get(endpoint);
    if (u === undefined) {
      u = workerBaseUrl(endpoint) ?? null;
      if (this.#baseUrls.size >= MAX_REMEMBERED_WORKERS) this.#baseUrls.clear();
      this.#baseUrls.set(endpoint, u);
    }
    return u;
  }

  async #attempts(req: OpenAIRequest, urls: readonly string[], start: number, signal: AbortSignal | undefined): Promise<Uint32Array> {
    const tries = Math.min(this.#maxAttempts, urls.length);
    const problems: string[] = [];
    for (let k = 0; k < tries; k++) {
      signal?.throwIfAborted();
      const url = urls[(start + k) % urls.length] as string;
      try {
        return await this.#askWorker(req, url, signal);
      } catch (err) {
        if (signal?.aborted === true) throw err;
        const reason: EngineAttemptFailure = err instanceof AttemptError ? err.reason : isTimeout(err) ? "timeout" : "network";
        this.counters.engineAttemptFailures[reason]++;
        problems.push(`${url}: ${reason === "timeout" ? `no answer within ${this.#timeoutMs} ms` : describe(err)}`);
      }
    }
    this.counters.failures.exhausted++;
    throw tokenizerUnavailable(req.model, `${tries} worker(s) failed (${problems.join("; ")})`);
  }

  async #askWorker(req: OpenAIRequest, base: string, signal: AbortSignal | undefined): Promise<Uint32Array> {
    const until = this.#noRender.get(base);
    const now = this.#clock.now();
    if (until === undefined || until <= now) {
      if (until !== undefined) this.#noRender.delete(base);
      this.counters.engineCalls.render++;
      const res = await this.#post(base + RENDER_PATHS[req.kind], renderRequestBody(req), signal);
      if (!NO_ENDPOINT_STATUSES.has(res.status)) return this.#ids(res, (b) => renderAnswerIds(req.kind, b));
      await res.body?.cancel();
      if (this.#noRender.size >= MAX_REMEMBERED_WORKERS) this.#noRender.delete(this.#noRender.keys().next().value as string);
      this.#noRender.set(base, now + RENDER_RETRY_AFTER_MS);
    }
    this.counters.engineCalls.tokenize++;
    const res = await this.#post(base + TOKENIZE_PATH, tokenizeRequestBody(req), signal);
    return this.#ids(res, tokenizeAnswerIds);
  }

  /** A POST whose signal also fires after the timeout (reading the answer's body included). */
  #post(url: string, body: string | Uint8Array, signal: AbortSignal | undefined): Promise<Response> {
    const timeout = AbortSignal.timeout(this.#timeoutMs);
    const combined = signal === undefined ? timeout : AbortSignal.any([signal, timeout]);
    return this.#fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body, signal: combined });
  }

  /** The answer's ids, read from its bytes (vllm-wire.ts: no res.json(), see idsOfAnswer). */
  async #ids(res: Response, parse: (bytes: Buffer) => Uint32Array | string): Promise<Uint32Array> {
    if (!res.ok) {
      const text = await res.text().catch(() => "");
      throw new AttemptError("http", `HTTP ${res.status} ${text.slice(0, 200)}`);
    }
    let bytes: Buffer;
    try {
      bytes = Buffer.from(await res.arrayBuffer());
    } catch (err) {
      // As res.json() was: a body read cut short by anything but the timeout counts as malformed.
      if (isTimeout(err)) throw err;
      throw new AttemptError("malformed", `answer is not JSON (${err instanceof Error ? err.message : String(err)})`);
    }
    const ids = parse(bytes);
    if (typeof ids === "string") throw new AttemptError("malformed", ids);
    return ids;
  }

  async close(): Promise<void> {
    this.#queue.clear();
    await this.#queue.onIdle();
  }
}
