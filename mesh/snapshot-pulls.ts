/**
 * Who is asked for a snapshot, when, and how many at once: the request side of the Clone
 * pattern's repair (inbound.ts decides that an origin needs one; this sends it).
 *
 * Two lanes, so that endpoints nobody has heard from cannot hold the ones that answer (issue 29's
 * G15: with 200 dead peers and one live one, every pull waited in one queue of 16 at the 2 s
 * control timeout, and the first snapshot, workers included, arrived at 24.9 s):
 *  - **pulls** of an origin heard on the stream (its heartbeat named its control endpoint, so it
 *    runs): at most MAX_CONCURRENT_SNAPSHOT_PULLS at once; past it the caller defers, counted,
 *    and its housekeeping asks again;
 *  - **first-contact probes** of an endpoint whose origin is not known yet (a peer just
 *    registered, by hand or by DNS): a queue of their own, MAX_CONCURRENT_FIRST_CONTACT_PROBES at
 *    once, each with the short FIRST_CONTACT_PROBE_TIMEOUT_MS. A probe whose endpoint was heard
 *    meanwhile is skipped when its turn comes: that peer's pull already went on the other lane.
 *    A failed probe marks the endpoint unreachable until it is heard (startup-sync.ts stops
 *    waiting for it).
 *
 * And one request per control endpoint at a time, whichever lane (G7): a replica restarted 20
 * times left 20 origins behind one endpoint, and each change pulled up to 16 snapshots of the one
 * process there. Whatever origin a request was for, the answer is the snapshot of the process at
 * that endpoint now.
 */
import PQueue from "p-queue";
import type { Logger } from "pino";
import type { BindingEvent } from "../src/core/index.js";
import type { DecodedPage } from "./binding-page-decoder.js";
import type { ControlClient } from "./control.js";
import type { Snapshot } from "./types.js";

/**
 * Snapshot requests in flight at once. Each holds a DEALER socket for up to the control timeout;
 * unbounded, heartbeats with forged origin ids pointing at a silent endpoint had one open per
 * tracked origin (1,023 measured) and exhausted libzmq's socket limit, so KV listeners and real
 * snapshot requests failed with "Too many open file descriptors". A mesh has tens of peers.
 */
export const MAX_CONCURRENT_SNAPSHOT_PULLS = 16;
/**
 * First-contact probes in flight at once: a DNS answer holds up to 256 addresses, so 256 dead
 * entries are all tried within 4 rounds of the probe timeout (4 s), not 16 rounds of 2 s.
 */
export const MAX_CONCURRENT_FIRST_CONTACT_PROBES = 64;
/**
 * How long a first-contact probe waits, ms: two heartbeat intervals (500 ms each). A live peer
 * whose snapshot takes longer to build is not lost: its heartbeat arrives meanwhile, and its
 * pull then goes on the other lane with the full control timeout.
 */
export const FIRST_CONTACT_PROBE_TIMEOUT_MS = 1_000;

export interface SnapshotPullsOptions {
  readonly control: Pick<ControlClient, "snapshot" | "bindingPage">;
  /** This replica's origin (the `from` of each request). */
  readonly self: bigint;
  readonly logger: Logger;
  /** Whether the endpoint's process was heard on the stream (a probe of it is then skipped). */
  readonly heard: (controlEndpoint: string) => boolean;
  /** A snapshot arrived from `controlEndpoint`; `refresh` as given to pull(). */
  readonly install: (s: Snapshot, controlEndpoint: string, refresh: boolean) => void;
  /** A request failed or timed out (counted by the caller). */
  readonly onFailure: () => void;
  /**
   * A paged snapshot's bindings (#29 G16): each page decoded off the main thread, then applied
   * in slices. Without it a paged snapshot's bindings are not pulled (tests of the lanes alone).
   */
  readonly pages?: SnapshotPages;
}

export interface SnapshotPages {
  decode(controlEndpoint: string, raw: Buffer): Promise<DecodedPage>;
  /** Applies one page's bindings (last-writer-wins merges), yielding the event loop between slices. */
  install(origin: bigint, bindings: readonly BindingEvent[], page: DecodedPage): Promise<void>;
  /** A page failed after the rest of `origin`'s snapshot was installed: what it lacks must be pulled again. */
  failed(origin: bigint, controlEndpoint: string, err: unknown): void;
}

export interface SnapshotPullsStats {
  /** Probes skipped because their endpoint was heard (or asked) before their turn. */
  probesSkipped: number;
}

export class SnapshotPulls {
  readonly stats: SnapshotPullsStats = { probesSkipped: 0 };
  readonly #o: SnapshotPullsOptions;
  readonly #pulls = new PQueue({ concurrency: MAX_CONCURRENT_SNAPSHOT_PULLS });
  readonly #probes = new PQueue({ concurrency: MAX_CONCURRENT_FIRST_CONTACT_PROBES });
  /** Control endpoints with a request in flight (either lane). */
  readonly #busy = new Set<string>();
  /** Endpoints waiting in the probe queue (each once). */
  readonly #queuedProbes = new Set<string>();
  /** Endpoints whose probe failed and that were not heard since. */
  readonly #unreachable = new Set<string>();
  /** Endpoints whose snapshot is installed but whose binding pages are still arriving. */
  readonly #paging = new Set<string>();
  /** The same by origin (a peer's registered endpoint and the one its heartbeats name may be spelled apart). */
  readonly #pagingOrigins = new Set<bigint>();
  #closed = false;

  constructor(o: SnapshotPullsOptions) {
    this.#o = o;
  }

  /** Whether a request to `controlEndpoint` is in flight now. */
  busy(controlEndpoint: string): boolean {
    return this.#busy.has(controlEndpoint);
  }

  /** Whether the pull lane is full (the caller defers and counts). */
  get full(): boolean {
    return this.#pulls.pending + this.#pulls.size >= MAX_CONCURRENT_SNAPSHOT_PULLS;
  }

  /** Pulls running now (the pull lane). */
  get inFlight(): number {
    return this.#pulls.pending;
  }

  /** Whether `controlEndpoint`'s snapshot is in but its bindings are still arriving (startup-sync.ts waits). */
  paging(controlEndpoint: string, origin: bigint | null): boolean {
    return this.#paging.has(controlEndpoint) || (origin !== null && this.#pagingOrigins.has(origin));
  }

  /** A probe of `controlEndpoint` failed and it was not heard since. */
  unreachable(controlEndpoint: string): boolean {
    return this.#unreachable.has(controlEndpoint) && !this.#o.heard(controlEndpoint);
  }

  /**
   * Pulls a heard origin's snapshot now (the caller checked busy() and full). `done` runs when the
   * request settles, either way.
   */
  pull(controlEndpoint: string, refresh: boolean, done: () => void): void {
    if (this.#closed) return;
    this.#busy.add(controlEndpoint);
    void this.#pulls
      .add(() => this.#request(controlEndpoint, refresh, undefined))
      .finally(() => {
        this.#busy.delete(controlEndpoint);
        done();
      });
  }

  /** Queues a first-contact probe of `controlEndpoint` (an endpoint queued already is not queued twice). */
  probe(controlEndpoint: string): void {
    if (this.#closed || this.#queuedProbes.has(controlEndpoint)) return;
    this.#queuedProbes.add(controlEndpoint);
    void this.#probes.add(async () => {
      this.#queuedProbes.delete(controlEndpoint);
      if (this.#closed) return;
      if (this.#busy.has(controlEndpoint) || this.#o.heard(controlEndpoint)) {
        this.stats.probesSkipped++;
        return;
      }
      this.#busy.add(controlEndpoint);
      try {
        const ok = await this.#request(controlEndpoint, false, FIRST_CONTACT_PROBE_TIMEOUT_MS);
        if (ok) this.#unreachable.delete(controlEndpoint);
        else this.#unreachable.add(controlEndpoint);
      } finally {
        this.#busy.delete(controlEndpoint);
      }
    });
  }

  /** Forgets what is known of an endpoint (its peer was deregistered). */
  forgetEndpoint(controlEndpoint: string): void {
    this.#unreachable.delete(controlEndpoint);
    this.#paging.delete(controlEndpoint);
  }

  close(): void {
    this.#closed = true;
    this.#pulls.clear();
    this.#probes.clear();
  }

  /** One request; true when its snapshot arrived (installed or not). */
  async #request(controlEndpoint: string, refresh: boolean, timeoutMs: number | undefined): Promise<boolean> {
    let snapshot: Snapshot;
    let cursor: bigint | undefined;
    const pages = this.#o.pages;
    try {
      snapshot = await this.#o.control.snapshot(controlEndpoint, this.#o.self, timeoutMs);
      if (this.#closed) return true;
      cursor = pages === undefined ? undefined : snapshot.bindingCursor;
      if (cursor === undefined || pages === undefined) {
        this.#o.install(snapshot, controlEndpoint, refresh);
        return true;
      }
    } catch (err) {
      this.#o.onFailure();
      if (!this.#closed) this.#o.logger.debug({ err, control: controlEndpoint }, "snapshot request failed (retried)");
      return false;
    }
    // Marked before the install, so the startup sync never sees it synced without its bindings;
    // a pull whose pages stopped leaves the mark until the retry's pages are all in.
    this.#paging.add(controlEndpoint);
    this.#pagingOrigins.add(snapshot.origin);
    try {
      this.#o.install(snapshot, controlEndpoint, refresh);
      await this.#pages(pages, controlEndpoint, snapshot.origin, cursor);
      this.#paging.delete(controlEndpoint);
      this.#pagingOrigins.delete(snapshot.origin);
    } catch (err) {
      this.#o.onFailure();
      if (!this.#closed) pages.failed(snapshot.origin, controlEndpoint, err);
    }
    return true;
  }

  /**
   * A snapshot's bindings, page by page: the next page is asked while this one is applied (one
   * ahead, no more; a page's `more` is known once it is decoded).
   */
  async #pages(pages: SnapshotPages, controlEndpoint: string, origin: bigint, cursor: bigint): Promise<void> {
    const ask = async (): Promise<DecodedPage> => pages.decode(controlEndpoint, await this.#o.control.bindingPage(controlEndpoint, this.#o.self, cursor));
    let pending = ask();
    for (;;) {
      const page = await pending;
      if (page.more) {
        pending = ask();
        pending.catch(() => undefined); // awaited next turn; not unhandled if the install throws first
      }
      if (this.#closed) return;
      await pages.install(origin, page.bindings, page);
      if (!page.more) return;
    }
  }
}
