/**
 * Entries the mesh's decoders left out of a peer's batch or snapshot (#29, G1/G2 on the receiving
 * side): counted by reason, and logged at warn, throttled. Before, one bad entry refused the whole
 * batch, then every snapshot of that origin: a peer registering a worker of 5,000 taints (refused
 * by the decoder's bound) cut every replica off from it, with nothing logged above debug.
 *
 * The receive thread counts what it skips in its own stats (receive-coalescer.ts) and hands the
 * first few over with its hand-over; the main thread's decoders (snapshots, and batches without
 * the thread) count here. `kvmesh_mesh_entries_skipped_total{reason}` sums both.
 */
import type { Logger } from "pino";

import { LogThrottle } from "../src/util/log-throttle.js";
import { ENTRY_SKIP_REASONS, type EntrySkipReason, type SkippedEntry, type SkipSink } from "./wire.js";

export type EntrySkipCounts = Record<EntrySkipReason, number>;

export const zeroSkipCounts = (): EntrySkipCounts => ({ over_bound: 0, invalid: 0 });

export function addSkipCounts(a: Readonly<EntrySkipCounts>, b: Readonly<EntrySkipCounts>): EntrySkipCounts {
  const out = zeroSkipCounts();
  for (const r of ENTRY_SKIP_REASONS) out[r] = a[r] + b[r];
  return out;
}

export class EntrySkips {
  readonly counts: EntrySkipCounts = zeroSkipCounts();
  readonly #log: Logger;
  readonly #throttle: LogThrottle;

  constructor(logger: Logger, throttle: LogThrottle = new LogThrottle()) {
    this.#log = logger;
    this.#throttle = throttle;
  }

  /** The sink for a decoder on this thread: counts and logs each skipped entry. */
  readonly sink: SkipSink = (s) => {
    this.counts[s.reason]++;
    this.log(s, "");
  };

  /** Logs one skipped entry (counted elsewhere, e.g. by the receive thread); `from`: which frame. */
  log(s: SkippedEntry, from: string): void {
    this.#throttle.hit((suppressed) => {
      this.#log.warn({ field: s.field, reason: s.reason, ...(from === "" ? {} : { from }), suppressed }, `mesh entry skipped (the rest of its batch or snapshot applies): ${s.message}`);
    });
  }
}
