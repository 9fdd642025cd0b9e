/**
 * The mesh's first sync after a start, as `/ready` sees it. A replica that has just started (or
 * restarted) knows none of the fleet's session bindings and bookings until its peers' first
 * snapshots are installed: served traffic before that would bind sessions anew (stickiness lost
 * across a rolling restart) and book against loads it cannot see. So while it is pulling them,
 * `/ready` answers 503 with `mesh_syncing: true` and the peers still awaited.
 *
 * Pure: the peers' views and the clock are injected. The wait ends, for good, at the first check
 * that finds
 *  - the first round of DNS discovery done (its peers are registered), and
 *  - every registered peer either synced (its origin is live, or a snapshot of it was installed)
 *    or heard from and then gone silent (suspect or down: it cannot answer, so it is not awaited),
 *    or never heard, its first-contact probe failed, and UNREACHABLE_AFTER_MS have passed (a
 *    dead DNS entry: 200 of them held a joiner for the whole timeout, issue 29's G15),
 * or once `timeoutMs` has passed since the start: a peer never heard from (unreachable, or listed
 * in DNS but gone) holds readiness that long at most. Later resyncs (a gap, a peer's restart)
 * do not turn `/ready` back: the replica already routes with what it has, and they take ms.
 */
import type { Clock } from "../src/core/index.js";
import type { PeerView } from "./membership.js";

/** Default bound on the startup wait, s (`--mesh-startup-sync-secs`): several snapshot retries (1 s, doubling). */
export const DEFAULT_MESH_STARTUP_SYNC_SECS = 10;
/**
 * A peer never heard whose probe failed stops holding the wait this long after the start, ms: the
 * suspect timeout (3 s), six heartbeat intervals, so a live peer whose probe merely timed out
 * (a large snapshot) has been heard by then and is awaited.
 */
export const UNREACHABLE_AFTER_MS = 3_000;

export interface StartupSyncOptions {
  /** Monotonic, ms; the wait starts at construction. */
  readonly clock: Clock;
  /** 0: no wait at all. */
  readonly timeoutMs: number;
  readonly peers: () => readonly PeerView[];
  /** Whether DNS discovery has finished its first round (true without DNS peers). */
  readonly discovered: () => boolean;
  /** Whether the peer at this publish endpoint was probed, did not answer, and was never heard (snapshot-pulls.ts). */
  readonly unreachable?: (endpoint: string) => boolean;
  /** Whether this peer has its snapshot in and its bindings still arriving in pages (snapshot-pulls.ts). */
  readonly paging?: (peer: PeerView) => boolean;
  /** Called once when the wait ends, with why. */
  readonly onDone?: (outcome: StartupSyncOutcome) => void;
}

export interface StartupSyncOutcome {
  readonly reason: "synced" | "timeout";
  readonly afterMs: number;
  /** Registered peers not synced when it ended (those the timeout gave up on). */
  readonly unsynced: readonly string[];
}

/** Whether a peer no longer holds the wait: synced, or heard and then silent. */
function settled(p: PeerView): boolean {
  return p.sync === "live" || p.snapshots > 0 || p.state === "suspect" || p.state === "down";
}

/** Whether a peer the wait gives up on early: never heard, and its probe failed (only after UNREACHABLE_AFTER_MS). */
function unreachable(p: PeerView, probeFailed: ((endpoint: string) => boolean) | undefined): boolean {
  return p.state === "connecting" && probeFailed?.(p.endpoint) === true;
}

export class StartupSync {
  readonly #o: StartupSyncOptions;
  readonly #startedAtMs: number;
  #done: boolean;

  constructor(o: StartupSyncOptions) {
    this.#o = o;
    this.#startedAtMs = o.clock.now();
    this.#done = o.timeoutMs <= 0;
  }

  /**
   * The peers `/ready` still waits for (endpoints, sorted), or null once the startup sync is over.
   * An empty list means DNS discovery has not answered yet.
   */
  pending(): string[] | null {
    if (this.#done) return null;
    const elapsed = this.#o.clock.now() - this.#startedAtMs;
    const giveUp = elapsed >= UNREACHABLE_AFTER_MS ? this.#o.unreachable : undefined;
    const waiting = this.#o.peers()
      .filter((p) => (!settled(p) && !unreachable(p, giveUp)) || this.#o.paging?.(p) === true)
      .map((p) => p.endpoint);
    const synced = waiting.length === 0 && this.#o.discovered();
    if (!synced && elapsed < this.#o.timeoutMs) return waiting;
    this.#done = true;
    this.#o.onDone?.({ reason: synced ? "synced" : "timeout", afterMs: elapsed, unsynced: waiting });
    return null;
  }
}
