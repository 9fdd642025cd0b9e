/**
 * The prefix index as a peer hands it to a joining replica (issue 25, the warm join): per
 * partition and per rank, the rank's blocks (PrefixIndex.exportRankEntries: its tree nodes,
 * parents first, and its lookup entries) and its KV stream position at the same instant, in a
 * compact binary chunk.
 *
 * Each rank is exported synchronously with its position, so a rank's blocks are exactly the
 * effect of its engine's batches up to `position.seq`: the joiner applies what its own listener
 * received past that seq (the continuity rule: index-join-journal.ts, applied by
 * src/app/warm-join.ts). Ranks are taken in a stable order and a chunk ends past `maxBytes` (at
 * least one whole rank), so the exporter encodes one chunk per request and never the whole fleet
 * at once; indexChunkSteps yields after each rank, so a server can let its event loop run
 * between ranks.
 *
 * Chunk layout (little-endian), version 2:
 *   magic "KVIX" u32, version u8, ranks u32, then per rank:
 *     model_name (u16 len + utf8), routing_group (u16 len + utf8), block_size u32,
 *     worker_id u64, dp_rank u32,
 *     position flags u8 (1: seq present, 2: digest present), seq u64, digest u64,
 *     nodes u32, entries u32,
 *     node parents i32 x nodes (-1: the root; else an earlier node), node local hashes (hi, lo) u32 pairs,
 *     entry nodes i32 x entries (non-decreasing), entry sequence hashes (hi, lo) u32 pairs,
 *     entry tiers u8 x entries.
 * Version 1 (records of stored events) is refused: a joiner then tries another peer, or starts
 * with the engines' replays alone.
 *
 * Pure: no I/O. Decoding checks every length, every parent and node reference and every tier,
 * and throws a registry error (KVMESH_BAD_REQUEST naming the field) on anything malformed; what
 * it returns can go to PrefixIndex.importRankEntries as it is.
 */
import { badRequest } from "./errors.js";
import { STORAGE_TIERS, type RankEntries, type RankExportViews } from "./prefix-index.js";
import type { WorkerId } from "./types.js";

/** "KVIX" read as a little-endian u32. */
export const INDEX_CHUNK_MAGIC = 0x5849564b;
export const INDEX_CHUNK_VERSION = 2;
/**
 * Default chunk size, bytes (a named default, not a flag): 1 MiB holds about 10 ranks of 4,096
 * blocks at 25 bytes a block (12 a node, 13 an entry), so a 1,024 x 4,096 index travels in
 * ~100 requests (measure with `npm run bench:warm-join`).
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

export interface IndexRankSnapshot {
  readonly modelName: string;
  readonly routingGroup: string;
  readonly blockSize: number;
  readonly workerId: WorkerId;
  readonly dpRank: number;
  /** Null when the exporter's listener has applied nothing for the rank (or runs without KV events). */
  readonly position: KvStreamPosition | null;
  readonly entries: RankEntries;
}

/** What a peer exports from: the ranks in a stable order, and one rank's records (index-snapshot order). */
export interface IndexSnapshotSource {
  /**
   * Every indexed rank, sorted by `key`; a source may leave out those up to `after` (a request's
   * cursor): sorting only the rest halves a request's cost on average (~2.5 ms at 1,024 ranks).
   */
  rankKeys(after?: string | null): IndexRankKey[];
  /** The rank's blocks now (PrefixIndex.exportRankEntries), or null if it left since rankKeys(). */
  exportRank(key: IndexRankKey): Omit<IndexRankSnapshot, "position"> | null;
  /**
   * What exporting the rank reads now (PrefixIndex.exportViews: live, read-only, valid until the
   * index next changes) and its partition's key (ranks of one partition share its node arrays),
   * or null if it left since rankKeys(). For copyIndexChunk (index-export-copy.ts).
   */
  exportViews(key: IndexRankKey): RankViewsOf | null;
}

/** A rank's names and its export views (IndexSnapshotSource.exportViews). */
export interface RankViewsOf extends Omit<IndexRankSnapshot, "position" | "entries"> {
  readonly partition: string;
  readonly views: RankExportViews;
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

/** Bytes of a rank's header: names, block size, worker id, dp rank, position, counts. */
export const rankHeaderBytes = (r: { readonly modelName: string; readonly routingGroup: string }): number => 2 + Buffer.byteLength(r.modelName) + 2 + Buffer.byteLength(r.routingGroup) + 4 + 8 + 4 + 1 + 16 + 8;
/** Bytes per node (parent i32, local hash) and per entry (node i32, sequence hash, tier u8). */
export const NODE_BYTES = 12;
export const ENTRY_BYTES = 13;
export const CHUNK_HEADER_BYTES = 9;

/** Bytes one rank takes in a chunk. */
export function rankBytes(r: Omit<IndexRankSnapshot, "position">): number {
  return rankHeaderBytes(r) + NODE_BYTES * r.entries.nodeParent.length + ENTRY_BYTES * r.entries.entryNode.length;
}

export interface IndexChunk {
  /**
   * The chunk in pieces: its header, then each rank's bytes (a sender copies them once, into
   * its reply: one 1 MiB copy fewer per chunk on the peer's main thread). chunkBytes() joins them.
   */
  readonly parts: readonly Buffer[];
  /** The chunk's length, bytes. */
  readonly bytes: number;
  readonly ranks: number;
  readonly blocks: number;
  /** The cursor to ask for next, or null: this was the last chunk. */
  readonly next: string | null;
}

/** The synchronous steps of indexChunkSteps: listing the ranks, and exporting one rank. */
export type IndexChunkStep = "keys" | "rank";

/**
 * The next chunk after `after` (null: from the first rank): whole ranks, each with its position,
 * until the chunk would pass `maxBytes` (always at least one rank, so a rank larger than the
 * bound still travels). Yields *before* each synchronous step, naming it, so a caller may let
 * other work run between steps (each rank is consistent on its own; a caller may decide from the
 * step's kind); returns the chunk.
 *
 * A rank is not exported when the last one's size would carry the chunk past `maxBytes`: a
 * fleet's ranks are of similar size, and exporting the rank that does not fit only to drop it
 * was ~1 in 11 exports at 4,096 blocks a rank (one is still dropped when it is larger than
 * predicted).
 */
export function* indexChunkSteps(
  source: IndexSnapshotSource,
  after: string | null,
  maxBytes: number,
  positionOf: (workerId: WorkerId, dpRank: number) => KvStreamPosition | null,
): Generator<IndexChunkStep, IndexChunk, void> {
  yield "keys";
  const keys = source.rankKeys(after);
  let i = after === null ? 0 : upperBound(keys, after);
  const parts: Buffer[] = [];
  let bytes = CHUNK_HEADER_BYTES;
  let blocks = 0;
  let lastSize = 0;
  for (; i < keys.length; i++) {
    if (parts.length > 0 && bytes + lastSize > maxBytes) break;
    yield "rank";
    const k = keys[i] as IndexRankKey;
    const r = source.exportRank(k);
    if (r === null) continue;
    const size = rankBytes(r);
    lastSize = size;
    if (parts.length > 0 && bytes + size > maxBytes) break;
    // Taken in the same synchronous step as the blocks: they are the batches up to this seq.
    parts.push(encodeRank({ ...r, position: positionOf(k.workerId, k.dpRank) }));
    bytes += size;
    blocks += r.entries.entryNode.length;
  }
  const last = parts.length === 0 ? null : (keys[i - 1] as IndexRankKey).key;
  return { parts: [chunkHeader(parts.length), ...parts], bytes, ranks: parts.length, blocks, next: i < keys.length ? last : null };
}

/** The chunk as one buffer. */
export const chunkBytes = (c: IndexChunk): Buffer => Buffer.concat(c.parts, c.bytes);

/** indexChunkSteps run to the end in one synchronous step. */
export function nextIndexChunk(
  source: IndexSnapshotSource,
  after: string | null,
  maxBytes: number,
  positionOf: (workerId: WorkerId, dpRank: number) => KvStreamPosition | null,
): IndexChunk {
  const steps = indexChunkSteps(source, after, maxBytes, positionOf);
  for (;;) {
    const s = steps.next();
    if (s.done === true) return s.value;
  }
}

export function upperBound(keys: readonly IndexRankKey[], after: string): number {
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
  return chunkOf(ranks.map(encodeRank));
}

function chunkOf(parts: readonly Buffer[]): Buffer {
  return Buffer.concat([chunkHeader(parts.length), ...parts]);
}

export function chunkHeader(ranks: number): Buffer {
  const head = Buffer.allocUnsafe(CHUNK_HEADER_BYTES);
  head.writeUInt32LE(INDEX_CHUNK_MAGIC, 0);
  head.writeUInt8(INDEX_CHUNK_VERSION, 4);
  head.writeUInt32LE(ranks, 5);
  return head;
}

export function encodeRank(r: IndexRankSnapshot): Buffer {
  const buf = Buffer.allocUnsafe(rankBytes(r));
  let o = writeString(buf, 0, r.modelName);
  o = writeString(buf, o, r.routingGroup);
  o = buf.writeUInt32LE(r.blockSize, o);
  o = buf.writeBigUInt64LE(r.workerId & U64_MASK, o);
  o = buf.writeUInt32LE(r.dpRank, o);
  const p = r.position;
  o = buf.writeUInt8((p === null ? 0 : 1) | (p?.digest == null ? 0 : 2), o);
  o = buf.writeBigUInt64LE(p === null ? 0n : p.seq & U64_MASK, o);
  o = buf.writeBigUInt64LE(p?.digest == null ? 0n : p.digest & U64_MASK, o);
  const e = r.entries;
  o = buf.writeUInt32LE(e.nodeParent.length, o);
  o = buf.writeUInt32LE(e.entryNode.length, o);
  o = putWords(buf, o, e.nodeParent);
  o = putWords(buf, o, e.nodeKeys);
  o = putWords(buf, o, e.entryNode);
  o = putWords(buf, o, e.entryHashes);
  buf.set(e.entryTier, o);
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
    const nodes = r.u32(`${at}.nodes`);
    const entries = r.u32(`${at}.entries`);
    // Checked before allocating: counts past what is left are malformed, not an allocation.
    if (NODE_BYTES * nodes + ENTRY_BYTES * entries > r.left) throw badRequest(`index chunk: ${at} has ${nodes} nodes and ${entries} entries, overrunning the chunk`, `index_chunk.${at}.entries`);
    const nodeParent = new Int32Array(r.words(nodes, `${at}.node_parents`).buffer);
    const nodeKeys = r.words(2 * nodes, `${at}.node_keys`);
    const entryNode = new Int32Array(r.words(entries, `${at}.entry_nodes`).buffer);
    const entryHashes = r.words(2 * entries, `${at}.entry_hashes`);
    const entryTier = r.bytes(entries, `${at}.entry_tiers`);
    for (let j = 0; j < nodes; j++) {
      const p = nodeParent[j] as number;
      if (p < -1 || p >= j) throw badRequest(`index chunk: ${at}.node_parents[${j}] is ${p}: a parent must be an earlier node or -1 (the root)`, `index_chunk.${at}.node_parents`);
    }
    let prev = 0;
    for (let j = 0; j < entries; j++) {
      const nd = entryNode[j] as number;
      if (nd < prev || nd >= nodes) throw badRequest(`index chunk: ${at}.entry_nodes[${j}] is ${nd}: entries name nodes in [0, ${nodes}), in order`, `index_chunk.${at}.entry_nodes`);
      prev = nd;
      if ((entryTier[j] as number) >= STORAGE_TIERS.length) throw badRequest(`index chunk: ${at}.entry_tiers[${j}] ${entryTier[j]} is not a storage tier`, `index_chunk.${at}.entry_tiers`);
    }
    out.push({
      modelName,
      routingGroup,
      blockSize,
      workerId,
      dpRank,
      position: (flags & 1) === 0 ? null : { seq, digest: (flags & 2) === 0 ? null : digest },
      entries: { nodeParent, nodeKeys, entryTier, entryNode, entryHashes },
    });
  }
  if (r.left !== 0) throw badRequest(`index chunk: ${r.left} trailing bytes`, "index_chunk");
  return out;
}

/** Whether typed arrays are little-endian here (then words travel as one copy of their bytes). */
const LITTLE_ENDIAN = new Uint8Array(Uint32Array.of(1).buffer)[0] === 1;

function putWords(buf: Buffer, o: number, words: Uint32Array | Int32Array): number {
  if (LITTLE_ENDIAN) {
    buf.set(new Uint8Array(words.buffer, words.byteOffset, words.byteLength), o);
    return o + words.byteLength;
  }
  for (let i = 0; i < words.length; i++) o = buf.writeUInt32LE((words[i] as number) >>> 0, o);
  return o;
}

function writeString(buf: Buffer, o: number, s: string): number {
  const len = buf.write(s, o + 2, "utf8");
  buf.writeUInt16LE(len, o);
  return o + 2 + len;
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

  /** `n` u32 words, copied into an array of their own (transferable). */
  words(n: number, field: string): Uint32Array {
    this.#need(4 * n, field);
    const out = new Uint32Array(n);
    if (LITTLE_ENDIAN) new Uint8Array(out.buffer).set(this.#buf.subarray(this.#o, this.#o + 4 * n));
    else for (let i = 0; i < n; i++) out[i] = this.#buf.readUInt32LE(this.#o + 4 * i);
    this.#o += 4 * n;
    return out;
  }

  bytes(n: number, field: string): Uint8Array {
    this.#need(n, field);
    const out = new Uint8Array(n);
    out.set(this.#buf.subarray(this.#o, this.#o + n));
    this.#o += n;
    return out;
  }
}
