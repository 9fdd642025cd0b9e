/**
 * Open-addressing hash map (tag: u32, hi: u32, lo: u32) -> non-negative int32, over one Int32Array.
 *
 * Why it exists: V8's Map keyed by BigInt is an order of magnitude slower per get; this table
 * costs 16 bytes per slot with no per-entry heap object, which matters at the millions of
 * entries of `npm run bench:core`.
 *
 * Layout: slot i occupies [4i .. 4i+3] = (tag, hi, lo, value); value -1 marks an empty slot, which is
 * why values must be in [0, 2^31). Keys sit next to their value so a probe touches one cache line.
 * Linear probing over a power-of-two capacity, grown (doubled) past 0.7 load; deletion uses
 * backward shifting, so there are no tombstones and probe chains never degrade with churn.
 */
import { badRequest } from "./errors.js";

const EMPTY = -1;
const SLOT_STRIDE = 4;
export const DEFAULT_U64_TABLE_CAPACITY = 16;
/** Linear probing stays at ~2 probes per hit up to ~0.7 load; past it chains grow quickly. */
const MAX_LOAD_FACTOR = 0.7;
/** 2^27 slots x 16 bytes = 2 GiB: beyond that a single Int32Array cannot grow anyway. */
const MAX_CAPACITY = 1 << 27;

/** 32-bit mix of the three key words (murmur3-style finalizer); the low bits pick the home slot. */
function mix(tag: number, hi: number, lo: number): number {
  let h = Math.imul(lo ^ Math.imul(hi, 0x9e3779b1), 0x85ebca6b) ^ Math.imul(tag, 0xc2b2ae35);
  h ^= h >>> 16;
  h = Math.imul(h, 0x7feb352d);
  h ^= h >>> 15;
  h = Math.imul(h, 0x846ca68b);
  return h ^ (h >>> 16);
}

/** Smallest power of two >= `slots` (at least 8). */
function roundCapacity(slots: number): number {
  let cap = 8;
  while (cap < slots) cap *= 2;
  return cap;
}

export class U64Table {
  readonly #initialCapacity: number;
  readonly #maxLoad: number;
  #slots: Int32Array;
  #mask: number;
  #size = 0;
  #growAt: number;

  /**
   * `initialCapacity` is in slots, rounded up to a power of two. `maxLoad` (in (0, 0.7]): grow
   * past this share of slots used; lower for a table whose keys mostly come and go (shorter probe
   * runs for inserts, misses and the backward shift of deletes, at more memory).
   */
  constructor(initialCapacity = DEFAULT_U64_TABLE_CAPACITY, maxLoad = MAX_LOAD_FACTOR) {
    if (!Number.isInteger(initialCapacity) || initialCapacity < 1) {
      throw badRequest(`initialCapacity must be a positive integer, got ${initialCapacity}`, "initialCapacity");
    }
    if (!(maxLoad > 0 && maxLoad <= MAX_LOAD_FACTOR)) throw badRequest(`maxLoad must be in (0, ${MAX_LOAD_FACTOR}], got ${maxLoad}`, "maxLoad");
    this.#maxLoad = maxLoad;
    this.#initialCapacity = roundCapacity(initialCapacity);
    this.#slots = U64Table.#allocate(this.#initialCapacity);
    this.#mask = this.#initialCapacity - 1;
    this.#growAt = Math.floor(this.#initialCapacity * maxLoad);
  }

  static #allocate(capacity: number): Int32Array {
    // Assertion (a programming error, never input): the fleet limits (maxPartitions, maxRanks) and the index bounds keep a table far below it.
    if (capacity > MAX_CAPACITY) throw new RangeError(`U64Table cannot grow beyond ${MAX_CAPACITY} slots`);
    // Every word, keys too (an empty slot's keys are never read): one native fill instead of a
    // strided loop, ~3x less of the warm join's decoding thread, which builds 1,024 tables.
    return new Int32Array(capacity * SLOT_STRIDE).fill(EMPTY);
  }

  get size(): number {
    return this.#size;
  }

  /** Bytes held by the backing typed array. */
  get byteSize(): number {
    return this.#slots.byteLength;
  }

  get capacity(): number {
    return this.#mask + 1;
  }

  /** The stored value, or -1 when the key is absent. */
  get(tag: number, hi: number, lo: number): number {
    const s = this.#slots;
    const mask = this.#mask;
    const t = tag | 0;
    const h = hi | 0;
    const l = lo | 0;
    let i = mix(t, h, l) & mask;
    for (;;) {
      const b = i * SLOT_STRIDE;
      const v = s[b + 3] as number;
      if (v === EMPTY) return -1;
      if (s[b + 2] === l && s[b + 1] === h && s[b] === t) return v;
      i = (i + 1) & mask;
    }
  }

  has(tag: number, hi: number, lo: number): boolean {
    return this.get(tag, hi, lo) !== -1;
  }

  /** Inserts or overwrites. `value` must be an integer in [0, 2^31). */
  set(tag: number, hi: number, lo: number, value: number): void {
    this.#makeRoomFor(value);
    this.#insert(tag | 0, hi | 0, lo | 0, value);
  }

  /**
   * Inserts unless the key is there: returns -1 when it inserted, else the value already held
   * (left as it is). One probe where get then set take two.
   */
  setIfAbsent(tag: number, hi: number, lo: number, value: number): number {
    this.#makeRoomFor(value);
    const s = this.#slots;
    const mask = this.#mask;
    const t = tag | 0;
    const h = hi | 0;
    const l = lo | 0;
    let i = mix(t, h, l) & mask;
    for (;;) {
      const b = i * SLOT_STRIDE;
      const v = s[b + 3] as number;
      if (v === EMPTY) {
        s[b] = t;
        s[b + 1] = h;
        s[b + 2] = l;
        s[b + 3] = value;
        this.#size++;
        return -1;
      }
      if (s[b + 2] === l && s[b + 1] === h && s[b] === t) return v;
      i = (i + 1) & mask;
    }
  }

  /** Before an insert: the value checked, and the table grown past its load bound. */
  #makeRoomFor(value: number): void {
    // Assertion (a programming error, never input): callers store rank keys and slot indices, all in range.
    if ((value | 0) !== value || value < 0) throw new RangeError(`U64Table value must be in [0, 2^31), got ${value}`);
    if (this.#size >= this.#growAt) this.#resize((this.#mask + 1) * 2);
  }

  #insert(t: number, h: number, l: number, value: number): void {
    const s = this.#slots;
    const mask = this.#mask;
    let i = mix(t, h, l) & mask;
    for (;;) {
      const b = i * SLOT_STRIDE;
      if (s[b + 3] === EMPTY) {
        s[b] = t;
        s[b + 1] = h;
        s[b + 2] = l;
        s[b + 3] = value;
        this.#size++;
        return;
      }
      if (s[b + 2] === l && s[b + 1] === h && s[b] === t) {
        s[b + 3] = value;
        return;
      }
      i = (i + 1) & mask;
    }
  }

  /** Removes the key; returns whether it was present. */
  delete(tag: number, hi: number, lo: number): boolean {
    return this.take(tag, hi, lo) !== -1;
  }

  /**
   * Removes the key and returns its value, or -1 when it is absent: one probe where get then
   * delete took two (the index's applyRemoved does this for every evicted block).
   */
  take(tag: number, hi: number, lo: number): number {
    const s = this.#slots;
    const mask = this.#mask;
    const t = tag | 0;
    const h = hi | 0;
    const l = lo | 0;
    let i = mix(t, h, l) & mask;
    for (;;) {
      const b = i * SLOT_STRIDE;
      if (s[b + 3] === EMPTY) return -1;
      if (s[b + 2] === l && s[b + 1] === h && s[b] === t) break;
      i = (i + 1) & mask;
    }
    const taken = s[i * SLOT_STRIDE + 3] as number;
    // Backward shift: pull later members of the probe run into the hole unless their home slot
    // lies cyclically in (hole, j], where moving them would put them before their home.
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      const bj = j * SLOT_STRIDE;
      if (s[bj + 3] === EMPTY) break;
      const home = mix(s[bj] as number, s[bj + 1] as number, s[bj + 2] as number) & mask;
      const stays = i <= j ? i < home && home <= j : i < home || home <= j;
      if (stays) continue;
      const bi = i * SLOT_STRIDE;
      s[bi] = s[bj] as number;
      s[bi + 1] = s[bj + 1] as number;
      s[bi + 2] = s[bj + 2] as number;
      s[bi + 3] = s[bj + 3] as number;
      i = j;
    }
    s[i * SLOT_STRIDE + 3] = EMPTY;
    this.#size--;
    return taken;
  }

  /**
   * Visits every entry (tags/hi/lo as uint32). The table must not be mutated from inside the
   * callback: backward-shift deletion can move unvisited entries behind the cursor.
   */
  forEach(cb: (tag: number, hi: number, lo: number, value: number) => void): void {
    U64Table.forEachSlot(this.#slots, cb);
  }

  /**
   * The backing slots, read-only and valid until the table next changes: the warm join's export
   * copies them in one synchronous step and walks the copy on a thread (forEachSlot there visits
   * the entries in the order forEach does).
   */
  slotsView(): Int32Array {
    return this.#slots;
  }

  /** forEach over slots in this layout (slotsView's, or a copy of them). */
  static forEachSlot(s: Int32Array, cb: (tag: number, hi: number, lo: number, value: number) => void): void {
    for (let b = 0; b < s.length; b += SLOT_STRIDE) {
      const v = s[b + 3] as number;
      if (v !== EMPTY) cb((s[b] as number) >>> 0, (s[b + 1] as number) >>> 0, (s[b + 2] as number) >>> 0, v);
    }
  }

  /**
   * The backing slots and entry count, for another thread to adopt (U64Table.adopt) after a
   * transfer: the warm join's decoding thread builds a rank's lookup table off the main thread.
   * The table is left empty at its initial capacity.
   */
  handOver(): { slots: Int32Array; size: number } {
    const out = { slots: this.#slots, size: this.#size };
    this.clear();
    return out;
  }

  /**
   * A table over slots another table handed over (handOver), in this layout. Checks the shape
   * (a power-of-two capacity of whole slots under the load bound) and the size against a count
   * of the occupied slots, so slots from elsewhere cannot leave the table inconsistent.
   * `countSlots` false skips the count (it reads every slot: ~0.25 s for the warm join's 1,024
   * tables of 8,192 slots) for slots a U64Table of this process's own code handed over.
   */
  static adopt(slots: Int32Array, size: number, countSlots = true): U64Table {
    const capacity = slots.length / SLOT_STRIDE;
    if (!Number.isInteger(capacity) || capacity < 8 || (capacity & (capacity - 1)) !== 0 || capacity > MAX_CAPACITY) {
      throw badRequest(`adopted slots must be a power-of-two number of ${SLOT_STRIDE}-word slots, got ${slots.length} words`, "slots");
    }
    let used = size;
    if (countSlots) {
      used = 0;
      for (let b = 3; b < slots.length; b += SLOT_STRIDE) if ((slots[b] as number) !== EMPTY) used++;
    }
    if (used !== size || size < 0 || size > Math.floor(capacity * MAX_LOAD_FACTOR)) throw badRequest(`adopted slots hold ${used} entries, said ${size} (capacity ${capacity})`, "size");
    // A table of the smallest capacity, then the adopted slots: sizing it to `capacity` first
    // allocated and filled a second array as large, only to drop it (~0.15 s of a warm join's
    // 1,024 ranks, most of it garbage collection).
    const t = new U64Table(1);
    t.#slots = slots;
    t.#mask = capacity - 1;
    t.#growAt = Math.floor(capacity * MAX_LOAD_FACTOR);
    t.#size = size;
    return t;
  }

  /**
   * Replaces every value v with map[v] (one pass over the slots, no probe): an adopted table's
   * values name the snapshot's nodes until the importer knows its own. Every value must index
   * `map`, and every mapped value must be in [0, 2^31).
   */
  remapValues(map: Int32Array): void {
    const s = this.#slots;
    for (let b = 3; b < s.length; b += SLOT_STRIDE) {
      const v = s[b] as number;
      if (v === EMPTY) continue;
      const to = map[v];
      // Assertion (a programming error, never input): the importer maps every node an entry names.
      if (to === undefined || to < 0) throw new RangeError(`U64Table.remapValues: value ${v} maps to ${to}`);
      s[b] = to;
    }
  }

  /** Drops every entry and returns to the initial capacity (releasing the large array). */
  clear(): void {
    this.#slots = U64Table.#allocate(this.#initialCapacity);
    this.#mask = this.#initialCapacity - 1;
    this.#growAt = Math.floor(this.#initialCapacity * this.#maxLoad);
    this.#size = 0;
  }

  #resize(capacity: number): void {
    const old = this.#slots;
    this.#slots = U64Table.#allocate(capacity);
    this.#mask = capacity - 1;
    this.#growAt = Math.floor(capacity * this.#maxLoad);
    this.#size = 0;
    for (let b = 0; b < old.length; b += SLOT_STRIDE) {
      const v = old[b + 3] as number;
      if (v !== EMPTY) this.#insert(old[b] as number, old[b + 1] as number, old[b + 2] as number, v);
    }
  }
}
