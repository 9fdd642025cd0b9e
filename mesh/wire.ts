/**
 * The mesh's wire codec (protocol v1): msgpack maps with short keys, written by msgpackr with
 * records off so any msgpack implementation can read a frame (msgpackr's records extension is
 * msgpackr-only).
 *
 * 64-bit ids, epochs, worker ids, binding sequences and writer ids are written as BigInt, so
 * they go out as int64/uint64 (never float64) and come back exact; decoding also accepts a
 * small non-negative integer in any msgpack int form, as another implementation may write one.
 *
 * A HashList goes as one `bin`: its interleaved (hi, lo) uint32 pairs, each u32 little-endian,
 * 8 bytes per hash (219 hashes = 1 752 bytes, against ~1 971 as an array of uint64 and an
 * array of BigInts to build on both sides).
 *
 * Decoding is the trust boundary: every field is checked (type, range, string byte length,
 * array bounds, known tags, v === 1) and a violation throws a MeshWireError naming the field path
 * in the TS shape (e.g. `events[3].event.sequence_hashes`). A violation inside one entry of a
 * batch or snapshot (an event, a booking, a binding, a catalogue entry...) skips that entry only
 * when the caller passes a SkipSink (the mesh always does: kvmesh_mesh_entries_skipped_total);
 * a bad envelope refuses the frame. Nothing half-built is returned. Unknown keys are ignored, so
 * v1 can grow by optional keys.
 * Encoding trusts the TS types; a sender bug surfaces as a decode error on every peer.
 *
 * Wire keys (value types in parentheses; u64 = uint64/int64/non-negative int):
 *   batch      v, o origin(u64), e epoch(u64), s seq, t sentAtMs, ev events[], tc causes (optional:
 *              [[traceId hex32, spanId hex16, flags]], the requests whose changes it carries)
 *   event      k "a" add | "p" prefill_complete | "f" free | "b" binding
 *   load       o origin, w owner, r request_id, m model_name, g routing_group
 *   add        + bs block_size, wk worker_id(u64), dp dp_rank, h sequence_hashes(bin),
 *              pt prefill_tokens, tp track_prefill, eo expected_output_tokens|nil,
 *              pd prefill_duration_ms|nil
 *   binding    m, g, sid session_id, wk worker_id(u64), dp dp_rank|nil, sq sequence(u64),
 *              wr writer_id(u64), rs reason
 *   loads      k "l", m, g, bs block_size, columns of equal length: wk worker_ids(u64[]),
 *              dp dp_ranks[], pt prefill_tokens[], bl blocks[], rq requests[]; added bookings as
 *              columns ad ids[], aw worker_ids(u64[]), ap dp_ranks[], ah predicted hashes (bin[],
 *              optional: absent when no booking carries any; predicted-cache.ts); rm removed ids[]
 *   catalog    k "c", wk worker_id(u64), sq sequence(u64), wr writer_id(u64), w worker|nil (nil:
 *              deleted), dr draining; worker: the `POST /workers` fields by their JSON names
 *              but worker_id, checked by the catalogue's own validator (worker-catalog.ts)
 *   status     k "w", wk worker_id(u64), sq sequence(u64), wr writer_id(u64), lc lifecycle,
 *              rs reasons[]
 *   drain      k "d", dr draining (the origin is leaving; src/core/replication/drain-kind.ts)
 *   heartbeat  v, o, e, s, t, ce controlEndpoint, pe publishEndpoint, nb bookings
 *              (+ nn 0, d "": legacy, see encodeHeartbeat)
 *   snapshot   v, o, e, s, bk [{a: add event map, c: prefillDone}], bn [binding map],
 *              ag [loads map], mg [{o origin(u64), ag [loads map]}] (both optional: absent in
 *              exact load replication and from older replicas), ct [catalog map], ws [status
 *              map] (optional: absent from older replicas), dn draining (optional: only when true),
 *              bc binding cursor (u64, optional: more bindings than bn follow in pages),
 *              dg [u64] other origins the sender holds as leaving (optional: absent when none),
 *              pr [{wk worker_id(u64), dp dp_rank, tt ms left, h checkpoint hashes(bin)}] the
 *              predicted cache (optional: absent when none; src/core/predicted-snapshot.ts)
 *   control    v, ty "snapshot"|"peer"|"unpeer", f from(u64), pe publishEndpoint, bp page size
 *              (snapshot, optional: the requester takes its bindings in pages of at most this
 *              many); ty "bindings", f, c cursor(u64), n page size
 *   reply      v, ty "snapshot"|"ok"|"error"|"bindings", sn snapshot map, msg message,
 *              bn [binding map] + mo more (bindings: one page, at most MAX_SNAPSHOT_PAGE_BINDINGS)
 */
import { Packr, Unpackr } from "msgpackr";

import { MAX_WORKER_STATUS_REASONS } from "../src/core/index.js";
import { KvmeshError } from "../src/core/index.js";
import { MAX_HASHES_PER_BOOKING, MAX_WORKER_FIELD_ENTRIES } from "../src/core/index.js";
import { MAX_ID_BYTES } from "../src/core/index.js";
import { MAX_SNAPSHOT_PREDICTED_PAIRS, type PredictionSnapshotRow } from "../src/core/index.js";
import type { HashList } from "../src/core/index.js";
import type { AddedBooking, BindingEvent, CatalogEvent, LoadAddEvent, LoadAggregateRow, LoadAggregates, LoadMarkEvent, PartitionRef, WorkerStatusEvent } from "../src/core/index.js";
import type { Lifecycle, WorkerRequest } from "../src/core/index.js";
import { recordToRequest, workerDraft } from "../src/core/index.js";
import { MAX_TRACE_CAUSES_PER_BATCH, PROTOCOL_VERSION } from "./types.js";
import type { ControlReply, ControlRequest, Heartbeat, MeshBatch, MeshEvent, Snapshot, SnapshotBooking, TraceCause } from "./types.js";
import { MeshWireError } from "./errors.js";

/** Events in one batch frame; the publisher's default is 256 (outbound-queue.ts). */
export const MAX_EVENTS_PER_BATCH = 16_384;
/** Hashes in one add event: one booking's, bounded where it enters (src/core/limits.ts). */
export const MAX_HASHES_PER_EVENT = MAX_HASHES_PER_BOOKING;
export const MAX_SNAPSHOT_BOOKINGS = 1_000_000;
/** Bindings in a whole (unpaged) snapshot, as every version before pages sends and reads it. */
export const MAX_SNAPSHOT_BINDINGS = 1_000_000;
/**
 * Bindings in one page of a paged snapshot (#29 G16), each page bounded on its own: 65,536 is one
 * partition's whole affinity table (DEFAULT_AFFINITY_MAX_ENTRIES), ~5.4 MB encoded.
 */
export const MAX_SNAPSHOT_PAGE_BINDINGS = 65_536;
/** Rank rows in one loads event: every rank of a partition (MAX_RANK_KEYS, src/core/rank-registry.ts). */
export const MAX_AGGREGATE_ROWS = 1 << 20;
/** Booking ids in one loads event's added or removed list (a snapshot lists every live booking). */
export const MAX_AGGREGATE_IDS = 1_000_000;
/** Partitions in a snapshot's aggregates. */
export const MAX_SNAPSHOT_PARTITIONS = 65_536;
/** Catalogue entries (workers and tombstones) and worker statuses in a snapshot. */
export const MAX_SNAPSHOT_CATALOG_ENTRIES = 1_048_576;
export const MAX_SNAPSHOT_WORKER_STATUSES = 1_048_576;
/** Entries of one map or list in a peer's worker: the bound POST /workers enforces (src/core/limits.ts). */
export { MAX_WORKER_FIELD_ENTRIES };
/** Other origins whose totals a snapshot carries (the mesh's tracked-origin bound is far below). */
export const MAX_SNAPSHOT_ORIGINS = 4_096;
/** Predicted checkpoint pairs in a snapshot, all rows together: the sender's own bound (a row past it is skipped). */
export { MAX_SNAPSHOT_PREDICTED_PAIRS };
/** A prediction's time left, ms: at most a day (the TTL flags' bound, predicted-cache.ts). */
const MAX_PREDICTION_TTL_MS = 86_400_000;
/** request_id, session_id, model_name, routing_group, UTF-8 bytes: the core's own bound. */
export { MAX_ID_BYTES };
export const MAX_ENDPOINT_BYTES = 1_024;
export const MAX_ERROR_MESSAGE_BYTES = 4_096;
/** Peer endpoints in a status reply. */
export const MAX_STATUS_PEERS = 4_096;
/** A full batch of 256 add events of 219 hashes is ~470 KiB; 64 MiB leaves room for big prompts. */
export const MAX_BATCH_FRAME_BYTES = 64 * 1024 * 1024;
export const MAX_HEARTBEAT_FRAME_BYTES = 64 * 1024;
export const MAX_CONTROL_REQUEST_FRAME_BYTES = 64 * 1024;
/** 100k bookings of 219 hashes measured 189 MB; 1 GiB stays under Node 20's 4 GiB Buffer limit. */
export const MAX_SNAPSHOT_FRAME_BYTES = 1024 * 1024 * 1024;

const U32_MAX = 0xffff_ffff;
const U64_MAX = (1n << 64n) - 1n;
const MAX_SAFE_BIG = BigInt(Number.MAX_SAFE_INTEGER);
const BYTES_PER_HASH = 8;

export { MeshWireError };

// Explicit options everywhere: `new Packr()` defaults to records ON.
const packr = new Packr({ useRecords: false, encodeUndefinedAsNil: true });
// int64AsType "bigint": u64 fields above 2^53 stay exact (the other modes round or stringify).
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: "bigint" });

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

// ---------------------------------------------------------------------------------------------
// Encoding

type WireMap = Record<string, unknown>;

function hashBytes(list: HashList): Buffer {
  if (LITTLE_ENDIAN) return Buffer.from(list.buffer, list.byteOffset, list.byteLength);
  const out = Buffer.allocUnsafe(list.byteLength);
  for (let i = 0; i < list.length; i++) out.writeUInt32LE(list[i] as number, i * 4);
  return out;
}

const EMPTY_HASHES: HashList = new Uint32Array(0);

function addToWire(e: LoadAddEvent): WireMap {
  return {
    k: "a",
    o: e.origin,
    w: e.owner,
    r: e.request_id,
    m: e.partition.model_name,
    g: e.partition.routing_group,
    bs: e.block_size,
    wk: e.worker_id,
    dp: e.dp_rank,
    h: hashBytes(e.sequence_hashes),
    pt: e.prefill_tokens,
    tp: e.track_prefill,
    eo: e.expected_output_tokens,
    pd: e.prefill_duration_ms,
  };
}

function markToWire(e: LoadMarkEvent): WireMap {
  return {
    k: e.type === "free" ? "f" : "p",
    o: e.origin,
    w: e.owner,
    r: e.request_id,
    m: e.partition.model_name,
    g: e.partition.routing_group,
  };
}

function bindingToWire(e: BindingEvent): WireMap {
  return {
    k: "b",
    m: e.model_name,
    g: e.routing_group,
    sid: e.session_id,
    wk: e.worker_id,
    dp: e.dp_rank,
    sq: e.sequence,
    wr: e.writer_id,
    rs: e.reason,
  };
}

/** Columnar: one array per field keeps a 1,024-row event to five arrays instead of 1,024 maps. */
function loadsToWire(a: LoadAggregates): WireMap {
  const n = a.rows.length;
  const wk = new Array<bigint>(n);
  const dp = new Array<number>(n);
  const pt = new Array<number>(n);
  const bl = new Array<number>(n);
  const rq = new Array<number>(n);
  for (let i = 0; i < n; i++) {
    const r = a.rows[i] as LoadAggregateRow;
    wk[i] = r.worker_id;
    dp[i] = r.dp_rank;
    pt[i] = r.prefill_tokens;
    bl[i] = r.blocks;
    rq[i] = r.requests;
  }
  const ad = a.added.map((b) => b.id);
  const aw = a.added.map((b) => b.worker_id);
  const ap = a.added.map((b) => b.dp_rank);
  const out: WireMap = { k: "l", m: a.partition.model_name, g: a.partition.routing_group, bs: a.block_size, wk, dp, pt, bl, rq, ad, aw, ap, rm: a.removed };
  // In-flight prefixes: only when some booking carries them (an empty bin for one that does not).
  if (a.added.some((b) => b.predicted !== undefined)) out.ah = a.added.map((b) => hashBytes(b.predicted ?? EMPTY_HASHES));
  return out;
}

/** A worker's fields by their JSON names, worker_id aside (it is the event's `wk`). */
function workerToWire(r: WorkerRequest): WireMap {
  const out: WireMap = {};
  for (const [k, v] of Object.entries(r)) if (k !== "worker_id" && v !== undefined && v !== null) out[k] = v;
  return out;
}

function catalogToWire(e: CatalogEvent): WireMap {
  return { k: "c", wk: e.worker_id, sq: e.sequence, wr: e.writer_id, w: e.worker === null ? null : workerToWire(e.worker.request), dr: e.worker?.draining ?? false };
}

function statusToWire(e: WorkerStatusEvent): WireMap {
  return { k: "w", wk: e.worker_id, sq: e.sequence, wr: e.writer_id, lc: e.lifecycle, rs: e.reasons };
}

function eventToWire(me: MeshEvent): WireMap {
  switch (me.kind) {
    case "binding":
      return bindingToWire(me.event);
    case "loads":
      return loadsToWire(me.event);
    case "catalog":
      return catalogToWire(me.event);
    case "worker_status":
      return statusToWire(me.event);
    case "load":
      return me.event.type === "add" ? addToWire(me.event) : markToWire(me.event);
    case "drain":
      return { k: "d", dr: me.event.draining };
  }
}

function bookingToWire(b: SnapshotBooking): WireMap {
  return { a: addToWire(b.add), c: b.prefillDone };
}

function mirroredToWire(m: { readonly origin: bigint; readonly aggregates: readonly LoadAggregates[] }): WireMap {
  return { o: m.origin, ag: m.aggregates.map(loadsToWire) };
}

function predictionToWire(r: PredictionSnapshotRow): WireMap {
  return { wk: r.worker_id, dp: r.dp_rank, tt: r.ttl_ms, h: hashBytes(r.hashes) };
}

/**
 * One key of a snapshot's wire map: a value packed whole, or a list whose items are made wire
 * maps and packed one by one (what encodeSnapshotReplyInSlices paces, snapshot-reply-encoder.ts).
 */
export type SnapshotWireField =
  | { readonly key: string; readonly value: unknown }
  | { readonly key: string; readonly list: readonly unknown[]; readonly toWire: (item: never) => unknown };

function listField<T>(key: string, list: readonly T[], toWire: (item: T) => unknown): SnapshotWireField {
  return { key, list, toWire };
}

/** A snapshot's wire map, key by key in wire order: the one layout both encoders write. */
export function snapshotWireFields(s: Snapshot): SnapshotWireField[] {
  const out: SnapshotWireField[] = [
    { key: "v", value: s.v },
    { key: "o", value: s.origin },
    { key: "e", value: s.epoch },
    { key: "s", value: s.seq },
    listField("bk", s.bookings, bookingToWire),
    listField("bn", s.bindings, bindingToWire),
  ];
  if (s.aggregates !== undefined && s.aggregates.length > 0) out.push(listField("ag", s.aggregates, loadsToWire));
  if (s.mirrored !== undefined && s.mirrored.length > 0) out.push(listField("mg", s.mirrored, mirroredToWire));
  if (s.catalog !== undefined && s.catalog.length > 0) out.push(listField("ct", s.catalog, catalogToWire));
  if (s.statuses !== undefined && s.statuses.length > 0) out.push(listField("ws", s.statuses, statusToWire));
  if (s.draining === true) out.push({ key: "dn", value: true });
  if (s.drainingOrigins !== undefined && s.drainingOrigins.length > 0) out.push({ key: "dg", value: s.drainingOrigins });
  if (s.bindingCursor !== undefined) out.push({ key: "bc", value: s.bindingCursor });
  if (s.predictions !== undefined && s.predictions.length > 0) out.push(listField("pr", s.predictions, predictionToWire));
  return out;
}

function snapshotToWire(s: Snapshot): WireMap {
  const out: WireMap = {};
  for (const f of snapshotWireFields(s)) {
    if ("value" in f) {
      out[f.key] = f.value;
      continue;
    }
    const list = new Array<unknown>(f.list.length);
    for (let i = 0; i < list.length; i++) list[i] = f.toWire(f.list[i] as never);
    out[f.key] = list;
  }
  return out;
}

/**
 * One value packed alone, as it is packed inside a frame (maps always as map16, msgpackr's
 * plain-object form). The bytes are a view of msgpackr's shared buffer, valid until the caller
 * is done with them: later packs write after them, never over them (see packLarge).
 */
export function packWireValue(value: unknown): Buffer {
  return packr.pack(value);
}

function estimateSnapshotBytes(s: Snapshot): number {
  let n = 64;
  for (const b of s.bookings) n += 8 + estimateEventBytes({ kind: "load", event: b.add });
  for (const b of s.bindings) n += estimateEventBytes({ kind: "binding", event: b });
  for (const a of s.aggregates ?? []) n += estimateEventBytes({ kind: "loads", event: a });
  for (const m of s.mirrored ?? []) for (const a of m.aggregates) n += 16 + estimateEventBytes({ kind: "loads", event: a });
  for (const e of s.catalog ?? []) n += estimateEventBytes({ kind: "catalog", event: e });
  for (const e of s.statuses ?? []) n += estimateEventBytes({ kind: "worker_status", event: e });
  // A row: its map, worker id, dp rank and ttl (~32 bytes) and its hashes' bin.
  for (const r of s.predictions ?? []) n += 32 + r.hashes.byteLength;
  return n;
}

/** Frames above this are packed into a buffer of their own (see packLarge). */
const LARGE_FRAME_BYTES = 4 * 1024 * 1024;
const SMALL_PACK_BUFFER_BYTES = 64 * 1024;

/**
 * msgpackr packs into one buffer shared by every Packr in the process and returns views of it.
 * Packing a large snapshot there grew it by 1.25x steps (copying it several times over, seconds
 * for a snapshot of hundreds of MB), then kept it, so every later small frame pinned it and each refill allocated another of the
 * same size. A large frame gets a buffer sized from the estimate instead, and the shared
 * buffer is reset to a small one afterwards.
 */
function packLarge(value: unknown, estimatedBytes: number): Buffer {
  if (estimatedBytes < LARGE_FRAME_BYTES) return packr.pack(value);
  packr.useBuffer(Buffer.allocUnsafeSlow(Math.ceil(estimatedBytes * 1.05) + 4096));
  try {
    return packr.pack(value);
  } finally {
    packr.useBuffer(Buffer.allocUnsafeSlow(SMALL_PACK_BUFFER_BYTES));
  }
}

export function encodeBatch(b: MeshBatch): Buffer {
  const ev = new Array<WireMap>(b.events.length);
  for (let i = 0; i < b.events.length; i++) ev[i] = eventToWire(b.events[i] as MeshEvent);
  if (b.causes === undefined || b.causes.length === 0) return packr.pack({ v: b.v, o: b.origin, e: b.epoch, s: b.seq, t: b.sentAtMs, ev });
  const tc = b.causes.map((c) => [c.traceId, c.spanId, c.flags]);
  return packr.pack({ v: b.v, o: b.origin, e: b.epoch, s: b.seq, t: b.sentAtMs, ev, tc });
}

export function encodeHeartbeat(hb: Heartbeat): Buffer {
  return packr.pack({
    v: hb.v,
    o: hb.origin,
    e: hb.epoch,
    s: hb.seq,
    t: hb.sentAtMs,
    ce: hb.controlEndpoint,
    pe: hb.publishEndpoint,
    nb: hb.bookings,
    // Legacy: v1 decoders before the binding count and digest were dropped require these two
    // keys (they were always 0 and ""), so a mixed-version mesh keeps its heartbeats. Decoders
    // ignore them; stop writing them with protocol v2.
    nn: 0,
    d: "",
  });
}

/** One buffer for the whole snapshot (100k bookings of 219 hashes: 189 MB). */
export function encodeSnapshot(s: Snapshot): Buffer {
  return packLarge(snapshotToWire(s), estimateSnapshotBytes(s));
}

export function encodeControlRequest(r: ControlRequest): Buffer {
  switch (r.type) {
    case "snapshot": {
      const m: WireMap = { v: PROTOCOL_VERSION, ty: r.type, f: r.from };
      if (r.publishEndpoint !== undefined) m.pe = r.publishEndpoint;
      if (r.pageBindings !== undefined) m.bp = r.pageBindings;
      return packr.pack(m);
    }
    case "bindings":
      return packr.pack({ v: PROTOCOL_VERSION, ty: r.type, f: r.from, c: r.cursor, n: r.max });
    case "status":
      return packr.pack({ v: PROTOCOL_VERSION, ty: r.type, f: r.from });
    case "lifecycle":
      return packr.pack({ v: PROTOCOL_VERSION, ty: r.type, f: r.from, ev: markToWire(r.event) });
    case "peer":
    case "unpeer":
      return packr.pack({ v: PROTOCOL_VERSION, ty: r.type, f: r.from, pe: r.publishEndpoint });
  }
}

export function encodeControlReply(r: ControlReply): Buffer {
  switch (r.type) {
    case "snapshot":
      return packLarge({ v: PROTOCOL_VERSION, ty: r.type, sn: snapshotToWire(r.snapshot) }, estimateSnapshotBytes(r.snapshot));
    case "ok":
      return packr.pack({ v: PROTOCOL_VERSION, ty: r.type });
    case "bindings":
      return packLarge({ v: PROTOCOL_VERSION, ty: r.type, bn: r.bindings.map(bindingToWire), mo: r.more }, r.bindings.reduce((n, b) => n + estimateEventBytes({ kind: "binding", event: b }), 64));
    case "status":
      return packr.pack({ v: PROTOCOL_VERSION, ty: r.type, o: r.origin, ps: r.peers });
    case "error":
      return packr.pack({ v: PROTOCOL_VERSION, ty: r.type, msg: r.message });
  }
}

/**
 * Encoded size of one event: the fixed part counted from the key table above with 64-bit ints at
 * their widest, plus string and hash lengths (within ~10 bytes for ASCII ids under 32 bytes).
 * What the outbound queue counts against its byte bounds, and what sizes a snapshot's buffer.
 */
export function estimateEventBytes(me: MeshEvent): number {
  // Rare events (a registration, a status change): their JSON text is near enough their msgpack size.
  if (me.kind === "catalog") return 64 + (me.event.worker === null ? 0 : JSON.stringify(workerToWire(me.event.worker.request)).length);
  if (me.kind === "worker_status") return 64 + me.event.reasons.reduce((n, r) => n + 3 + r.length, 0);
  if (me.kind === "drain") return 8;
  if (me.kind === "binding") {
    const e = me.event;
    return 72 + e.model_name.length + e.routing_group.length + e.session_id.length;
  }
  if (me.kind === "loads") {
    const a = me.event;
    let ids = 0;
    for (const b of a.added) ids += 16 + b.id.length + (b.predicted === undefined ? 0 : 2 + b.predicted.byteLength);
    for (const id of a.removed) ids += 2 + id.length;
    // Per row: u64 worker id 9, dp rank <= 5, two float64s 9 each, requests <= 5.
    return 48 + a.partition.model_name.length + a.partition.routing_group.length + 37 * a.rows.length + ids;
  }
  const e = me.event;
  const base = 40 + e.request_id.length + e.partition.model_name.length + e.partition.routing_group.length;
  return e.type === "add" ? base + 72 + e.sequence_hashes.byteLength : base;
}

// ---------------------------------------------------------------------------------------------
// Decoding

type Fields = Readonly<Record<string, unknown>>;

const OVER_BOUND = { overBound: true } as const;

/** Why one entry of a batch or snapshot was skipped: `kvmesh_mesh_entries_skipped_total{reason}`. */
export type EntrySkipReason = "over_bound" | "invalid";
export const ENTRY_SKIP_REASONS: readonly EntrySkipReason[] = ["over_bound", "invalid"];

/** One entry (an event, a booking, a binding, a catalogue entry, ...) left out of what was decoded. */
export interface SkippedEntry {
  /** Path of the offending field, e.g. `events[3].event.worker.taints`. */
  readonly field: string;
  readonly reason: EntrySkipReason;
  readonly message: string;
}

/**
 * Told of each entry a decoder leaves out. Without one, decoding is strict: the first bad entry
 * refuses the whole frame (tools, tests). The mesh always passes one (#29: a peer that refused a
 * whole batch or snapshot for one over-bound worker stopped hearing its origin at all).
 */
export type SkipSink = (skipped: SkippedEntry) => void;

/**
 * `read(raw)`, or, when it throws a MeshWireError and a sink is given, undefined with the entry
 * reported to the sink. Envelope fields (origin, epoch, seq, the lists themselves) are never
 * read through here: a frame whose envelope is bad is refused whole.
 */
function entry<T>(skip: SkipSink | undefined, read: () => T): T | undefined {
  if (skip === undefined) return read();
  try {
    return read();
  } catch (err) {
    if (!(err instanceof MeshWireError)) throw err;
    skip({ field: err.field, reason: err.overBound ? "over_bound" : "invalid", message: err.message });
    return undefined;
  }
}

/** The entries of `raw` that decode, in order (the rest reported to `skip`). */
function entries<T>(raw: readonly unknown[], skip: SkipSink | undefined, read: (item: unknown, i: number) => T): T[] {
  const out: T[] = [];
  for (let i = 0; i < raw.length; i++) {
    const v = entry(skip, () => read(raw[i], i));
    if (v !== undefined) out.push(v);
  }
  return out;
}

function describe(value: unknown): string {
  if (value === null) return "nil";
  if (Array.isArray(value)) return "array";
  if (value instanceof Uint8Array) return "binary";
  return typeof value;
}

const isMap = (value: unknown): value is Fields =>
  typeof value === "object" && value !== null && Object.getPrototypeOf(value) === Object.prototype;

function map(raw: unknown, field: string): Fields {
  if (!isMap(raw)) throw new MeshWireError(field, `expected a map, got ${describe(raw)}`);
  return raw;
}

function array(raw: unknown, field: string, max: number): readonly unknown[] {
  if (!Array.isArray(raw)) throw new MeshWireError(field, `expected an array, got ${describe(raw)}`);
  if (raw.length > max) throw new MeshWireError(field, `${raw.length} items exceeds the maximum of ${max}`, OVER_BOUND);
  return raw as unknown[];
}

function u64(raw: unknown, field: string): bigint {
  if (typeof raw === "bigint") {
    if (raw < 0n || raw > U64_MAX) throw new MeshWireError(field, `${raw} is outside the u64 range`);
    return raw;
  }
  if (typeof raw === "number" && Number.isSafeInteger(raw) && raw >= 0) return BigInt(raw);
  throw new MeshWireError(field, `expected a u64 integer, got ${describe(raw)} ${typeof raw === "number" ? raw : ""}`.trimEnd());
}

function nonZeroU64(raw: unknown, field: string): bigint {
  const v = u64(raw, field);
  if (v === 0n) throw new MeshWireError(field, "must be non-zero");
  return v;
}

/** A non-negative integer up to `max` (<= 2^53 - 1); a bigint in range is accepted too. */
function uint(raw: unknown, field: string, max: number): number {
  let v = raw;
  if (typeof v === "bigint" && v >= 0n && v <= MAX_SAFE_BIG) v = Number(v);
  if (typeof v !== "number" || !Number.isInteger(v)) throw new MeshWireError(field, `expected a non-negative integer, got ${describe(raw)}`);
  if (v < 0 || v > max) throw new MeshWireError(field, `${v} is outside [0, ${max}]`);
  return v;
}

function nonNegative(raw: unknown, field: string): number {
  let v = raw;
  if (typeof v === "bigint" && v >= 0n && v <= MAX_SAFE_BIG) v = Number(v);
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0) throw new MeshWireError(field, `expected a finite non-negative number, got ${describe(raw)}`);
  return v;
}

function bool(raw: unknown, field: string): boolean {
  if (typeof raw !== "boolean") throw new MeshWireError(field, `expected a boolean, got ${describe(raw)}`);
  return raw;
}

function str(raw: unknown, field: string, maxBytes: number, allowEmpty: boolean): string {
  if (typeof raw !== "string") throw new MeshWireError(field, `expected a string, got ${describe(raw)}`);
  if (!allowEmpty && raw.length === 0) throw new MeshWireError(field, "must not be empty");
  // UTF-8 takes at least one byte per UTF-16 unit and at most three, so most strings skip the count.
  if (raw.length > maxBytes || (raw.length * 3 > maxBytes && Buffer.byteLength(raw, "utf8") > maxBytes)) {
    throw new MeshWireError(field, `longer than ${maxBytes} bytes`, OVER_BOUND);
  }
  return raw;
}

/** A page size a requester asks for: 1 ... MAX_SNAPSHOT_PAGE_BINDINGS. */
function pageSize(raw: unknown, field: string): number {
  const n = uint(raw, field, MAX_SNAPSHOT_PAGE_BINDINGS);
  if (n === 0) throw new MeshWireError(field, "must be at least 1");
  return n;
}

function version(m: Fields): void {
  if (m.v !== PROTOCOL_VERSION) throw new MeshWireError("v", `unsupported protocol version ${String(m.v)} (expected ${PROTOCOL_VERSION})`);
}

/**
 * Decoded hash lists are carved out of shared 64 KiB chunks: one typed-array allocation per
 * list was a large share of decoding an add batch (`tsx scripts/bench-wire.ts`). A live list keeps at most its chunk
 * alive, and the load ledger copies what it keeps anyway.
 */
const HASH_ARENA_CHUNK_WORDS = 16 * 1024;
const hashArena = {
  chunk: new Uint32Array(0),
  used: 0,
  take(words: number): Uint32Array {
    if (words * 4 > HASH_ARENA_CHUNK_WORDS) return new Uint32Array(words);
    if (this.used + words > this.chunk.length) {
      this.chunk = new Uint32Array(HASH_ARENA_CHUNK_WORDS);
      this.used = 0;
    }
    const out = this.chunk.subarray(this.used, this.used + words);
    this.used += words;
    return out;
  },
};

function hashList(raw: unknown, field: string): HashList {
  if (!(raw instanceof Uint8Array)) throw new MeshWireError(field, `expected binary, got ${describe(raw)}`);
  if (raw.byteLength % BYTES_PER_HASH !== 0) throw new MeshWireError(field, `byte length ${raw.byteLength} is not a multiple of ${BYTES_PER_HASH}`);
  if (raw.byteLength > MAX_HASHES_PER_EVENT * BYTES_PER_HASH) {
    throw new MeshWireError(field, `${raw.byteLength / BYTES_PER_HASH} hashes exceeds the maximum of ${MAX_HASHES_PER_EVENT}`, OVER_BOUND);
  }
  // Always a copy: the bytes are a view into the frame, which must not stay alive (a snapshot
  // frame is 189 MB) for as long as one booking does.
  const out = hashArena.take(raw.byteLength / 4);
  if (LITTLE_ENDIAN) {
    new Uint8Array(out.buffer, out.byteOffset, out.byteLength).set(raw);
  } else {
    const dv = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
    for (let i = 0; i < out.length; i++) out[i] = dv.getUint32(i * 4, true);
  }
  return out;
}

function partition(m: Fields, at: string): PartitionRef {
  return {
    model_name: str(m.m, `${at}.partition.model_name`, MAX_ID_BYTES, true),
    routing_group: str(m.g, `${at}.partition.routing_group`, MAX_ID_BYTES, true),
  };
}

function nullable<T>(raw: unknown, read: (raw: unknown) => T): T | null {
  return raw === null || raw === undefined ? null : read(raw);
}

function decodeAdd(m: Fields, at: string): LoadAddEvent {
  return {
    type: "add",
    origin: nonZeroU64(m.o, `${at}.origin`),
    owner: nonZeroU64(m.w, `${at}.owner`),
    request_id: str(m.r, `${at}.request_id`, MAX_ID_BYTES, false),
    partition: partition(m, at),
    block_size: uint(m.bs, `${at}.block_size`, U32_MAX),
    worker_id: u64(m.wk, `${at}.worker_id`),
    dp_rank: uint(m.dp, `${at}.dp_rank`, U32_MAX),
    sequence_hashes: hashList(m.h, `${at}.sequence_hashes`),
    prefill_tokens: uint(m.pt, `${at}.prefill_tokens`, Number.MAX_SAFE_INTEGER),
    track_prefill: bool(m.tp, `${at}.track_prefill`),
    expected_output_tokens: nullable(m.eo, (v) => uint(v, `${at}.expected_output_tokens`, Number.MAX_SAFE_INTEGER)),
    prefill_duration_ms: nullable(m.pd, (v) => nonNegative(v, `${at}.prefill_duration_ms`)),
  };
}

function decodeMark(m: Fields, at: string, type: LoadMarkEvent["type"]): LoadMarkEvent {
  return {
    type,
    origin: nonZeroU64(m.o, `${at}.origin`),
    owner: nonZeroU64(m.w, `${at}.owner`),
    request_id: str(m.r, `${at}.request_id`, MAX_ID_BYTES, false),
    partition: partition(m, at),
  };
}

const BINDING_REASONS: ReadonlySet<unknown> = new Set<BindingEvent["reason"]>(["bind", "rebind", "refresh", "unbind"]);

function decodeBinding(m: Fields, at: string): BindingEvent {
  const model_name = str(m.m, `${at}.model_name`, MAX_ID_BYTES, true);
  const routing_group = str(m.g, `${at}.routing_group`, MAX_ID_BYTES, true);
  const session_id = str(m.sid, `${at}.session_id`, MAX_ID_BYTES, false);
  const worker_id = u64(m.wk, `${at}.worker_id`);
  const dp_rank = nullable(m.dp, (v) => uint(v, `${at}.dp_rank`, U32_MAX));
  const sequence = u64(m.sq, `${at}.sequence`);
  const writer_id = nonZeroU64(m.wr, `${at}.writer_id`);
  if (!BINDING_REASONS.has(m.rs)) throw new MeshWireError(`${at}.reason`, `unknown reason ${JSON.stringify(describeScalar(m.rs))}`);
  const reason = m.rs as BindingEvent["reason"];
  return { model_name, routing_group, session_id, worker_id, dp_rank, sequence, writer_id, reason };
}

function decodeLoads(m: Fields, at: string): LoadAggregates {
  const wk = array(m.wk, `${at}.rows.worker_id`, MAX_AGGREGATE_ROWS);
  const n = wk.length;
  const column = (raw: unknown, name: string): readonly unknown[] => {
    const c = array(raw, `${at}.rows.${name}`, MAX_AGGREGATE_ROWS);
    if (c.length !== n) throw new MeshWireError(`${at}.rows.${name}`, `${c.length} values for ${n} rows`);
    return c;
  };
  const dp = column(m.dp, "dp_rank");
  const pt = column(m.pt, "prefill_tokens");
  const bl = column(m.bl, "blocks");
  const rq = column(m.rq, "requests");
  const rows = new Array<LoadAggregateRow>(n);
  for (let i = 0; i < n; i++) {
    rows[i] = {
      worker_id: u64(wk[i], `${at}.rows[${i}].worker_id`),
      dp_rank: uint(dp[i], `${at}.rows[${i}].dp_rank`, U32_MAX),
      prefill_tokens: nonNegative(pt[i], `${at}.rows[${i}].prefill_tokens`),
      blocks: nonNegative(bl[i], `${at}.rows[${i}].blocks`),
      requests: uint(rq[i], `${at}.rows[${i}].requests`, Number.MAX_SAFE_INTEGER),
    };
  }
  const ids = (raw: unknown, name: string): string[] => array(raw, `${at}.${name}`, MAX_AGGREGATE_IDS).map((v, i) => str(v, `${at}.${name}[${i}]`, MAX_ID_BYTES, false));
  const addedIds = ids(m.ad, "added");
  const aw = array(m.aw, `${at}.added.worker_id`, MAX_AGGREGATE_IDS);
  const ap = array(m.ap, `${at}.added.dp_rank`, MAX_AGGREGATE_IDS);
  if (aw.length !== addedIds.length || ap.length !== addedIds.length) throw new MeshWireError(`${at}.added`, `${addedIds.length} ids with ${aw.length} worker ids and ${ap.length} dp ranks`);
  const added: AddedBooking[] = addedIds.map((id, i) => ({ id, worker_id: u64(aw[i], `${at}.added[${i}].worker_id`), dp_rank: uint(ap[i], `${at}.added[${i}].dp_rank`, U32_MAX) }));
  if (m.ah !== undefined) {
    const ah = array(m.ah, `${at}.added.predicted`, MAX_AGGREGATE_IDS);
    if (ah.length !== addedIds.length) throw new MeshWireError(`${at}.added.predicted`, `${ah.length} hash lists for ${addedIds.length} ids`);
    for (let i = 0; i < ah.length; i++) {
      const h = hashList(ah[i], `${at}.added[${i}].predicted`);
      if (h.length > 0) added[i] = { ...(added[i] as AddedBooking), predicted: h };
    }
  }
  return {
    partition: partition(m, at),
    block_size: uint(m.bs, `${at}.block_size`, U32_MAX),
    rows,
    added,
    removed: ids(m.rm, "removed"),
  };
}

/**
 * A peer's worker, checked by the catalogue's own validator (the one `POST /workers` meets), after
 * its maps and lists are bounded; its refusal names the field under `at`.
 */
function decodeWorker(raw: unknown, workerId: bigint, at: string): WorkerRequest {
  const m = map(raw, at);
  for (const [k, v] of Object.entries(m)) {
    if (Array.isArray(v)) array(v, `${at}.${k}`, MAX_WORKER_FIELD_ENTRIES);
    else if (isMap(v) && Object.keys(v).length > MAX_WORKER_FIELD_ENTRIES) throw new MeshWireError(`${at}.${k}`, `more than ${MAX_WORKER_FIELD_ENTRIES} entries`, OVER_BOUND);
  }
  try {
    return recordToRequest(workerDraft({ ...(m as Partial<WorkerRequest>), worker_id: workerId }));
  } catch (err) {
    if (!(err instanceof KvmeshError)) throw err;
    const field = typeof err.details?.field === "string" ? err.details.field : "";
    throw new MeshWireError(field === "" ? at : `${at}.${field}`, err.message);
  }
}

function decodeCatalog(m: Fields, at: string): CatalogEvent {
  const worker_id = u64(m.wk, `${at}.worker_id`);
  const sequence = u64(m.sq, `${at}.sequence`);
  const writer_id = nonZeroU64(m.wr, `${at}.writer_id`);
  if (m.w === null || m.w === undefined) return { worker_id, sequence, writer_id, worker: null };
  const request = decodeWorker(m.w, worker_id, `${at}.worker`);
  return { worker_id, sequence, writer_id, worker: { request, draining: bool(m.dr, `${at}.draining`) } };
}

const LIFECYCLES: ReadonlySet<unknown> = new Set<Lifecycle>(["incomplete", "schedulable", "draining", "unschedulable"]);

function decodeStatus(m: Fields, at: string): WorkerStatusEvent {
  const worker_id = u64(m.wk, `${at}.worker_id`);
  // 0 when the status was taken before any version (cannot happen from kvmesh, harmless if it does).
  const sequence = u64(m.sq, `${at}.sequence`);
  const writer_id = u64(m.wr, `${at}.writer_id`);
  if (!LIFECYCLES.has(m.lc)) throw new MeshWireError(`${at}.lifecycle`, `unknown lifecycle ${JSON.stringify(describeScalar(m.lc))}`);
  const lifecycle = m.lc as Lifecycle;
  const reasons = array(m.rs, `${at}.reasons`, MAX_WORKER_STATUS_REASONS).map((r, i) => str(r, `${at}.reasons[${i}]`, MAX_ERROR_MESSAGE_BYTES, true));
  return { worker_id, sequence, writer_id, lifecycle, reasons };
}

function describeScalar(v: unknown): unknown {
  return typeof v === "string" ? v.slice(0, 32) : describe(v);
}

function decodeEvent(raw: unknown, at: string): MeshEvent {
  const m = map(raw, at);
  switch (m.k) {
    case "a":
      return { kind: "load", event: decodeAdd(m, `${at}.event`) };
    case "p":
      return { kind: "load", event: decodeMark(m, `${at}.event`, "prefill_complete") };
    case "f":
      return { kind: "load", event: decodeMark(m, `${at}.event`, "free") };
    case "b":
      return { kind: "binding", event: decodeBinding(m, `${at}.event`) };
    case "l":
      return { kind: "loads", event: decodeLoads(m, `${at}.event`) };
    case "c":
      return { kind: "catalog", event: decodeCatalog(m, `${at}.event`) };
    case "w":
      return { kind: "worker_status", event: decodeStatus(m, `${at}.event`) };
    case "d":
      return { kind: "drain", event: { draining: bool(m.dr, `${at}.event.draining`) } };
    default:
      throw new MeshWireError(`${at}.kind`, `unknown event kind ${JSON.stringify(describeScalar(m.k))}`);
  }
}

function unpackFrame(buf: Uint8Array, maxBytes: number): Fields {
  if (!(buf instanceof Uint8Array)) throw new MeshWireError("payload", `expected binary, got ${describe(buf)}`);
  if (buf.byteLength === 0) throw new MeshWireError("payload", "empty");
  if (buf.byteLength > maxBytes) throw new MeshWireError("payload", `${buf.byteLength} bytes exceeds the maximum of ${maxBytes}`);
  let raw: unknown;
  try {
    raw = unpackr.unpack(buf);
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    throw new MeshWireError("payload", `invalid msgpack (${reason})`, { cause: err });
  }
  const m = map(raw, "payload");
  version(m);
  return m;
}

function decodeSnapshotFields(m: Fields, at: string, skip: SkipSink | undefined): Snapshot {
  const p = at === "" ? "" : `${at}.`;
  if (at !== "" && m.v !== PROTOCOL_VERSION) throw new MeshWireError(`${p}v`, `unsupported protocol version ${String(m.v)}`);
  const origin = nonZeroU64(m.o, `${p}origin`);
  const epoch = u64(m.e, `${p}epoch`);
  const seq = uint(m.s, `${p}seq`, Number.MAX_SAFE_INTEGER);
  // Each booking, binding, totals event, catalogue entry and status is one entry: a bad one is
  // skipped (with a sink), the rest of the snapshot installs.
  const bookings = entries(array(m.bk, `${p}bookings`, MAX_SNAPSHOT_BOOKINGS), skip, (raw, i): SnapshotBooking => {
    const bat = `${p}bookings[${i}]`;
    const b = map(raw, bat);
    return { add: decodeAdd(map(b.a, `${bat}.add`), `${bat}.add`), prefillDone: bool(b.c, `${bat}.prefillDone`) };
  });
  const bindings = entries(array(m.bn, `${p}bindings`, MAX_SNAPSHOT_BINDINGS), skip, (raw, i) => decodeBinding(map(raw, `${p}bindings[${i}]`), `${p}bindings[${i}]`));
  const loadsList = (raw: unknown, at: string): LoadAggregates[] => entries(array(raw, at, MAX_SNAPSHOT_PARTITIONS), skip, (a, i) => decodeLoads(map(a, `${at}[${i}]`), `${at}[${i}]`));
  const aggregates = m.ag === undefined ? undefined : loadsList(m.ag, `${p}aggregates`);
  const mirrored =
    m.mg === undefined
      ? undefined
      : entries(array(m.mg, `${p}mirrored`, MAX_SNAPSHOT_ORIGINS), skip, (raw, i) => {
          const o = map(raw, `${p}mirrored[${i}]`);
          return { origin: nonZeroU64(o.o, `${p}mirrored[${i}].origin`), aggregates: loadsList(o.ag, `${p}mirrored[${i}].aggregates`) };
        });
  const catalog = m.ct === undefined ? undefined : entries(array(m.ct, `${p}catalog`, MAX_SNAPSHOT_CATALOG_ENTRIES), skip, (raw, i) => decodeCatalog(map(raw, `${p}catalog[${i}]`), `${p}catalog[${i}]`));
  const statuses = m.ws === undefined ? undefined : entries(array(m.ws, `${p}statuses`, MAX_SNAPSHOT_WORKER_STATUSES), skip, (raw, i) => decodeStatus(map(raw, `${p}statuses[${i}]`), `${p}statuses[${i}]`));
  return {
    v: PROTOCOL_VERSION,
    origin,
    epoch,
    seq,
    bookings,
    bindings,
    ...(aggregates === undefined ? {} : { aggregates }),
    ...(mirrored === undefined ? {} : { mirrored }),
    ...(catalog === undefined ? {} : { catalog }),
    ...(statuses === undefined ? {} : { statuses }),
    ...(m.dn === undefined ? {} : { draining: bool(m.dn, `${p}draining`) }),
    ...(m.dg === undefined ? {} : { drainingOrigins: entries(array(m.dg, `${p}drainingOrigins`, MAX_SNAPSHOT_ORIGINS), skip, (raw, i) => nonZeroU64(raw, `${p}drainingOrigins[${i}]`)) }),
    ...(m.bc === undefined ? {} : { bindingCursor: u64(m.bc, `${p}bindingCursor`) }),
    ...(m.pr === undefined ? {} : { predictions: decodePredictions(m.pr, `${p}predictions`, skip) }),
  };
}

/** A snapshot's predicted cache: each row is one entry; a row past the pairs' bound is skipped as over it. */
function decodePredictions(raw: unknown, at: string, skip: SkipSink | undefined): PredictionSnapshotRow[] {
  let pairs = 0;
  return entries(array(raw, at, MAX_SNAPSHOT_PREDICTED_PAIRS), skip, (item, i): PredictionSnapshotRow => {
    const rat = `${at}[${i}]`;
    const r = map(item, rat);
    const worker_id = u64(r.wk, `${rat}.worker_id`);
    const dp_rank = uint(r.dp, `${rat}.dp_rank`, U32_MAX);
    const ttl_ms = uint(r.tt, `${rat}.ttl_ms`, MAX_PREDICTION_TTL_MS);
    if (ttl_ms === 0) throw new MeshWireError(`${rat}.ttl_ms`, "must be at least 1");
    const hashes = hashList(r.h, `${rat}.hashes`);
    if (hashes.length === 0) throw new MeshWireError(`${rat}.hashes`, "must not be empty");
    pairs += hashes.length / 2;
    if (pairs > MAX_SNAPSHOT_PREDICTED_PAIRS) throw new MeshWireError(`${rat}.hashes`, `more than ${MAX_SNAPSHOT_PREDICTED_PAIRS} predicted hashes in one snapshot`, OVER_BOUND);
    return { worker_id, dp_rank, ttl_ms, hashes };
  });
}

/** `skip`: where bad events go (the rest of the batch is kept); without it, one refuses the batch. */
export function decodeBatch(buf: Uint8Array, skip?: SkipSink): MeshBatch {
  const m = unpackFrame(buf, MAX_BATCH_FRAME_BYTES);
  const origin = nonZeroU64(m.o, "origin");
  const epoch = u64(m.e, "epoch");
  const seq = uint(m.s, "seq", Number.MAX_SAFE_INTEGER);
  if (seq === 0) throw new MeshWireError("seq", "batches are numbered from 1");
  const sentAtMs = nonNegative(m.t, "sentAtMs");
  const events = entries(array(m.ev, "events", MAX_EVENTS_PER_BATCH), skip, (raw, i) => decodeEvent(raw, `events[${i}]`));
  if (m.tc === undefined || m.tc === null) return { v: PROTOCOL_VERSION, origin, epoch, seq, sentAtMs, events };
  return { v: PROTOCOL_VERSION, origin, epoch, seq, sentAtMs, events, causes: decodeCauses(m.tc) };
}

const TRACE_ID = /^[0-9a-f]{32}$/;
const SPAN_ID = /^[0-9a-f]{16}$/;
const ZERO_ID = /^0+$/;

/** A batch's trace causes: W3C ids (lowercase hex, not all zero) and flags (0 ... 255). */
function decodeCauses(raw: unknown): TraceCause[] {
  const list = array(raw, "causes", MAX_TRACE_CAUSES_PER_BATCH);
  return list.map((c, i): TraceCause => {
    const at = `causes[${i}]`;
    const t = array(c, at, 3);
    if (t.length !== 3) throw new MeshWireError(at, `a cause is [traceId, spanId, flags], got ${t.length} items`);
    const [traceId, spanId] = t;
    if (typeof traceId !== "string" || !TRACE_ID.test(traceId) || ZERO_ID.test(traceId)) throw new MeshWireError(`${at}.traceId`, "must be 32 lowercase hex digits, not all zero");
    if (typeof spanId !== "string" || !SPAN_ID.test(spanId) || ZERO_ID.test(spanId)) throw new MeshWireError(`${at}.spanId`, "must be 16 lowercase hex digits, not all zero");
    return { traceId, spanId, flags: uint(t[2], `${at}.flags`, 0xff) };
  });
}

export function decodeHeartbeat(buf: Uint8Array): Heartbeat {
  const m = unpackFrame(buf, MAX_HEARTBEAT_FRAME_BYTES);
  return {
    v: PROTOCOL_VERSION,
    origin: nonZeroU64(m.o, "origin"),
    epoch: u64(m.e, "epoch"),
    seq: uint(m.s, "seq", Number.MAX_SAFE_INTEGER),
    sentAtMs: nonNegative(m.t, "sentAtMs"),
    controlEndpoint: str(m.ce, "controlEndpoint", MAX_ENDPOINT_BYTES, false),
    publishEndpoint: str(m.pe, "publishEndpoint", MAX_ENDPOINT_BYTES, false),
    bookings: uint(m.nb, "bookings", Number.MAX_SAFE_INTEGER),
  };
}

export function decodeSnapshot(buf: Uint8Array, skip?: SkipSink): Snapshot {
  return decodeSnapshotFields(unpackFrame(buf, MAX_SNAPSHOT_FRAME_BYTES), "", skip);
}

export function decodeControlRequest(buf: Uint8Array): ControlRequest {
  const m = unpackFrame(buf, MAX_CONTROL_REQUEST_FRAME_BYTES);
  const type = m.ty;
  switch (type) {
    case "snapshot":
      return {
        type,
        from: nonZeroU64(m.f, "from"),
        publishEndpoint: m.pe === undefined ? undefined : str(m.pe, "publishEndpoint", MAX_ENDPOINT_BYTES, false),
        ...(m.bp === undefined ? {} : { pageBindings: pageSize(m.bp, "pageBindings") }),
      };
    case "bindings":
      return { type, from: nonZeroU64(m.f, "from"), cursor: u64(m.c, "cursor"), max: pageSize(m.n, "max") };
    case "status":
      return { type, from: nonZeroU64(m.f, "from") };
    case "lifecycle": {
      const ev = map(m.ev, "event");
      const kind = ev.k;
      if (kind !== "f" && kind !== "p") throw new MeshWireError("event.kind", `a lifecycle request carries a free or a prefill_complete, got ${JSON.stringify(describeScalar(kind))}`);
      return { type, from: nonZeroU64(m.f, "from"), event: decodeMark(ev, "event", kind === "f" ? "free" : "prefill_complete") };
    }
    case "peer":
    case "unpeer":
      return { type, from: nonZeroU64(m.f, "from"), publishEndpoint: str(m.pe, "publishEndpoint", MAX_ENDPOINT_BYTES, false) };
    default:
      throw new MeshWireError("type", `unknown control request type ${JSON.stringify(describeScalar(type))}`);
  }
}

export function decodeControlReply(buf: Uint8Array, skip?: SkipSink): ControlReply {
  const m = unpackFrame(buf, MAX_SNAPSHOT_FRAME_BYTES);
  const type = m.ty;
  switch (type) {
    case "snapshot":
      return { type, snapshot: decodeSnapshotFields(map(m.sn, "snapshot"), "snapshot", skip) };
    case "ok":
      return { type };
    case "bindings":
      return { type, bindings: entries(array(m.bn, "bindings", MAX_SNAPSHOT_PAGE_BINDINGS), skip, (raw, i) => decodeBinding(map(raw, `bindings[${i}]`), `bindings[${i}]`)), more: bool(m.mo, "more") };
    case "status":
      return { type, origin: nonZeroU64(m.o, "origin"), peers: array(m.ps, "peers", MAX_STATUS_PEERS).map((e, i) => str(e, `peers[${i}]`, MAX_ENDPOINT_BYTES, false)) };
    case "error":
      return { type, message: str(m.msg, "message", MAX_ERROR_MESSAGE_BYTES, true) };
    default:
      throw new MeshWireError("type", `unknown control reply type ${JSON.stringify(describeScalar(type))}`);
  }
}
