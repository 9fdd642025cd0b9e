/**
 * 64-bit hashes (block hashes, sequence hashes) stay exact everywhere.
 *
 * At the boundaries (HTTP JSON, KV events, mesh frames) a hash is a `bigint` in [0, 2^64); the
 * inputs also accept the signed form (toU64), and the HTTP responses that return a booking's
 * sequence hashes give them signed (hashListToSignedBigInts), as the reference does.
 * Inside hot structures it is a pair of uint32 (hi, lo): V8's Map with BigInt keys is an order
 * of magnitude slower per get than an open-addressing table over Uint32Arrays (u64-table.ts), and
 * a BigInt costs a heap object per key, which adds up at the millions of indexed pairs of
 * `npm run bench:core`.
 *
 * A `HashList` is a Uint32Array of interleaved pairs: [hi0, lo0, hi1, lo1, ...].
 */
import { badRequest } from "./errors.js";

export type HashList = Uint32Array;

const U64_MAX = (1n << 64n) - 1n;
const I64_MIN = -(1n << 63n);
const MASK32 = 0xffffffffn;

export const hashCount = (list: HashList): number => list.length >>> 1;

/** Accepts a signed or unsigned 64-bit integer and returns its unsigned reinterpretation. */
export function toU64(value: bigint): bigint {
  if (value < I64_MIN || value > U64_MAX) throw badRequest(`hash ${value} is outside the 64-bit range`, "hash");
  return value < 0n ? value + (1n << 64n) : value;
}

/** Unsigned -> signed two's-complement (the reference sends hashes as signed i64 over HTTP). */
export function u64ToI64(value: bigint): bigint {
  return value >= 1n << 63n ? value - (1n << 64n) : value;
}

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/**
 * BigInts (signed or unsigned 64-bit, as toU64 accepts) to a HashList. On little-endian hosts
 * each value is range-checked with two BigInt comparisons (no allocation) and stored through a
 * BigUint64Array view of the output, whose conversion (ToBigUint64, modulo 2^64) is exactly
 * toU64's for an in-range value; the (lo, hi) words are then swapped to (hi, lo). toU64 then a
 * shift, a mask and two Number() per value allocated three BigInts each: 42-57 us for a
 * 14,000-token prompt's 219 hashes against 7 us this way, and a /select given hash lists
 * converts two of them (`npm run bench:core`: the largest self time of a select, 38%).
 */
export function hashListFromBigInts(values: readonly bigint[]): HashList {
  const n = values.length;
  const out = new Uint32Array(n * 2);
  if (!LITTLE_ENDIAN) {
    for (let i = 0; i < n; i++) {
      const v = toU64(values[i] as bigint);
      out[2 * i] = Number(v >> 32n);
      out[2 * i + 1] = Number(v & MASK32);
    }
    return out;
  }
  const u64 = new BigUint64Array(out.buffer, 0, n);
  for (let i = 0; i < n; i++) {
    const v = values[i] as bigint;
    u64[i] = v;
    // Checked after the store, which brought the value's digits into the cache (a list's BigInts
    // are scattered over the heap): ~1 us less a list than checking first.
    if (v > U64_MAX || v < I64_MIN) toU64(v);
  }
  for (let i = 0; i < 2 * n; i += 2) {
    const lo = out[i] as number;
    out[i] = out[i + 1] as number;
    out[i + 1] = lo;
  }
  return out;
}
/** Pairs swapped to (lo, hi), read back as u64; grows to fit, shared by all calls (synchronous). */
let swapped = new Uint32Array(512);
let swappedU64 = new BigUint64Array(swapped.buffer);
let swappedI64 = new BigInt64Array(swapped.buffer);

/**
 * The list as BigInts. On little-endian hosts each element is read from a BigUint64Array over the
 * pairs swapped to (lo, hi): one BigInt per hash, made natively, where pairToBigInt makes four
 * (two BigInt(), a shift, an or): several times faster for a prompt's list, and a
 * select_and_reserve leaves well under half the heap garbage (sampling heap profiler under
 * `npm run bench:http`).
 */
export function hashListToBigInts(list: HashList): bigint[] {
  return toBigInts(list, false);
}

/**
 * The list as signed 64-bit BigInts (two's complement: values >= 2^63 come back negative), the
 * form the reference puts on HTTP: its `SelectResponse.sequence_hashes` is a `Vec<i64>` filled
 * with `hash as i64` (lib/kv-router/src/services/selection/types.rs, core/run.rs). Same cost as
 * hashListToBigInts: the swapped pairs are read through a BigInt64Array instead.
 */
export function hashListToSignedBigInts(list: HashList): bigint[] {
  return toBigInts(list, true);
}

function toBigInts(list: HashList, signed: boolean): bigint[] {
  const n = hashCount(list);
  const out = new Array<bigint>(n);
  if (!LITTLE_ENDIAN) {
    for (let i = 0; i < n; i++) {
      const v = pairToBigInt(list[2 * i] as number, list[2 * i + 1] as number);
      out[i] = signed ? u64ToI64(v) : v;
    }
    return out;
  }
  if (swapped.length < 2 * n) {
    swapped = new Uint32Array(Math.max(2 * n, 2 * swapped.length));
    swappedU64 = new BigUint64Array(swapped.buffer);
    swappedI64 = new BigInt64Array(swapped.buffer);
  }
  const s = swapped;
  for (let i = 0; i < 2 * n; i += 2) {
    s[i] = list[i + 1] as number;
    s[i + 1] = list[i] as number;
  }
  const u = signed ? swappedI64 : swappedU64;
  for (let i = 0; i < n; i++) out[i] = u[i] as bigint;
  return out;
}

export const pairToBigInt = (hi: number, lo: number): bigint => (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0);

export function bigIntHi(v: bigint): number {
  return Number(v >> 32n);
}
export function bigIntLo(v: bigint): number {
  return Number(v & MASK32);
}
