/**
 * Dynamo-compatible block hashing (Dynamo's lib/kv-router/src/protocols.rs): XXH3-64 over the little-endian u32
 * bytes of each complete block of tokens, seeded with 1337 (plus LoRA / cache-salt terms), and the
 * chained sequence hash over consecutive block hashes. Values must match Dynamo bit for bit, since
 * the index compares them with hashes computed by other routers and by the engines.
 *
 * Speed: a long prompt's hashing is dominated by its native `@node-rs/xxhash` calls, one per
 * block (`npm run bench:core`); everything else is one copy of the tokens into a
 * Uint32Array and zero-copy subarray views over it.
 */
import { xxh3 } from "@node-rs/xxhash";
import { badRequest } from "./errors.js";
import { hashCount, toU64, type HashList } from "./hash64.js";

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
  const n = tokens.length;
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    const t = tokens[i] as number;
    // `t >>> 0 === t` is false for NaN, fractions, negatives and values >= 2^32.
    if (t >>> 0 !== t) {
      throw badRequest(`token_ids[${i}] must be an integer in [0, 4294967295], got ${String(t)}`, "token_ids");
    }
    out[i] = t;
  }
  return out;
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
  if (!Number.isInteger(blockSize) || blockSize < 1) {
    throw badRequest(`block_size must be a positive integer, got ${String(blockSize)}`, "block_size");
  }
  const words = tokensToU32(tokens);
  const isEagle = opts?.isEagle ?? false;
  const count = completeBlockCount(words.length, blockSize, isEagle);
  const out = new Uint32Array(count * 2);
  if (count === 0) return out;

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
