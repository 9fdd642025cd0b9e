/**
 * The warm join's export, in two halves (issue 25): what a peer's main thread does for a chunk is
 * only a copy, and the walk and the encode run on a thread (mesh/index-export-thread.ts).
 *
 *  - copyIndexChunk, on the main thread, in ONE synchronous step: picks the chunk's ranks after
 *    the cursor, and copies what their export reads (PrefixIndex.exportViews): each rank's lookup
 *    slots (~128 KB for 4,096 blocks) and, once per partition in the chunk, the node arrays'
 *    parent and key words up to the highest node id (12 bytes a node, ~3 MB at 1,024 x 4,096
 *    with shared prefixes): memcpy, no walk. Each rank's KV stream position is taken in the same
 *    step.
 *  - encodeIndexChunkCopy, anywhere (a thread): walks each rank's copy (rankEntriesFromViews,
 *    the walk exportRankEntries runs, so the bytes are those the main thread would have sent) and
 *    encodes the chunk (index-snapshot.ts's layout).
 *
 * Consistency: every rank of a chunk is exported as of the copy's instant, with the position
 * taken then, so a rank's entries are exactly the effect of its batches up to that position, as
 * when the main thread exported it in one step. What changes after the copy (a rank's new events,
 * a node pruned and reused) is not in the chunk and cannot corrupt it: the walk reads the copy.
 *
 * Sizing: a chunk takes ranks while their bound (header + 25 bytes per lookup entry: a rank
 * exports at most as many nodes as entries) fits `maxBytes`, at least one; the walk can only
 * come out smaller (blocks cut off from the root are left out), so no exported rank is dropped.
 */
import { CHUNK_HEADER_BYTES, chunkHeader, encodeRank, ENTRY_BYTES, NODE_BYTES, rankHeaderBytes, upperBound, type IndexChunk, type IndexRankKey, type IndexRankSnapshot, type IndexSnapshotSource, type KvStreamPosition } from "./index-snapshot.js";
import { rankEntriesFromViews } from "./prefix-index.js";
import type { WorkerId } from "./types.js";

/** A partition's node arrays as copied for one chunk (PrefixIndex.exportViews). */
export interface NodeArraysCopy {
  readonly parent: Int32Array;
  readonly keyHi: Uint32Array;
  readonly keyLo: Uint32Array;
}

/** One rank of a chunk copy: its names and position (as IndexRankSnapshot's), lookup slots, and which node arrays it reads. */
export interface RankCopy extends Omit<IndexRankSnapshot, "entries"> {
  /** Index into IndexChunkCopy.nodes. */
  readonly nodes: number;
  /** The rank's lookup slots (U64Table layout), null: it holds nothing. */
  readonly slots: Int32Array | null;
  readonly size: number;
}

export interface IndexChunkCopy {
  readonly nodes: readonly NodeArraysCopy[];
  readonly ranks: readonly RankCopy[];
  /** The cursor to ask for next, or null: this is the last chunk. */
  readonly next: string | null;
}

/**
 * The chunk after `after` as copies, in one synchronous step (see the file's comment). `keys` is
 * the source's rankKeys(after), listed before (possibly in an earlier turn of the event loop): a
 * rank that left since is skipped, one emptied since travels empty, as exportRank does.
 */
export function copyIndexChunk(
  source: IndexSnapshotSource,
  keys: readonly IndexRankKey[],
  after: string | null,
  maxBytes: number,
  positionOf: (workerId: WorkerId, dpRank: number) => KvStreamPosition | null,
  alloc: BufferAlloc = freshBuffer,
): IndexChunkCopy {
  const copy = <T extends Int32Array | Uint32Array>(v: T, make: (b: ArrayBuffer, n: number) => T): T => {
    const out = make(alloc(v.byteLength), v.length);
    out.set(v);
    return out;
  };
  const i32 = (b: ArrayBuffer, n: number): Int32Array => new Int32Array(b, 0, n);
  const u32 = (b: ArrayBuffer, n: number): Uint32Array => new Uint32Array(b, 0, n);
  const nodes: NodeArraysCopy[] = [];
  const nodesOf = new Map<string, number>();
  const ranks: RankCopy[] = [];
  let bytes = CHUNK_HEADER_BYTES;
  let i = after === null ? 0 : upperBound(keys, after);
  for (; i < keys.length; i++) {
    const k = keys[i] as IndexRankKey;
    const r = source.exportViews(k);
    if (r === null) continue;
    const v = r.views;
    const bound = rankHeaderBytes(r) + (NODE_BYTES + ENTRY_BYTES) * v.size;
    if (ranks.length > 0 && bytes + bound > maxBytes) break;
    bytes += bound;
    let at = nodesOf.get(r.partition);
    if (at === undefined) {
      at = nodes.length;
      nodesOf.set(r.partition, at);
      nodes.push({ parent: copy(v.parent, i32), keyHi: copy(v.keyHi, u32), keyLo: copy(v.keyLo, u32) });
    }
    ranks.push({
      modelName: r.modelName,
      routingGroup: r.routingGroup,
      blockSize: r.blockSize,
      workerId: r.workerId,
      dpRank: r.dpRank,
      // Taken in the same synchronous step as the copies: the entries are the batches up to it.
      position: positionOf(k.workerId, k.dpRank),
      nodes: at,
      slots: v.slots === null ? null : copy(v.slots, i32),
      size: v.size,
    });
  }
  const last = ranks.length === 0 ? null : (keys[i - 1] as IndexRankKey).key;
  return { nodes, ranks, next: i < keys.length ? last : null };
}

/**
 * Where a copy's arrays get their buffers (at least `bytes` long; a longer one is used from its
 * start): a fresh one each, or one recycled from an earlier chunk (index-export-worker.ts: 1,024
 * x 4,096 copies ~380 MB per join, which fresh buffers zero and the collector tracks).
 */
export type BufferAlloc = (bytes: number) => ArrayBuffer;

const freshBuffer: BufferAlloc = (bytes) => new ArrayBuffer(bytes);

/** The copy's buffers, each its own (BufferAlloc's): for a transfer to the thread that encodes it. */
export function indexChunkCopyBuffers(c: IndexChunkCopy): ArrayBuffer[] {
  const out: ArrayBuffer[] = [];
  for (const n of c.nodes) out.push(n.parent.buffer as ArrayBuffer, n.keyHi.buffer as ArrayBuffer, n.keyLo.buffer as ArrayBuffer);
  for (const r of c.ranks) if (r.slots !== null) out.push(r.slots.buffer as ArrayBuffer);
  return out.filter((b) => b.byteLength > 0);
}

/** Walks and encodes a chunk copy: the chunk exportRankEntries and indexChunkSteps would give at the copy's instant. */
export function encodeIndexChunkCopy(c: IndexChunkCopy): IndexChunk {
  let longest = 0;
  for (const n of c.nodes) longest = Math.max(longest, n.parent.length);
  const mark = new Int32Array(longest);
  const parts: Buffer[] = [chunkHeader(c.ranks.length)];
  let bytes = CHUNK_HEADER_BYTES;
  let blocks = 0;
  for (const r of c.ranks) {
    const n = c.nodes[r.nodes];
    // Assertion (a programming error, never input): copyIndexChunk names a partition it copied.
    if (n === undefined) throw new RangeError(`encodeIndexChunkCopy: rank names node arrays ${r.nodes} of ${c.nodes.length}`);
    const entries = rankEntriesFromViews({ parent: n.parent, keyHi: n.keyHi, keyLo: n.keyLo, slots: r.slots, size: r.size }, mark);
    const buf = encodeRank({ modelName: r.modelName, routingGroup: r.routingGroup, blockSize: r.blockSize, workerId: r.workerId, dpRank: r.dpRank, position: r.position, entries });
    parts.push(buf);
    bytes += buf.length;
    blocks += entries.entryNode.length;
  }
  return { parts, bytes, ranks: c.ranks.length, blocks, next: c.next };
}
