/**
 * The mock engines' own tokenizer and chat template: deterministic, dependency-free, fast, and
 * the same in every process, so a router that asks a mock engine to tokenize (POST /tokenize,
 * /v1/chat/completions/render) gets exactly the ids that engine then caches and publishes in its
 * KV events. It is not a real model's tokenizer, only a stable function from text to ids:
 *
 * - Special tokens `<|endoftext|>` = 0, `<|im_start|>` = 1, `<|im_end|>` = 2 are matched first.
 * - The text between them splits into words (runs of letters, digits and `_`) and single other
 *   non-space characters; whitespace separates pieces and yields no id.
 * - A piece's id is FIRST_WORD_ID + FNV-1a-32(UTF-8 of the piece) mod (MOCK_VOCAB_SIZE -
 *   FIRST_WORD_ID). Collisions are possible and harmless (ids only need to be a function of text).
 *
 * The chat template is fixed (ChatML-like, as Qwen's): `<|im_start|>{role}\n{content}<|im_end|>\n`
 * per message, text parts of an array content joined by "\n", a non-text part rendered as
 * `<{type}>`, an assistant's tool calls as `<tool_call>{json}</tool_call>` lines, tools (when
 * given) as a first `<|im_start|>tools\n{json}<|im_end|>\n` turn, and with add_generation_prompt
 * (the default, as vLLM's) a final `<|im_start|>assistant\n`. continue_final_message leaves the
 * last message open (no `<|im_end|>`).
 */

/** Ids are in [0, MOCK_VOCAB_SIZE): a Llama-3-sized vocabulary. */
export const MOCK_VOCAB_SIZE = 128_000;
/** Ids below this are the special tokens. */
export const FIRST_WORD_ID = 16;
export const MOCK_SPECIAL_TOKENS: Readonly<Record<string, number>> = Object.freeze({ "<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2 });

const SPECIAL = /<\|endoftext\|>|<\|im_start\|>|<\|im_end\|>/g;
const PIECE = /[\p{L}\p{N}_]+|[^\s\p{L}\p{N}_]/gu;
const encoder = new TextEncoder();

function pieceId(piece: string): number {
  let h = 0x811c9dc5;
  for (const b of encoder.encode(piece)) {
    h ^= b;
    h = Math.imul(h, 0x01000193);
  }
  return FIRST_WORD_ID + ((h >>> 0) % (MOCK_VOCAB_SIZE - FIRST_WORD_ID));
}

function pushPieces(text: string, out: number[]): void {
  for (const m of text.matchAll(PIECE)) out.push(pieceId(m[0]));
}

/** The ids of `text` (special tokens recognised wherever they appear). */
export function mockTokenize(text: string): Uint32Array {
  const out: number[] = [];
  let at = 0;
  for (const m of text.matchAll(SPECIAL)) {
    pushPieces(text.slice(at, m.index), out);
    out.push(MOCK_SPECIAL_TOKENS[m[0]] as number);
    at = m.index + m[0].length;
  }
  pushPieces(text.slice(at), out);
  return Uint32Array.from(out);
}

/** The filler text of `n` generated tokens (`tok0 tok1 ...`, the mock generates no language). */
export function mockCompletionText(n: number, from = 0): string {
  const words: string[] = [];
  for (let i = from; i < from + n; i++) words.push(`tok${i}`);
  return words.join(" ");
}

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

function contentText(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  const parts: string[] = [];
  for (const p of content) {
    if (!isObject(p)) continue;
    parts.push(p.type === "text" && typeof p.text === "string" ? p.text : `<${String(p.type)}>`);
  }
  return parts.join("\n");
}

/** The mock chat template applied to a checked chat body (see the file comment). */
export function renderMockChat(body: Readonly<Json>): string {
  const messages = Array.isArray(body.messages) ? (body.messages as unknown[]) : [];
  const continueFinal = body.continue_final_message === true;
  const addGenerationPrompt = !continueFinal && body.add_generation_prompt !== false;
  let out = "";
  if (Array.isArray(body.tools) && body.tools.length > 0) out += `<|im_start|>tools\n${JSON.stringify(body.tools)}<|im_end|>\n`;
  messages.forEach((m, i) => {
    if (!isObject(m)) return;
    let text = contentText(m.content);
    if (Array.isArray(m.tool_calls)) {
      for (const call of m.tool_calls) if (isObject(call)) text += `\n<tool_call>${JSON.stringify(call.function)}</tool_call>`;
    }
    const last = i === messages.length - 1;
    out += `<|im_start|>${String(m.role)}\n${text}`;
    if (!(last && continueFinal)) out += "<|im_end|>\n";
  });
  if (addGenerationPrompt) out += "<|im_start|>assistant\n";
  return out;
}
