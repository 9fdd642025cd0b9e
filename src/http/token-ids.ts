/**
 * Fast, exact parsing of request bodies that carry a prompt as `token_ids`.
 *
 * Why: a 14,000-token prompt is ~88 KB of JSON. The generic path (bytes -> string, 16-digit-run
 * probe, JSON.parse into a 14,000-element JS array, a per-element check in schemas.ts, then a
 * copy into a Uint32Array for hashing) was the largest self-time item of the daemon under
 * bench:http. Here the top-level `token_ids` array is read straight from the bytes into a
 * Uint32Array, and only the rest of the body (a few hundred bytes, with the array replaced by
 * `null`) goes through the exact generic parser. On bench:http's bodies that roughly halved parse
 * and validation in the daemon under load (`npm run bench:http`); the byte loop is now the whole
 * cost, close to a plain byte sum's.
 *
 * Exactness: the fast path takes only what it can decide alone, and hands everything else to
 * `parseJsonBytes` over the whole original body, so results and error messages are exactly those
 * of the generic path:
 * - the `token_ids` key is found by walking the top-level object (string state, escapes and
 *   nesting depth tracked), so a `"token_ids"` inside a string or a nested object is never taken;
 *   a top-level key written with escapes (`"token\u005fids"`) falls back, since its spelling on
 *   the wire then differs from the key it decodes to;
 * - elements must be canonical JSON integer literals in [0, 2^32): any sign, fraction, exponent,
 *   leading zero, oversized or non-number element falls back, and the schema check then answers
 *   422 `token_ids[i]: must be an integer in [0, 4294967295]` as before (or 400 for invalid JSON);
 *   integer-valued literals such as `1.0` or `1e3` therefore stay accepted, as JSON.parse reads them;
 * - a duplicate top-level `token_ids` follows JSON.parse: the last one wins (as for every other
 *   field), and only that one is validated;
 * - if the rest of the body fails to parse, the whole body is re-parsed so the error (and its
 *   byte offset) is the generic path's.
 * The placeholder is `null`, not a number: `[1]e5` after a value is invalid JSON, and so is
 * `nulle5`, whereas `0e5` would be valid: no invalid body can become valid by the substitution.
 */
import { parseJsonBytes } from "./json.js";
import { WASM_MAX_BYTES, WASM_MIN_BYTES, WasmU32ArrayParser } from "./u32-array-parser.js";

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COLON = 0x3a;
const COMMA = 0x2c;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;
const ZERO = 0x30;
const U32_MAX = 0xffff_ffff;
/** 4294967295 has 10 digits: an 11th means out of range without reading further. */
const MAX_U32_DIGITS = 10;
/** The key as it appears on the wire, quotes included. */
const KEY = Buffer.from('"token_ids"', "latin1");
const PLACEHOLDER = Buffer.from("null", "latin1");
/** Scratch tokens for one parse (requests are parsed synchronously, one at a time); grows to fit. */
const INITIAL_SCRATCH_TOKENS = 32_768;
/** A larger scratch (1 MiB) is not kept: an 8 MiB body of 4M one-digit tokens would pin 16 MiB. */
const MAX_KEPT_SCRATCH_TOKENS = 262_144;
let scratch = new Uint32Array(INITIAL_SCRATCH_TOKENS);
/** The same loop in WebAssembly for long arrays (u32-array-parser.ts); undefined where unavailable. */
const wasm = WasmU32ArrayParser.create();

/** Where a top-level token array was found, and its parsed tokens. */
export interface TokenSpan {
  /** Byte offset of the array's `[`. */
  readonly start: number;
  /** Byte offset just past its `]`. */
  readonly end: number;
  readonly tokens: Uint32Array;
}

const isWs = (c: number): boolean => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

/**
 * parseJsonBytes, except that a top-level `token_ids` array of canonical integer literals in
 * [0, 2^32) comes back as a Uint32Array instead of a number[]. Any other body (or any token_ids
 * the fast path does not take) is parsed by parseJsonBytes unchanged, errors included.
 */
export function parseJsonBytesWithTokenIds(bytes: Buffer): unknown {
  const span = findTopLevelU32Array(bytes, KEY);
  if (span === undefined) return parseJsonBytes(bytes);
  const rest = withPlaceholder(bytes, span);
  let parsed: unknown;
  try {
    parsed = parseJsonBytes(rest);
  } catch {
    // Malformed or too deep elsewhere: the generic parse of the original reports it with its own offsets.
    return parseJsonBytes(bytes);
  }
  // findTokenIds only succeeds inside a top-level object, so `parsed` is one with a null token_ids.
  (parsed as Record<string, unknown>).token_ids = span.tokens;
  return parsed;
}

/** The body with the span's array replaced by `null`: what the caller parses generically. */
export function withPlaceholder(bytes: Buffer, span: TokenSpan): Buffer {
  return Buffer.concat([bytes.subarray(0, span.start), PLACEHOLDER, bytes.subarray(span.end)]);
}

/** A top-level key as it appears on the wire, quotes included, for findTopLevelU32Array. */
export const wireKey = (key: string): Buffer => Buffer.from(JSON.stringify(key), "utf8");

/**
 * Walks the top-level object for its last plain `key` (the wire form, quotes included: wireKey)
 * and parses that key's array. Undefined when the body is not an object, has no such key, spells
 * a top-level key with escapes, or the array is not all canonical u32 literals: the caller then
 * parses generically. Malformed JSON elsewhere is not detected here (the caller's parse of the
 * rest, with the array replaced by `null`, does that; see this file's header for why the
 * substitution cannot turn an invalid body valid).
 */
export function findTopLevelU32Array(b: Buffer, key: Buffer): TokenSpan | undefined {
  const n = b.length;
  let p = 0;
  while (p < n && isWs(b[p] as number)) p++;
  if (b[p] !== OPEN_BRACE) return undefined;
  p++;
  let depth = 1;
  let found: TokenSpan | undefined;
  while (p < n) {
    const c = b[p] as number;
    if (c === QUOTE) {
      const open = p;
      let escaped = false;
      p++;
      for (;;) {
        if (p >= n) return undefined;
        const s = b[p] as number;
        if (s === QUOTE) break;
        if (s === BACKSLASH) {
          escaped = true;
          p += 2;
        } else p++;
      }
      p++;
      if (depth !== 1) continue;
      let q = p;
      while (q < n && isWs(b[q] as number)) q++;
      if (b[q] !== COLON) continue;
      // A top-level key.
      if (escaped) return undefined;
      if (p - open !== key.length || b.compare(key, 0, key.length, open, p) !== 0) continue;
      q++;
      while (q < n && isWs(b[q] as number)) q++;
      if (b[q] !== OPEN_BRACKET) return undefined;
      const span = parseU32Array(b, q);
      if (span === undefined) return undefined;
      found = span;
      p = span.end;
    } else {
      if (c === OPEN_BRACE || c === OPEN_BRACKET) depth++;
      else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
        if (--depth === 0) return found;
      }
      p++;
    }
  }
  return undefined;
}

/**
 * The array opening at `start` if every element is a canonical integer literal in [0, 2^32).
 * The first `]` after `start` must close it (no element may contain one), and since a `]` is
 * neither a digit, whitespace nor a comma, every scan below stops there at the latest: the
 * per-byte loops need no bounds checks.
 */
function parseU32Array(b: Buffer, start: number): TokenSpan | undefined {
  const end = b.indexOf(CLOSE_BRACKET, start + 1);
  if (end < 0) return undefined;
  if (wasm !== undefined && end - start >= WASM_MIN_BYTES && end - start <= WASM_MAX_BYTES) {
    const tokens = wasm.parse(b, start, end);
    return tokens === undefined ? undefined : { start, end: end + 1, tokens };
  }
  // k elements take at least 2k - 1 bytes between the brackets (a digit each, commas between).
  const capacity = ((end - start) >>> 1) + 1;
  let out = scratch;
  if (out.length < capacity) {
    out = new Uint32Array(Math.max(capacity, 2 * out.length));
    if (out.length <= MAX_KEPT_SCRATCH_TOKENS) scratch = out;
  }
  let p = start + 1;
  let c = b[p] as number;
  while (isWs(c)) c = b[++p] as number;
  if (p === end) return { start, end: end + 1, tokens: new Uint32Array(0) };
  let count = 0;
  for (;;) {
    // `(c - ZERO) >>> 0 <= 9` tests for a digit with one unsigned compare: any byte below '0'
    // wraps to a large u32 (a little faster than a two-sided test on bench:http's bodies).
    let d = (c - ZERO) >>> 0;
    if (d > 9) return undefined;
    const digitsStart = p;
    let value = d;
    c = b[++p] as number;
    d = (c - ZERO) >>> 0;
    if (value === 0) {
      if (d <= 9) return undefined;
    } else {
      while (d <= 9) {
        value = value * 10 + d;
        c = b[++p] as number;
        d = (c - ZERO) >>> 0;
      }
      // Up to 10 digits the double arithmetic is exact; beyond, the literal is out of range anyway.
      if (p - digitsStart > MAX_U32_DIGITS || value > U32_MAX) return undefined;
    }
    out[count++] = value;
    // Compact separators (`,` right after the digits, as JSON.stringify writes) are tested first.
    if (c === COMMA) {
      c = b[++p] as number;
      if ((c - ZERO) >>> 0 <= 9) continue;
    } else {
      while (isWs(c)) c = b[++p] as number;
      // The first `]` is `end`, so reaching one closes the array.
      if (c === CLOSE_BRACKET) return { start, end: end + 1, tokens: out.slice(0, count) };
      if (c !== COMMA) return undefined;
      c = b[++p] as number;
    }
    while (isWs(c)) c = b[++p] as number;
  }
}
