/**
 * Shared pieces of the fuzz suites: a seeded case generator, a JSON writer that can emit literals
 * no JS value serializes to (1e999, 2^64 as text, -0), value pools of 64-bit edge cases, and a raw
 * HTTP/1.1 client for what fetch cannot send (pipelined garbage, bad framing, slow clients).
 */
import { connect, type Socket } from "node:net";
import { Packr, Unpackr } from "msgpackr";

import { seededRandom, type Random } from "../../src/core/index.js";

/** A JSON literal written verbatim (numbers JSON.stringify cannot produce, or invalid text). */
export class RawJson {
  constructor(readonly text: string) {}
}

/** JSON text with bigints as bare integers and RawJson verbatim; objects keep insertion order. */
export function jsonText(v: unknown): string {
  if (v instanceof RawJson) return v.text;
  switch (typeof v) {
    case "bigint":
      return v.toString();
    case "number":
      return Number.isFinite(v) ? String(v) : "null";
    case "string":
      return JSON.stringify(v);
    case "boolean":
      return v ? "true" : "false";
    case "undefined":
      return "null";
    case "object": {
      if (v === null) return "null";
      if (Array.isArray(v)) return `[${v.map(jsonText).join(",")}]`;
      return `{${Object.entries(v as Record<string, unknown>)
        .map(([k, x]) => `${JSON.stringify(k)}:${jsonText(x)}`)
        .join(",")}}`;
    }
    case "function":
    case "symbol":
      return "null";
  }
}

/** Seeded helpers over src/core/random.ts's mulberry32: the same seed replays the same cases. */
export class Fuzz {
  readonly #r: Random;
  constructor(seed: number) {
    this.#r = seededRandom(seed);
  }
  next(): number {
    return this.#r.next();
  }
  /** Uniform integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.#r.next() * n);
  }
  chance(p: number): boolean {
    return this.#r.next() < p;
  }
  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new RangeError("pick from an empty list");
    return items[this.int(items.length)] as T;
  }
  bytes(n: number): Buffer {
    const b = Buffer.allocUnsafe(n);
    for (let i = 0; i < n; i++) b[i] = this.int(256);
    return b;
  }
  u64(): bigint {
    return (BigInt(this.int(0x1_0000_0000)) << 32n) | BigInt(this.int(0x1_0000_0000));
  }
  /** A shuffled copy. */
  shuffle<T>(items: readonly T[]): T[] {
    const a = [...items];
    for (let i = a.length - 1; i > 0; i--) {
      const j = this.int(i + 1);
      [a[i], a[j]] = [a[j] as T, a[i] as T];
    }
    return a;
  }
}

export const TWO_53 = 2n ** 53n;
export const TWO_63 = 2n ** 63n;
export const TWO_64 = 2n ** 64n;

/** The 64-bit edge values the issue names, plus their neighbours, as exact JSON integers. */
export const EDGE_INTEGERS: readonly bigint[] = [
  -1n,
  0n,
  1n,
  TWO_53 - 1n,
  TWO_53,
  TWO_53 + 1n,
  TWO_63 - 1n,
  TWO_63,
  TWO_64 - 1n,
  TWO_64,
  -(TWO_63 + 1n),
  -TWO_63,
  2n ** 32n,
  2n ** 32n - 1n,
  10n ** 30n,
];

/** Values of every JSON type and edge, for replacing one field of a valid body. */
export const VALUE_POOL: readonly unknown[] = [
  null,
  true,
  false,
  "",
  "x",
  "1",
  "18446744073709551615",
  " ",
  "\u0000",
  "\ud800",
  "é🎉",
  "a".repeat(300),
  "b".repeat(70_000),
  1.5,
  -0.5,
  new RawJson("-0"),
  new RawJson("1e999"),
  new RawJson("-1e999"),
  new RawJson("1E400"),
  new RawJson("1e-400"),
  new RawJson("123456789012345678901234567890123456789"),
  new RawJson("0.0000000000000000000000000001"),
  new RawJson("9007199254740993.0"),
  new RawJson("1.8446744073709552e19"),
  1e308,
  -1e308,
  Number.MAX_SAFE_INTEGER,
  -Number.MAX_SAFE_INTEGER,
  ...EDGE_INTEGERS,
  [],
  [null],
  [1, "a"],
  [-1],
  [TWO_64],
  {},
  { a: 1 },
  new RawJson('{"__proto__":{"polluted":1}}'),
  new RawJson('{"constructor":{"prototype":{"polluted":1}}}'),
];

/** Strings that are not valid JSON documents (or not a single one). */
export const MALFORMED_JSON: readonly string[] = [
  "{",
  "}",
  "[",
  '{"a"',
  '{"a":',
  '{"a":}',
  '{"a":1,}',
  "{'a':1}",
  '{"a":1}{"b":2}',
  '{"a":1} x',
  "{a:1}",
  '{"a":NaN}',
  '{"a":Infinity}',
  '{"a":-}',
  '{"a":01}',
  '{"a":1.}',
  '{"a":.5}',
  '{"a":1e}',
  '{"a":0x10}',
  '{"a":"\\x41"}',
  '{"a":"\\u12"}',
  '{"a":"unterminated}',
  '{"a":"ctrl\u0001char"}',
  '{"a":tru}',
  '{"a":nul}',
  "// comment\n{}",
  "{/* c */}",
  "\u00ef\u00bb\u00bf{}",
  "undefined",
  "\u0000",
  '{"a":1}\u0000',
  '{"worker_id":18446744073709551615,',
  '{"worker_id":184467440737095516150000000000000000,"x":',
];

/** Byte sequences that are not valid UTF-8 (lone continuation, overlong, surrogate, truncated, > U+10FFFF). */
export const INVALID_UTF8: readonly Buffer[] = [
  Buffer.from([0xff]),
  Buffer.from([0xfe, 0xff]),
  Buffer.from([0x80]),
  Buffer.from([0xc0, 0xaf]),
  Buffer.from([0xe0, 0x80, 0xaf]),
  Buffer.from([0xed, 0xa0, 0x80]),
  Buffer.from([0xe2, 0x82]),
  Buffer.from([0xf4, 0x90, 0x80, 0x80]),
  Buffer.from([0xf8, 0x88, 0x80, 0x80, 0x80]),
  Buffer.from([0xc3]),
];

/** `depth` nested arrays around `inner` (100k levels: ~200 KB of text). */
export function nestedArrays(depth: number, inner = "1"): string {
  return "[".repeat(depth) + inner + "]".repeat(depth);
}

/** `depth` nested objects `{"a":{"a":...}}`. */
export function nestedObjects(depth: number, inner = "1"): string {
  return '{"a":'.repeat(depth) + inner + "}".repeat(depth);
}

// ---------------------------------------------------------------------------------------------
// Structural mutation of the msgpack value tree

const treePackr = new Packr({ useRecords: false, encodeUndefinedAsNil: true, variableMapSize: true });
// 64-bit integers come back as bigint, so re-packing a mutated tree keeps them exact.
const treeUnpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: "bigint" });

/** msgpack bytes -> a plain value tree (maps as objects, 64-bit ints as bigint). */
export const unpackTree = (b: Uint8Array): unknown => treeUnpackr.unpack(b) as unknown;
/** A value tree -> msgpack bytes (throws for values msgpack has no type for). */
export const packTree = (v: unknown): Buffer => treePackr.pack(v);

export const MSGPACK_POOL: readonly (() => unknown)[] = [
  () => null,
  () => true,
  () => -1,
  () => 1.5,
  () => NaN,
  () => Infinity,
  () => "x",
  () => "é".repeat(1000),
  () => "",
  () => [],
  () => ({}),
  () => Buffer.from([1, 2, 3]),
  () => [null, "a", 1],
  () => ({ type: "BlockStored" }),
  () => ({ type: "Unknown" }),
  () => Array.from({ length: 20_000 }, () => 7),
  () => Array.from({ length: 5_000 }, () => TWO_64 - 1n),
  () => Array.from({ length: 2_000 }, () => "BlockRemoved"),
  ...EDGE_INTEGERS.filter((v) => v >= -(2n ** 63n) && v < TWO_64).map((v) => () => v),
];

export function nestedValue(depth: number): unknown {
  let v: unknown = 1;
  for (let i = 0; i < depth; i++) v = [v];
  return v;
}

/** Every container path in `v` (objects and arrays), as key lists. */
function paths(v: unknown, at: (string | number)[] = [], out: (string | number)[][] = []): (string | number)[][] {
  if (Array.isArray(v)) {
    out.push(at);
    v.forEach((x, i) => paths(x, [...at, i], out));
  } else if (typeof v === "object" && v !== null && !(v instanceof Uint8Array)) {
    out.push(at);
    for (const [k, x] of Object.entries(v)) paths(x, [...at, k], out);
  }
  return out;
}

function getAt(v: unknown, p: readonly (string | number)[]): unknown {
  let cur = v;
  for (const k of p) cur = (cur as Record<string | number, unknown>)[k];
  return cur;
}

/** Replaces, deletes or adds one member of a random container; returns what it did. */
export function mutateTree(f: Fuzz, root: unknown): { value: unknown; what: string } {
  const value = structuredClone(root);
  const targets = paths(value);
  const p = f.pick(targets);
  const container = getAt(value, p) as Record<string | number, unknown> | unknown[];
  const keys: (string | number)[] = Array.isArray(container) ? container.map((_, i) => i) : Object.keys(container);
  const roll = f.int(10);
  if (roll < 6 && keys.length > 0) {
    const k = f.pick(keys);
    const v = f.chance(0.05) ? nestedValue(f.chance(0.5) ? 50_000 : 100) : f.pick(MSGPACK_POOL)();
    (container as Record<string | number, unknown>)[k] = v;
    return { value, what: `${p.join(".")}.${k} replaced` };
  }
  if (roll < 8 && keys.length > 0) {
    const k = f.pick(keys);
    if (Array.isArray(container)) container.splice(Number(k), 1);
    else Reflect.deleteProperty(container, String(k));
    return { value, what: `${p.join(".")}.${k} removed` };
  }
  if (Array.isArray(container)) container.push(f.pick(MSGPACK_POOL)());
  else (container as Record<string, unknown>)[`unknown_${f.int(100)}`] = f.pick(MSGPACK_POOL)();
  return { value, what: `${p.join(".")} grew` };
}

/** Byte-level damage: truncation, flipped bytes, inserted or random bytes. */
export function mutateBytes(f: Fuzz, b: Buffer): { bytes: Buffer; what: string; truncated: boolean } {
  const roll = f.int(4);
  if (roll === 0 && b.length > 1) {
    const cut = 1 + f.int(b.length - 1);
    return { bytes: b.subarray(0, cut), what: `truncated ${cut}/${b.length}`, truncated: true };
  }
  if (roll === 1) {
    const out = Buffer.from(b);
    for (let i = 0, n = 1 + f.int(4); i < n; i++) out[f.int(out.length)] = f.int(256);
    return { bytes: out, what: "flipped", truncated: false };
  }
  if (roll === 2) {
    const at = f.int(b.length);
    return { bytes: Buffer.concat([b.subarray(0, at), f.bytes(1 + f.int(8)), b.subarray(at)]), what: "inserted", truncated: false };
  }
  return { bytes: f.bytes(1 + f.int(200)), what: "random", truncated: false };
}

// ------------------------------------------------------------------------------------------
// Raw HTTP/1.1

export interface RawResponse {
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;
  readonly body: Buffer;
}

/**
 * Parses consecutive HTTP/1.1 responses (Content-Length or chunked framing, or to end of data
 * after `connection: close` without a length). Stops at the first incomplete one.
 */
export function parseResponses(data: Buffer): RawResponse[] {
  const out: RawResponse[] = [];
  let p = 0;
  while (p < data.length) {
    const headEnd = data.indexOf("\r\n\r\n", p);
    if (headEnd < 0) break;
    const lines = data.toString("latin1", p, headEnd).split("\r\n");
    const m = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? "");
    if (m === null) break;
    const headers: Record<string, string> = {};
    for (const l of lines.slice(1)) {
      const i = l.indexOf(":");
      if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
    }
    let q = headEnd + 4;
    let body: Buffer;
    if (headers["content-length"] !== undefined) {
      const n = Number(headers["content-length"]);
      if (q + n > data.length) break;
      body = data.subarray(q, q + n);
      q += n;
    } else if (headers["transfer-encoding"]?.toLowerCase() === "chunked") {
      const parts: Buffer[] = [];
      let complete = false;
      for (;;) {
        const le = data.indexOf("\r\n", q);
        if (le < 0) break;
        const size = parseInt(data.toString("latin1", q, le), 16);
        if (!Number.isFinite(size)) break;
        if (size === 0) {
          q = le + 4;
          complete = true;
          break;
        }
        parts.push(data.subarray(le + 2, le + 2 + size));
        q = le + 2 + size + 2;
      }
      if (!complete) break;
      body = Buffer.concat(parts);
    } else {
      body = data.subarray(q);
      q = data.length;
    }
    out.push({ status: Number(m[1]), headers, body });
    p = q;
  }
  return out;
}

export interface RawExchange {
  readonly responses: RawResponse[];
  /** The server closed the connection (as opposed to our timeout ending the exchange). */
  readonly closedByServer: boolean;
  readonly bytes: Buffer;
}

/**
 * Writes `chunks` to host:port (with `gapMs` between them), reads until the server closes,
 * `timeoutMs` passes or `signal` aborts, and parses what came back.
 */
export function rawExchange(host: string, port: number, chunks: readonly (Buffer | string)[], timeoutMs: number, gapMs = 0, signal?: AbortSignal): Promise<RawExchange> {
  return new Promise((resolve) => {
    const got: Buffer[] = [];
    let closedByServer = false;
    let done = false;
    const sock: Socket = connect(port, host);
    const finish = (): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      const bytes = Buffer.concat(got);
      resolve({ responses: parseResponses(bytes), closedByServer, bytes });
    };
    const timer = setTimeout(finish, timeoutMs);
    signal?.addEventListener("abort", finish, { once: true });
    sock.on("data", (d: Buffer) => got.push(d));
    sock.on("end", () => {
      closedByServer = true;
      finish();
    });
    sock.on("close", () => {
      closedByServer = true;
      finish();
    });
    sock.on("error", () => {
      closedByServer = true;
      finish();
    });
    sock.on("connect", () => {
      void (async () => {
        for (const c of chunks) {
          if (done || sock.destroyed) return;
          sock.write(c);
          if (gapMs > 0) await new Promise<void>((r) => setTimeout(r, gapMs));
        }
      })();
    });
  });
}

/** A POST request's bytes with a JSON body (and any extra headers). */
export function httpRequest(method: string, path: string, body?: string | Buffer, headers: Record<string, string> = {}): Buffer {
  const b = body === undefined ? undefined : typeof body === "string" ? Buffer.from(body) : body;
  const h: Record<string, string> = { host: "127.0.0.1", ...(b === undefined ? {} : { "content-type": "application/json", "content-length": String(b.length) }), ...headers };
  const head = `${method} ${path} HTTP/1.1\r\n${Object.entries(h)
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join("")}\r\n`;
  return b === undefined ? Buffer.from(head, "latin1") : Buffer.concat([Buffer.from(head, "latin1"), b]);
}

/** Nearest-rank percentile of `xs` (p in [0, 100]). */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] as number;
}
