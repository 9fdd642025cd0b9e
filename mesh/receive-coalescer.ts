/**
 * What the mesh's receive thread (receive-thread.ts) does with each frame from a peer's PUB:
 * decode it, and fold it into the entries that go to the main thread at the next hand-over.
 *
 * Why fold: on the main thread a peer's batch cost 300-500 us however small (a zeromq.js receive,
 * two promise hops, msgpack decode and validation, the origin tracker, the apply, all in cold,
 * baseline-compiled code at 100 messages/s), which made a passive peer's main thread cost 20-25%
 * of what the origin spent routing the request. Handing the main thread one message per apply
 * interval, holding everything that arrived in it, makes that cost follow the interval instead
 * of the peers' publish rate.
 *
 * Folding keeps every guarantee of the per-batch path:
 * - consecutive batches of one (origin, epoch) merge into one batch covering `firstSeq..seq`
 *   (the origin tracker applies such a batch when it continues or overlaps what was applied;
 *   every event applies idempotently, so an overlap re-applied is harmless);
 * - a heartbeat ends its origin's merge, so it still follows exactly the batches sent before it;
 * - in a merged batch, load totals ("loads" events, absolute values) of one partition fold into
 *   one event whose rows are the latest per rank, and whose booking ids are what the sequence
 *   leaves added or removed; per-booking events, bindings, catalogue entries and worker statuses
 *   are kept, in order (a catalogue entry's version decides on apply, so none is folded away).
 * Nothing is dropped here: malformed frames are counted, and a full hand-over goes at once.
 */
import type { LoadAggregateRow, LoadAggregates } from "../src/core/index.js";
import { MeshWireError } from "./errors.js";
import { MAX_TRACE_CAUSES_PER_BATCH, PROTOCOL_VERSION, TOPIC_BATCH, TOPIC_HEARTBEAT, type Heartbeat, type MeshBatch, type MeshEvent, type TraceCause } from "./types.js";
import { decodeBatch, decodeHeartbeat, type EntrySkipReason, type SkippedEntry } from "./wire.js";

/**
 * A merged batch stops growing at this many events (a new one starts): bounds one apply's work on
 * the main thread (~1 us an event) and one structured clone.
 */
export const MAX_MERGED_EVENTS = 4_096;
/** Events held for the next hand-over past which it goes at once, whatever the interval. */
export const MAX_PENDING_EVENTS = 16_384;

/** What the main thread gets, in arrival order. */
export type ReceivedEntry =
  | {
      readonly kind: "batch";
      /** `firstSeq` set when consecutive batches were merged (the batch covers firstSeq..seq). */
      readonly batch: MeshBatch;
      /** Publish-to-receive lag of each batch merged into it, ms (clamped at 0 for clock skew). */
      readonly lagsMs: number[];
    }
  | { readonly kind: "heartbeat"; readonly heartbeat: Heartbeat; readonly lagMs: number };

export interface CoalescerStats {
  /** Messages read from the SUB, well-formed or not. */
  received: number;
  /** Messages without exactly two frames, or that failed to decode (also counted in decodeErrors). */
  malformed: number;
  /** Of `malformed`: payloads the wire codec refused. */
  decodeErrors: number;
  /** Entries (events) left out of batches that were otherwise kept, by reason (wire.ts SkipSink). */
  skipped: Record<EntrySkipReason, number>;
  /** Batches folded into the batch before them (each one main-thread apply saved). */
  merged: number;
  /** Hand-overs sent to the main thread. */
  handovers: number;
}

/** A merged batch being built: mutable copies of what was decoded. */
interface Building {
  origin: bigint;
  epoch: bigint;
  firstSeq: number;
  seq: number;
  sentAtMs: number;
  events: MeshEvent[];
  lagsMs: number[];
  /** The merged batches' trace causes, at most MAX_MERGED_TRACE_CAUSES (none without tracing: no array). */
  causes: TraceCause[] | undefined;
  /** Partition key -> index in `events` of its folded loads event. */
  loadsAt: Map<string, number>;
}

type Pending = { kind: "building"; b: Building } | Extract<ReceivedEntry, { kind: "heartbeat" }>;

export interface DecodeFailure {
  readonly topic: string;
  readonly field: string;
  readonly message: string;
  /** Set when only one entry was left out (the rest of the batch was kept): logged at warn. */
  readonly skipped?: EntrySkipReason;
}

export class ReceiveCoalescer {
  readonly stats: CoalescerStats = { received: 0, malformed: 0, decodeErrors: 0, merged: 0, handovers: 0, skipped: { over_bound: 0, invalid: 0 } };
  /** Entries skipped by the last add() (reported with its outcome). */
  #skips: DecodeFailure[] = [];
  readonly #skip = (s: SkippedEntry): void => {
    this.stats.skipped[s.reason]++;
    this.#skips.push({ topic: TOPIC_BATCH, field: s.field, message: s.message, skipped: s.reason });
  };
  #pending: Pending[] = [];
  #pendingEvents = 0;
  /** Origin -> the batch still open for merging (none after its heartbeat or a hand-over). */
  readonly #open = new Map<bigint, Building>();
  readonly #self: bigint | null;

  /** `self`: this replica's origin (its own frames, looped back, are not handed over). */
  constructor(self: bigint | null = null) {
    this.#self = self;
  }

  get pendingEvents(): number {
    return this.#pendingEvents;
  }

  get empty(): boolean {
    return this.#pending.length === 0;
  }

  /**
   * Decodes one message (frames as read from the SUB) and folds it in; returns why it was refused
   * (one failure) or which of its entries were skipped (one each, the batch kept), if any.
   */
  add(frames: readonly Buffer[], wallNowMs: number): DecodeFailure[] {
    this.stats.received++;
    if (frames.length !== 2) {
      this.stats.malformed++;
      return [];
    }
    const topic = (frames[0] as Buffer).toString("utf8");
    const payload = frames[1] as Buffer;
    this.#skips = [];
    try {
      if (topic === TOPIC_BATCH) this.#addBatch(decodeBatch(payload, this.#skip), wallNowMs);
      else if (topic === TOPIC_HEARTBEAT) this.#addHeartbeat(decodeHeartbeat(payload), wallNowMs);
      else this.stats.malformed++;
      return this.#skips;
    } catch (err) {
      this.stats.malformed++;
      this.stats.decodeErrors++;
      if (err instanceof MeshWireError) return [{ topic, field: err.field, message: err.message }];
      return [{ topic, field: "payload", message: err instanceof Error ? err.message : String(err) }];
    }
  }

  /** Whether the pending entries are past MAX_PENDING_EVENTS (hand them over now). */
  get full(): boolean {
    return this.#pendingEvents >= MAX_PENDING_EVENTS;
  }

  /** Everything pending, in arrival order; merging starts afresh after. */
  take(): ReceivedEntry[] {
    const out = this.#pending.map((p): ReceivedEntry => (p.kind === "building" ? { kind: "batch", batch: freeze(p.b), lagsMs: p.b.lagsMs } : p));
    this.#pending = [];
    this.#pendingEvents = 0;
    this.#open.clear();
    if (out.length > 0) this.stats.handovers++;
    return out;
  }

  #addBatch(batch: MeshBatch, wallNowMs: number): void {
    if (batch.origin === this.#self) return;
    const lag = Math.max(0, wallNowMs - batch.sentAtMs);
    const open = this.#open.get(batch.origin);
    if (open !== undefined && open.epoch === batch.epoch && batch.seq === open.seq + 1 && open.events.length + batch.events.length <= MAX_MERGED_EVENTS) {
      const before = open.events.length;
      for (const e of batch.events) fold(open, e);
      this.#pendingEvents += open.events.length - before;
      open.seq = batch.seq;
      open.sentAtMs = batch.sentAtMs;
      open.lagsMs.push(lag);
      addCauses(open, batch);
      this.stats.merged++;
      return;
    }
    const b: Building = { origin: batch.origin, epoch: batch.epoch, firstSeq: batch.seq, seq: batch.seq, sentAtMs: batch.sentAtMs, events: [], lagsMs: [lag], causes: undefined, loadsAt: new Map() };
    addCauses(b, batch);
    for (const e of batch.events) fold(b, e);
    this.#pending.push({ kind: "building", b });
    this.#pendingEvents += b.events.length;
    this.#open.set(batch.origin, b);
  }

  #addHeartbeat(hb: Heartbeat, wallNowMs: number): void {
    if (hb.origin === this.#self) return;
    this.#open.delete(hb.origin);
    this.#pending.push({ kind: "heartbeat", heartbeat: hb, lagMs: Math.max(0, wallNowMs - hb.sentAtMs) });
    this.#pendingEvents++;
  }
}

/**
 * Trace causes one merged batch keeps, so one apply span links at most this many requests (the
 * rest of a burst's links are left out; the state they carried is applied all the same).
 */
export const MAX_MERGED_TRACE_CAUSES = 4 * MAX_TRACE_CAUSES_PER_BATCH;

function addCauses(b: Building, batch: MeshBatch): void {
  if (batch.causes === undefined) return;
  const into = (b.causes ??= []);
  for (const c of batch.causes) {
    if (into.length >= MAX_MERGED_TRACE_CAUSES) return;
    into.push(c);
  }
}

function freeze(b: Building): MeshBatch {
  const batch: MeshBatch = { v: PROTOCOL_VERSION, origin: b.origin, epoch: b.epoch, seq: b.seq, sentAtMs: b.sentAtMs, events: b.events, ...(b.causes === undefined ? {} : { causes: b.causes }) };
  return b.firstSeq === b.seq ? batch : { ...batch, firstSeq: b.firstSeq };
}

/** Appends `e` to `b`, folding a loads event into the earlier one of its partition. */
function fold(b: Building, e: MeshEvent): void {
  if (e.kind !== "loads") {
    b.events.push(e);
    return;
  }
  const key = `${e.event.block_size}\u0000${e.event.partition.model_name}\u0000${e.event.partition.routing_group}`;
  const at = b.loadsAt.get(key);
  if (at === undefined) {
    b.loadsAt.set(key, b.events.length);
    b.events.push(e);
    return;
  }
  const prev = b.events[at] as { kind: "loads"; event: LoadAggregates };
  b.events[at] = { kind: "loads", event: mergeLoads(prev.event, e.event) };
}

const rankKey = (r: { worker_id: bigint; dp_rank: number }): string => `${r.worker_id}:${r.dp_rank}`;

/**
 * `first` then `next` as one event. Rows are absolute totals, so the later row of a rank wins.
 * The core removes an event's `removed` ids before it adds its `added` ones; so a booking added in
 * `first` and removed in `next` must be in neither (applied in order, it ends up absent).
 */
export function mergeLoads(first: LoadAggregates, next: LoadAggregates): LoadAggregates {
  const rows = new Map<string, LoadAggregateRow>();
  for (const r of first.rows) rows.set(rankKey(r), r);
  for (const r of next.rows) rows.set(rankKey(r), r);
  const nextRemoved = new Set(next.removed);
  const firstAdded = new Set(first.added.map((a) => a.id));
  const added = [...first.added.filter((a) => !nextRemoved.has(a.id)), ...next.added];
  const removed = [...first.removed, ...next.removed.filter((id) => !firstAdded.has(id))];
  return { partition: first.partition, block_size: first.block_size, rows: [...rows.values()], added, removed };
}
