/**
 * The token_ids byte loop in WebAssembly (u32-array.wat), for long arrays.
 *
 * Why: that loop was the largest self-time item of the daemon's main thread under bench:http,
 * well above a plain byte sum's cost. The same state machine compiled by V8's WebAssembly tier
 * parses bench:http's long arrays in about half the time, the copy into its memory and of the
 * tokens out included (`npm run bench:http`; profile with --cpu-prof). It answers exactly what the JS loop answers (the tokens, or
 * "not canonical: fall back"), which test/unit/http/u32-array-parser.test.ts checks on random and
 * corrupted arrays.
 *
 * Used only where it pays and is safe: arrays of WASM_MIN_BYTES to WASM_MAX_BYTES (the module's
 * memory grows to fit the largest seen: at most ~3x WASM_MAX_BYTES), on little-endian hosts
 * (tokens are read back through a Uint32Array view of the module's little-endian memory), and
 * when WebAssembly is available (not under --jitless); otherwise the JS loop runs.
 */
import { U32_ARRAY_WASM_BASE64 } from "./u32-array-wasm.js";

/** Below this many bytes the copy and call overheads outweigh the faster loop. */
export const WASM_MIN_BYTES = 2 * 1024;
/** 1 MiB of token bytes (~170,000 tokens); longer arrays use the JS loop. */
export const WASM_MAX_BYTES = 1024 * 1024;
const PAGE_BYTES = 65_536;
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

type ParseExport = (p: number, out: number) => number;
/** The parts of the WebAssembly API used here (its types live in lib.dom, which we do not load). */
interface WasmMemory {
  readonly buffer: ArrayBuffer;
  grow(pages: number): number;
}
interface WasmApi {
  readonly Module: new (bytes: Uint8Array) => object;
  readonly Instance: new (module: object, imports: object) => { readonly exports: { readonly memory: WasmMemory; readonly parse: ParseExport } };
}

export class WasmU32ArrayParser {
  readonly #memory: WasmMemory;
  readonly #parse: ParseExport;

  private constructor(memory: WasmMemory, parse: ParseExport) {
    this.#memory = memory;
    this.#parse = parse;
  }

  /** The parser, or undefined where WebAssembly is unavailable or the host is big-endian. */
  static create(): WasmU32ArrayParser | undefined {
    const api = (globalThis as { WebAssembly?: WasmApi }).WebAssembly;
    if (!LITTLE_ENDIAN || api === undefined) return undefined;
    try {
      const { memory, parse } = new api.Instance(new api.Module(Buffer.from(U32_ARRAY_WASM_BASE64, "base64")), {}).exports;
      return new WasmU32ArrayParser(memory, parse);
    } catch {
      return undefined;
    }
  }

  /**
   * The array whose `[` is at b[start] and whose first `]` is at b[end]: its tokens, or undefined
   * when an element is not a canonical integer literal in [0, 2^32) (the JS loop's rule).
   */
  parse(b: Buffer, start: number, end: number): Uint32Array | undefined {
    // The bytes after `[` through `]`, at offset 0; the tokens after them, 4-byte aligned (at most
    // one token per two bytes of the array).
    const len = end - start;
    const out = (len + 3) & ~3;
    const need = out + 4 * ((len >>> 1) + 1);
    const have = this.#memory.buffer.byteLength;
    if (need > have) this.#memory.grow(Math.ceil((need - have) / PAGE_BYTES));
    new Uint8Array(this.#memory.buffer, 0, len).set(b.subarray(start + 1, end + 1));
    const n = this.#parse(0, out);
    if (n < 0) return undefined;
    return new Uint32Array(this.#memory.buffer, out, n).slice();
  }
}
