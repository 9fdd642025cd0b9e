/**
 * The `/select` -> `/reservations` cache (Dynamo's lib/kv-router/src/services/selection/pending.rs): a selection made without a
 * booking is kept, keyed by (partition, selection id), until the caller books it or it expires.
 * Replica-local by design; the value type is the caller's.
 *
 * Every entry has the same TTL and the clock is monotonic, so insertion order is both expiry
 * order and eviction order. Entries sit in an intrusive doubly-linked list (oldest at the head):
 * sweeping and evicting pop the head, a remove unlinks in O(1), and a re-insert unlinks and
 * appends so the key moves to the back. The order index therefore holds exactly the live entries
 * and cannot grow behind a long-lived front entry (the reference's
 * `order_index_bounded_by_live_entries_under_pinned_front`). A single Map in insertion order was
 * measured first: finding its front after front deletions walks V8's tombstones (several times
 * this list's cost per evicting insert when full, `npm run bench:core`), and a
 * composite string key pays a fresh string hash per lookup, hence the list and nested maps.
 *
 * Large entries (a prompt of millions of tokens) have a budget of their own inside the byte
 * budget, and past it they evict each other, oldest first, before anything else: 67 `/select`s
 * of 2M-token prompts (~4 MB each) used to fill the whole 256 MiB and push every other caller's
 * selection out, so their `POST /reservations` got 404. Now such a caller churns only the large
 * entries; everyone else's stay until they expire or the entry cap is reached.
 */

import { KvmeshError } from "./errors.js";
import type { Clock } from "./time.js";

export const DEFAULT_PENDING_TTL_MS = 120_000;
export const DEFAULT_PENDING_MAX_ENTRIES = 4_096;
/** 256 MiB. */
export const DEFAULT_PENDING_MAX_BYTES = 268_435_456;
/** An entry above maxBytes / this is large: 1 MiB by default, a prompt of ~64k blocks (4M tokens at block size 64, 1M at 16). */
export const PENDING_LARGE_ENTRY_DIVISOR = 256;
/** Large entries together hold at most maxBytes / this: 64 MiB by default. */
export const PENDING_LARGE_BUDGET_DIVISOR = 4;

export interface PendingSelectionsOptions {
  readonly clock: Clock;
  readonly ttlMs?: number;
  readonly maxEntries?: number;
  readonly maxBytes?: number;
  /** Entries above this many bytes are large. Default maxBytes / PENDING_LARGE_ENTRY_DIVISOR. */
  readonly largeEntryBytes?: number;
  /** Byte budget of the large entries together. Default maxBytes / PENDING_LARGE_BUDGET_DIVISOR. */
  readonly maxLargeBytes?: number;
}

export interface PendingHit<V> {
  readonly value: V;
  readonly generation: number;
}

interface Slot<V> {
  readonly partitionKey: string;
  readonly selectionId: string;
  readonly value: V;
  readonly bytes: number;
  readonly generation: number;
  readonly insertedAtMs: number;
  prev: Slot<V> | undefined;
  next: Slot<V> | undefined;
  /** Large entries only: their own list, oldest first. */
  readonly large: boolean;
  largePrev: Slot<V> | undefined;
  largeNext: Slot<V> | undefined;
}

export class PendingSelections<V> {
  readonly ttlMs: number;
  readonly maxEntries: number;
  readonly maxBytes: number;
  readonly largeEntryBytes: number;
  readonly maxLargeBytes: number;
  readonly #clock: Clock;
  /** partition -> selection id -> slot; an emptied partition map is deleted. */
  readonly #byPartition = new Map<string, Map<string, Slot<V>>>();
  #head: Slot<V> | undefined;
  #tail: Slot<V> | undefined;
  #size = 0;
  #bytes = 0;
  #largeHead: Slot<V> | undefined;
  #largeTail: Slot<V> | undefined;
  #largeBytes = 0;
  #evictions = 0;
  #largeEvictions = 0;
  #nextGeneration = 1;

  constructor(options: PendingSelectionsOptions) {
    this.ttlMs = positive("ttlMs", options.ttlMs ?? DEFAULT_PENDING_TTL_MS);
    this.maxEntries = positive("maxEntries", options.maxEntries ?? DEFAULT_PENDING_MAX_ENTRIES);
    this.maxBytes = positive("maxBytes", options.maxBytes ?? DEFAULT_PENDING_MAX_BYTES);
    this.largeEntryBytes = positive("largeEntryBytes", options.largeEntryBytes ?? this.maxBytes / PENDING_LARGE_ENTRY_DIVISOR);
    this.maxLargeBytes = positive("maxLargeBytes", options.maxLargeBytes ?? this.maxBytes / PENDING_LARGE_BUDGET_DIVISOR);
    this.#clock = options.clock;
  }

  get size(): number {
    return this.#size;
  }

  /** Sum of the callers' approximate sizes of the cached entries. */
  get bytes(): number {
    return this.#bytes;
  }

  /** Live entries pushed out by the entry cap or the byte budgets (expiry is not counted). */
  get evictions(): number {
    return this.#evictions;
  }

  /** Of `evictions`, large entries pushed out by other large entries (the large budget). */
  get largeEvictions(): number {
    return this.#largeEvictions;
  }

  /** Bytes held by large entries. */
  get largeBytes(): number {
    return this.#largeBytes;
  }

  /**
   * Caches a selection and returns its generation. The latest insert for a key wins. A large
   * entry past the large budget evicts the oldest large entries first; then, past the entry cap
   * or byte budget, the oldest entries go. The entry just inserted is never evicted, so one entry
   * larger than the whole budget is kept alone rather than lost.
   */
  insert(partitionKey: string, selectionId: string, value: V, bytes: number): number {
    if (!Number.isFinite(bytes) || bytes < 0) {
      throw new KvmeshError("KVMESH_INTERNAL", `pending selection size must be a finite byte count >= 0 (got ${bytes})`);
    }
    const now = this.#clock.now();
    this.#sweepAt(now);
    let partition = this.#byPartition.get(partitionKey);
    if (partition === undefined) {
      partition = new Map();
      this.#byPartition.set(partitionKey, partition);
    } else {
      const previous = partition.get(selectionId);
      if (previous !== undefined) this.#unlink(previous);
    }
    const slot: Slot<V> = {
      partitionKey,
      selectionId,
      value,
      bytes,
      generation: this.#nextGeneration++,
      insertedAtMs: now,
      prev: this.#tail,
      next: undefined,
      large: bytes > this.largeEntryBytes,
      largePrev: undefined,
      largeNext: undefined,
    };
    if (this.#tail === undefined) this.#head = slot;
    else this.#tail.next = slot;
    this.#tail = slot;
    partition.set(selectionId, slot);
    this.#size++;
    this.#bytes += bytes;
    if (slot.large) {
      slot.largePrev = this.#largeTail;
      if (this.#largeTail === undefined) this.#largeHead = slot;
      else this.#largeTail.largeNext = slot;
      this.#largeTail = slot;
      this.#largeBytes += bytes;
      while (this.#largeHead !== undefined && this.#largeHead !== slot && this.#largeBytes > this.maxLargeBytes) {
        this.#drop(this.#largeHead);
        this.#evictions++;
        this.#largeEvictions++;
      }
    }
    while (this.#head !== undefined && this.#head !== slot && (this.#size > this.maxEntries || this.#bytes > this.maxBytes)) {
      this.#drop(this.#head);
      this.#evictions++;
    }
    return slot.generation;
  }

  /** The cached selection, unless absent or expired (an expired one is removed). */
  peek(partitionKey: string, selectionId: string): PendingHit<V> | undefined {
    const slot = this.#byPartition.get(partitionKey)?.get(selectionId);
    if (slot === undefined) return undefined;
    if (this.#expired(slot, this.#clock.now())) {
      this.#drop(slot);
      return undefined;
    }
    return { value: slot.value, generation: slot.generation };
  }

  /**
   * Removes the entry; with `generation`, only if it is still that insert, so a booking that
   * raced a newer `/select` for the same id does not consume the newer selection.
   */
  remove(partitionKey: string, selectionId: string, generation?: number): boolean {
    const slot = this.#byPartition.get(partitionKey)?.get(selectionId);
    if (slot === undefined) return false;
    if (generation !== undefined && slot.generation !== generation) return false;
    this.#drop(slot);
    return true;
  }

  /** Removes expired entries; returns how many. */
  sweep(): number {
    return this.#sweepAt(this.#clock.now());
  }

  #sweepAt(now: number): number {
    let removed = 0;
    while (this.#head !== undefined && this.#expired(this.#head, now)) {
      this.#drop(this.#head);
      removed++;
    }
    return removed;
  }

  #expired(slot: Slot<V>, now: number): boolean {
    return now - slot.insertedAtMs >= this.ttlMs;
  }

  /** Removes a slot from the list and the key maps. */
  #drop(slot: Slot<V>): void {
    this.#unlink(slot);
    const partition = this.#byPartition.get(slot.partitionKey);
    if (partition === undefined) return;
    partition.delete(slot.selectionId);
    if (partition.size === 0) this.#byPartition.delete(slot.partitionKey);
  }

  /** Removes a slot from the list and the counters (the key map entry is the caller's job). */
  #unlink(slot: Slot<V>): void {
    if (slot.prev === undefined) this.#head = slot.next;
    else slot.prev.next = slot.next;
    if (slot.next === undefined) this.#tail = slot.prev;
    else slot.next.prev = slot.prev;
    slot.prev = undefined;
    slot.next = undefined;
    this.#size--;
    this.#bytes -= slot.bytes;
    if (!slot.large) return;
    if (slot.largePrev === undefined) this.#largeHead = slot.largeNext;
    else slot.largePrev.largeNext = slot.largeNext;
    if (slot.largeNext === undefined) this.#largeTail = slot.largePrev;
    else slot.largeNext.largePrev = slot.largePrev;
    slot.largePrev = undefined;
    slot.largeNext = undefined;
    this.#largeBytes -= slot.bytes;
  }
}

function positive(field: string, value: number): number {
  if (!Number.isFinite(value) || value <= 0) {
    throw new KvmeshError("KVMESH_INTERNAL", `pending selections ${field} must be a positive number (got ${value})`);
  }
  return value;
}
