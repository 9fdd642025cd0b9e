/**
 * The request and response shapes of vLLM's tokenization endpoints, as its OpenAI server defines
 * them (vllm/entrypoints/serve/render and serve/tokenize):
 *
 * - `POST /v1/chat/completions/render` takes a ChatCompletionRequest (the client's body as is)
 *   and answers a GenerateRequest: `{request_id, token_ids, features, sampling_params, model,
 *   ...}`; `token_ids` are the prompt's ids after the chat template, exactly what the engine
 *   would schedule. `POST /v1/completions/render` takes a CompletionRequest and answers a list of
 *   GenerateRequest, one per prompt.
 * - `POST /tokenize` takes a TokenizeChatRequest `{model, messages, tools, add_generation_prompt
 *   (default true), continue_final_message, add_special_tokens (default false),
 *   chat_template_kwargs}` or a TokenizeCompletionRequest `{model, prompt, add_special_tokens
 *   (default true)}` and answers `{count, max_model_len, tokens}`. It is the fallback for a
 *   vLLM without the render endpoints; it renders the template from the fields above only (a
 *   chat body's other template inputs, e.g. `documents`, are not passed).
 */
import { findTopLevelU32Array, withPlaceholder, wireKey } from "../http/token-ids.js";
import { MAX_TOKEN_ID } from "../openai/limits.js";
import { rewriteModel } from "../openai/model-rewrite.js";
import type { OpenAIKind, OpenAIRequest } from "./contract.js";

export const RENDER_PATHS: Readonly<Record<OpenAIKind, string>> = Object.freeze({ chat: "/v1/chat/completions/render", completions: "/v1/completions/render" });
export const TOKENIZE_PATH = "/tokenize";

/**
 * The render request: the client's body, with the (possibly rewritten) model. The client's own
 * bytes when the request carries them (contract.ts `bytes`): the same JSON, no re-serialising of
 * a 220 KB conversation per request, and numbers exactly as the client wrote them.
 */
export function renderRequestBody(req: OpenAIRequest): string | Uint8Array {
  const bytes = req.bytes;
  if (bytes === undefined) return JSON.stringify({ ...req.body, model: req.model });
  return req.body.model === req.model ? bytes : rewriteModel(bytes, req.model);
}

const TOKENIZE_CHAT_FIELDS = ["messages", "tools", "add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template_kwargs", "chat_template"] as const;

/** The /tokenize request for a body (chat or completions). */
export function tokenizeRequestBody(req: OpenAIRequest): string {
  const out: Record<string, unknown> = { model: req.model };
  if (req.kind === "chat") {
    for (const k of TOKENIZE_CHAT_FIELDS) if (req.body[k] !== undefined && req.body[k] !== null) out[k] = req.body[k];
  } else {
    const p = req.body.prompt;
    out.prompt = Array.isArray(p) ? p[0] : p;
    if (typeof req.body.add_special_tokens === "boolean") out.add_special_tokens = req.body.add_special_tokens;
  }
  return JSON.stringify(out);
}

/** Token ids from a JSON value, or a reason it is not a list of u32 ids. */
function idsOf(v: unknown, what: string): Uint32Array | string {
  if (!Array.isArray(v)) return `${what} is not an array`;
  const out = new Uint32Array(v.length);
  for (let i = 0; i < v.length; i++) {
    const t: unknown = v[i];
    if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t > MAX_TOKEN_ID) return `${what}[${i}] is not a token id`;
    out[i] = t;
  }
  if (out.length === 0) return `${what} is empty`;
  return out;
}

const field = (v: unknown, k: string): unknown => (typeof v === "object" && v !== null ? (v as Record<string, unknown>)[k] : undefined);

/** The ids in a render response, or why it is malformed. */
export function parseRenderResponse(kind: OpenAIKind, json: unknown): Uint32Array | string {
  if (kind === "chat") return idsOf(field(json, "token_ids"), "token_ids");
  if (!Array.isArray(json) || json.length !== 1) return "a completions render answer must be a list of one GenerateRequest";
  return idsOf(field(json[0], "token_ids"), "[0].token_ids");
}

/** The ids in a /tokenize response, or why it is malformed. */
export function parseTokenizeResponse(json: unknown): Uint32Array | string {
  return idsOf(field(json, "tokens"), "tokens");
}

/**
 * fetch's `res.json()` decoding (UTF-8, a BOM dropped, invalid bytes replaced), so an answer read
 * here decodes to exactly the text `res.json()` would parse.
 */
const utf8 = new TextDecoder();
const TOKEN_IDS_KEY = wireKey("token_ids");
const TOKENS_KEY = wireKey("tokens");

/**
 * The ids in an answer's bytes, or why it is malformed: the same result and reason as
 * JSON.parse followed by `fromJson`, cheaper. Why: a 220 KB chat prompt renders to ~31,000 ids,
 * ~190 KB of JSON; `res.json()` (UTF-8 decode, JSON.parse into a 31,000-element JS array) and
 * idsOf's per-element checks were the largest items of the picker's tokenization CPU under
 * bench:epp (docs/tokenization.md). Here a top-level `key` array of canonical u32 literals is read
 * straight from the bytes into a Uint32Array (src/http/token-ids.ts, as the picker reads
 * completions bodies), and only the rest of the answer, the array replaced by `null`, is
 * JSON-parsed, to refuse an answer that is not JSON. Anything else (an escaped key, `1.0`, a
 * completions render's list, a BOM, malformed JSON) takes the generic path, whose reasons are
 * unchanged.
 */
function idsOfAnswer(bytes: Buffer, key: Buffer | undefined, what: string, fromJson: (json: unknown) => Uint32Array | string): Uint32Array | string {
  const span = key === undefined ? undefined : findTopLevelU32Array(bytes, key);
  if (span !== undefined && parsesAsJson(withPlaceholder(bytes, span))) {
    const ids = span.tokens;
    if (MAX_TOKEN_ID < 0xffff_ffff) {
      const over = ids.findIndex((t) => t > MAX_TOKEN_ID);
      if (over >= 0) return `${what}[${over}] is not a token id`;
    }
    return ids.length === 0 ? `${what} is empty` : ids;
  }
  let json: unknown;
  try {
    json = JSON.parse(utf8.decode(bytes));
  } catch (err) {
    return `answer is not JSON (${err instanceof Error ? err.message : String(err)})`;
  }
  return fromJson(json);
}

function parsesAsJson(bytes: Buffer): boolean {
  try {
    JSON.parse(utf8.decode(bytes));
    return true;
  } catch {
    return false;
  }
}

/** parseRenderResponse over an answer's bytes (idsOfAnswer). */
export function renderAnswerIds(kind: OpenAIKind, bytes: Buffer): Uint32Array | string {
  const fromJson = (json: unknown): Uint32Array | string => parseRenderResponse(kind, json);
  // A completions render answers a list of one GenerateRequest: the generic path (an object there is malformed).
  return idsOfAnswer(bytes, kind === "chat" ? TOKEN_IDS_KEY : undefined, "token_ids", fromJson);
}

/** parseTokenizeResponse over an answer's bytes (idsOfAnswer). */
export function tokenizeAnswerIds(bytes: Buffer): Uint32Array | string {
  return idsOfAnswer(bytes, TOKENS_KEY, "tokens", parseTokenizeResponse);
}
