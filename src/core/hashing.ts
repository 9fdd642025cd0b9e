/**
 * Dynamo-compatible block hashing (Dynamo's lib/kv-router/src/protocols.rs): XXH3-64 over the little-endian u32
 * bytes of each complete block of tokens, seeded with 1337 (plus LoRA / cache-salt terms), and the
 * chained sequence hash over consecutive block hashes. Values must match Dynamo bit for bit, since
 * the index compares them with hashes computed by other routers and by the engines.
 *
 * Speed: a prompt is hashed in one WebAssembly call (wasm-xxh3.ts, xxh3.wat): its tokens are
 * copied once into the module's memory, and every block hash and, with computePromptHashes,
 * every sequence hash is computed there, with no BigInt per block. A cold 14,000-token prompt
 * at block size 64 went from ~300 us (one native `@node-rs/xxhash` call per block and per chain
 * step, each with a BigInt seed and result) to the figure in docs/benchmarks.md
 * (`npm run bench:core`). Without WebAssembly (--jitless) or on a big-endian host the native
 * per-block path below runs, with the same results.
 */
import { xxh3 } from "@node-rs/xxhash";
import { badRequest } from "./errors.js";
import { hashCount, toU64, type HashList } from "./hash64.js";
import { WasmXxh3 } from "./wasm-xxh3.js";

/** The one-call hasher of this thread; undefined where WebAssembly is unavailable. */
const wasm = WasmXxh3.create();

export const XXH3_SEED = 1337n;

const U64_MASK = (1n << 64n) - 1n;
const U32_MASK = 0xffffffffn;
const LORA_SEED = 0n;
const SALT_SEED = 1n;
const BYTES_PER_TOKEN = 4;
const BYTES_PER_MM_HASH = 8;

/** Typed arrays use platform byte order; the hash input must be little-endian regardless. */
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/**
 * Seed for block hashes: 1337, plus xxh3(lora_name, seed 0), plus xxh3(cache_salt, seed 1), wrapping
 * mod 2^64. Empty or absent strings contribute nothing, so unsalted base-model prompts share 1337.
 */
export function saltSeed(loraName?: string | null, cacheSalt?: string | null): bigint {
  let seed = XXH3_SEED;
  if (loraName !== undefined && loraName !== null && loraName !== "") {
    seed += xxh3.xxh64(Buffer.from(loraName, "utf8"), LORA_SEED);
  }
  if (cacheSalt !== undefined && cacheSalt !== null && cacheSalt !== "") {
    seed += xxh3.xxh64(Buffer.from(cacheSalt, "utf8"), SALT_SEED);
  }
  return seed & U64_MASK;
}

/**
 * Number of hashable blocks: complete blocks only (a trailing partial block is ignored); Eagle
 * windows span blockSize+1 tokens stepping by blockSize, hence (n-1)/blockSize.
 */
export function completeBlockCount(tokens: ArrayLike<number> | number, blockSize: number, isEagle = false): number {
  const n = typeof tokens === "number" ? tokens : tokens.length;
  if (isEagle) return n < 1 ? 0 : Math.floor((n - 1) / blockSize);
  return Math.floor(n / blockSize);
}

export interface BlockHashOptions {
  readonly loraName?: string | null;
  readonly cacheSalt?: string | null;
  readonly isEagle?: boolean;
  /** Per block index: the multimodal object hashes whose placeholder tokens fall in that block. */
  readonly blockMmHashes?: readonly (readonly bigint[] | undefined)[];
}

/** Copies the tokens into a Uint32Array, rejecting anything that is not an integer in [0, 2^32). */
function tokensToU32(tokens: ArrayLike<number>): Uint32Array {
  if (tokens instanceof Uint32Array) return tokens;
  const out = new Uint32Array(tokens.length);
  copyTokens(tokens, out, 0);
  return out;
}

/** Writes the tokens at out[at...], validating each (the first invalid one is the error). */
function copyTokens(tokens: ArrayLike<number>, out: Uint32Array, at: number): void {
  if (tokens instanceof Uint32Array) {
    out.set(tokens, at);
    return;
  }
  const n = tokens.length;
  for (let i = 0; i < n; i++) {
    const t = tokens[i] as number;
    // `t >>> 0 === t` is false for NaN, fractions, negatives and values >= 2^32.
    if (t >>> 0 !== t) {
      throw badRequest(`token_ids[${i}] must be an integer in [0, 4294967295], got ${String(t)}`, "token_ids");
    }
    out[at + i] = t;
  }
}

/** Little-endian byte view of the token words (a copy only on big-endian hosts). */
function leBytes(words: Uint32Array): Uint8Array {
  if (LITTLE_ENDIAN) return new Uint8Array(words.buffer, words.byteOffset, words.byteLength);
  const out = new Uint8Array(words.length * BYTES_PER_TOKEN);
  const dv = new DataView(out.buffer);
  for (let i = 0; i < words.length; i++) dv.setUint32(i * BYTES_PER_TOKEN, words[i] as number, true);
  return out;
}

function compareU64(a: bigint, b: bigint): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Token bytes of one block followed by its sorted mm hashes as little-endian u64. */
function withMmHashes(blockBytes: Uint8Array, mmHashes: readonly bigint[]): Uint8Array {
  const sorted = mmHashes.map(toU64).sort(compareU64);
  const out = new Uint8Array(blockBytes.length + sorted.length * BYTES_PER_MM_HASH);
  out.set(blockBytes, 0);
  const dv = new DataView(out.buffer);
  for (let k = 0; k < sorted.length; k++) dv.setBigUint64(blockBytes.length + k * BYTES_PER_MM_HASH, sorted[k] as bigint, true);
  return out;
}

/** Local (content) hash of every complete block, as a HashList of (hi, lo) pairs. */
export function computeBlockHashes(tokens: ArrayLike<number>, blockSize: number, opts?: BlockHashOptions): HashList {
  return hashPrompt(tokens, blockSize, opts, false).localHashes;
}

/**
 * Block hashes and their sequence hashes in one pass: equal to computeBlockHashes followed by
 * computeSequenceHashes, without a second walk (or, natively, a second round of calls).
 */
export function computePromptHashes(tokens: ArrayLike<number>, blockSize: number, opts?: BlockHashOptions): { readonly localHashes: HashList; readonly seqHashes: HashList } {
  const r = hashPrompt(tokens, blockSize, opts, true);
  return { localHashes: r.localHashes, seqHashes: r.seqHashes ?? computeSequenceHashes(r.localHashes) };
}

function hashPrompt(tokens: ArrayLike<number>, blockSize: number, opts: BlockHashOptions | undefined, withSeq: boolean): { localHashes: HashList; seqHashes?: HashList } {
  if (!Number.isInteger(blockSize) || blockSize < 1) {
    throw badRequest(`block_size must be a positive integer, got ${String(blockSize)}`, "block_size");
  }
  const isEagle = opts?.isEagle ?? false;
  const count = completeBlockCount(tokens.length, blockSize, isEagle);
  const mm = opts?.blockMmHashes;
  if (wasm === undefined || (mm !== undefined && mm.length > 0)) {
    // The native path, also for multimodal prompts (a block's input grows by its objects' hashes).
    const localHashes = nativeBlockHashes(tokens, blockSize, count, opts);
    return withSeq ? { localHashes, seqHashes: computeSequenceHashes(localHashes) } : { localHashes };
  }
  const localHashes = new Uint32Array(count * 2);
  const seqHashes = withSeq ? new Uint32Array(count * 2) : undefined;
  const seed = saltSeed(opts?.loraName, opts?.cacheSalt);
  const window = isEagle ? blockSize + 1 : blockSize;
  wasm.blocks(tokens.length, (mem, at) => {
    copyTokens(tokens, mem, at);
  }, count, blockSize, window, Number(seed >> 32n), Number(seed & U32_MASK), localHashes, seqHashes);
  return seqHashes === undefined ? { localHashes } : { localHashes, seqHashes };
}

/** One native XXH3 call per block (see the header): without WebAssembly, and for multimodal blocks. */
function nativeBlockHashes(tokens: ArrayLike<number>, blockSize: number, count: number, opts: BlockHashOptions | undefined): HashList {
  const words = tokensToU32(tokens);
  const out = new Uint32Array(count * 2);
  if (count === 0) return out;
  const isEagle = opts?.isEagle ?? false;
  const seed = saltSeed(opts?.loraName, opts?.cacheSalt);
  const bytes = leBytes(words);
  const mm = opts?.blockMmHashes;
  const stride = blockSize * BYTES_PER_TOKEN;
  const windowBytes = (isEagle ? blockSize + 1 : blockSize) * BYTES_PER_TOKEN;
  for (let i = 0; i < count; i++) {
    const start = i * stride;
    let input = bytes.subarray(start, start + windowBytes);
    const blockMm = mm?.[i];
    if (blockMm !== undefined && blockMm.length > 0) input = withMmHashes(input, blockMm);
    const h = xxh3.xxh64(input, seed);
    out[2 * i] = Number(h >> 32n);
    out[2 * i + 1] = Number(h & U32_MASK);
  }
  return out;
}

/** 16-byte scratch for one chain step: le_u64(prev) ‖ le_u64(block). Reused: hashing is synchronous. */
const chainBytes = new Uint8Array(16);
const chainView = new DataView(chainBytes.buffer);

/** seq[0] = block[0]; seq[i] = XXH3-64(le_u64(seq[i-1]) ‖ le_u64(block[i]), seed 1337). */
export function computeSequenceHashes(blocks: HashList): HashList {
  const n = hashCount(blocks);
  const out = new Uint32Array(n * 2);
  if (n === 0) return out;
  if (wasm !== undefined) {
    wasm.chain(blocks, out);
    return out;
  }
  let prevHi = blocks[0] as number;
  let prevLo = blocks[1] as number;
  out[0] = prevHi;
  out[1] = prevLo;
  for (let i = 1; i < n; i++) {
    chainView.setUint32(0, prevLo, true);
    chainView.setUint32(4, prevHi, true);
    chainView.setUint32(8, blocks[2 * i + 1] as number, true);
    chainView.setUint32(12, blocks[2 * i] as number, true);
    const h = xxh3.xxh64(chainBytes, XXH3_SEED);
    prevHi = Number(h >> 32n);
    prevLo = Number(h & U32_MASK);
    out[2 * i] = prevHi;
    out[2 * i + 1] = prevLo;
  }
  return out;
}
