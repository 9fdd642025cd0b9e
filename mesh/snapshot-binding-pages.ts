/**
 * The pulling side of a snapshot sent in pages (#29 G16): each page of bindings is decoded on a
 * worker thread (binding-page-decoder.ts) and applied here in slices of the event loop, so
 * `/health` and `/select` keep answering while 1,000,000 bindings arrive. Before, the snapshot
 * was one reply: over 1,000,000 bindings it was refused whole, and decoding 1,000,000 took
 * 4.8-7.8 s on the main thread, with nothing answered meanwhile.
 *
 * Bindings merge last-writer-wins on their version, so they apply after the rest of the
 * snapshot (catalogue, statuses, load) and in any order against the stream's own binding events.
 * A page that fails (a timeout, the peer's cursor closed) leaves the bindings applied so far and
 * pulls a fresh snapshot of that origin after PAGE_RETRY_DELAY_MS, counted as a snapshot failure.
 */
import type { Logger } from "pino";

import type { BindingEvent, Clock, Timers } from "../src/core/index.js";
import type { BindingPageDecoder, DecodedPage } from "./binding-page-decoder.js";
import type { EntrySkips } from "./entry-skips.js";
import type { ReplicaEvent, ReplicaPort } from "./replica-port.js";
import type { SnapshotPages } from "./snapshot-pulls.js";
import { ENTRY_SKIP_REASONS } from "./wire.js";
import { LogThrottle } from "../src/util/log-throttle.js";

/**
 * The apply yields the event loop once a slice has run this long, ms: a binding merge takes
 * ~1-2 us, so a slice is a few thousand bindings and /health waits a few ms behind it at most.
 */
export const BINDING_INSTALL_SLICE_MS = 4;
/** A failed page's origin is pulled again after this long, ms: the first snapshot retry's 1 s. */
export const PAGE_RETRY_DELAY_MS = 1_000;

export interface SnapshotBindingPagesStats {
  /** Pages of peers' snapshots applied. */
  pages: number;
  /** Bindings in them (each merged last-writer-wins). */
  bindings: number;
  /** Pulls whose pages stopped before the last one (the origin is pulled again). */
  failed: number;
}

export interface SnapshotBindingPagesOptions {
  readonly port: Pick<ReplicaPort, "apply">;
  readonly decoder: BindingPageDecoder;
  readonly skips: EntrySkips;
  readonly logger: Logger;
  readonly clock: Clock;
  readonly timers: Timers;
  /** Pulls `origin`'s snapshot again from `controlEndpoint` (a refresh). */
  readonly repull: (origin: bigint, controlEndpoint: string) => void;
  /** Whether the mesh is closing (no retry then). */
  readonly closed: () => boolean;
}

export class SnapshotBindingPages implements SnapshotPages {
  readonly stats: SnapshotBindingPagesStats = { pages: 0, bindings: 0, failed: 0 };
  readonly #o: SnapshotBindingPagesOptions;
  readonly #failLog = new LogThrottle();

  constructor(o: SnapshotBindingPagesOptions) {
    this.#o = o;
  }

  decode(controlEndpoint: string, raw: Buffer): Promise<DecodedPage> {
    return this.#o.decoder.decode(controlEndpoint, raw);
  }

  async install(origin: bigint, bindings: readonly BindingEvent[], page: DecodedPage): Promise<void> {
    const skips = this.#o.skips;
    for (const r of ENTRY_SKIP_REASONS) skips.counts[r] += page.counts[r];
    for (const s of page.skipped) skips.log(s, `snapshot bindings of ${origin}`);
    const clock = this.#o.clock;
    let sliceStart = clock.now();
    const events: ReplicaEvent[] = [];
    for (let i = 0; i < bindings.length; ) {
      if (clock.now() - sliceStart >= BINDING_INSTALL_SLICE_MS) {
        await new Promise<void>((resolve) => this.#o.timers.setImmediate(resolve));
        if (this.#o.closed()) return;
        sliceStart = clock.now();
      }
      // A few hundred at a time between clock reads: the clock costs more than a merge.
      const end = Math.min(bindings.length, i + 256);
      events.length = 0;
      for (; i < end; i++) events.push({ kind: "binding", event: bindings[i] as BindingEvent });
      this.#o.port.apply(origin, events);
    }
    this.stats.pages++;
    this.stats.bindings += bindings.length;
  }

  failed(origin: bigint, controlEndpoint: string, err: unknown): void {
    this.stats.failed++;
    this.#failLog.hit((suppressed) => {
      this.#o.logger.warn({ err, control: controlEndpoint, origin: origin.toString(), suppressed }, "snapshot binding pages stopped before the last one: pulling that origin's snapshot again");
    });
    this.#o.timers.setTimeout(() => {
      if (!this.#o.closed()) this.#o.repull(origin, controlEndpoint);
    }, PAGE_RETRY_DELAY_MS);
  }
}
