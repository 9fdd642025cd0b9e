/**
 * Parses and checks an OpenAI request body (`/v1/completions`, `/v1/chat/completions`) into the
 * OpenAIRequest the tokenizers take. It checks what routing and tokenization read (the model, the
 * prompt or the messages, tools, the chat-template switches) and leaves the rest of the body to
 * the engine, which validates sampling parameters itself. Every refusal is a KVMESH_BAD_REQUEST
 * (400) whose message starts with the field path, e.g. `messages[2].content: ...`, and whose
 * details.field is that path; a body that is not JSON is KVMESH_MALFORMED_JSON (400).
 *
 * Decisions (docs/tokenization.md):
 * - `prompt` is one prompt: a string, or an array of token ids (then the request skips
 *   tokenization). A one-element array around either is that prompt. A batch (two or more
 *   prompts) is refused naming `prompt`: one routing decision cannot place several prompts.
 * - Shapes are bounded (limits.ts), whatever the byte size.
 *
 * Speed: a /v1/completions body whose top-level `prompt` is a flat array of canonical integer
 * literals (what a client serialising token ids writes) is not decoded to a string nor walked by
 * JSON.parse: the array is read from the bytes into a Uint32Array (src/http/token-ids.ts, the
 * WebAssembly loop for long arrays) and only the rest of the body, the array replaced by `null`,
 * goes through JSON.parse. At bench:epp's 220 KB bodies the JS JSON walk (decodeJsonObject) was
 * 13-19% of the daemon's main thread, plus most of its GC (a 31,000-element JS array per request).
 * Anything the fast path does not take (`[[ids]]`, `1.0`, `-1`, escapes in a top-level key,
 * malformed JSON anywhere) is parsed as before, so results and error messages are unchanged.
 */
import { badRequest, KvmeshError } from "../core/index.js";
import type { OpenAIKind, OpenAIRequest } from "../tokenize/contract.js";
import { findTopLevelU32Array, withPlaceholder, wireKey } from "../http/token-ids.js";
import { MAX_CHAT_MESSAGES, MAX_CONTENT_PARTS, MAX_JSON_DEPTH, MAX_PROMPT_TOKEN_IDS, MAX_TOKEN_ID, MAX_TOOLS } from "./limits.js";

/** The request paths the parser understands, and their kind. */
export const OPENAI_PATHS: Readonly<Record<string, OpenAIKind>> = Object.freeze({
  "/v1/completions": "completions",
  "/v1/chat/completions": "chat",
});

/** The kind of an OpenAI request path (query string ignored), or undefined for any other path. */
export function openAIKindOfPath(path: string): OpenAIKind | undefined {
  const q = path.indexOf("?");
  const bare = q < 0 ? path : path.slice(0, q);
  return Object.hasOwn(OPENAI_PATHS, bare) ? OPENAI_PATHS[bare] : undefined;
}

export interface ParseOptions {
  /** The model the gateway asks for (`x-gateway-model-name-rewrite`): replaces the body's. */
  readonly modelOverride?: string | undefined;
}

/** A refusal naming the field: 400, details.field = the path. */
export const fieldError = (field: string, problem: string): KvmeshError => badRequest(`${field}: ${problem}`, field);

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);
const typeName = (v: unknown): string => (v === null ? "null" : Array.isArray(v) ? "an array" : typeof v);

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Decodes and JSON-parses a body; refuses anything but a JSON object. */
export function decodeJsonObject(bytes: Uint8Array | string): Json {
  let text: string;
  try {
    text = typeof bytes === "string" ? bytes : utf8.decode(bytes);
  } catch (cause) {
    throw new KvmeshError("KVMESH_MALFORMED_JSON", "body is not valid UTF-8", { cause, details: { field: "body" } });
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (cause) {
    // Includes a RangeError from nesting deeper than V8's parser recurses.
    throw new KvmeshError("KVMESH_MALFORMED_JSON", `body is not valid JSON: ${cause instanceof Error ? cause.message : String(cause)}`, { cause, details: { field: "body" } });
  }
  if (!isObject(value)) throw fieldError("body", `must be a JSON object, got ${typeName(value)}`);
  return value;
}

/** Parses a body sent to `kind`'s endpoint. Throws a registry error naming the field. */
export function parseOpenAIRequest(kind: OpenAIKind, bytes: Uint8Array | string, options: ParseOptions = {}): OpenAIRequest {
  if (kind === "completions" && typeof bytes !== "string") {
    const fast = parseCompletionsWithTokenIds(Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength), options);
    if (fast !== undefined) return fast;
  }
  const req = checkOpenAIBody(kind, decodeJsonObject(bytes), options);
  // The bytes go along for the engine tokenizer's render call (contract.ts `bytes`); ids given need none.
  return typeof bytes === "string" || req.tokenIds !== undefined ? req : { ...req, bytes };
}

const PROMPT_KEY = wireKey("prompt");

/**
 * The fast path of a completions body (see the header): undefined when it does not apply or the
 * rest of the body does not parse (the generic path then reports exactly what it always did).
 * The checks run in the generic path's order (model, depth, prompt), so a body refused on both
 * paths is refused with the same error. `body.prompt` is the Uint32Array.
 */
function parseCompletionsWithTokenIds(bytes: Buffer, options: ParseOptions): OpenAIRequest | undefined {
  const span = findTopLevelU32Array(bytes, PROMPT_KEY);
  if (span === undefined) return undefined;
  let body: Json;
  try {
    body = decodeJsonObject(withPlaceholder(bytes, span));
  } catch {
    return undefined;
  }
  const model = checkModel(body, options.modelOverride);
  checkDepth(body, "body", 0);
  const ids = span.tokens;
  if (ids.length === 0) throw fieldError("prompt", "must not be empty");
  if (ids.length > MAX_PROMPT_TOKEN_IDS) throw fieldError("prompt", `holds ${ids.length} token ids, more than ${MAX_PROMPT_TOKEN_IDS}`);
  if (MAX_TOKEN_ID < 0xffff_ffff) tokenIdsOf(Array.from(ids), "prompt");
  body.prompt = ids;
  return { kind: "completions", model, body, tokenIds: ids };
}

/** Checks an already decoded body (the mock engines' server, tests). */
export function checkOpenAIBody(kind: OpenAIKind, body: Json, options: ParseOptions = {}): OpenAIRequest {
  const model = checkModel(body, options.modelOverride);
  checkDepth(body, "body", 0);
  switch (kind) {
    case "completions": {
      const tokenIds = checkPrompt(body.prompt);
      return { kind, model, body, tokenIds };
    }
    case "chat":
      checkChat(body);
      return { kind, model, body };
  }
}

function checkModel(body: Json, override: string | undefined): string {
  if (override !== undefined) {
    if (override.length === 0) throw fieldError("x-gateway-model-name-rewrite", "must not be empty");
    if (body.model !== undefined && typeof body.model !== "string") throw fieldError("model", `must be a string, got ${typeName(body.model)}`);
    return override;
  }
  if (body.model === undefined) throw fieldError("model", "is required");
  if (typeof body.model !== "string") throw fieldError("model", `must be a string, got ${typeName(body.model)}`);
  if (body.model.length === 0) throw fieldError("model", "must not be empty");
  return body.model;
}

/** Walks the value to MAX_JSON_DEPTH; the recursion is bounded by that depth. */
function checkDepth(v: unknown, path: string, depth: number): void {
  if (typeof v !== "object" || v === null) return;
  if (depth >= MAX_JSON_DEPTH) throw fieldError(path, `nests deeper than ${MAX_JSON_DEPTH} levels`);
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const item: unknown = v[i];
      if (typeof item === "object" && item !== null) checkDepth(item, `${path}[${i}]`, depth + 1);
    }
    return;
  }
  for (const [k, item] of Object.entries(v)) {
    if (typeof item === "object" && item !== null) checkDepth(item, path === "body" ? k : `${path}.${k}`, depth + 1);
  }
}

/** Returns the token ids when the prompt is given as ids, undefined for text. */
function checkPrompt(prompt: unknown): readonly number[] | undefined {
  if (prompt === undefined || prompt === null) throw fieldError("prompt", "is required");
  if (typeof prompt === "string") {
    if (prompt.length === 0) throw fieldError("prompt", "must not be empty");
    return undefined;
  }
  if (!Array.isArray(prompt)) throw fieldError("prompt", `must be a string or an array of token ids, got ${typeName(prompt)}`);
  if (prompt.length === 0) throw fieldError("prompt", "must not be empty");
  const first: unknown = prompt[0];
  if (typeof first === "string" || Array.isArray(first)) {
    // [text] or [[ids]]: one prompt in a list. More is a batch.
    if (prompt.length > 1) throw fieldError("prompt", `holds ${prompt.length} prompts: send one prompt per request (a batch cannot be routed as one)`);
    if (typeof first === "string") {
      if (first.length === 0) throw fieldError("prompt[0]", "must not be empty");
      return undefined;
    }
    return tokenIdsOf(first as unknown[], "prompt[0]");
  }
  return tokenIdsOf(prompt as unknown[], "prompt");
}

/** Checks every id; returns the body's own array (no copy: a 4 Mi-id prompt is not duplicated). */
function tokenIdsOf(ids: readonly unknown[], field: string): readonly number[] {
  if (ids.length === 0) throw fieldError(field, "must not be empty");
  if (ids.length > MAX_PROMPT_TOKEN_IDS) throw fieldError(field, `holds ${ids.length} token ids, more than ${MAX_PROMPT_TOKEN_IDS}`);
  for (let i = 0; i < ids.length; i++) {
    const t = ids[i];
    if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t > MAX_TOKEN_ID) {
      throw fieldError(`${field}[${i}]`, `must be a token id (an integer in [0, ${MAX_TOKEN_ID}]), got ${typeof t === "number" ? String(t) : typeName(t)}`);
    }
  }
  return ids as readonly number[];
}

const optionalBoolean = (body: Json, key: string): void => {
  const v = body[key];
  if (v !== undefined && v !== null && typeof v !== "boolean") throw fieldError(key, `must be a boolean, got ${typeName(v)}`);
};

function checkChat(body: Json): void {
  const messages = body.messages;
  if (messages === undefined) throw fieldError("messages", "is required");
  if (!Array.isArray(messages)) throw fieldError("messages", `must be an array, got ${typeName(messages)}`);
  if (messages.length === 0) throw fieldError("messages", "must not be empty");
  if (messages.length > MAX_CHAT_MESSAGES) throw fieldError("messages", `holds ${messages.length} messages, more than ${MAX_CHAT_MESSAGES}`);
  for (let i = 0; i < messages.length; i++) checkMessage(messages[i], `messages[${i}]`);
  checkTools(body.tools);
  optionalBoolean(body, "add_generation_prompt");
  optionalBoolean(body, "continue_final_message");
  if (body.add_generation_prompt === true && body.continue_final_message === true) {
    throw fieldError("continue_final_message", "cannot be true together with add_generation_prompt");
  }
  const kwargs = body.chat_template_kwargs;
  if (kwargs !== undefined && kwargs !== null && !isObject(kwargs)) throw fieldError("chat_template_kwargs", `must be an object, got ${typeName(kwargs)}`);
}

function checkMessage(m: unknown, path: string): void {
  if (!isObject(m)) throw fieldError(path, `must be an object, got ${typeName(m)}`);
  if (typeof m.role !== "string" || m.role.length === 0) throw fieldError(`${path}.role`, m.role === undefined ? "is required" : "must be a non-empty string");
  const content = m.content;
  if (Array.isArray(content)) {
    if (content.length > MAX_CONTENT_PARTS) throw fieldError(`${path}.content`, `holds ${content.length} parts, more than ${MAX_CONTENT_PARTS}`);
    for (let j = 0; j < content.length; j++) checkContentPart(content[j], `${path}.content[${j}]`);
  } else if (content !== undefined && content !== null && typeof content !== "string") {
    throw fieldError(`${path}.content`, `must be a string, an array of content parts or null, got ${typeName(content)}`);
  }
  const calls = m.tool_calls;
  if (calls !== undefined && calls !== null) {
    if (!Array.isArray(calls)) throw fieldError(`${path}.tool_calls`, `must be an array, got ${typeName(calls)}`);
    for (let j = 0; j < calls.length; j++) {
      const call: unknown = calls[j];
      const cp = `${path}.tool_calls[${j}]`;
      if (!isObject(call)) throw fieldError(cp, `must be an object, got ${typeName(call)}`);
      const fn = call.function;
      if (!isObject(fn)) throw fieldError(`${cp}.function`, fn === undefined ? "is required" : `must be an object, got ${typeName(fn)}`);
      if (typeof fn.name !== "string") throw fieldError(`${cp}.function.name`, "must be a string");
    }
  }
}

function checkContentPart(p: unknown, path: string): void {
  if (!isObject(p)) throw fieldError(path, `must be an object, got ${typeName(p)}`);
  if (typeof p.type !== "string" || p.type.length === 0) throw fieldError(`${path}.type`, p.type === undefined ? "is required" : "must be a non-empty string");
  if (p.type === "text" && typeof p.text !== "string") throw fieldError(`${path}.text`, p.text === undefined ? "is required for a text part" : `must be a string, got ${typeName(p.text)}`);
}

function checkTools(tools: unknown): void {
  if (tools === undefined || tools === null) return;
  if (!Array.isArray(tools)) throw fieldError("tools", `must be an array, got ${typeName(tools)}`);
  if (tools.length > MAX_TOOLS) throw fieldError("tools", `holds ${tools.length} tools, more than ${MAX_TOOLS}`);
  for (let i = 0; i < tools.length; i++) {
    const t: unknown = tools[i];
    const path = `tools[${i}]`;
    if (!isObject(t)) throw fieldError(path, `must be an object, got ${typeName(t)}`);
    if (t.type !== undefined && t.type !== "function") throw fieldError(`${path}.type`, `must be "function", got ${JSON.stringify(t.type)}`);
    const fn = t.function;
    if (!isObject(fn)) throw fieldError(`${path}.function`, fn === undefined ? "is required" : `must be an object, got ${typeName(fn)}`);
    if (typeof fn.name !== "string" || fn.name.length === 0) throw fieldError(`${path}.function.name`, "must be a non-empty string");
  }
}
