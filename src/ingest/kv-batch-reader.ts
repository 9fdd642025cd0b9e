/**
 * The ingest thread's fast path (issue 26): a vLLM KV-event batch read straight from its msgpack
 * bytes into the prepared form the main thread indexes (prepared-batch-codec.ts), with no object
 * per event, hash or token: engine hashes are read as u32 pairs (no BigInt), token_ids go from
 * the bytes into a reused Uint32Array and are hashed there (computeBlockHashes, XXH3 in WASM).
 *
 * Why: msgpackr materialising every map, array and BigInt, then converting hashes back to u32
 * pairs and encoding the batch, was ~60% of the ingest thread (a --cpu-prof of bench:ingest at
 * 0.8M block ops/s: unpack 20%, hashListFromBigInts 10%, token copy 4%, encode 2%;
 * docs/ingest-thread.md has the figures).
 *
 * It only takes the common shape: map or array form; BlockStored / BlockRemoved /
 * AllBlocksCleared with integer hashes, flat token_ids, a block size, no cache salt, extra_keys,
 * multimodal infos, group or cache-spec kind, no ext types; within every per-message cap. For
 * anything else it returns null and the caller runs the general decoder (kv-event-decoder.ts),
 * which validates, names the bad field, sheds at the caps and handles every variant. So the fast
 * path changes no outcome: a property test (test/unit/ingest/kv-batch-reader.test.ts) checks it
 * against decode + prepare + encode on the batches it accepts.
 */
import { computeBlockHashes } from "../core/index.js";

import { MAX_KV_EVENTS_PER_MESSAGE, MAX_KV_HASHES_PER_MESSAGE, MAX_KV_TOKENS_PER_MESSAGE, toTier } from "./kv-event-decoder.js";
import type { PreparedKvBatch } from "./prepared-batch-codec.js";
import { PREPARED_CLEARED, PREPARED_HAS_PARENT, PREPARED_NO_STRING, PREPARED_REMOVED, PREPARED_STORED, tierCode } from "./prepared-batch-codec.js";

/** Nesting skipped inside unknown fields before giving up (to the general decoder). */
const MAX_SKIP_DEPTH = 32;
/** Words of a stored event's header in the prepared form (kind .. engine count). */
const STORED_HEADER_WORDS = 9;

/**
 * Thrown inside the reader to mean "not the common shape": never escapes readPreparedKvBatch. One
 * instance, made once: a fallback costs no stack capture.
 */
class NotFastPath extends Error {}
const NOT_FAST = new NotFastPath("not the fast path's shape");

const ascii = new TextDecoder("latin1");

/** Growable scratch buffers, reused batch after batch (the thread is synchronous). */
let out = new Uint32Array(4096);
let hashes = new Uint32Array(1024);
let tokens = new Uint32Array(4096);

function ensureOut(words: number, at: number): void {
  if (at + words <= out.length) return;
  const next = new Uint32Array(Math.max(out.length * 2, at + words));
  next.set(out.subarray(0, at));
  out = next;
}

class Reader {
  p = 0;
  constructor(readonly b: Uint8Array, readonly dv: DataView) {}

  byte(): number {
    if (this.p >= this.b.length) throw NOT_FAST;
    return this.b[this.p++] as number;
  }

  /** A map header's entry count, or -1 when the next value is not a map. */
  mapLength(): number {
    const c = this.b[this.p];
    if (c === undefined) throw NOT_FAST;
    return this.#header(c, 0x80, 0xde);
  }

  /** An array header's element count, or -1 when the next value is not an array. */
  arrayLength(): number {
    const c = this.b[this.p];
    if (c === undefined) throw NOT_FAST;
    return this.#header(c, 0x90, 0xdc);
  }

  /** A map's or array's header (fix form from `fix`, 16/32-bit forms at `wide`, `wide` + 1), or -1. */
  #header(c: number, fix: number, wide: number): number {
    if (c >= fix && c <= fix + 0x0f) {
      this.p++;
      return c & 0x0f;
    }
    if (c === wide) {
      this.p++;
      return this.u16();
    }
    if (c === wide + 1) {
      this.p++;
      return this.u32();
    }
    return -1;
  }

  u16(): number {
    if (this.p + 2 > this.b.length) throw NOT_FAST;
    const v = this.dv.getUint16(this.p);
    this.p += 2;
    return v;
  }

  u32(): number {
    if (this.p + 4 > this.b.length) throw NOT_FAST;
    const v = this.dv.getUint32(this.p);
    this.p += 4;
    return v;
  }

  isNil(): boolean {
    if (this.b[this.p] !== 0xc0) return false;
    this.p++;
    return true;
  }

  /** A string's bytes as [start, end), or throws when the next value is not a string. */
  strRange(): number {
    const c = this.byte();
    let n: number;
    if (c >= 0xa0 && c <= 0xbf) n = c & 0x1f;
    else if (c === 0xd9) n = this.byte();
    else if (c === 0xda) n = this.u16();
    else if (c === 0xdb) n = this.u32();
    else throw NOT_FAST;
    const start = this.p;
    if (start + n > this.b.length) throw NOT_FAST;
    this.p += n;
    return start;
  }

  /** An ASCII string (anything else goes to the general decoder, whose UTF-8 handling is the rule). */
  asciiString(): string {
    const start = this.strRange();
    for (let i = start; i < this.p; i++) if ((this.b[i] as number) >= 0x80) throw NOT_FAST;
    return ascii.decode(this.b.subarray(start, this.p));
  }

  /** Whether the bytes [start, end) are the ASCII string `s`. */
  keyIs(start: number, end: number, s: string): boolean {
    if (end - start !== s.length) return false;
    for (let i = 0; i < s.length; i++) if (this.b[start + i] !== s.charCodeAt(i)) return false;
    return true;
  }

  /** A non-negative integer below 2^32 (any msgpack int width), else throws. */
  u32Value(): number {
    const c = this.byte();
    if (c <= 0x7f) return c;
    switch (c) {
      case 0xcc:
      case 0xd0: {
        const v = c === 0xcc ? this.byte() : (this.byte() << 24) >> 24;
        if (v < 0) throw NOT_FAST;
        return v;
      }
      case 0xcd:
        return this.u16();
      case 0xce:
        return this.u32();
      case 0xcf: {
        if (this.u32() !== 0) throw NOT_FAST;
        return this.u32();
      }
      case 0xd1:
      case 0xd2:
      case 0xd3: {
        const size = c === 0xd1 ? 2 : c === 0xd2 ? 4 : 8;
        if (this.p + size > this.b.length || ((this.b[this.p] as number) & 0x80) !== 0) throw NOT_FAST;
        if (size === 8 && this.dv.getUint32(this.p) !== 0) throw NOT_FAST;
        const v = size === 2 ? this.dv.getUint16(this.p) : this.dv.getUint32(this.p + size - 4);
        this.p += size;
        return v;
      }
      default:
        throw NOT_FAST;
    }
  }

  /** A non-negative integer hash below 2^64 into dst[at], dst[at + 1] as (hi, lo), else throws. */
  hash(dst: Uint32Array, at: number): void {
    const c = this.b[this.p];
    if (c === 0xcf || c === 0xd3) {
      this.p++;
      if (this.p + 8 > this.b.length || (c === 0xd3 && ((this.b[this.p] as number) & 0x80) !== 0)) throw NOT_FAST;
      dst[at] = this.dv.getUint32(this.p);
      dst[at + 1] = this.dv.getUint32(this.p + 4);
      this.p += 8;
      return;
    }
    dst[at] = 0;
    dst[at + 1] = this.u32Value();
  }

  /** A finite number (float or int), as the decoder's toTimestamp takes it. */
  number(): number {
    const c = this.b[this.p];
    if (c === 0xcb) {
      this.p++;
      if (this.p + 8 > this.b.length) throw NOT_FAST;
      const v = this.dv.getFloat64(this.p);
      this.p += 8;
      if (!Number.isFinite(v)) throw NOT_FAST;
      return v;
    }
    if (c === 0xca) {
      this.p++;
      if (this.p + 4 > this.b.length) throw NOT_FAST;
      const v = this.dv.getFloat32(this.p);
      this.p += 4;
      if (!Number.isFinite(v)) throw NOT_FAST;
      return v;
    }
    return this.u32Value();
  }

  /** Skips one value of any plain type (not ext: msgpackr may give those meaning). */
  skip(depth = 0): void {
    if (depth > MAX_SKIP_DEPTH) throw NOT_FAST;
    const c = this.byte();
    if (c <= 0x7f || c >= 0xe0 || c === 0xc0 || c === 0xc2 || c === 0xc3) return;
    if (c >= 0xa0 && c <= 0xbf) this.advance(c & 0x1f);
    else if (c >= 0x90 && c <= 0x9f) this.skipN(c & 0x0f, depth);
    else if (c >= 0x80 && c <= 0x8f) this.skipN(2 * (c & 0x0f), depth);
    else if (c === 0xcc || c === 0xd0) this.advance(1);
    else if (c === 0xcd || c === 0xd1) this.advance(2);
    else if (c === 0xce || c === 0xd2 || c === 0xca) this.advance(4);
    else if (c === 0xcf || c === 0xd3 || c === 0xcb) this.advance(8);
    else if (c === 0xc4 || c === 0xd9) this.advance(this.byte());
    else if (c === 0xc5 || c === 0xda) this.advance(this.u16());
    else if (c === 0xc6 || c === 0xdb) this.advance(this.u32());
    else if (c === 0xdc) this.skipN(this.u16(), depth);
    else if (c === 0xdd) this.skipN(this.u32(), depth);
    else if (c === 0xde) this.skipN(2 * this.u16(), depth);
    else if (c === 0xdf) this.skipN(2 * this.u32(), depth);
    else throw NOT_FAST;
  }

  advance(n: number): void {
    if (this.p + n > this.b.length) throw NOT_FAST;
    this.p += n;
  }

  skipN(n: number, depth: number): void {
    for (let i = 0; i < n; i++) this.skip(depth + 1);
  }
}

/** Per-batch totals, checked against the per-message caps (over one: the general decoder sheds). */
interface Totals {
  events: number;
  hashes: number;
  tokens: number;
}

/** block_hashes into the hashes scratch; returns the count. */
function readHashes(r: Reader, t: Totals): number {
  const n = r.arrayLength();
  if (n < 0) throw NOT_FAST;
  t.hashes += n;
  if (t.hashes > MAX_KV_HASHES_PER_MESSAGE) throw NOT_FAST;
  if (2 * n > hashes.length) hashes = new Uint32Array(Math.max(2 * n, 2 * hashes.length));
  for (let i = 0; i < n; i++) r.hash(hashes, 2 * i);
  return n;
}

/** Flat token_ids into the tokens scratch; returns the count (Eagle pairs go to the general decoder). */
function readTokens(r: Reader, t: Totals): number {
  const n = r.arrayLength();
  if (n < 0) throw NOT_FAST;
  t.tokens += n;
  if (t.tokens > MAX_KV_TOKENS_PER_MESSAGE) throw NOT_FAST;
  if (n > tokens.length) tokens = new Uint32Array(Math.max(n, 2 * tokens.length));
  const b = r.b;
  for (let i = 0; i < n; i++) {
    // Fixints first: at vocabularies of 150k most token ids are u32 (0xce) or u16 (0xcd).
    const c = b[r.p] as number;
    if (c === 0xce && r.p + 5 <= b.length) {
      tokens[i] = r.dv.getUint32(r.p + 1);
      r.p += 5;
    } else if (c === 0xcd && r.p + 3 <= b.length) {
      tokens[i] = ((b[r.p + 1] as number) << 8) | (b[r.p + 2] as number);
      r.p += 3;
    } else tokens[i] = r.u32Value();
  }
  return n;
}

function readTier(r: Reader): number {
  if (r.isNil()) return tierCode("device");
  return tierCode(toTier(r.asciiString(), 0, ""));
}

/** What one event's fields are, while its map or array is read. */
interface EventFields {
  kind: number;
  hashCount: number;
  hasHashes: boolean;
  parentHi: number;
  parentLo: number;
  hasParent: boolean;
  tokenCount: number;
  hasTokens: boolean;
  blockSize: number;
  hasBlockSize: boolean;
  tier: number;
  loraName: string | null;
}

const fields: EventFields = { kind: -1, hashCount: 0, hasHashes: false, parentHi: 0, parentLo: 0, hasParent: false, tokenCount: 0, hasTokens: false, blockSize: 0, hasBlockSize: false, tier: 0, loraName: null };
const parentPair = new Uint32Array(2);

function resetFields(): void {
  fields.kind = -1;
  fields.hashCount = 0;
  fields.hasHashes = false;
  fields.hasParent = false;
  fields.parentHi = 0;
  fields.parentLo = 0;
  fields.tokenCount = 0;
  fields.hasTokens = false;
  fields.blockSize = 0;
  fields.hasBlockSize = false;
  fields.tier = tierCode("device");
  fields.loraName = null;
}

function readTag(r: Reader): number {
  const start = r.strRange();
  if (r.keyIs(start, r.p, "BlockStored")) return PREPARED_STORED;
  if (r.keyIs(start, r.p, "BlockRemoved")) return PREPARED_REMOVED;
  if (r.keyIs(start, r.p, "AllBlocksCleared")) return PREPARED_CLEARED;
  throw NOT_FAST;
}

function readParent(r: Reader): void {
  if (r.isNil()) return;
  r.hash(parentPair, 0);
  fields.hasParent = true;
  fields.parentHi = parentPair[0] as number;
  fields.parentLo = parentPair[1] as number;
}

/** A field that must be absent or nil on the fast path (salts, multimodal, groups: the general decoder's). */
function requireNil(r: Reader): void {
  if (!r.isNil()) throw NOT_FAST;
}

function readMapEvent(r: Reader, entries: number, t: Totals, strings: string[]): number {
  resetFields();
  let seen = 0;
  for (let k = 0; k < entries; k++) {
    const start = r.strRange();
    const end = r.p;
    let bit: number;
    if (r.keyIs(start, end, "type")) {
      bit = 1;
      fields.kind = readTag(r);
    } else if (r.keyIs(start, end, "block_hashes")) {
      bit = 2;
      fields.hashCount = readHashes(r, t);
      fields.hasHashes = true;
    } else if (r.keyIs(start, end, "parent_block_hash")) {
      bit = 4;
      readParent(r);
    } else if (r.keyIs(start, end, "token_ids")) {
      bit = 8;
      fields.tokenCount = readTokens(r, t);
      fields.hasTokens = true;
    } else if (r.keyIs(start, end, "block_size")) {
      bit = 16;
      fields.hasBlockSize = true;
      if (!r.isNil()) fields.blockSize = r.u32Value();
    } else if (r.keyIs(start, end, "lora_id")) {
      bit = 32;
      if (!r.isNil()) r.u32Value();
    } else if (r.keyIs(start, end, "medium")) {
      bit = 64;
      fields.tier = readTier(r);
    } else if (r.keyIs(start, end, "lora_name")) {
      bit = 128;
      fields.loraName = r.isNil() ? null : r.asciiString();
    } else if (r.keyIs(start, end, "group_idx")) {
      bit = 256;
      if (!r.isNil() && r.u32Value() !== 0) throw NOT_FAST;
    } else if (r.keyIs(start, end, "extra_keys") || r.keyIs(start, end, "block_mm_infos") || r.keyIs(start, end, "cache_salt") || r.keyIs(start, end, "kv_cache_spec_kind")) {
      bit = 0;
      requireNil(r);
    } else if (r.keyIs(start, end, "__proto__")) {
      throw NOT_FAST;
    } else {
      bit = 0;
      r.skip();
    }
    // A repeated key: msgpackr keeps the last, the fast path leaves it to the general decoder.
    if ((seen & bit) !== 0) throw NOT_FAST;
    seen |= bit;
  }
  if (fields.kind === -1) throw NOT_FAST;
  if (fields.kind === PREPARED_STORED && (!fields.hasHashes || !fields.hasTokens || !fields.hasBlockSize)) throw NOT_FAST;
  if (fields.kind === PREPARED_REMOVED && !fields.hasHashes) throw NOT_FAST;
  return emitEvent(strings);
}

/**
 * Array form: BlockStored [tag, block_hashes, parent, token_ids, block_size, lora_id, medium,
 * lora_name, extra_keys, group_idx, kind, ...]; BlockRemoved [tag, block_hashes, medium,
 * group_idx, ...]; AllBlocksCleared [tag, ...].
 */
function readArrayEvent(r: Reader, items: number, t: Totals, strings: string[]): number {
  resetFields();
  if (items < 1) throw NOT_FAST;
  fields.kind = readTag(r);
  let i = 1;
  if (fields.kind === PREPARED_STORED) {
    if (items < 5) throw NOT_FAST;
    fields.hashCount = readHashes(r, t);
    readParent(r);
    fields.tokenCount = readTokens(r, t);
    if (!r.isNil()) fields.blockSize = r.u32Value();
    i = 5;
    if (i < items && !r.isNil()) r.u32Value();
    if (++i < items) fields.tier = readTier(r);
    if (++i < items) fields.loraName = r.isNil() ? null : r.asciiString();
    i = Math.min(items, i + 1);
    // extra_keys, group_idx, kind: nil only (their rules are the general decoder's).
    for (; i < items && i <= 10; i++) requireNil(r);
  } else if (fields.kind === PREPARED_REMOVED) {
    if (items < 2) throw NOT_FAST;
    fields.hashCount = readHashes(r, t);
    if (items > 2) fields.tier = readTier(r);
    if (items > 3) requireNil(r);
    i = Math.min(items, 4);
  }
  for (; i < items; i++) r.skip();
  return emitEvent(strings);
}

let at = 0;

/** Appends the event in fields to `out` (the prepared form's layout). */
function emitEvent(strings: string[]): number {
  if (fields.kind === PREPARED_CLEARED) {
    ensureOut(1, at);
    out[at++] = PREPARED_CLEARED;
    return 1;
  }
  const n = fields.hashCount;
  if (fields.kind === PREPARED_REMOVED) {
    ensureOut(3 + 2 * n, at);
    out[at++] = PREPARED_REMOVED;
    out[at++] = fields.tier;
    out[at++] = n;
    out.set(hashes.subarray(0, 2 * n), at);
    at += 2 * n;
    return 1;
  }
  // No block size (nil or 0): the prepared form cannot hold its tokens; the general path keeps them.
  if (fields.blockSize < 1) throw NOT_FAST;
  const local = computeBlockHashes(tokens.subarray(0, fields.tokenCount), fields.blockSize, { loraName: fields.loraName });
  ensureOut(STORED_HEADER_WORDS + 1 + 2 * n + local.length, at);
  out[at++] = PREPARED_STORED;
  out[at++] = fields.tier;
  out[at++] = fields.hasParent ? PREPARED_HAS_PARENT : 0;
  out[at++] = fields.parentHi;
  out[at++] = fields.parentLo;
  out[at++] = fields.blockSize;
  out[at++] = fields.loraName === null ? PREPARED_NO_STRING : strings.push(fields.loraName) - 1;
  out[at++] = PREPARED_NO_STRING;
  out[at++] = n;
  out.set(hashes.subarray(0, 2 * n), at);
  at += 2 * n;
  out[at++] = local.length >>> 1;
  out.set(local, at);
  at += local.length;
  return 1;
}

function readEvents(r: Reader, strings: string[]): number {
  const n = r.arrayLength();
  if (n < 0 || n > MAX_KV_EVENTS_PER_MESSAGE) throw NOT_FAST;
  const t: Totals = { events: n, hashes: 0, tokens: 0 };
  ensureOut(1, at);
  out[at++] = n;
  for (let i = 0; i < n; i++) {
    const m = r.mapLength();
    if (m >= 0) readMapEvent(r, m, t, strings);
    else {
      const a = r.arrayLength();
      if (a < 0) throw NOT_FAST;
      readArrayEvent(r, a, t, strings);
    }
  }
  return n;
}

/** The batch in the prepared form, or null when it is not the common shape (the general decoder takes it). */
export function readPreparedKvBatch(payload: Uint8Array): PreparedKvBatch | null {
  const r = new Reader(payload, new DataView(payload.buffer, payload.byteOffset, payload.byteLength));
  const strings: string[] = [];
  at = 0;
  try {
    let ts = 0;
    let dpRank: number | null = null;
    const m = r.mapLength();
    if (m >= 0) {
      let seen = 0;
      for (let k = 0; k < m; k++) {
        const start = r.strRange();
        const end = r.p;
        let bit = 0;
        if (r.keyIs(start, end, "ts")) {
          bit = 1;
          ts = r.number();
        } else if (r.keyIs(start, end, "events")) {
          bit = 2;
          readEvents(r, strings);
        } else if (r.keyIs(start, end, "data_parallel_rank")) {
          bit = 4;
          dpRank = r.isNil() ? null : r.u32Value();
        } else if (r.keyIs(start, end, "__proto__")) throw NOT_FAST;
        else r.skip();
        if ((seen & bit) !== 0) throw NOT_FAST;
        seen |= bit;
      }
      if ((seen & 3) !== 3) throw NOT_FAST;
    } else {
      const a = r.arrayLength();
      if (a < 2) throw NOT_FAST;
      ts = r.number();
      readEvents(r, strings);
      if (a >= 3) dpRank = r.isNil() ? null : r.u32Value();
      for (let i = 3; i < a; i++) r.skip();
    }
    // Trailing bytes after the batch: the general decoder's call.
    if (r.p !== payload.length) return null;
    return { ts, dpRank, words: out.slice(0, at), strings };
  } catch (err) {
    if (err === NOT_FAST) return null;
    throw err;
  }
}
