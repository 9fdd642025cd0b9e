/**
 * The continuity rule of the warm join (issue 25): a joining replica's KV listeners run from the
 * start, and their batches are applied at once AND journaled here, per rank, until the rank's
 * peer snapshot is installed. The snapshot holds the rank's blocks as of its position P (the
 * publisher's seq, and the digest of that batch's payload, which names the publisher's
 * incarnation). Installing it replaces the rank's blocks, so what the replica received past P
 * must be applied again on top, in seq order:
 *
 *  - journaled batches with seq > P are re-applied;
 *  - seqs past P that the journal does not hold (shed at its bound, oldest first, or never
 *    delivered: the listener's first replay ran short) are a gap [P + 1, first retained):
 *    replayed from the engine, and what the engine no longer holds is counted as unrepaired;
 *  - a listener behind P (it has not reached P yet) gets a floor: its batches up to P are
 *    already in the snapshot and are skipped, unless the batch at P carries another digest (a
 *    restarted publisher), which lifts the floor;
 *  - a snapshot whose batch at P the journal holds with another digest, or taken across a
 *    publisher restart the listener saw, is of another incarnation: refused (stale), the rank
 *    keeps its own state.
 *
 * Pure data: the caller (src/app/warm-join.ts) does the replay and the applying.
 */
import type { KvStreamPosition } from "./index-snapshot.js";
import type { KvEventBatch } from "./kv-events.js";

/**
 * Default bound on journaled batches, all ranks together. A join takes seconds; at the ~100
 * batches/s of a busy engine rank, 65,536 batches is 0.6 s of 1,024 ranks or minutes of a few
 * dozen. Past it the oldest batches are shed (counted) and come back through the engine's replay.
 */
export const DEFAULT_JOIN_JOURNAL_BATCHES = 65_536;

export interface JournalEntry {
  readonly seq: bigint;
  readonly digest: bigint | null;
  readonly batch: KvEventBatch;
}

export type JoinPlan =
  | {
      readonly kind: "install";
      /** Journaled batches past P, in seq order, to apply after the snapshot. */
      readonly apply: readonly JournalEntry[];
      /** Seqs past P the listener delivered and the journal shed: replay [from, to) from the engine. */
      readonly gap: { readonly from: bigint; readonly to: bigint } | null;
      /** Batches up to this seq are in the snapshot: skip them when the listener delivers them. */
      readonly floor: KvStreamPosition | null;
    }
  | { readonly kind: "stale"; readonly reason: string };

interface RankJournal {
  entries: JournalEntry[];
  /** Last seq the listener delivered (journaled or not). */
  last: bigint | null;
  /** The publisher restarted while journaling: positions before it name another incarnation. */
  reset: boolean;
}

export interface JoinJournalStats {
  readonly batches: number;
  readonly shed: number;
}

export class IndexJoinJournal {
  readonly #max: number;
  readonly #ranks = new Map<string, RankJournal>();
  /** Journaled batches in arrival order across ranks, for oldest-first shedding. */
  #fifo: { key: string; entry: JournalEntry }[] = [];
  #fifoHead = 0;
  #batches = 0;
  #shed = 0;
  #open = true;
  /** Ranks installed (or given up): no longer journaled. */
  readonly #done = new Set<string>();

  constructor(maxBatches = DEFAULT_JOIN_JOURNAL_BATCHES) {
    // Assertion (a programming error, never input): the daemon passes the named default.
    if (!Number.isInteger(maxBatches) || maxBatches <= 0) throw new RangeError(`maxBatches must be a positive integer, got ${maxBatches}`);
    this.#max = maxBatches;
  }

  get stats(): JoinJournalStats {
    return { batches: this.#batches, shed: this.#shed };
  }

  /** Whether batches of `key` are still journaled (the join is open and the rank not installed). */
  recording(key: string): boolean {
    return this.#open && !this.#done.has(key);
  }

  /** A batch the listener delivered (and the caller applied) for `key`. */
  record(key: string, seq: bigint, digest: bigint | null, batch: KvEventBatch): void {
    if (!this.recording(key)) return;
    const r = this.#rank(key);
    r.last = seq;
    const entry = { seq, digest, batch };
    r.entries.push(entry);
    this.#fifo.push({ key, entry });
    this.#batches++;
    while (this.#batches > this.#max) this.#shedOldest();
  }

  /** The rank's publisher restarted (the listener reset it): earlier journaled batches are void. */
  reset(key: string): void {
    if (!this.recording(key)) return;
    const r = this.#rank(key);
    this.#batches -= r.entries.length;
    r.entries = [];
    r.last = null;
    r.reset = true;
  }

  /**
   * What installing a snapshot of `key` taken at `position` needs (see the file comment).
   * `position` null (the peer's listener had applied nothing): install, and re-apply everything.
   */
  plan(key: string, position: KvStreamPosition | null): JoinPlan {
    const r = this.#ranks.get(key);
    const entries = r?.entries ?? [];
    if (position === null) return { kind: "install", apply: [...entries], gap: null, floor: null };
    const p = position.seq;
    const atP = entries.find((e) => e.seq === p);
    if (atP !== undefined && atP.digest !== null && position.digest !== null && atP.digest !== position.digest) {
      return { kind: "stale", reason: `the batch at seq ${p} differs: the snapshot is of another publisher incarnation` };
    }
    if (r?.reset === true && atP === undefined) return { kind: "stale", reason: "the publisher restarted since the snapshot's position" };
    const apply = entries.filter((e) => e.seq > p);
    const last = r?.last ?? null;
    if (last === null || last <= p) return { kind: "install", apply, gap: null, floor: position };
    const firstKept = apply.length > 0 ? (apply[0] as JournalEntry).seq : last + 1n;
    // Seqs past P the journal lacks: shed at its bound, or never delivered (the listener's own
    // replay ran short). Either way the engine is asked; what it lacks is counted by the caller.
    const gap = firstKept > p + 1n ? { from: p + 1n, to: firstKept } : null;
    return { kind: "install", apply, gap, floor: null };
  }

  /** The rank is installed (or given up): stop journaling it. */
  finish(key: string): void {
    const r = this.#ranks.get(key);
    if (r === undefined) return;
    this.#batches -= r.entries.length;
    r.entries = [];
    this.#ranks.delete(key);
    this.#done.add(key);
  }

  /** The join is over: journal nothing more, free everything. */
  close(): void {
    this.#open = false;
    this.#ranks.clear();
    this.#done.clear();
    this.#fifo = [];
    this.#fifoHead = 0;
    this.#batches = 0;
  }

  #rank(key: string): RankJournal {
    let r = this.#ranks.get(key);
    if (r === undefined) {
      r = { entries: [], last: null, reset: false };
      this.#ranks.set(key, r);
    }
    return r;
  }

  #shedOldest(): void {
    for (;;) {
      const item = this.#fifo[this.#fifoHead];
      if (item === undefined) return;
      this.#fifo[this.#fifoHead] = undefined as unknown as { key: string; entry: JournalEntry };
      this.#fifoHead++;
      if (this.#fifoHead > 1024 && this.#fifoHead * 2 > this.#fifo.length) {
        this.#fifo = this.#fifo.slice(this.#fifoHead);
        this.#fifoHead = 0;
      }
      const r = this.#ranks.get(item.key);
      if (r === undefined || r.entries[0] !== item.entry) continue; // finished or reset since
      r.entries.shift();
      this.#batches--;
      this.#shed++;
      return;
    }
  }
}
