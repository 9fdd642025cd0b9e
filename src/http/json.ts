/**
 * Lossless JSON for 64-bit ids and hashes.
 *
 * Node 20's JSON.parse turns 18446744073709551615 into 18446744073709552000 and has no
 * source-text access in revivers (that arrived in Node 21), so integers above 2^53 would be
 * silently corrupted. `parseJson` returns integer literals outside the safe range as `bigint`
 * (safe integers and every non-integer literal stay `number`, exactly as JSON.parse gives them).
 *
 * Fast path: a body without a run of 16 digits cannot hold an unsafe integer (2^53 has 16 digits),
 * so it goes straight to the native JSON.parse. Only bodies carrying hashes or 64-bit worker ids
 * reach the hand-written parser below, which is small and single-pass. Prompt routes do not send
 * their `token_ids` through here at all: token-ids.ts reads that array straight into a
 * Uint32Array and passes only the rest of the body to parseJsonBytes.
 */

/** Nesting deeper than this is not a request any route accepts; it bounds the parser's recursion. */
export const MAX_JSON_DEPTH = 64;

/** Longest integer literal (sign excluded) that is always a safe integer: 15 digits < 2^53. */
const MAX_SAFE_DIGITS = 15;
/** 2^53 has 16 digits: text without a 16-digit run holds no unsafe integer. */
const UNSAFE_DIGIT_RUN = 16;
const MIN_SAFE = BigInt(Number.MIN_SAFE_INTEGER);
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/** Nesting beyond MAX_JSON_DEPTH (the text may be valid JSON; the shape is what is refused). */
export class JsonDepthError extends RangeError {
  constructor(depth: number) {
    super(`body: JSON nested deeper than ${depth} levels`);
    this.name = "JsonDepthError";
  }
}

/**
 * Parses JSON text; integer literals outside [-(2^53-1), 2^53-1] become `bigint`.
 * Throws SyntaxError on malformed text and JsonDepthError on nesting beyond MAX_JSON_DEPTH
 * (the latter only on the exact path; the fast path leaves deep shapes to validation).
 */
export function parseJson(text: string): unknown {
  if (!hasDigitRun((i) => text.charCodeAt(i), text.length)) return JSON.parse(text) as unknown;
  return new ExactParser(Buffer.from(text, "utf8")).parseDocument();
}

/** parseJson over a UTF-8 body as received (the server's path: no string is built for the check). */
export function parseJsonBytes(bytes: Buffer): unknown {
  if (!hasDigitRun((i) => bytes[i] as number, bytes.length)) return JSON.parse(bytes.toString("utf8")) as unknown;
  return new ExactParser(bytes).parseDocument();
}

/**
 * Whether a run of UNSAFE_DIGIT_RUN digits exists. Any such run covers a position that is a
 * multiple of 16 (minus one), so only every 16th character is probed and only digit probes look
 * around: several times faster than a full scan or /\d{16}/ (which backtracks at every digit)
 * on a long token body.
 */
function hasDigitRun(at: (i: number) => number, n: number): boolean {
  for (let i = UNSAFE_DIGIT_RUN - 1; i < n; i += UNSAFE_DIGIT_RUN) {
    if (!isDigit(at(i))) continue;
    let a = i;
    while (a > 0 && isDigit(at(a - 1))) a--;
    let b = i + 1;
    while (b < n && isDigit(at(b))) b++;
    if (b - a >= UNSAFE_DIGIT_RUN) return true;
  }
  return false;
}

/** A single-pass recursive-descent parser over UTF-8 bytes (indexing a Buffer is cheaper than charCodeAt here). */
class ExactParser {
  readonly #b: Buffer;
  #pos = 0;
  #depth = 0;

  constructor(bytes: Buffer) {
    this.#b = bytes;
  }

  parseDocument(): unknown {
    const v = this.#value();
    this.#ws();
    if (this.#pos < this.#b.length) this.#fail("unexpected data after the JSON value");
    return v;
  }

  #fail(what: string): never {
    throw new SyntaxError(`${what} at byte ${this.#pos}`);
  }

  /** The byte at p, or -1 past the end. */
  #at(p: number): number {
    return p < this.#b.length ? (this.#b[p] as number) : -1;
  }

  #ws(): void {
    let p = this.#pos;
    for (;;) {
      const c = this.#at(p);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) p++;
      else break;
    }
    this.#pos = p;
  }

  #value(): unknown {
    this.#ws();
    const c = this.#at(this.#pos);
    switch (c) {
      case 0x7b /* { */:
        return this.#object();
      case 0x5b /* [ */:
        return this.#array();
      case 0x22 /* " */:
        return this.#string();
      case 0x74 /* t */:
        return this.#literal("true", true);
      case 0x66 /* f */:
        return this.#literal("false", false);
      case 0x6e /* n */:
        return this.#literal("null", null);
      default:
        if (c === 0x2d || isDigit(c)) return this.#number();
        return this.#fail(c < 0 ? "unexpected end of JSON input" : "unexpected character");
    }
  }

  #literal<T>(word: string, value: T): T {
    if (this.#b.toString("latin1", this.#pos, this.#pos + word.length) !== word) this.#fail("invalid literal");
    this.#pos += word.length;
    return value;
  }

  #enter(): void {
    if (++this.#depth > MAX_JSON_DEPTH) throw new JsonDepthError(MAX_JSON_DEPTH);
  }

  #object(): Record<string, unknown> {
    this.#enter();
    this.#pos++;
    const out: Record<string, unknown> = {};
    this.#ws();
    if (this.#at(this.#pos) === 0x7d) {
      this.#pos++;
      this.#depth--;
      return out;
    }
    for (;;) {
      this.#ws();
      if (this.#at(this.#pos) !== 0x22) this.#fail("expected a string key");
      const key = this.#string();
      this.#ws();
      if (this.#at(this.#pos) !== 0x3a) this.#fail("expected ':'");
      this.#pos++;
      const v = this.#value();
      // Same as JSON.parse: "__proto__" is an own data property, never the prototype.
      if (key === "__proto__") Object.defineProperty(out, key, { value: v, enumerable: true, writable: true, configurable: true });
      else out[key] = v;
      this.#ws();
      const c = this.#at(this.#pos++);
      if (c === 0x2c) continue;
      if (c === 0x7d) break;
      this.#pos--;
      this.#fail("expected ',' or '}'");
    }
    this.#depth--;
    return out;
  }

  #array(): unknown[] {
    this.#enter();
    this.#pos++;
    const out: unknown[] = [];
    this.#ws();
    if (this.#at(this.#pos) === 0x5d) {
      this.#pos++;
      this.#depth--;
      return out;
    }
    for (;;) {
      out.push(this.#value());
      this.#ws();
      const c = this.#at(this.#pos++);
      if (c === 0x2c) continue;
      if (c === 0x5d) break;
      this.#pos--;
      this.#fail("expected ',' or ']'");
    }
    this.#depth--;
    return out;
  }

  #string(): string {
    const b = this.#b;
    const start = this.#pos;
    let p = start + 1;
    let escaped = false;
    for (;;) {
      const c = this.#at(p);
      if (c === 0x22) break;
      if (c === 0x5c) {
        escaped = true;
        p += 2;
        continue;
      }
      if (c < 0) {
        this.#pos = p;
        this.#fail("unterminated string");
      }
      if (c < 0x20) {
        this.#pos = p;
        this.#fail("control character in string");
      }
      p++;
    }
    this.#pos = p + 1;
    // Escapes are rare in ids and names: let the native parser decode (and validate) them.
    return escaped ? (JSON.parse(b.toString("utf8", start, p + 1)) as string) : b.toString("utf8", start + 1, p);
  }

  #number(): number | bigint {
    const start = this.#pos;
    let p = start;
    const negative = this.#at(p) === 0x2d;
    if (negative) p++;
    const digitsStart = p;
    let value = 0;
    const first = this.#at(p);
    if (first === 0x30) p++;
    else if (first >= 0x31 && first <= 0x39) {
      for (let c = first; isDigit(c); c = this.#at(++p)) value = value * 10 + (c - 0x30);
    } else {
      this.#pos = p;
      this.#fail("invalid number");
    }
    const intDigits = p - digitsStart;
    let integer = true;
    if (this.#at(p) === 0x2e) {
      integer = false;
      p = this.#digits(p + 1);
    }
    const e = this.#at(p);
    if (e === 0x65 || e === 0x45) {
      integer = false;
      const sign = this.#at(p + 1);
      p = this.#digits(sign === 0x2b || sign === 0x2d ? p + 2 : p + 1);
    }
    this.#pos = p;
    if (integer && intDigits <= MAX_SAFE_DIGITS) return negative ? -value : value;
    const literal = this.#b.toString("latin1", start, p);
    if (!integer) return Number(literal);
    const big = BigInt(literal);
    return big >= MIN_SAFE && big <= MAX_SAFE ? Number(big) : big;
  }

  /** One or more digits from p; returns the position after them. */
  #digits(p: number): number {
    if (!isDigit(this.#at(p))) {
      this.#pos = p;
      this.#fail("invalid number");
    }
    while (isDigit(this.#at(p))) p++;
    return p;
  }
}

const isDigit = (c: number): boolean => c >= 0x30 && c <= 0x39;

/**
 * JSON.stringify with bigints written as bare integers. JSON.stringify cannot do it (it throws on
 * bigint, and a replacer can only produce quoted strings), so this is a small serializer with the
 * same rules: undefined/function/symbol members are skipped (null in arrays), non-finite numbers
 * are null, `toJSON` is honoured.
 */
export function stringifyJson(value: unknown): string {
  return write(value) ?? "null";
}

function write(v: unknown): string | undefined {
  switch (typeof v) {
    case "string":
      return JSON.stringify(v);
    case "number":
      return Number.isFinite(v) ? String(v) : "null";
    case "bigint":
      return v.toString();
    case "boolean":
      return v ? "true" : "false";
    case "object":
      return v === null ? "null" : writeObject(v);
    case "undefined":
    case "function":
    case "symbol":
      return undefined;
  }
}

function writeObject(o: object): string | undefined {
  const toJSON = (o as { toJSON?: unknown }).toJSON;
  if (typeof toJSON === "function") return write((toJSON as () => unknown).call(o));
  if (Array.isArray(o)) {
    const a = o as unknown[];
    let out = "[";
    for (let i = 0; i < a.length; i++) {
      if (i > 0) out += ",";
      out += write(a[i]) ?? "null";
    }
    return out + "]";
  }
  let out = "{";
  let first = true;
  for (const k of Object.keys(o)) {
    const s = write((o as Record<string, unknown>)[k]);
    if (s === undefined) continue;
    out += (first ? "" : ",") + JSON.stringify(k) + ":" + s;
    first = false;
  }
  return out + "}";
}
