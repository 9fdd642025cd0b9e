/**
 * The warm join over the mesh's control channel (issue 25): a starting replica pulls a peer's
 * prefix index, chunk by chunk, and hands each chunk to its installer. This is the Clone
 * pattern the mesh already uses for bookings and bindings (control.ts snapshots), applied to
 * the index, with two differences:
 *
 *  - chunked: a request names a cursor (the last rank received) and the peer encodes the ranks
 *    after it up to DEFAULT_INDEX_CHUNK_BYTES (src/core/index-snapshot.ts). The peer keeps no
 *    state between requests and never encodes its whole index at once; each rank travels whole,
 *    with its KV stream position taken in the same synchronous step, as flat typed arrays
 *    (PrefixIndex.exportRankEntries). The walk and the encode run on the peer's export thread
 *    (index-export-worker.ts: this thread only copies what they read, src/core/index-export-copy.ts),
 *    or, while that thread loads or after it failed, here in slices of its event loop of
 *    EXPORT_SLICE_MS, so its /select keeps its latency while a joiner pulls;
 *  - decoded off the main thread: each chunk goes to a worker thread (index-sync-thread.ts).
 *    Given this replica's ranks (IndexTreeSink.targets), the thread merges them into whole
 *    partition trees, handed over at the end for the main thread to adopt in one step per
 *    partition; other ranks come back at once as typed arrays (transferred, not copied) and
 *    are installed rank by rank on the main thread, one chunk per turn of the event loop.
 *
 * Wire (raw, beside the control channel's msgpack: a msgpack map never starts with "K"):
 *   request: "KVIQ" u32 LE, version u8, from u64 LE, publish endpoint (u16 + utf8),
 *            cursor flag u8, cursor (u16 + utf8)
 *   reply:   status u8 (0 ok, 1 error); ok: next-cursor flag u8, next cursor (u16 + utf8), chunk;
 *            error: utf8 message.
 * A request is authorized as a snapshot request is (membership's checkSnapshot).
 */
import type { Worker } from "node:worker_threads";

import type { Logger } from "pino";
import type { Registry } from "prom-client";

import { copyIndexChunk, DEFAULT_INDEX_CHUNK_BYTES, indexChunkSteps, systemClock, systemTimers, type IndexPartitionTree, type IndexRankSnapshot, type IndexRankTarget, type IndexChunk, type IndexSnapshotSource, type KvStreamPosition, type MergedRank } from "../src/core/index.js";
import type { Clock, Timers, WorkerId } from "../src/core/index.js";
import type { ControlLink } from "./control.js";
import { collectedCounter, collectedLabelledCounter } from "../src/metrics/collected.js";
import { ExportSlicer } from "./export-slicer.js";
import { IndexExportWorker, type ExportThreadState } from "./index-export-worker.js";
import { MeshOptionError, MeshRemoteError, MeshWireError } from "./errors.js";
import { siblingFile, startWorkerThread } from "../src/util/worker-thread.js";

/** "KVIQ" read as a little-endian u32. */
export const INDEX_SYNC_REQUEST_MAGIC = 0x5149564b;
const INDEX_SYNC_VERSION = 1;
const OK = 0;
const ERR = 1;
/**
 * The export lets its event loop run before a step would carry a slice past this, ms
 * (export-slicer.ts; one 4,096-block rank is ~1-1.6 ms of it here). Between two slices a peer
 * serves its waiting requests, so the slice sets the pull's pace against the /select wait.
 * bench:warm-join, 3 runs each, load 2.5-4.5: 4 ms -> /ready in 4.20-4.75 s (unpinned), and
 * with the peer on a core of its own its event-loop delay p99 while a joiner syncs is 7.9-8.9 ms
 * (2-5 ms without a joiner; 9.6-11.6 ms when a slice ended only once past 4 ms, overrunning by
 * up to a rank); 2 ms -> 4.9-6.6 ms, but /ready in 4.54-5.34 s, past the 5 s target in 2 of 3
 * runs. The tail (p999, max) is set by longer stalls outside the export (docs/warm-join.md).
 */
const EXPORT_SLICE_MS = 4;
/** Bound on a cursor or endpoint in a request, bytes. */
const MAX_REQUEST_STRING_BYTES = 4096;

export interface IndexSyncRequest {
  readonly from: bigint;
  readonly publishEndpoint: string | undefined;
  readonly cursor: string | null;
}

export function isIndexSyncRequest(raw: Buffer): boolean {
  return raw.length >= 4 && raw.readUInt32LE(0) === INDEX_SYNC_REQUEST_MAGIC;
}

export function encodeIndexSyncRequest(r: IndexSyncRequest): Buffer {
  const pe = Buffer.from(r.publishEndpoint ?? "", "utf8");
  const cur = Buffer.from(r.cursor ?? "", "utf8");
  const buf = Buffer.alloc(4 + 1 + 8 + 2 + pe.length + 1 + 2 + cur.length);
  let o = buf.writeUInt32LE(INDEX_SYNC_REQUEST_MAGIC, 0);
  o = buf.writeUInt8(INDEX_SYNC_VERSION, o);
  o = buf.writeBigUInt64LE(r.from, o);
  o = buf.writeUInt16LE(pe.length, o);
  o += pe.copy(buf, o);
  o = buf.writeUInt8(r.cursor === null ? 0 : 1, o);
  o = buf.writeUInt16LE(cur.length, o);
  cur.copy(buf, o);
  return buf;
}

export function decodeIndexSyncRequest(raw: Buffer): IndexSyncRequest {
  const need = (o: number, n: number, field: string): void => {
    if (o + n > raw.length) throw new MeshWireError(`index_sync.${field}`, `overruns the request (${raw.length} bytes)`);
  };
  need(0, 13, "header");
  if (raw.readUInt32LE(0) !== INDEX_SYNC_REQUEST_MAGIC) throw new MeshWireError("index_sync.magic", "not an index sync request");
  const v = raw.readUInt8(4);
  if (v !== INDEX_SYNC_VERSION) throw new MeshWireError("index_sync.version", `version ${v}, expected ${INDEX_SYNC_VERSION}`);
  const from = raw.readBigUInt64LE(5);
  let o = 13;
  const str = (field: string): string => {
    need(o, 2, field);
    const len = raw.readUInt16LE(o);
    o += 2;
    if (len > MAX_REQUEST_STRING_BYTES) throw new MeshWireError(`index_sync.${field}`, `${len} bytes, over ${MAX_REQUEST_STRING_BYTES}`);
    need(o, len, field);
    const s = raw.toString("utf8", o, o + len);
    o += len;
    return s;
  };
  const pe = str("publish_endpoint");
  need(o, 1, "cursor");
  const hasCursor = raw.readUInt8(o++) === 1;
  const cursor = str("cursor");
  if (o !== raw.length) throw new MeshWireError("index_sync", `${raw.length - o} trailing bytes`);
  return { from, publishEndpoint: pe === "" ? undefined : pe, cursor: hasCursor ? cursor : null };
}

/** An ok reply's head: status and the next cursor. */
function okHead(next: string | null): Buffer {
  const cur = Buffer.from(next ?? "", "utf8");
  const head = Buffer.alloc(1 + 1 + 2 + cur.length);
  head.writeUInt8(OK, 0);
  head.writeUInt8(next === null ? 0 : 1, 1);
  head.writeUInt16LE(cur.length, 2);
  cur.copy(head, 4);
  return head;
}

/** The reply: its head, then the chunk's parts, copied once. */
function encodeOk(next: string | null, chunk: IndexChunk): Buffer {
  const head = okHead(next);
  return Buffer.concat([head, ...chunk.parts], head.length + chunk.bytes);
}

function encodeError(message: string): Buffer {
  return Buffer.concat([Buffer.of(ERR), Buffer.from(message, "utf8")]);
}

/** A reply: the next cursor and the chunk (a view into `raw`), or throws MeshRemoteError on an error reply. */
export function decodeIndexSyncReply(endpoint: string, raw: Buffer): { next: string | null; chunk: Buffer } {
  if (raw.length < 1) throw new MeshWireError("index_sync_reply", "empty reply");
  if (raw.readUInt8(0) === ERR) throw new MeshRemoteError(endpoint, raw.toString("utf8", 1));
  if (raw.length < 4) throw new MeshWireError("index_sync_reply", "truncated header");
  const hasNext = raw.readUInt8(1) === 1;
  const len = raw.readUInt16LE(2);
  if (4 + len > raw.length) throw new MeshWireError("index_sync_reply.next", "overruns the reply");
  return { next: hasNext ? raw.toString("utf8", 4, 4 + len) : null, chunk: raw.subarray(4 + len) };
}

// ------------------------------------------------------------------ server

export interface IndexSyncServerOptions {
  readonly source: IndexSnapshotSource;
  /** The rank's KV stream position now (the ingest's listener), null without one. */
  readonly positionOf: (workerId: WorkerId, dpRank: number) => KvStreamPosition | null;
  /** Chunk size, bytes (DEFAULT_INDEX_CHUNK_BYTES). */
  readonly chunkBytes?: number;
  /** For the turns of the event loop between the slices of a chunk (systemTimers, systemClock). */
  readonly timers?: Timers;
  readonly clock?: Clock;
  /**
   * Walk and encode the chunks on a thread of their own (index-export-worker.ts; default true):
   * this thread then only copies what they read. False: in slices of this thread, always.
   */
  readonly exportThread?: boolean;
  /** Starts the export thread (tests inject one that fails). */
  readonly spawnExportThread?: () => Worker;
  /** Where a failure of the export thread is reported (once). */
  readonly logger?: Logger;
}

export interface IndexSyncServerStats {
  chunksServed: number;
  ranksServed: number;
  blocksServed: number;
  bytesServed: number;
  refused: number;
  malformed: number;
  /** Chunks walked and encoded on the export thread, and on this thread in slices. */
  chunksOffThread: number;
  chunksSliced: number;
  /** The export thread could not start or died (then the slicer serves every chunk). */
  exportThreadFailures: number;
  /** A chunk the export thread failed to encode, exported again in slices. */
  chunksRetried: number;
  /** This thread's time in the export's synchronous steps (listing, copying; or slices), ms. */
  exportMainMs: number;
}

/** Who may read the index: the same check as a snapshot request (membership.ts). */
export type IndexSyncAuthorizer = (from: bigint, publishEndpoint: string | undefined) => Promise<string | null>;

export class IndexSyncServer {
  readonly stats: IndexSyncServerStats = { chunksServed: 0, ranksServed: 0, blocksServed: 0, bytesServed: 0, refused: 0, malformed: 0, chunksOffThread: 0, chunksSliced: 0, exportThreadFailures: 0, chunksRetried: 0, exportMainMs: 0 };
  readonly #o: IndexSyncServerOptions;
  readonly #chunkBytes: number;
  /** Kept across requests: its predictions are what a joiner's requests have cost so far. */
  readonly #slicer: ExportSlicer;
  readonly #clock: Clock;
  readonly #thread: IndexExportWorker | null;

  constructor(o: IndexSyncServerOptions) {
    this.#o = o;
    this.#clock = o.clock ?? systemClock;
    this.#slicer = new ExportSlicer(this.#clock, EXPORT_SLICE_MS);
    this.#thread =
      o.exportThread === false
        ? null
        : new IndexExportWorker({
            ...(o.spawnExportThread === undefined ? {} : { spawn: o.spawnExportThread }),
            ...(o.timers === undefined ? {} : { timers: o.timers }),
            onFailure: (err) => {
              this.stats.exportThreadFailures++;
              o.logger?.warn({ err }, "index export thread failed: a joiner's chunks are exported on the main thread, in slices, from now on (kvmesh_index_export_thread_failures_total)");
            },
          });
    this.#chunkBytes = o.chunkBytes ?? DEFAULT_INDEX_CHUNK_BYTES;
    if (!Number.isInteger(this.#chunkBytes) || this.#chunkBytes < 1024) throw new MeshOptionError("chunkBytes", `must be an integer of at least 1024, got ${this.#chunkBytes}`);
  }

  /** The control channel's hook (control.ts): our reply, or null when `raw` is not an index request. */
  handle(raw: Buffer, authorize: IndexSyncAuthorizer): Promise<Buffer> | null {
    if (!isIndexSyncRequest(raw)) return null;
    return this.#handle(raw, authorize);
  }

  async #handle(raw: Buffer, authorize: IndexSyncAuthorizer): Promise<Buffer> {
    let req: IndexSyncRequest;
    try {
      req = decodeIndexSyncRequest(raw);
    } catch (err) {
      this.stats.malformed++;
      return encodeError(err instanceof Error ? err.message : "malformed index sync request");
    }
    const refused = await authorize(req.from, req.publishEndpoint);
    if (refused !== null) {
      this.stats.refused++;
      return encodeError(`index sync refused: ${refused}`);
    }
    const timers = this.#o.timers ?? systemTimers;
    const offThread = await this.#offThread(req.cursor, timers);
    if (offThread !== null) return offThread;
    // Ranks in slices of the event loop: each rank's export is one synchronous step with its
    // position (~1 ms of CPU at 4,096 blocks), and a slice ends before a step that would carry
    // it past EXPORT_SLICE_MS (export-slicer.ts), so this replica's /select waits for one slice
    // at most. A turn per rank would tie the pull's pace to this replica's request rate (1,024
    // ranks behind ~10 ms of /selects each: 10 s).
    const steps = indexChunkSteps(this.#o.source, req.cursor, this.#chunkBytes, this.#o.positionOf);
    const slicer = this.#slicer;
    slicer.reset();
    let step = steps.next();
    while (step.done !== true) {
      while (slicer.yieldBefore(step.value)) await new Promise<void>((resolve) => timers.setImmediate(resolve));
      const t = this.#clock.now();
      step = steps.next();
      this.stats.exportMainMs += this.#clock.now() - t;
      slicer.stepDone();
    }
    const c = step.value;
    this.stats.chunksSliced++;
    this.#served(c.ranks, c.blocks, c.bytes);
    return encodeOk(c.next, c);
  }

  /**
   * The chunk walked and encoded on the export thread: this thread lists the ranks (one step),
   * lets its event loop run, then copies what the chunk's export reads, with the ranks'
   * positions, in one step (copyIndexChunk: memcpy, ~1 ms at 1,024 x 4,096 against ~13 ms of
   * walking 10 ranks here). Null when the thread is not ready (loading, or failed) or fails on
   * this chunk: the caller exports it in slices.
   */
  async #offThread(cursor: string | null, timers: Timers): Promise<Buffer | null> {
    const thread = this.#thread;
    if (thread?.ready() !== true) return null;
    let t = this.#clock.now();
    const keys = this.#o.source.rankKeys(cursor);
    this.stats.exportMainMs += this.#clock.now() - t;
    await new Promise<void>((resolve) => timers.setImmediate(resolve));
    if (!thread.ready()) return null;
    t = this.#clock.now();
    const copy = copyIndexChunk(this.#o.source, keys, cursor, this.#chunkBytes, this.#o.positionOf, thread.alloc);
    const head = okHead(copy.next);
    this.stats.exportMainMs += this.#clock.now() - t;
    try {
      const c = await thread.encode(copy, head);
      this.stats.chunksOffThread++;
      this.#served(c.ranks, c.blocks, c.bytes);
      return c.reply;
    } catch (err) {
      // The thread died meanwhile (counted and logged once, by onFailure) or refused this chunk.
      this.stats.chunksRetried++;
      if (thread.state === "ready") this.#o.logger?.warn({ err }, "index export thread failed a chunk: exported on the main thread instead");
      return null;
    }
  }

  #served(ranks: number, blocks: number, bytes: number): void {
    this.stats.chunksServed++;
    this.stats.ranksServed += ranks;
    this.stats.blocksServed += blocks;
    this.stats.bytesServed += bytes;
  }

  /**
   * Starts the export thread now rather than on the first index request (the daemon calls it once
   * its own join is over), so a joiner's first chunks are not exported in slices while it loads.
   */
  startExportThread(): void {
    this.#thread?.start();
  }

  /** The export thread's state (null: exportThread false). */
  get exportThreadState(): ExportThreadState | null {
    return this.#thread?.state ?? null;
  }

  /** Bytes the export thread's copies keep for the next chunks (0 without it). */
  get exportRecycledBytes(): number {
    return this.#thread?.recycledBytes ?? 0;
  }

  /** Ends the export thread, if one started. */
  async close(): Promise<void> {
    await this.#thread?.close();
  }
}

/** kvmesh_index_export_* series: the peer's side of the warm join. */
export function registerIndexExportMetrics(registry: Registry, server: IndexSyncServer): void {
  const st = server.stats;
  collectedLabelledCounter(registry, { name: "kvmesh_index_export_chunks_total", help: "Prefix index chunks served to joining peers, by where they were walked and encoded: the export thread, or this thread in slices." }, ["path"], () => [
    [{ path: "thread" }, st.chunksOffThread],
    [{ path: "slices" }, st.chunksSliced],
  ]);
  collectedCounter(registry, { name: "kvmesh_index_export_thread_failures_total", help: "The index export thread could not start or died: chunks are exported on the main thread, in slices, from then on (also a warning)." }, () => st.exportThreadFailures);
  collectedCounter(registry, { name: "kvmesh_index_export_main_thread_seconds_total", help: "Main-thread time in the index export's synchronous steps (listing and copying ranks, or exporting them in slices)." }, () => st.exportMainMs / 1000);
}

// ------------------------------------------------------------------ client

/** Default per-request timeout of an index chunk, ms: a 1 MiB chunk over loopback takes a few ms. */
export const DEFAULT_INDEX_CHUNK_TIMEOUT_MS = 5_000;

export interface IndexSyncClientOptions {
  readonly link: ControlLink;
  /** Our origin and PUB endpoint, for the peer's check of who asks. */
  readonly from: bigint;
  readonly advertise: string | undefined;
  readonly timeoutMs?: number;
  /** For the pull's phase times (systemClock). */
  readonly clock?: Clock;
}

export interface IndexSyncResult {
  readonly peer: string;
  readonly chunks: number;
  readonly ranks: number;
  readonly bytes: number;
  /**
   * Wall time of the pull's phases on this replica's main thread, ms: waiting for the peer's
   * replies (its export and the transfer, beyond what overlapped the install), waiting for the
   * decoding thread, installing. For the join's log line: which one to cut.
   */
  readonly phasesMs: { readonly wait: number; readonly decode: number; readonly install: number; readonly build: number; readonly adopt: number };
}

/** Installs one decoded chunk (the ranks in it); may be async (a replay of a gap). */
export type IndexChunkInstaller = (ranks: IndexRankSnapshot[]) => Promise<void> | void;

/** The whole-tree install: which ranks the decoding thread merges, and what becomes of them. */
export interface IndexTreeSink {
  /** This replica's ranks when the pull starts (SelectionService.indexRankTargets). */
  readonly targets: readonly IndexRankTarget[];
  /** Each chunk's ranks merged on the thread, in order: their blocks come with the trees. */
  merged(ranks: MergedRank[]): void;
  /** The partitions' trees once every chunk is in; may be async (a replay of a gap). */
  adopt(trees: IndexPartitionTree[]): Promise<void> | void;
}

export class IndexSyncClient {
  readonly #o: IndexSyncClientOptions;
  #decoder: ChunkDecoder | null = null;

  constructor(o: IndexSyncClientOptions) {
    this.#o = o;
  }

  /**
   * Starts the decoding thread now, so that it has loaded its modules (the core, from source
   * under tsx a second or more on a loaded host) by the time the first chunk arrives: the warm
   * join calls it while the mesh's startup sync runs.
   */
  prepare(): void {
    this.#decoder ??= new ChunkDecoder();
    this.#decoder.start();
  }

  /** Stops a thread prepare() started that no pull took (no peer to pull from). */
  async release(): Promise<void> {
    const d = this.#decoder;
    this.#decoder = null;
    await d?.close();
  }

  /**
   * Pulls the whole index from `controlEndpoint`, chunk by chunk, each decoded on a worker thread
   * and then installed while the peer encodes the next (one request ahead, no more). Rejects on the first failed request (the caller tries another peer).
   * With `trees`, the ranks it names are merged into partition trees on the thread instead and
   * handed to `trees.adopt` once the last chunk is in (nothing of them is installed before).
   */
  async pull(controlEndpoint: string, install: IndexChunkInstaller, trees?: IndexTreeSink): Promise<IndexSyncResult> {
    const decoder = this.#decoder ?? new ChunkDecoder();
    this.#decoder = null;
    if (trees !== undefined) decoder.target(trees.targets);
    const clock = this.#o.clock ?? systemClock;
    let chunks = 0;
    let ranks = 0;
    let bytes = 0;
    let wait = 0;
    let decode = 0;
    let installMs = 0;
    let build = 0;
    let adopt = 0;
    // Each reply goes to the decoding thread as soon as it arrives, so the thread decodes chunk
    // i + 1 while this thread installs chunk i (one request ahead, no more: at most one chunk
    // in flight, one decoding and one installing).
    const ask = (cursor: string | null): Promise<{ next: string | null; ranks: Promise<DecodedChunk> }> =>
      this.#o.link
        .request(controlEndpoint, encodeIndexSyncRequest({ from: this.#o.from, publishEndpoint: this.#o.advertise, cursor }), this.#o.timeoutMs ?? DEFAULT_INDEX_CHUNK_TIMEOUT_MS)
        .then((raw) => {
          const reply = decodeIndexSyncReply(controlEndpoint, raw);
          bytes += reply.chunk.length;
          chunks++;
          const decoded = decoder.decode(reply.chunk);
          decoded.catch(() => undefined); // awaited in turn; not unhandled if an earlier step throws first
          return { next: reply.next, ranks: decoded };
        });
    let pending = ask(null);
    try {
      for (;;) {
        let t = clock.now();
        const reply = await pending;
        wait += clock.now() - t;
        // The peer encodes the next chunk while this one decodes and installs here.
        if (reply.next !== null) {
          pending = ask(reply.next);
          pending.catch(() => undefined); // awaited next turn; not unhandled if the install throws first
        }
        t = clock.now();
        const got = await reply.ranks;
        decode += clock.now() - t;
        ranks += got.ranks.length + got.merged.length;
        if (got.merged.length > 0) trees?.merged(got.merged);
        t = clock.now();
        await install(got.ranks);
        installMs += clock.now() - t;
        if (reply.next === null) break;
      }
      if (trees !== undefined) {
        let t = clock.now();
        const built = await decoder.finish();
        build = clock.now() - t;
        t = clock.now();
        await trees.adopt(built);
        adopt = clock.now() - t;
      }
    } finally {
      await decoder.close();
    }
    const ms = (x: number): number => Math.round(x);
    return { peer: controlEndpoint, chunks, ranks, bytes, phasesMs: { wait: ms(wait), decode: ms(decode), install: ms(installMs), build: ms(build), adopt: ms(adopt) } };
  }
}

// ------------------------------------------------------------------ the decoding thread

const THREAD_FILE = siblingFile(import.meta.url, "index-sync-thread");

export type ThreadRequest = { readonly t: "targets"; readonly targets: readonly IndexRankTarget[] } | { readonly t: "chunk"; readonly id: number; readonly chunk: Uint8Array } | { readonly t: "finish"; readonly id: number };

export interface ThreadReply {
  readonly id: number;
  /** A chunk's ranks to install one by one. */
  readonly ranks?: IndexRankSnapshot[];
  /** A chunk's ranks merged into the trees. */
  readonly merged?: MergedRank[];
  /** The trees ("finish"). */
  readonly trees?: IndexPartitionTree[];
  readonly error?: string;
}

interface DecodedChunk {
  readonly ranks: IndexRankSnapshot[];
  readonly merged: MergedRank[];
}

/** One worker thread for the duration of a pull; chunks go in transferred, ranks come back transferred. */
class ChunkDecoder {
  #worker: Worker | null = null;
  #nextId = 1;
  readonly #waiting = new Map<number, { resolve: (r: ThreadReply) => void; reject: (e: Error) => void }>();

  /** The ranks the thread merges into trees from the next chunk on. */
  target(targets: readonly IndexRankTarget[]): void {
    const m: ThreadRequest = { t: "targets", targets };
    this.#start().postMessage(m);
  }

  async decode(chunk: Buffer): Promise<DecodedChunk> {
    // A copy the thread owns (the reply buffer may be a view into a pooled one).
    const copy = new Uint8Array(chunk.length);
    copy.set(chunk);
    const r = await this.#ask({ t: "chunk", id: this.#nextId++, chunk: copy }, [copy.buffer]);
    if (r.ranks === undefined) throw new MeshWireError("index_chunk", "no ranks");
    return { ranks: r.ranks, merged: r.merged ?? [] };
  }

  /** The trees merged so far (all of them: called after the last chunk). */
  async finish(): Promise<IndexPartitionTree[]> {
    const r = await this.#ask({ t: "finish", id: this.#nextId++ }, []);
    return r.trees ?? [];
  }

  #ask(m: ThreadRequest & { readonly id: number }, transfer: ArrayBuffer[]): Promise<ThreadReply> {
    const w = this.#start();
    return new Promise((resolve, reject) => {
      this.#waiting.set(m.id, { resolve, reject });
      w.postMessage(m, transfer);
    });
  }

  async close(): Promise<void> {
    const w = this.#worker;
    this.#worker = null;
    if (w !== null) await w.terminate();
  }

  start(): void {
    this.#start();
  }

  #start(): Worker {
    if (this.#worker !== null) return this.#worker;
    const w = startWorkerThread(THREAD_FILE, undefined);
    w.unref();
    w.on("message", (m: ThreadReply) => {
      const p = this.#waiting.get(m.id);
      if (p === undefined) return;
      this.#waiting.delete(m.id);
      if (m.error !== undefined) p.reject(new MeshWireError("index_chunk", m.error));
      else p.resolve(m);
    });
    const fail = (err: Error): void => {
      for (const p of this.#waiting.values()) p.reject(err);
      this.#waiting.clear();
      this.#worker = null;
    };
    w.on("error", fail);
    w.on("exit", (code) => {
      if (this.#waiting.size > 0) fail(new Error(`index sync decoding thread exited (${code})`));
    });
    this.#worker = w;
    return w;
  }
}
