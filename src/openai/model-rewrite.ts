/**
 * Rewrites the top-level `model` of a JSON body (for `x-gateway-model-name-rewrite`), returning
 * the new bytes. It splices the bytes instead of re-serialising the parsed body: JSON.parse and
 * JSON.stringify would change what the engine receives elsewhere in the body (a `seed` above
 * 2^53 loses digits, `1.0` becomes `1`, key order of duplicates, escapes), and the gateway must
 * forward the client's body with only the model changed.
 *
 * The scan is over bytes: every structural JSON character is ASCII, and no byte of a multi-byte
 * UTF-8 sequence is below 0x80, so quotes and brackets are found without decoding. Every
 * top-level `model` member is replaced (JSON.parse keeps the last of duplicates; the engine must
 * see the new model whichever one it keeps). A body without one gets `"model"` added first.
 */
import { fieldError } from "./parse-request.js";

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;
const COLON = 0x3a;
const COMMA = 0x2c;

const isSpace = (b: number): boolean => b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;

/** Index just past the string whose opening quote is at `i`. */
function skipString(buf: Uint8Array, i: number): number {
  let j = i + 1;
  while (j < buf.length) {
    const b = buf[j] as number;
    if (b === BACKSLASH) j += 2;
    else if (b === QUOTE) return j + 1;
    else j++;
  }
  throw fieldError("body", "unterminated string");
}

/** Index just past the JSON value starting at `i` (after whitespace). */
function skipValue(buf: Uint8Array, i: number): number {
  const b = buf[i];
  if (b === QUOTE) return skipString(buf, i);
  if (b === OPEN_BRACE || b === OPEN_BRACKET) {
    let depth = 0;
    let j = i;
    while (j < buf.length) {
      const c = buf[j] as number;
      if (c === QUOTE) {
        j = skipString(buf, j);
        continue;
      }
      if (c === OPEN_BRACE || c === OPEN_BRACKET) depth++;
      else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
        depth--;
        if (depth === 0) return j + 1;
      }
      j++;
    }
    throw fieldError("body", "unterminated object or array");
  }
  // A number, true, false or null: up to the next delimiter.
  let j = i;
  while (j < buf.length) {
    const c = buf[j] as number;
    if (c === COMMA || c === CLOSE_BRACE || c === CLOSE_BRACKET || isSpace(c)) break;
    j++;
  }
  return j;
}

function skipSpace(buf: Uint8Array, i: number): number {
  let j = i;
  while (j < buf.length && isSpace(buf[j] as number)) j++;
  return j;
}

const MODEL_KEY = new TextEncoder().encode('"model"');

function isModelKey(buf: Uint8Array, start: number, end: number): boolean {
  if (end - start !== MODEL_KEY.length) return false;
  for (let k = 0; k < MODEL_KEY.length; k++) if (buf[start + k] !== MODEL_KEY[k]) return false;
  return true;
}

/** [start, end) byte spans of every top-level `model` value. */
function modelValueSpans(buf: Uint8Array): [number, number][] {
  let i = skipSpace(buf, 0);
  if (buf[i] !== OPEN_BRACE) throw fieldError("body", "must be a JSON object");
  i++;
  const spans: [number, number][] = [];
  for (;;) {
    i = skipSpace(buf, i);
    if (buf[i] === CLOSE_BRACE) return spans;
    if (buf[i] !== QUOTE) throw fieldError("body", `expected a member name at byte ${i}`);
    const keyStart = i;
    i = skipString(buf, i);
    const keyEnd = i;
    i = skipSpace(buf, i);
    if (buf[i] !== COLON) throw fieldError("body", `expected ':' at byte ${i}`);
    i = skipSpace(buf, i + 1);
    const valueStart = i;
    i = skipValue(buf, i);
    // `"model"` spelled with escapes (`"mod\u0065l"`) is not matched; JSON.parse would match it.
    // The parser checks `model` first, and a client that escapes key names gets its own model.
    if (isModelKey(buf, keyStart, keyEnd)) spans.push([valueStart, i]);
    i = skipSpace(buf, i);
    if (buf[i] === COMMA) i++;
    else if (buf[i] === CLOSE_BRACE) return spans;
    else throw fieldError("body", `expected ',' or '}' at byte ${i}`);
  }
}

/** The body with its top-level `model` set to `model` (bytes; the input is not modified). */
export function rewriteModel(body: Uint8Array, model: string): Uint8Array {
  const value = new TextEncoder().encode(JSON.stringify(model));
  const spans = modelValueSpans(body);
  if (spans.length === 0) {
    const open = skipSpace(body, 0);
    const rest = skipSpace(body, open + 1);
    const member = new TextEncoder().encode(`"model":${JSON.stringify(model)}${body[rest] === CLOSE_BRACE ? "" : ","}`);
    return concat([body.subarray(0, open + 1), member, body.subarray(open + 1)]);
  }
  const parts: Uint8Array[] = [];
  let at = 0;
  for (const [start, end] of spans) {
    parts.push(body.subarray(at, start), value);
    at = end;
  }
  parts.push(body.subarray(at));
  return concat(parts);
}

function concat(parts: readonly Uint8Array[]): Uint8Array {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
