/**
 * Aggregate load replication for bench:scale --stress: the fake origin's synthetic bookings
 * (synthetic-bookings.ts BookingSchedule) kept as a real replica keeps its own bookings in
 * aggregate mode (src/core/load-ledger.ts for the per-rank totals, src/core/load-aggregates.ts
 * LoadAggregation for what is published), so a real peer mirrors it exactly as it mirrors a
 * replica:
 * - per rank (worker_id, dp_rank 0): requests = live bookings; prefill_tokens = the prompt
 *   tokens of those still in prefill (no duration hint, so nothing decays); blocks = the UNIQUE
 *   sequence hashes of the live bookings (a hash two bookings share counts once, as the ledger
 *   counts it). The stress prompts do share: request k goes to worker (k mod workers) + 1 with
 *   prompt k mod prompts, so with 1,024 workers and 16 prompts a worker's bookings all carry the
 *   same prompt. The union is kept with a refcount per (rank, prompt) and per (rank, hash), the
 *   hashes being touched only when a prompt starts or stops being live on the rank;
 * - `take()`: the absolute totals of the ranks that changed since the last take, with the ids
 *   booked and ended since (one booked and ended in between is in neither), as LoadAggregation.take;
 * - `publishedRequests`: the requests the totals taken so far add up to (the heartbeat's count);
 * - `snapshot()`: every rank with load, every live id as added, nothing removed.
 * Pure: no clock, no I/O.
 */
import type { HashList } from "../../src/core/index.js";
import type { AddedBooking, LoadAggregateRow, LoadAggregates } from "../../src/core/index.js";
import { BookingSchedule, SYNTHETIC_PARTITION, type ScheduleSink, type SyntheticBookingsOptions } from "./synthetic-bookings.js";

interface RankTotals {
  readonly workerId: bigint;
  requests: number;
  prefillTokens: number;
  /** Live bookings per prompt (by identity: the schedule hands out the same HashList objects). */
  readonly prompts: Map<HashList, number>;
  /** Live prompts' sequence hashes ("hi:lo") -> how many live prompts carry it; size = blocks. */
  readonly hashes: Map<string, number>;
  /** Requests in the totals last taken for this rank. */
  published: number;
  changed: boolean;
}

interface LiveBooking {
  readonly rank: RankTotals;
  readonly hashes: HashList;
  prefillDone: boolean;
}

/** Hash keys of a prompt, built once per prompt. */
const keyCache = new WeakMap<HashList, string[]>();
function hashKeys(list: HashList): string[] {
  let keys = keyCache.get(list);
  if (keys === undefined) {
    keys = [];
    for (let i = 0; i + 1 < list.length; i += 2) keys.push(`${list[i]}:${list[i + 1]}`);
    keyCache.set(list, keys);
  }
  return keys;
}

export class AggregateBookings {
  readonly #schedule: BookingSchedule;
  readonly #o: Required<SyntheticBookingsOptions>;
  readonly #ranks = new Map<bigint, RankTotals>();
  readonly #live = new Map<string, LiveBooking>();
  readonly #changed: RankTotals[] = [];
  readonly #added = new Map<string, AddedBooking>();
  readonly #removed = new Set<string>();
  #publishedRequests = 0;
  readonly #sink: ScheduleSink = {
    prefillDue: (id) => {
      const b = this.#live.get(id);
      if (b === undefined || b.prefillDone) return;
      b.prefillDone = true;
      b.rank.prefillTokens -= this.#o.promptTokens;
      this.#touch(b.rank);
    },
    freeDue: (id) => {
      const b = this.#live.get(id);
      if (b === undefined) return;
      this.#live.delete(id);
      const r = b.rank;
      r.requests--;
      if (!b.prefillDone) r.prefillTokens -= this.#o.promptTokens;
      const n = (r.prompts.get(b.hashes) ?? 0) - 1;
      if (n > 0) r.prompts.set(b.hashes, n);
      else {
        r.prompts.delete(b.hashes);
        for (const key of hashKeys(b.hashes)) {
          const c = (r.hashes.get(key) ?? 0) - 1;
          if (c > 0) r.hashes.set(key, c);
          else r.hashes.delete(key);
        }
      }
      this.#touch(r);
      if (!this.#added.delete(id)) this.#removed.add(id);
    },
    booked: (_k, id, workerId, hashes) => {
      let r = this.#ranks.get(workerId);
      if (r === undefined) {
        r = { workerId, requests: 0, prefillTokens: 0, prompts: new Map(), hashes: new Map(), published: 0, changed: false };
        this.#ranks.set(workerId, r);
      }
      r.requests++;
      r.prefillTokens += this.#o.promptTokens;
      const n = r.prompts.get(hashes) ?? 0;
      r.prompts.set(hashes, n + 1);
      if (n === 0) for (const key of hashKeys(hashes)) r.hashes.set(key, (r.hashes.get(key) ?? 0) + 1);
      this.#touch(r);
      this.#live.set(id, { rank: r, hashes, prefillDone: false });
      this.#added.set(id, { id, worker_id: workerId, dp_rank: 0 });
    },
  };

  constructor(o: SyntheticBookingsOptions) {
    this.#schedule = new BookingSchedule(o);
    this.#o = this.#schedule.options;
  }

  /** Requests booked so far. */
  get issued(): number {
    return this.#schedule.issued;
  }

  /** Bookings added and not yet freed. */
  get live(): number {
    return this.#live.size;
  }

  /** Requests the totals taken so far add up to: what a peer that applied them all mirrors. */
  get publishedRequests(): number {
    return this.#publishedRequests;
  }

  /** The prefill marks and frees due at `nowMs`, then `newRequests` bookings; whether any total changed. */
  step(nowMs: number, newRequests: number): boolean {
    this.#schedule.advance(nowMs, newRequests, this.#sink);
    return this.#changed.length > 0 || this.#added.size > 0 || this.#removed.size > 0;
  }

  /** The changed ranks' totals and the ids booked and ended since the last take; empty when nothing changed. */
  take(): LoadAggregates[] {
    if (this.#changed.length === 0 && this.#added.size === 0 && this.#removed.size === 0) return [];
    const rows: LoadAggregateRow[] = [];
    for (const r of this.#changed) {
      r.changed = false;
      rows.push(this.#row(r));
      this.#publishedRequests += r.requests - r.published;
      r.published = r.requests;
    }
    this.#changed.length = 0;
    const added = [...this.#added.values()];
    const removed = [...this.#removed];
    this.#added.clear();
    this.#removed.clear();
    return [{ partition: SYNTHETIC_PARTITION, block_size: this.#o.blockSize, rows, added, removed }];
  }

  /** Every rank with load and every live id (as added): what a snapshot of this origin carries. */
  snapshot(): LoadAggregates[] {
    const rows: LoadAggregateRow[] = [];
    for (const r of this.#ranks.values()) if (r.requests > 0) rows.push(this.#row(r));
    const added: AddedBooking[] = [];
    for (const [id, b] of this.#live) added.push({ id, worker_id: b.rank.workerId, dp_rank: 0 });
    if (rows.length === 0 && added.length === 0) return [];
    return [{ partition: SYNTHETIC_PARTITION, block_size: this.#o.blockSize, rows, added, removed: [] }];
  }

  #row(r: RankTotals): LoadAggregateRow {
    return { worker_id: r.workerId, dp_rank: 0, prefill_tokens: r.prefillTokens, blocks: r.hashes.size, requests: r.requests };
  }

  #touch(r: RankTotals): void {
    if (r.changed) return;
    r.changed = true;
    this.#changed.push(r);
  }
}
