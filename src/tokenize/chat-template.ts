/**
 * A model's chat template (Jinja, from tokenizer_config.json or chat_template.jinja beside it),
 * rendered as vLLM renders it for a chat request, with @huggingface/jinja (the Jinja subset
 * Hugging Face maintains for chat templates; trim_blocks and lstrip_blocks on, as transformers
 * sets them; raise_exception and strftime_now defined).
 *
 * What vLLM hands the template, and this file reproduces:
 * - `messages`: each message with `content` as a string (text parts joined by "\n", vLLM's
 *   "string" content format) unless the template loops over a message's content, when it gets
 *   the parts list (vLLM's "openai" format, which it detects the same way). A null content is "".
 *   An assistant's tool_calls get `function.arguments` parsed from its JSON string, as vLLM does
 *   for Hugging Face templates.
 * - `tools`: each tool as vLLM's pydantic model dumps it: `{type, function: {name, description,
 *   parameters}}` in that order, absent ones as null, extra fields after.
 * - `add_generation_prompt` (default true), `continue_final_message`, the special tokens
 *   (bos_token, eos_token, pad_token, unk_token) and the body's chat_template_kwargs.
 * Not reproduced: multimodal placeholders (an image part renders as the template renders a
 * non-text part, not as the engine's processor expands it): use --tokenizer engine for those.
 */
import { Template } from "@huggingface/jinja";

import { fieldError } from "../openai/parse-request.js";

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/** vLLM's content-format detection, reduced to its signal: a loop over a message's content. */
const LOOPS_OVER_CONTENT = /\{%-?\s*for\s+\w+\s+in\s+\w+(?:\.content|\[\s*['"]content['"]\s*\])/;

export interface ChatTemplateOptions {
  /** Special tokens the template may reference (`bos_token`, ...), from tokenizer_config.json. */
  readonly specialTokens?: Readonly<Record<string, string>>;
}

export class ChatTemplate {
  readonly #template: Template;
  readonly #contentAsParts: boolean;
  readonly #special: Readonly<Record<string, string>>;

  constructor(source: string, options: ChatTemplateOptions = {}) {
    this.#template = new Template(source);
    this.#contentAsParts = LOOPS_OVER_CONTENT.test(source);
    this.#special = options.specialTokens ?? {};
  }

  /** The variables the template sees for a checked chat body (the fixture generator renders them with Python's jinja2 too). */
  context(body: Readonly<Json>): Json {
    const continueFinal = body.continue_final_message === true;
    const kwargs = isObject(body.chat_template_kwargs) ? body.chat_template_kwargs : {};
    return {
      ...this.#special,
      ...kwargs,
      messages: (body.messages as unknown[]).map((m) => this.#message(m as Json)),
      tools: Array.isArray(body.tools) ? body.tools.map(toolAsDumped) : null,
      add_generation_prompt: continueFinal ? false : body.add_generation_prompt !== false,
      continue_final_message: continueFinal,
    };
  }

  /** The prompt text of a checked chat body. */
  render(body: Readonly<Json>): string {
    const context = this.context(body);
    const messages = context.messages as Json[];
    const continueFinal = context.continue_final_message === true;
    let text: string;
    try {
      text = this.#template.render(context);
    } catch (err) {
      // The template's own raise_exception (e.g. "Conversation roles must alternate"): vLLM answers 400.
      throw fieldError("messages", `the chat template refused the conversation: ${err instanceof Error ? err.message : String(err)}`);
    }
    return continueFinal ? cutAfterFinalMessage(text, messages) : text;
  }

  #message(m: Json): Json {
    const out: Json = { ...m };
    const c = m.content;
    if (c === null || c === undefined) out.content = this.#contentAsParts ? [] : "";
    else if (Array.isArray(c)) out.content = this.#contentAsParts ? c : textOfParts(c);
    if (Array.isArray(m.tool_calls)) {
      out.tool_calls = m.tool_calls.map((call: unknown) => {
        if (!isObject(call) || !isObject(call.function) || typeof call.function.arguments !== "string") return call;
        try {
          return { ...call, function: { ...call.function, arguments: JSON.parse(call.function.arguments) as unknown } };
        } catch {
          return call;
        }
      });
    }
    return out;
  }
}

function textOfParts(parts: readonly unknown[]): string {
  const texts: string[] = [];
  for (const p of parts) if (isObject(p) && p.type === "text" && typeof p.text === "string") texts.push(p.text);
  return texts.join("\n");
}

function toolAsDumped(t: unknown): unknown {
  if (!isObject(t) || !isObject(t.function)) return t;
  const { name, description, parameters, ...fnExtra } = t.function;
  const extra = Object.fromEntries(Object.entries(t).filter(([k]) => k !== "type" && k !== "function"));
  return { type: t.type ?? "function", function: { name, description: description ?? null, parameters: parameters ?? null, ...fnExtra }, ...extra };
}

/** continue_final_message: the text up to the end of the final message's content (transformers' rule). */
function cutAfterFinalMessage(text: string, messages: readonly Json[]): string {
  const last = messages[messages.length - 1]?.content;
  const final = (typeof last === "string" ? last : "").trimEnd();
  if (final.length === 0) return text;
  const at = text.lastIndexOf(final);
  return at < 0 ? text : text.slice(0, at + final.length);
}
