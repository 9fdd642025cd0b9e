/**
 * The prefix index as a peer hands it to a joining replica (issue 25, the warm join): per
 * partition and per rank, the rank's blocks (as the stored events that rebuild them, dumpRank)
 * and its KV stream position at the same instant, in a compact binary chunk.
 *
 * Each rank is exported synchronously with its position, so a rank's blocks are exactly the
 * effect of its engine's batches up to `position.seq`: the joiner applies what its own listener
 * received past that seq (the continuity rule: index-join-journal.ts, applied by src/app/warm-join.ts). Ranks are taken
 * in a stable order and a chunk ends past `maxBytes` (at least one whole rank), so the exporter
 * encodes one chunk per request and never the whole fleet at once.
 *
 * Chunk layout (little-endian):
 *   magic "KVIX" u32, version u8, ranks u32, then per rank:
 *     model_name (u16 len + utf8), routing_group (u16 len + utf8), block_size u32,
 *     worker_id u64, dp_rank u32,
 *     position flags u8 (1: seq present, 2: digest present), seq u64, digest u64,
 *     records u32, per record: tier u8, has_parent u8, parent (hi u32, lo u32),
 *       blocks u32, block hashes (hi, lo) u32 pairs, local hashes (hi, lo) u32 pairs.
 *
 * Pure: no I/O. Decoding checks every length against the buffer and throws a registry error
 * (KVMESH_BAD_REQUEST naming the field) on anything malformed.
 */
import { badRequest } from "./errors.js";
import { hashCount, type HashList } from "./hash64.js";
import { STORAGE_TIERS, type StorageTier } from "./prefix-index.js";
import type { WorkerId } from "./types.js";

/** "KVIX" read as a little-endian u32. */
export const INDEX_CHUNK_MAGIC = 0x5849564b;
export const INDEX_CHUNK_VERSION = 1;
/**
 * Default chunk size, bytes (a named default, not a flag): 1 MiB holds about 8 ranks of 4,096
 * blocks at 32 bytes a block, so a peer encodes only a few ranks per request and a 1,024 x 4,096
 * index travels in ~128 requests (measure with `npm run bench:warm-join`).
 */
export const DEFAULT_INDEX_CHUNK_BYTES = 1024 * 1024;
/** Decoding refuses strings longer than this (model names and routing groups), bytes. */
const MAX_NAME_BYTES = 1024;
const U64_MASK = 0xffff_ffff_ffff_ffffn;

/** A rank's place in its engine's KV stream: the last batch applied, and that batch's payload digest. */
export interface KvStreamPosition {
  readonly seq: bigint;
  /** xxh64 of the batch's payload: names the publisher's incarnation (a restarted engine numbers from 0 again). */
  readonly digest: bigint | null;
}

/** One stored event of a snapshot, hashes as HashLists ([hi, lo] u32 pairs). */
export interface IndexRecord {
  readonly tier: StorageTier;
  /** The parent's sequence hash as one [hi, lo] pair, or null (from the root). */
  readonly parent: HashList | null;
  readonly blockHashes: HashList;
  readonly localHashes: HashList;
}

export interface IndexRankSnapshot {
  readonly modelName: string;
  readonly routingGroup: string;
  readonly blockSize: number;
  readonly workerId: WorkerId;
  readonly dpRank: number;
  /** Null when the exporter's listener has applied nothing for the rank (or runs without KV events). */
  readonly position: KvStreamPosition | null;
  readonly records: readonly IndexRecord[];
}

/** What a peer exports from: the ranks in a stable order, and one rank's records (index-snapshot order). */
export interface IndexSnapshotSource {
  /** Every indexed rank, sorted by `key`. */
  rankKeys(): IndexRankKey[];
  /** The rank's blocks now, or null if it left since rankKeys(). */
  exportRank(key: IndexRankKey): Omit<IndexRankSnapshot, "position"> | null;
}

export interface IndexRankKey {
  /** Sort and cursor key: partition, worker id, dp rank. */
  readonly key: string;
  readonly workerId: WorkerId;
  readonly dpRank: number;
}

export function rankCursorKey(partitionKey: string, workerId: WorkerId, dpRank: number): string {
  // Fixed-width numbers so that string order is numeric order within a partition.
  return `${partitionKey}\u0000${workerId.toString().padStart(20, "0")}\u0000${dpRank.toString().padStart(10, "0")}`;
}

/** Bytes one rank takes in a chunk. */
export function rankBytes(r: Omit<IndexRankSnapshot, "position">): number {
  let n = 2 + Buffer.byteLength(r.modelName) + 2 + Buffer.byteLength(r.routingGroup) + 4 + 8 + 4 + 1 + 16 + 4;
  for (const rec of r.records) n += 1 + 1 + 8 + 4 + 4 * (rec.blockHashes.length + rec.localHashes.length);
  return n;
}

export interface IndexChunk {
  readonly chunk: Buffer;
  readonly ranks: number;
  readonly blocks: number;
  /** The cursor to ask for next, or null: this was the last chunk. */
  readonly next: string | null;
}

/**
 * The next chunk after `after` (null: from the first rank): whole ranks, each with its position,
 * until the chunk passes `maxBytes` (always at least one rank, so a rank larger than the bound
 * still travels).
 */
export function nextIndexChunk(
  source: IndexSnapshotSource,
  after: string | null,
  maxBytes: number,
  positionOf: (workerId: WorkerId, dpRank: number) => KvStreamPosition | null,
): IndexChunk {
  const keys = source.rankKeys();
  let i = after === null ? 0 : upperBound(keys, after);
  const ranks: IndexRankSnapshot[] = [];
  let bytes = 9;
  let blocks = 0;
  for (; i < keys.length; i++) {
    const k = keys[i] as IndexRankKey;
    const r = source.exportRank(k);
    if (r === null) continue;
    const size = rankBytes(r);
    if (ranks.length > 0 && bytes + size > maxBytes) break;
    // Taken in the same synchronous step as the blocks: they are the batches up to this seq.
    ranks.push({ ...r, position: positionOf(k.workerId, k.dpRank) });
    bytes += size;
    for (const rec of r.records) blocks += hashCount(rec.blockHashes);
  }
  const last = ranks.length === 0 ? null : (keys[i - 1] as IndexRankKey).key;
  return { chunk: encodeIndexChunk(ranks), ranks: ranks.length, blocks, next: i < keys.length ? last : null };
}

function upperBound(keys: readonly IndexRankKey[], after: string): number {
  let lo = 0;
  let hi = keys.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if ((keys[mid] as IndexRankKey).key <= after) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

export function encodeIndexChunk(ranks: readonly IndexRankSnapshot[]): Buffer {
  let size = 9;
  for (const r of ranks) size += rankBytes(r);
  const buf = Buffer.allocUnsafe(size);
  let o = buf.writeUInt32LE(INDEX_CHUNK_MAGIC, 0);
  o = buf.writeUInt8(INDEX_CHUNK_VERSION, o);
  o = buf.writeUInt32LE(ranks.length, o);
  for (const r of ranks) {
    o = writeString(buf, o, r.modelName);
    o = writeString(buf, o, r.routingGroup);
    o = buf.writeUInt32LE(r.blockSize, o);
    o = buf.writeBigUInt64LE(r.workerId & U64_MASK, o);
    o = buf.writeUInt32LE(r.dpRank, o);
    const p = r.position;
    o = buf.writeUInt8((p === null ? 0 : 1) | (p?.digest == null ? 0 : 2), o);
    o = buf.writeBigUInt64LE(p === null ? 0n : p.seq & U64_MASK, o);
    o = buf.writeBigUInt64LE(p?.digest == null ? 0n : p.digest & U64_MASK, o);
    o = buf.writeUInt32LE(r.records.length, o);
    for (const rec of r.records) {
      o = buf.writeUInt8(STORAGE_TIERS.indexOf(rec.tier), o);
      o = buf.writeUInt8(rec.parent === null ? 0 : 1, o);
      o = buf.writeUInt32LE(rec.parent === null ? 0 : (rec.parent[0] as number), o);
      o = buf.writeUInt32LE(rec.parent === null ? 0 : (rec.parent[1] as number), o);
      const n = hashCount(rec.blockHashes);
      o = buf.writeUInt32LE(n, o);
      o = writeWords(buf, o, rec.blockHashes);
      o = writeWords(buf, o, rec.localHashes);
    }
  }
  return buf;
}

/** Throws KVMESH_BAD_REQUEST naming the field on a malformed chunk. */
export function decodeIndexChunk(buf: Uint8Array): IndexRankSnapshot[] {
  const r = new Reader(buf);
  if (r.u32("magic") !== INDEX_CHUNK_MAGIC) throw badRequest("index chunk: bad magic (not an index snapshot chunk)", "index_chunk.magic");
  const v = r.u8("version");
  if (v !== INDEX_CHUNK_VERSION) throw badRequest(`index chunk: version ${v}, expected ${INDEX_CHUNK_VERSION}`, "index_chunk.version");
  const count = r.u32("ranks");
  const out: IndexRankSnapshot[] = [];
  for (let i = 0; i < count; i++) {
    const at = `ranks[${i}]`;
    const modelName = r.str(`${at}.model_name`);
    const routingGroup = r.str(`${at}.routing_group`);
    const blockSize = r.u32(`${at}.block_size`);
    const workerId = r.u64(`${at}.worker_id`);
    const dpRank = r.u32(`${at}.dp_rank`);
    const flags = r.u8(`${at}.position`);
    const seq = r.u64(`${at}.position.seq`);
    const digest = r.u64(`${at}.position.digest`);
    const nrec = r.u32(`${at}.records`);
    // Each record takes at least 18 bytes: a count past what is left is malformed, not an allocation.
    if (nrec * 18 > r.left) throw badRequest(`index chunk: ${at}.records ${nrec} overruns the chunk`, `index_chunk.${at}.records`);
    const records: IndexRecord[] = [];
    for (let j = 0; j < nrec; j++) {
      const rat = `${at}.records[${j}]`;
      const tierIdx = r.u8(`${rat}.tier`);
      const tier = STORAGE_TIERS[tierIdx];
      if (tier === undefined) throw badRequest(`index chunk: ${rat}.tier ${tierIdx} is not a storage tier`, `index_chunk.${rat}.tier`);
      const hasParent = r.u8(`${rat}.has_parent`);
      const phi = r.u32(`${rat}.parent`);
      const plo = r.u32(`${rat}.parent`);
      const n = r.u32(`${rat}.blocks`);
      const blockHashes = r.words(2 * n, `${rat}.block_hashes`);
      const localHashes = r.words(2 * n, `${rat}.local_hashes`);
      records.push({ tier, parent: hasParent === 0 ? null : Uint32Array.of(phi, plo), blockHashes, localHashes });
    }
    out.push({ modelName, routingGroup, blockSize, workerId, dpRank, position: (flags & 1) === 0 ? null : { seq, digest: (flags & 2) === 0 ? null : digest }, records });
  }
  if (r.left !== 0) throw badRequest(`index chunk: ${r.left} trailing bytes`, "index_chunk");
  return out;
}

function writeString(buf: Buffer, o: number, s: string): number {
  const len = buf.write(s, o + 2, "utf8");
  buf.writeUInt16LE(len, o);
  return o + 2 + len;
}

function writeWords(buf: Buffer, o: number, words: HashList): number {
  for (let i = 0; i < words.length; i++) o = buf.writeUInt32LE(words[i] as number, o);
  return o;
}

class Reader {
  readonly #buf: Buffer;
  #o = 0;

  constructor(b: Uint8Array) {
    this.#buf = Buffer.from(b.buffer, b.byteOffset, b.byteLength);
  }

  get left(): number {
    return this.#buf.length - this.#o;
  }

  #need(n: number, field: string): void {
    if (n > this.left) throw badRequest(`index chunk: ${field} overruns the chunk (${n} bytes wanted, ${this.left} left)`, `index_chunk.${field}`);
  }

  u8(field: string): number {
    this.#need(1, field);
    return this.#buf.readUInt8(this.#o++);
  }

  u32(field: string): number {
    this.#need(4, field);
    const v = this.#buf.readUInt32LE(this.#o);
    this.#o += 4;
    return v;
  }

  u64(field: string): bigint {
    this.#need(8, field);
    const v = this.#buf.readBigUInt64LE(this.#o);
    this.#o += 8;
    return v;
  }

  str(field: string): string {
    const len = this.u32Short(field);
    if (len > MAX_NAME_BYTES) throw badRequest(`index chunk: ${field} is ${len} bytes, over ${MAX_NAME_BYTES}`, `index_chunk.${field}`);
    this.#need(len, field);
    const s = this.#buf.toString("utf8", this.#o, this.#o + len);
    this.#o += len;
    return s;
  }

  u32Short(field: string): number {
    this.#need(2, field);
    const v = this.#buf.readUInt16LE(this.#o);
    this.#o += 2;
    return v;
  }

  words(n: number, field: string): Uint32Array {
    this.#need(4 * n, field);
    const out = new Uint32Array(n);
    for (let i = 0; i < n; i++) out[i] = this.#buf.readUInt32LE(this.#o + 4 * i);
    this.#o += 4 * n;
    return out;
  }
}
