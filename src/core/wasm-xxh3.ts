/**
 * XXH3-64 and the prompt hashing of hashing.ts in WebAssembly (xxh3.wat): one call per prompt.
 *
 * Why: with one native `@node-rs/xxhash` call per block (BigInt seed in, BigInt out) and one per
 * chain step, a cold 14,000-token prompt at block size 64 cost ~300 us, nearly all of it call
 * overhead and BigInt traffic; XXH3 itself over the prompt's 56 KB is a few tens of us. Here the
 * tokens are copied once into the module's memory and every block hash and sequence hash is
 * computed there (`npm run bench:core`, "hash" rows).
 *
 * Used when WebAssembly is available (not under --jitless) and the host is little-endian (the
 * module's memory is read back through Uint32Array views); otherwise hashing.ts keeps the
 * native per-block path. Synchronous, single-threaded: one instance per thread, its memory reused.
 */
import { XXH3_WASM_BASE64 } from "./xxh3-wasm.js";

/** Where the caller's buffers start in the module's memory (below: the secrets and accumulators). */
const SCRATCH = 1024;
const PAGE_BYTES = 65_536;
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

type HashExport = (p: number, len: number, seedHi: number, seedLo: number, out: number) => void;
type BlocksExport = (tok: number, count: number, stride: number, window: number, seedHi: number, seedLo: number, out: number, seqOut: number) => void;
type ChainExport = (input: number, count: number, out: number) => void;

/** The parts of the WebAssembly API used here (its types live in lib.dom, which we do not load). */
interface WasmMemory {
  readonly buffer: ArrayBuffer;
  grow(pages: number): number;
}
interface Xxh3Exports {
  readonly memory: WasmMemory;
  readonly hash: HashExport;
  readonly blocks: BlocksExport;
  readonly chain: ChainExport;
}
interface WasmApi {
  readonly Module: new (bytes: Uint8Array) => object;
  readonly Instance: new (module: object, imports: object) => { readonly exports: Xxh3Exports };
}

export class WasmXxh3 {
  readonly #x: Xxh3Exports;
  #u32 = new Uint32Array(0);
  #u8 = new Uint8Array(0);

  private constructor(x: Xxh3Exports) {
    this.#x = x;
    this.#views();
  }

  /** The module, or undefined where WebAssembly (with SIMD) is unavailable or the host is big-endian. */
  static create(): WasmXxh3 | undefined {
    const api = (globalThis as { WebAssembly?: WasmApi }).WebAssembly;
    if (!LITTLE_ENDIAN || api === undefined) return undefined;
    try {
      return new WasmXxh3(new api.Instance(new api.Module(Buffer.from(XXH3_WASM_BASE64, "base64")), {}).exports);
    } catch {
      return undefined;
    }
  }

  /** Byte offset in memory of the scratch area, after making sure `bytes` fit in it. */
  #reserve(bytes: number): number {
    const have = this.#x.memory.buffer.byteLength;
    const need = SCRATCH + bytes;
    if (need > have) {
      this.#x.memory.grow(Math.ceil((need - have) / PAGE_BYTES));
      this.#views();
    }
    return SCRATCH;
  }

  #views(): void {
    this.#u32 = new Uint32Array(this.#x.memory.buffer);
    this.#u8 = new Uint8Array(this.#x.memory.buffer);
  }

  /** XXH3-64 of `bytes` with the seed, as (hi, lo) written to out[at], out[at + 1]. */
  hashBytes(bytes: Uint8Array, seedHi: number, seedLo: number, out: Uint32Array, at: number): void {
    const p = this.#reserve(bytes.length + 8);
    this.#u8.set(bytes, p);
    const o = p + ((bytes.length + 7) & ~7);
    this.#x.hash(p, bytes.length, seedHi, seedLo, o);
    out[at] = this.#u32[o >>> 2] as number;
    out[at + 1] = this.#u32[(o >>> 2) + 1] as number;
  }

  /**
   * Block hashes of `count` windows of `window` tokens stepping by `stride` tokens over the u32
   * tokens, and (when `seqOut` is given) their sequence hashes, in one pass. `fill` writes the
   * tokens into the module's memory (a Uint32Array view, at the index it is given) and may throw
   * (validation); nothing is kept across calls.
   */
  blocks(
    tokenCount: number,
    fill: (mem: Uint32Array, at: number) => void,
    count: number,
    stride: number,
    window: number,
    seedHi: number,
    seedLo: number,
    out: Uint32Array,
    seqOut: Uint32Array | undefined,
  ): void {
    const tokBytes = tokenCount * 4;
    const p = this.#reserve(tokBytes + 16 * count);
    fill(this.#u32, p >>> 2);
    const o = p + tokBytes;
    const so = o + 8 * count;
    this.#x.blocks(p, count, stride * 4, window * 4, seedHi, seedLo, o, seqOut === undefined ? 0 : so);
    out.set(this.#u32.subarray(o >>> 2, (o >>> 2) + 2 * count));
    if (seqOut !== undefined) seqOut.set(this.#u32.subarray(so >>> 2, (so >>> 2) + 2 * count));
  }

  /** Sequence hashes of a HashList of block hashes. */
  chain(blocks: Uint32Array, out: Uint32Array): void {
    const n = blocks.length >>> 1;
    const p = this.#reserve(16 * n);
    this.#u32.set(blocks, p >>> 2);
    const o = p + 8 * n;
    this.#x.chain(p, n, o);
    out.set(this.#u32.subarray(o >>> 2, (o >>> 2) + 2 * n));
  }
}
