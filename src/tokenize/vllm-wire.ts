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
import { MAX_TOKEN_ID } from "../openai/limits.js";
import type { OpenAIKind, OpenAIRequest } from "./contract.js";

export const RENDER_PATHS: Readonly<Record<OpenAIKind, string>> = Object.freeze({ chat: "/v1/chat/completions/render", completions: "/v1/completions/render" });
export const TOKENIZE_PATH = "/tokenize";

/** The render request: the client's body, with the (possibly rewritten) model. */
export function renderRequestBody(req: OpenAIRequest): string {
  return JSON.stringify({ ...req.body, model: req.model });
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
