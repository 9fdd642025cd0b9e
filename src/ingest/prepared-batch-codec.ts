/**
 * A prepared batch (prepare-kv-batch.ts) as one Uint32Array, which the ingest thread transfers to
 * the main thread instead of letting postMessage clone the batch's objects: cloning a batch of 4
 * events with its 6 hash lists cost ~54 us (0.4 us a block op, as much as indexing it), moving a
 * buffer costs one allocation. The main thread reads the events back with their hash lists as
 * views into the buffer, no copy.
 *
 * Words: [event count, then per event]
 *   cleared: 2
 *   removed: 1, tier, n, n hash pairs (hi, lo)
 *   stored:  0, tier, flags (1 parent, 2 eagle), parent hi, parent lo, block size, lora name
 *            index, cache salt index (NO_STRING: none), n, n engine pairs, m, m content pairs
 * Strings (lora names, salts) travel beside the buffer. A batch the form cannot hold (a stored
 * event whose content hashes were not computed, or with multimodal hashes) is not encoded
 * (null): it is posted as it is.
 */
import type { KvEvent, KvEventBatch, StorageTier } from "../core/index.js";

export const PREPARED_STORED = 0;
export const PREPARED_REMOVED = 1;
export const PREPARED_CLEARED = 2;
export const PREPARED_HAS_PARENT = 1;
const EAGLE = 2;
export const PREPARED_NO_STRING = 0xffff_ffff;
const STORED = PREPARED_STORED;
const REMOVED = PREPARED_REMOVED;
const CLEARED = PREPARED_CLEARED;
const HAS_PARENT = PREPARED_HAS_PARENT;
const NO_STRING = PREPARED_NO_STRING;
const TIERS: readonly StorageTier[] = ["device", "host", "disk"];
const MASK32 = 0xffff_ffffn;

/** A tier's code in the prepared form. */
export const tierCode = (tier: StorageTier): number => TIERS.indexOf(tier);

export interface EncodedBatch {
  readonly words: Uint32Array;
  readonly strings: string[];
}

/** A whole batch in the prepared form: what the ingest thread hands to the main thread. */
export interface PreparedKvBatch extends EncodedBatch {
  readonly ts: number;
  readonly dpRank: number | null;
}

export function encodePreparedBatch(batch: KvEventBatch): EncodedBatch | null {
  let size = 1;
  for (const ev of batch.events) {
    if (ev.type === "cleared") size += 1;
    else if (ev.type === "removed") size += 3 + (ev.engineHashes?.length ?? Number.NaN);
    else if (ev.localHashes === undefined || ev.engineHashes === undefined || ev.blockMmHashes !== undefined) return null;
    else size += 10 + ev.engineHashes.length + ev.localHashes.length;
  }
  if (!Number.isFinite(size)) return null;
  const w = new Uint32Array(size);
  const strings: string[] = [];
  const str = (s: string | null | undefined): number => (s === null || s === undefined ? NO_STRING : strings.push(s) - 1);
  let o = 0;
  w[o++] = batch.events.length;
  for (const ev of batch.events) {
    if (ev.type === "cleared") {
      w[o++] = CLEARED;
    } else if (ev.type === "removed") {
      const h = ev.engineHashes as Uint32Array;
      w[o++] = REMOVED;
      w[o++] = TIERS.indexOf(ev.tier);
      w[o++] = h.length >>> 1;
      w.set(h, o);
      o += h.length;
    } else {
      const h = ev.engineHashes as Uint32Array;
      const l = ev.localHashes as Uint32Array;
      w[o++] = STORED;
      w[o++] = TIERS.indexOf(ev.tier);
      w[o++] = (ev.parentHash !== null ? HAS_PARENT : 0) | (ev.eagle ? EAGLE : 0);
      w[o++] = ev.parentHash === null ? 0 : Number(ev.parentHash >> 32n);
      w[o++] = ev.parentHash === null ? 0 : Number(ev.parentHash & MASK32);
      w[o++] = ev.blockSize ?? 0;
      w[o++] = str(ev.loraName);
      w[o++] = str(ev.cacheSalt);
      w[o++] = h.length >>> 1;
      w.set(h, o);
      o += h.length;
      w[o++] = l.length >>> 1;
      w.set(l, o);
      o += l.length;
    }
  }
  return { words: w, strings };
}

/**
 * The batch back as events whose hash lists are views into `w`. Runs on the main thread for every
 * batch the ingest thread hands over, so it is written flat: no closure, no spread (the closures
 * and the conditional spread were ~7% of the main thread's apply, bench:ingest --apply-only).
 */
export function decodePreparedBatch(ts: number, dpRank: number | null, w: Uint32Array, strings: readonly string[]): KvEventBatch {
  const n = w[0] as number;
  const events: KvEvent[] = new Array<KvEvent>(n);
  let o = 1;
  for (let i = 0; i < n; i++) {
    const kind = w[o++];
    if (kind === CLEARED) {
      events[i] = { type: "cleared" };
    } else if (kind === REMOVED) {
      const t = TIERS[w[o] as number] as StorageTier;
      const count = (w[o + 1] as number) * 2;
      o += 2;
      events[i] = { type: "removed", blockHashes: [], tier: t, engineHashes: w.subarray(o, o + count) };
      o += count;
    } else {
      const t = TIERS[w[o] as number] as StorageTier;
      const flags = w[o + 1] as number;
      const hi = w[o + 2] as number;
      const lo = w[o + 3] as number;
      const blockSize = w[o + 4] as number;
      const lora = w[o + 5] as number;
      const salt = w[o + 6] as number;
      const engineCount = (w[o + 7] as number) * 2;
      o += 8;
      const engineHashes = w.subarray(o, o + engineCount);
      o += engineCount;
      const localCount = (w[o++] as number) * 2;
      const localHashes = w.subarray(o, o + localCount);
      o += localCount;
      const ev: KvEvent = {
        type: "stored",
        blockHashes: [],
        parentHash: (flags & HAS_PARENT) !== 0 ? (BigInt(hi) << 32n) | BigInt(lo) : null,
        tokenIds: [],
        blockSize,
        loraName: lora === NO_STRING ? null : (strings[lora] as string),
        tier: t,
        eagle: (flags & EAGLE) !== 0,
        engineHashes,
        localHashes,
      };
      if (salt !== NO_STRING) ev.cacheSalt = strings[salt] as string;
      events[i] = ev;
    }
  }
  return { ts, events, dpRank };
}
