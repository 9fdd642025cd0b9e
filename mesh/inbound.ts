/**
 * The mesh's inbound side: peers' batches and heartbeats, snapshot pulls and installs, peer
 * liveness and the divergence check.
 *
 * Batches from peers apply synchronously, one batch (<= 256 events from our publishers) per
 * message, idempotent in the core. A gap, a new epoch or first contact with an origin triggers a
 * snapshot request over the control channel; the snapshot replaces what this replica mirrors of
 * that origin, then buffered batches after it apply (the ZeroMQ Guide's Clone pattern; the
 * per-origin decisions are origin-tracker.ts's). A heartbeat whose booking count disagrees with
 * what we mirror at the same seq, twice in a row, forces a snapshot.
 *
 * Everything here reads the monotonic clock except the lag histograms (publisher's wall-clock
 * `sentAtMs` against ours). The receive thread decodes off the main thread; this talks to the core
 * through ReplicaPort's apply, install, describe and dropOrigin, and to membership through
 * InboundMembership only.
 */
import type { Logger } from "pino";
import type { Clock, TimerHandle, Timers } from "../src/core/index.js";
import type { ControlClient } from "./control.js";
import { MeshWireError } from "./errors.js";
import { DEFAULT_MAX_TRACKED_ORIGINS, MeshReceiver, type LagObserver, type OriginStats } from "./origin-tracker.js";
import { PeerHealth, type PeerState } from "./peer-health.js";
import type { ReceivedEntry } from "./receive-coalescer.js";
import type { ReplicaPort } from "./replica-port.js";
import { SnapshotPulls, type SnapshotPages } from "./snapshot-pulls.js";
import { TOPIC_BATCH, TOPIC_HEARTBEAT, type Heartbeat, type MeshBatch, type Snapshot } from "./types.js";
import type { AppliedBatch, MeshApplyTracer } from "../src/util/trace-cause.js";

export type { AppliedBatch, MeshApplyTracer };
import { decodeBatch, decodeHeartbeat, type SkipSink } from "./wire.js";

/** Debounce between a worker (re)registration and re-pulling the peers that sent load for it, ms. */
export const WORKER_CHANGE_RESNAPSHOT_DELAY_MS = 50;
/**
 * Snapshot pulls in flight at once (snapshot-pulls.ts says why the bound); an origin over it stays
 * due and is asked on a later housekeeping tick (250 ms), and is counted (`snapshotPullsDeferred`).
 * First-contact probes (origin unknown) wait in a queue of their own instead: nothing else would
 * retry them.
 */
export { MAX_CONCURRENT_SNAPSHOT_PULLS } from "./snapshot-pulls.js";
/** Consecutive heartbeats with a booking count unlike ours (at the same seq) that force a snapshot. */
export const DIVERGENT_HEARTBEATS_FOR_RESYNC = 2;

/** What inbound tells membership, and asks it. */
/**
 * How long a deregistered peer's late messages and snapshots are ignored, ms: longer than anything
 * in flight can take (a snapshot pull's 2 s control timeout, a hand-over's 250 ms) and shorter than
 * a deliberate re-registration, which lifts it at once anyway (MeshInbound.welcome).
 */
export const DEPARTED_IGNORE_MS = 5_000;

export interface InboundMembership {
  /** A heartbeat from `origin`, whose PUB is `publishEndpoint` (registered or not). */
  peerHeard(publishEndpoint: string, origin: bigint): void;
  /** A snapshot of `origin` came from `controlEndpoint`: the registered peer there is `origin`. */
  snapshotFrom(controlEndpoint: string, origin: bigint): void;
  /** Origins of registered peers: their snapshots go first. */
  registeredOrigins(): ReadonlySet<bigint | null>;
}

export interface InboundStats {
  batchesApplied: number;
  eventsApplied: number;
  /** Frames that failed to decode or had the wrong shape. */
  malformed: number;
  snapshotsInstalled: number;
  snapshotFailures: number;
  divergenceResyncs: number;
  /** Snapshot pulls for known origins not sent because MAX_CONCURRENT_SNAPSHOT_PULLS were in flight (retried). */
  snapshotPullsDeferred: number;
  /** Origins declared down whose mirrored bookings or totals were dropped (see #originDown). */
  downOriginsDropped: number;
  /** Origins declared down that had said they were leaving: their bookings kept (G8, see #originDown). */
  leftOriginsKept: number;
  /** Pulls sent by refreshSoon: origins whose load for a worker unknown then could now be placed (G6). */
  missedStatePulls: number;
}

export interface MeshInboundOptions {
  /** This replica's origin: its own frames (looped back by a misconfigured peer) are ignored. */
  readonly origin: bigint;
  readonly port: Pick<ReplicaPort, "apply" | "install" | "describe" | "dropOrigin">;
  readonly control: Pick<ControlClient, "snapshot" | "bindingPage">;
  /** How a paged snapshot's bindings are decoded and applied (snapshot-binding-pages.ts). */
  readonly pages?: SnapshotPages;
  readonly logger: Logger;
  /** Monotonic, ms: peer health, snapshot timeouts and retries, origin idleness. */
  readonly clock: Clock;
  /** Wall clock, ms since the Unix epoch: lag against the publishers' `sentAtMs`. */
  readonly wallClock: Clock;
  readonly timers: Timers;
  /** Origin-tracker and peer-health tuning (tests shorten them). */
  readonly snapshotTimeoutMs?: number;
  readonly suspectAfterMs?: number;
  readonly downAfterMs?: number;
  /** Where lag samples go (the mesh's lag histograms); none without metrics. */
  readonly lagObserver?: LagObserver;
  /** Tracing on: told of each applied batch that carried trace causes (a span linked to them). */
  readonly applyTracer?: MeshApplyTracer;
  /** Where events left out of a batch decoded here go (entry-skips.ts); without it, one refuses the batch. */
  readonly skip?: SkipSink;
}

export class MeshInbound {
  readonly stats: InboundStats = {
    batchesApplied: 0,
    eventsApplied: 0,
    malformed: 0,
    snapshotsInstalled: 0,
    snapshotFailures: 0,
    divergenceResyncs: 0,
    snapshotPullsDeferred: 0,
    downOriginsDropped: 0,
    leftOriginsKept: 0,
    missedStatePulls: 0,
  };
  readonly receiver: MeshReceiver;
  readonly health: PeerHealth;
  readonly #o: MeshInboundOptions;
  readonly #log: Logger;
  #membership: InboundMembership | undefined;
  /** origin -> its control endpoint, learned from heartbeats and snapshot replies. */
  readonly #control = new Map<bigint, string>();
  /** Consecutive heartbeats whose counts disagreed with what we mirror, per origin. */
  readonly #mismatch = new Map<bigint, number>();
  readonly #inflight = new Set<bigint>();
  /** The request side: lanes, one request per endpoint, unreachable endpoints (snapshot-pulls.ts). */
  readonly #snapshots: SnapshotPulls;
  /** Origins to re-pull once the debounce after a worker change ends (refreshSoon). */
  readonly #refreshOrigins = new Set<bigint>();
  /** Origins deregistered here -> when, monotonic ms (see forget). */
  readonly #departed = new Map<bigint, number>();
  /** Origins adopted from peers' snapshots and not heard from directly yet -> when, monotonic ms (#expireAdopted). */
  readonly #adopted = new Map<bigint, number>();
  #refreshTimer: TimerHandle | undefined;
  #closed = false;

  constructor(o: MeshInboundOptions) {
    this.#o = o;
    this.#log = o.logger;
    this.#snapshots = new SnapshotPulls({
      control: o.control,
      self: o.origin,
      logger: o.logger,
      heard: (ep) => {
        for (const c of this.#control.values()) if (c === ep) return true;
        return false;
      },
      install: (snapshot, ep, refresh) => {
        this.#install(snapshot, ep, refresh);
      },
      onFailure: () => {
        this.stats.snapshotFailures++;
      },
      ...(o.pages === undefined ? {} : { pages: o.pages }),
    });
    this.health = new PeerHealth({
      ...(o.suspectAfterMs === undefined ? {} : { suspectAfterMs: o.suspectAfterMs }),
      ...(o.downAfterMs === undefined ? {} : { downAfterMs: o.downAfterMs }),
    });
    // An origin evicted from the bounded tracker table takes its per-origin state with it.
    this.receiver = new MeshReceiver({
      clock: o.wallClock,
      idleClock: o.clock,
      ...(o.snapshotTimeoutMs === undefined ? {} : { snapshotTimeoutMs: o.snapshotTimeoutMs }),
      ...(o.lagObserver === undefined ? {} : { lagObserver: o.lagObserver }),
      onEvict: (origin) => {
        this.health.remove(origin);
        this.#control.delete(origin);
        this.#mismatch.delete(origin);
      },
    });
  }

  /** Set once, before any message arrives (membership and inbound refer to each other). */
  bindMembership(m: InboundMembership): void {
    this.#membership = m;
  }

  get #members(): InboundMembership {
    if (this.#membership === undefined) throw new Error("MeshInbound: bindMembership() was not called");
    return this.#membership;
  }

  /** One message from a peer's PUB (MeshTransport.onMessage). */
  onMessage(topic: string, payload: Buffer, frames: number): void {
    if (frames !== 2) {
      this.stats.malformed++;
      return;
    }
    try {
      if (topic === TOPIC_BATCH) this.onBatch(decodeBatch(payload, this.#o.skip));
      else if (topic === TOPIC_HEARTBEAT) this.onHeartbeat(decodeHeartbeat(payload));
      else this.stats.malformed++;
    } catch (err) {
      this.stats.malformed++;
      if (err instanceof MeshWireError) this.#log.debug({ field: err.field, topic }, `malformed mesh frame: ${err.message}`);
      else this.#log.error({ err, topic }, "mesh frame handling failed");
    }
  }

  /** A receive thread's hand-over (transport.onEntries): decoded, folded, in arrival order. */
  onEntries(entries: readonly ReceivedEntry[]): void {
    for (const e of entries) {
      try {
        if (e.kind === "batch") this.onBatch(e.batch, e.lagsMs);
        else this.onHeartbeat(e.heartbeat, e.lagMs);
      } catch (err) {
        this.#log.error({ err, kind: e.kind }, "mesh entry handling failed");
      }
    }
  }

  /** `lagsMs`: as measured by a receive thread (see MeshReceiver.onBatch); else taken now. */
  onBatch(b: MeshBatch, lagsMs?: readonly number[]): void {
    if (b.origin === this.#o.origin || this.#isDeparted(b.origin)) return;
    // The receiver first: an origin it refuses (table full) leaves no state here either.
    const action = this.receiver.onBatch(b, lagsMs);
    if (action.action === "refused") return;
    this.health.observe(b.origin, this.#o.clock.now());
    if (action.action === "apply") this.#apply(b);
    else if (action.action === "resync") this.#resync(b.origin, action.reason);
  }

  onHeartbeat(hb: Heartbeat, lagMs?: number): void {
    if (hb.origin === this.#o.origin || this.#isDeparted(hb.origin)) return;
    const action = this.receiver.onHeartbeat(hb, lagMs);
    // Refused (origin table full) or from a dead epoch (a late or replayed frame): it says
    // nothing about the origin's current process, so it changes no liveness, endpoint or peering.
    if (action.action === "refused" || action.action === "drop-stale") return;
    this.health.observe(hb.origin, this.#o.clock.now());
    this.#control.set(hb.origin, hb.controlEndpoint);
    this.#members.peerHeard(hb.publishEndpoint, hb.origin);
    if (action.action === "resync") {
      this.#resync(hb.origin, action.reason);
      return;
    }
    this.#checkDivergence(hb);
  }

  /**
   * With every batch up to hb.seq applied, we must mirror exactly the bookings the origin owns.
   * DIVERGENT_HEARTBEATS_FOR_RESYNC disagreeing heartbeats in a row force a snapshot (one may
   * race a batch in flight).
   */
  #checkDivergence(hb: Heartbeat): void {
    const t = this.receiver.tracker(hb.origin);
    if (t?.state !== "live" || t.lastAppliedSeq !== hb.seq) return;
    const mirrored = this.#o.port.describe(hb.origin).bookings;
    const n = mirrored === hb.bookings ? 0 : (this.#mismatch.get(hb.origin) ?? 0) + 1;
    this.#mismatch.set(hb.origin, n);
    if (n >= DIVERGENT_HEARTBEATS_FOR_RESYNC) {
      this.stats.divergenceResyncs++;
      this.#mismatch.set(hb.origin, 0);
      this.#log.info({ origin: hb.origin.toString(), mirrored, theirs: hb.bookings }, "mirrored bookings diverged: re-snapshotting");
      this.pullSnapshot(hb.controlEndpoint, hb.origin, true);
    }
  }

  #apply(b: MeshBatch): void {
    this.#o.port.apply(b.origin, b.events);
    this.stats.batchesApplied++;
    this.stats.eventsApplied += b.events.length;
    if (b.causes !== undefined && this.#o.applyTracer !== undefined) {
      this.#o.applyTracer.batchApplied({ origin: b.origin, firstSeq: b.firstSeq ?? b.seq, seq: b.seq, events: b.events.length, sentAtMs: b.sentAtMs, causes: b.causes });
    }
  }

  #resync(origin: bigint, reason: string): void {
    const control = this.#control.get(origin);
    this.#log.debug({ origin: origin.toString(), reason }, "mesh resync");
    // Without a control endpoint yet, the origin's next heartbeat (<= 500 ms) brings one and
    // housekeeping sends the request then.
    if (control !== undefined) this.pullSnapshot(control, origin);
  }

  /** Due snapshot retries (registered peers first) and peer-health transitions; on a timer. */
  housekeeping(nowMs: number): void {
    if (this.#closed) return;
    // Registered peers' origins first: they must not queue behind origins nobody registered.
    const registered = this.#members.registeredOrigins();
    const due = this.receiver.snapshotsDue(nowMs).sort((x, y) => Number(registered.has(y)) - Number(registered.has(x)));
    for (const origin of due) {
      const control = this.#control.get(origin);
      if (control !== undefined) this.pullSnapshot(control, origin);
    }
    for (const t of this.health.tick(nowMs)) {
      this.#log.info({ origin: t.origin.toString(), from: t.from, to: t.to }, "mesh peer state changed");
      if (t.to === "down") this.#originDown(t.origin);
    }
    this.#expireAdopted(nowMs);
  }

  /**
   * Origins known only from peers' snapshots (adopted totals) that this replica has not heard
   * from itself within the down timeout are taken as down too. A live origin is heard within
   * seconds of a snapshot naming it (every replica peers with every other); one that is not is
   * the dead replica its peers are dropping at the same time, and a joiner that adopted it (a
   * replica restarted with a new id, say) must drop it with them or it alone keeps its load
   * until the booking expiry (the fault suite's kill scenario caught that: one worker's load
   * differed on the restarted replica).
   */
  #expireAdopted(nowMs: number): void {
    if (this.#adopted.size === 0) return;
    const downAfterMs = this.health.downAfterMs;
    for (const [origin, at] of this.#adopted) {
      if (this.health.state(origin) !== undefined) {
        this.#adopted.delete(origin); // heard directly: the health path owns it now
      } else if (nowMs - at >= downAfterMs) {
        this.#adopted.delete(origin);
        if (this.#o.port.describe(origin).draining === true) {
          // The snapshot said it was leaving (G8): kept until freed or expired, as its peers keep it.
          this.stats.leftOriginsKept++;
          this.#log.info({ origin: origin.toString() }, "mesh origin known only from peers' snapshots left (it said it was leaving): its adopted load kept until freed or expired");
        } else {
          this.#dropDown(origin, "mesh origin known only from peers' snapshots was never heard: its adopted load dropped");
        }
      }
    }
  }

  /**
   * `origin` has been silent for the down timeout (10 s): every survivor drops what it mirrors of
   * it, and forgets where its stream stood, so its next message (a restart, a healed partition,
   * SIGCONT) is a first contact that installs a full snapshot.
   *
   * Why drop rather than keep until expiry: a replica killed mid-burst leaves each survivor with
   * whatever prefix of its last batches reached it, so kept, the survivors disagreed for good
   * (finding F16: 1,971 against 1,995 mirrored bookings, past the dead replica's restart). Dropped,
   * they agree within a housekeeping tick of each other. The price: the requests it routed may
   * still run on their workers, and their load is no longer counted here; the workers' own KV
   * events still show what they cache, and its in-flight requests end within the booking expiry
   * anyway. Its health entry stays ("down"), so /replica_sync/peers still shows it, and snapshots
   * from other peers do not bring its state back (#replace skips origins that are down here).
   */
  #originDown(origin: bigint): void {
    this.receiver.forget(origin);
    this.#mismatch.delete(origin);
    // Its endpoint now belongs to whatever process runs there next (a restart is a new origin):
    // kept, each restart left one more origin for every refresh to pull from there (G7).
    this.#control.delete(origin);
    if (this.#o.port.describe(origin).draining === true) {
      // It said it was leaving (a clean shutdown, G8): its bookings stay until freed or expired,
      // and a free for one at any replica still counts it out.
      this.stats.leftOriginsKept++;
      this.#log.info({ origin: origin.toString() }, "mesh peer left (it said it was leaving): its mirrored bookings kept until freed or expired");
    } else {
      this.#dropDown(origin, "mesh peer down: its mirrored bookings dropped (a full snapshot is pulled when it is heard again)");
    }
    this.#pruneDown();
  }

  /** Drops what is mirrored of a down origin, counted and logged. */
  #dropDown(origin: bigint, why: string): void {
    const dropped = this.#o.port.dropOrigin(origin);
    this.stats.downOriginsDropped++;
    this.#log.warn({ origin: origin.toString(), dropped }, why);
  }

  /**
   * Down origins have no tracker, so the tracker table's bound (and its eviction, which also
   * clears health and control entries) no longer covers them: each restart of a replica leaves
   * one. Past the same bound, the longest-silent down ones are forgotten for good.
   */
  #pruneDown(): void {
    const states = this.health.states();
    const excess = states.size - DEFAULT_MAX_TRACKED_ORIGINS;
    if (excess <= 0) return;
    const down = [...states].filter(([o, st]) => st === "down" && this.receiver.tracker(o) === undefined).map(([o]) => o);
    down.sort((a, b) => (this.health.lastSeenMs(a) ?? 0) - (this.health.lastSeenMs(b) ?? 0));
    for (const o of down.slice(0, excess)) {
      this.health.remove(o);
      this.#control.delete(o);
    }
  }

  /**
   * Requests a snapshot; `origin` null when it is not known yet (first contact by endpoint).
   * `refresh`: a live origin's state is re-read (divergence, or workers that registered since),
   * outside the tracker's resync protocol.
   */
  /** The control endpoint `origin` last announced (heartbeat) or answered a snapshot from. */
  controlEndpointOf(origin: bigint): string | undefined {
    return this.#control.get(origin);
  }

  pullSnapshot(controlEndpoint: string, origin: bigint | null, refresh = false): void {
    if (this.#closed) return;
    if (origin === null) {
      this.#snapshots.probe(controlEndpoint);
      return;
    }
    // One request per endpoint: the one in flight answers for whatever process runs there (G7).
    if (this.#inflight.has(origin) || this.#snapshots.busy(controlEndpoint)) return;
    if (this.#snapshots.full) {
      const n = ++this.stats.snapshotPullsDeferred;
      if (n === 1 || n % 1000 === 0) this.#log.warn({ deferred_total: n, in_flight: this.#snapshots.inFlight }, "snapshot pulls at their bound: deferred (retried by housekeeping)");
      return;
    }
    this.#inflight.add(origin);
    if (!refresh) this.receiver.snapshotRequested(origin, this.#o.clock.now());
    this.#snapshots.pull(controlEndpoint, refresh, () => {
      this.#inflight.delete(origin);
    });
  }

  /** Whether `controlEndpoint`'s snapshot is in and its bindings are still arriving in pages. */
  paging(controlEndpoint: string, origin: bigint | null): boolean {
    return this.#snapshots.paging(controlEndpoint, origin);
  }

  /** Whether the first-contact probe of `controlEndpoint` failed and nothing was heard from there since (startup-sync.ts). */
  unreachable(controlEndpoint: string): boolean {
    return this.#snapshots.unreachable(controlEndpoint);
  }

  #install(s: Snapshot, controlEndpoint: string, refresh: boolean): void {
    if (this.#closed || s.origin === this.#o.origin || this.#isDeparted(s.origin)) return;
    this.#control.set(s.origin, controlEndpoint);
    this.#members.snapshotFrom(controlEndpoint, s.origin);
    const t = this.receiver.tracker(s.origin);
    if (refresh && t?.state === "live" && t.epoch === s.epoch) {
      // Only a snapshot at least as new as what was applied may replace it; batches after it
      // re-apply idempotently.
      if (s.seq < t.lastAppliedSeq) return;
      this.#replace(s);
      this.stats.snapshotsInstalled++;
      return;
    }
    if (!this.receiver.wantsSnapshot(s)) return;
    this.#replace(s);
    this.stats.snapshotsInstalled++;
    this.health.observe(s.origin, this.#o.clock.now());
    for (const b of this.receiver.onSnapshot(s)) this.#apply(b);
  }

  /**
   * What a snapshot replaces is the core's to decide, in its kinds' order (the replication port's
   * install). The mesh only keeps out what the sender mirrors of origins this replica saw go down,
   * and remembers the origins it learns of only this way (#expireAdopted).
   */
  #replace(s: Snapshot): void {
    const states = this.health.states();
    const mirrored = s.mirrored?.filter((m) => states.get(m.origin) !== "down");
    this.#o.port.install(s.origin, mirrored === undefined ? s : { ...s, mirrored });
    const now = this.#o.clock.now();
    for (const m of mirrored ?? []) if (m.origin !== this.#o.origin && !states.has(m.origin) && !this.#adopted.has(m.origin)) this.#adopted.set(m.origin, now);
  }

  /**
   * `origins` sent load for a worker this replica did not know, ignored when it arrived
   * (src/core/replication/missed-state.ts); the worker is known now, so pull their fresh
   * snapshots, debounced (a fleet registers in a burst), one per control endpoint. Before, every
   * worker change re-pulled every origin ever heard (G6, G7).
   */
  refreshSoon(origins: readonly bigint[]): void {
    if (this.#closed) return;
    for (const o of origins) this.#refreshOrigins.add(o);
    if (this.#refreshTimer !== undefined || this.#refreshOrigins.size === 0) return;
    this.#refreshTimer = this.#o.timers.setTimeout(() => {
      this.#refreshTimer = undefined;
      const endpoints = new Set<string>();
      for (const origin of this.#refreshOrigins) {
        const control = this.#control.get(origin);
        if (control === undefined || endpoints.has(control)) continue;
        endpoints.add(control);
        this.stats.missedStatePulls++;
        this.pullSnapshot(control, origin, true);
      }
      this.#refreshOrigins.clear();
    }, WORKER_CHANGE_RESNAPSHOT_DELAY_MS);
  }

  /** Drops everything kept about `origin` (the core's mirror is membership's to drop). */
  forget(origin: bigint): void {
    this.receiver.forget(origin);
    this.health.remove(origin);
    this.#control.delete(origin);
    this.#mismatch.delete(origin);
    // What is still in flight from it (a heartbeat read before our SUB let go, a snapshot pull
    // queued before) must not bring it back: a late heartbeat used to re-teach us its control
    // endpoint, and the first-contact snapshot re-installed its bookings after deregistration.
    this.#departed.set(origin, this.#o.clock.now());
    if (this.#departed.size > DEFAULT_MAX_TRACKED_ORIGINS) this.#departed.delete(this.#departed.keys().next().value as bigint);
  }

  /** A peer (re)registered or asked to peer back: what it sends is welcome again. */
  welcome(origin: bigint | null): void {
    if (origin === null) this.#departed.clear();
    else this.#departed.delete(origin);
  }

  /** Deregistered (or unpeered) within DEPARTED_IGNORE_MS: its messages and snapshots are ignored. */
  #isDeparted(origin: bigint): boolean {
    const at = this.#departed.get(origin);
    if (at === undefined) return false;
    if (this.#o.clock.now() - at < DEPARTED_IGNORE_MS) return true;
    this.#departed.delete(origin);
    return false;
  }

  peerStates(): Map<bigint, PeerState> {
    return this.health.states();
  }

  originStats(origin: bigint): OriginStats | undefined {
    return this.receiver.tracker(origin)?.stats();
  }

  /** Snapshot pulls running now (first-contact probes not included). */
  get pullsInFlight(): number {
    return this.#snapshots.inFlight;
  }

  close(): void {
    this.#closed = true;
    this.#refreshTimer?.cancel();
    this.#snapshots.close();
  }
}
