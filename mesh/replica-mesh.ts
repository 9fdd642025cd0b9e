/**
 * The replica mesh: wires a SelectionService to its peers.
 *
 * Out: every local load event and session binding goes into a bounded queue; one flush loop
 * drains it whole on each wake-up into numbered batches (seq per (origin, epoch)) and publishes
 * them; heartbeats every HEARTBEAT_INTERVAL_MS carry the last seq and counts.
 * In: batches from peers apply synchronously, one batch (<= 256 events from our publishers) per
 * message, idempotent in the core. A gap, a new epoch or first contact with an origin triggers a
 * snapshot request over the control channel; the snapshot replaces what this replica mirrors of
 * that origin, then buffered batches after it apply (the ZeroMQ Guide's Clone pattern).
 * Membership: register/deregister connect or disconnect our SUB, and ask the peer (over its
 * control ROUTER) to do the same towards us, so one command forms or breaks both directions.
 */
import type { Logger } from "pino";
import type { Clock, Random } from "../src/core/clock.js";
import { KvmeshError } from "../src/core/errors.js";
import type { MeshControl } from "../src/http/server.js";
import type { BindingEvent, LoadEvent } from "../src/core/replica-events.js";
import type { SelectionService } from "../src/core/selection-service.js";
import type { MeshCurveConfig } from "./curve.js";
import { controlEndpointFor, parsePeerEndpoint } from "./endpoints.js";
import { LAG_BUCKETS_MS, type LagHistogram, MeshReceiver } from "./origin-tracker.js";
import { OutboundQueue } from "./outbound-queue.js";
import { PeerHealth, type PeerState } from "./peer-health.js";
import { MeshTransport, MeshRemoteError } from "./transport.js";
import { TOPIC_BATCH, TOPIC_HEARTBEAT, type ControlRequest, type Heartbeat, type MeshBatch, type Snapshot } from "./types.js";
import {
  decodeBatch,
  decodeControlReply,
  decodeControlRequest,
  decodeHeartbeat,
  encodeBatch,
  encodeControlReply,
  encodeControlRequest,
  encodeHeartbeat,
  MeshWireError,
} from "./wire.js";

/** Heartbeat period, ms: bounds how long an idle gap or a silent peer goes unnoticed. */
export const DEFAULT_MESH_HEARTBEAT_INTERVAL_MS = 500;
/** How often due snapshot retries and peer-health transitions are checked, ms. */
export const MESH_HOUSEKEEPING_INTERVAL_MS = 100;
/** How long a computed replica slot (for tie spreading) is reused, ms: membership moves slowly. */
const SLOT_REFRESH_MS = 250;
/** Debounce between a worker (re)registration and re-pulling peers' snapshots, ms. */
export const WORKER_CHANGE_RESNAPSHOT_DELAY_MS = 50;
/**
 * Minimum spacing between outbound flushes, ms. Each published batch costs a ZeroMQ send (a wake-up
 * of the I/O thread) here and a receive + decode + dispatch on every peer, whatever its size. An
 * event after a quiet spell still goes out on the next event-loop turn (no added lag when idle);
 * within this window of the previous flush it waits for the window to end and shares a batch.
 * The price is up to this much replication lag (not seen by the lag histogram, which starts at
 * the flush), widening the select-to-book race by as much. Measured in bench:mesh (4 replicas,
 * 200 req/s, 2 cores): 0 and 5 ms both gave ~2.1 batches per request (a replica's bursts are
 * ~10 ms apart); 20 ms gave 0.93 and cut total replica CPU ~7% (ZeroMQ I/O threads 880 -> 590 ms
 * per 10 s), too much lag for the race. 2 ms only merges what arrives in bursts.
 */
export const DEFAULT_MESH_FLUSH_INTERVAL_MS = 2;
/** A registered peer silent this long (the suspect timeout) is redialed; then backoff to the max, ms. */
export const SILENT_PEER_REDIAL_MS = 3_000;
export const SILENT_PEER_REDIAL_MAX_MS = 30_000;
/** Control requests (snapshot, peer, unpeer) give up after this long, ms. */
export const DEFAULT_CONTROL_TIMEOUT_MS = 2_000;
/**
 * Snapshot requests in flight at once. Each holds a DEALER socket for up to the control timeout;
 * unbounded, heartbeats with forged origin ids pointing at a silent endpoint had one open per
 * tracked origin (1,023 measured) and exhausted libzmq's socket limit, so KV listeners and real
 * snapshot requests failed with "Too many open file descriptors". A mesh has tens of peers;
 * an origin over the bound stays due and is asked on a later housekeeping tick (100 ms).
 */
export const MAX_CONCURRENT_SNAPSHOT_PULLS = 16;

export interface ReplicaMeshOptions {
  readonly service: SelectionService;
  /** Where the XPUB binds, e.g. tcp://0.0.0.0:7100; the control ROUTER binds on the next port. */
  readonly publishBind: string;
  /** How peers reach this replica's XPUB (needed when publishBind is a wildcard). */
  readonly advertiseEndpoint?: string | undefined;
  readonly peers?: readonly string[];
  readonly logger: Logger;
  /** Wall clock (ms since the Unix epoch): lag is publish-to-apply across processes. */
  readonly wallClock?: Clock;
  readonly random?: Random;
  readonly heartbeatIntervalMs?: number;
  readonly controlTimeoutMs?: number;
  /** Minimum spacing between outbound flushes, ms (0: flush on every event-loop turn). */
  readonly flushIntervalMs?: number;
  /** CURVE: encrypt the mesh and accept only listed replicas (mesh/transport.ts); unset = plain. */
  readonly curve?: MeshCurveConfig | undefined;
  /**
   * Spread argmin ties by replica slot (src/core/tie-spread.ts), default on. Off only to measure the
   * select-to-book race without it (bench:mesh --no-tie-spread).
   */
  readonly tieSpread?: boolean;
}

export interface PeerView {
  endpoint: string;
  origin: string | null;
  state: PeerState | "connecting";
  last_seq: number | null;
  lag_p50_ms: number | null;
  lag_p99_ms: number | null;
  gaps: number;
  snapshots: number;
  sync: "syncing" | "live" | null;
}

export interface MeshStats {
  batchesSent: number;
  eventsSent: number;
  heartbeatsSent: number;
  batchesApplied: number;
  eventsApplied: number;
  malformed: number;
  snapshotsServed: number;
  snapshotsInstalled: number;
  snapshotFailures: number;
  divergenceResyncs: number;
  /** Silent registered peers redialed (see SILENT_PEER_REDIAL_MS). */
  redials: number;
}

export class ReplicaMesh implements MeshControl {
  readonly #service: SelectionService;
  readonly #transport: MeshTransport;
  readonly #log: Logger;
  readonly #clock: Clock;
  readonly #epoch: bigint;
  readonly #origin: bigint;
  readonly #advertise: string;
  readonly #controlTimeoutMs: number;
  readonly #flushIntervalMs: number;
  /** Wall-clock ms of the last flush start: -Infinity lets the first event go out at once. */
  #lastFlushAtMs = -Infinity;
  readonly #queue: OutboundQueue;
  readonly #receiver: MeshReceiver;
  readonly #health = new PeerHealth();
  /** Registered peers (their publish endpoints) -> origin once learned. */
  readonly #peers = new Map<string, bigint | null>();
  /** origin -> its control endpoint, learned from heartbeats and snapshot replies. */
  readonly #control = new Map<bigint, string>();
  /** Consecutive heartbeats whose counts disagreed with what we mirror, per origin. */
  readonly #mismatch = new Map<bigint, number>();
  #seq = 0;
  #slotCache = { index: 0, count: 1 };
  #slotAtMs = -Infinity;
  #resnapshotTimer: NodeJS.Timeout | undefined;
  #flushScheduled = false;
  #flushing: Promise<void> | undefined;
  #closed = false;
  readonly #timers: NodeJS.Timeout[] = [];
  readonly #inflightSnapshots = new Set<bigint>();
  /** Silent registered peers: when to redial each next, and the backoff after that. */
  readonly #redial = new Map<string, { atMs: number; backoffMs: number }>();
  /** Registered peers that confirmed they connect back to us, and requests in flight. */
  readonly #peeredBack = new Set<string>();
  readonly #askingPeerBack = new Set<string>();
  readonly stats: MeshStats = {
    batchesSent: 0,
    eventsSent: 0,
    heartbeatsSent: 0,
    batchesApplied: 0,
    eventsApplied: 0,
    malformed: 0,
    snapshotsServed: 0,
    snapshotsInstalled: 0,
    snapshotFailures: 0,
    divergenceResyncs: 0,
    redials: 0,
  };

  private constructor(o: ReplicaMeshOptions, transport: MeshTransport) {
    this.#service = o.service;
    this.#transport = transport;
    this.#log = o.logger;
    this.#clock = o.wallClock ?? { now: () => Date.now() };
    this.#origin = o.service.replicaId;
    this.#epoch = randomU64(o.random);
    this.#advertise = o.advertiseEndpoint ?? transport.publishEndpoint;
    this.#controlTimeoutMs = o.controlTimeoutMs ?? DEFAULT_CONTROL_TIMEOUT_MS;
    this.#flushIntervalMs = flushIntervalOf(o);
    this.#queue = new OutboundQueue({
      onShed: (_e, total) => {
        if (total === 1 || total % 1000 === 0) this.#log.warn({ shed_total: total }, "mesh outbound queue full: event shed (peers will re-snapshot)");
      },
    });
    // An origin evicted from the bounded tracker table takes its per-origin glue state with it.
    this.#receiver = new MeshReceiver({
      clock: this.#clock,
      onEvict: (origin) => {
        this.#health.remove(origin);
        this.#control.delete(origin);
        this.#mismatch.delete(origin);
      },
    });
    o.service.onLoadEvent((event: LoadEvent) => {
      this.#enqueue({ kind: "load", event });
    });
    o.service.onBindingEvent((event: BindingEvent) => {
      this.#enqueue({ kind: "binding", event });
    });
    transport.onMessage((topic, payload, frames) => {
      this.#onMessage(topic, payload, frames);
    });
    transport.onControl((req) => this.#onControl(req));
    if (o.tieSpread !== false) o.service.setReplicaSlot(() => this.#slot());
    // Peers' bookings for a worker this replica did not know were ignored when they arrived;
    // once workers register, pull fresh snapshots (debounced: a fleet registers in a burst).
    o.service.onWorkerChange(() => {
      if (this.#resnapshotTimer !== undefined || this.#closed) return;
      this.#resnapshotTimer = setTimeout(() => {
        this.#resnapshotTimer = undefined;
        for (const [origin, control] of this.#control) this.#pullSnapshot(control, origin, true);
      }, WORKER_CHANGE_RESNAPSHOT_DELAY_MS);
      this.#resnapshotTimer.unref();
    });
    const hb = setInterval(() => {
      this.#sendHeartbeat();
    }, o.heartbeatIntervalMs ?? DEFAULT_MESH_HEARTBEAT_INTERVAL_MS);
    const hk = setInterval(() => {
      this.#housekeeping();
    }, MESH_HOUSEKEEPING_INTERVAL_MS);
    hb.unref();
    hk.unref();
    this.#timers.push(hb, hk);
  }

  static async start(o: ReplicaMeshOptions): Promise<ReplicaMesh> {
    // Before binding: a throw after it would leave the sockets open.
    flushIntervalOf(o);
    const transport = await MeshTransport.bind({ publishBind: o.publishBind, logger: o.logger, ...(o.curve === undefined ? {} : { curve: o.curve }) });
    const mesh = new ReplicaMesh(o, transport);
    for (const p of o.peers ?? []) await mesh.registerPeer(p);
    return mesh;
  }

  get origin(): bigint {
    return this.#origin;
  }

  get publishEndpoint(): string {
    return this.#advertise;
  }

  get shed(): number {
    return this.#queue.shed;
  }

  // ------------------------------------------------------------------ membership (MeshControl)

  registerPeer(endpoint: string): Promise<boolean> {
    const ep = parsePeerEndpoint(endpoint);
    if (ep === parsePeerEndpoint(this.#advertise)) throw new KvmeshError("KVMESH_BAD_REQUEST", `endpoint ${ep} is this replica itself`, { details: { field: "endpoint" } });
    const added = this.#connect(ep);
    // Ask the peer to connect back (symmetric peering) and pull its state. A peer that is not up
    // yet is asked again on its first heartbeat, and its state arrives through first contact.
    this.#askPeerBack(ep);
    this.#pullSnapshot(controlEndpointFor(ep), null);
    return Promise.resolve(added);
  }

  /** Asks the replica at `ep` to connect its SUB to us, once per (endpoint, process). */
  #askPeerBack(ep: string): void {
    if (this.#closed || this.#askingPeerBack.has(ep)) return;
    this.#askingPeerBack.add(ep);
    this.#requestControl(controlEndpointFor(ep), { type: "peer", from: this.#origin, publishEndpoint: this.#advertise })
      .then(() => {
        this.#peeredBack.add(ep);
      })
      .catch((err: unknown) => {
        this.#log.debug({ err, peer: ep }, "peer-back request failed (asked again on its next heartbeat)");
      })
      .finally(() => {
        this.#askingPeerBack.delete(ep);
      });
  }

  async deregisterPeer(endpoint: string): Promise<boolean> {
    const ep = parsePeerEndpoint(endpoint);
    if (!this.#peers.has(ep)) return false;
    const origin = this.#peers.get(ep) ?? null;
    this.#peers.delete(ep);
    this.#peeredBack.delete(ep);
    this.#transport.disconnectPeer(ep);
    await this.#requestControl(controlEndpointFor(ep), { type: "unpeer", from: this.#origin, publishEndpoint: this.#advertise }).catch((err: unknown) => {
      this.#log.debug({ err, peer: ep }, "unpeer request failed");
    });
    if (origin !== null) this.#forgetOrigin(origin);
    return true;
  }

  listPeers(): PeerView[] {
    const states = this.#health.states();
    return [...this.#peers.entries()]
      .map(([endpoint, origin]) => {
        const t = origin === null ? undefined : this.#receiver.tracker(origin);
        const s = t?.stats();
        return {
          endpoint,
          origin: origin?.toString() ?? null,
          state: origin === null ? "connecting" : (states.get(origin) ?? "connecting"),
          last_seq: s?.lastAppliedSeq ?? null,
          lag_p50_ms: s?.lagP50Ms ?? null,
          lag_p99_ms: s?.lagP99Ms ?? null,
          gaps: s?.gaps ?? 0,
          snapshots: s?.snapshots ?? 0,
          sync: s?.state ?? null,
        } satisfies PeerView;
      })
      .sort((a, b) => (a.endpoint < b.endpoint ? -1 : a.endpoint > b.endpoint ? 1 : 0));
  }

  #connect(ep: string): boolean {
    if (this.#peers.has(ep)) return false;
    this.#peers.set(ep, null);
    this.#transport.connectPeer(ep);
    return true;
  }

  #forgetOrigin(origin: bigint): void {
    this.#receiver.forget(origin);
    this.#health.remove(origin);
    this.#control.delete(origin);
    this.#mismatch.delete(origin);
    const dropped = this.#service.dropOrigin(origin);
    this.#log.info({ origin: origin.toString(), dropped }, "peer deregistered: its mirrored bookings dropped");
  }

  /** This replica's position among itself and its live peers, by replica id. */
  #slot(): { index: number; count: number } {
    const now = this.#clock.now();
    if (now - this.#slotAtMs >= SLOT_REFRESH_MS) {
      const ids = [this.#origin];
      for (const [origin, state] of this.#health.states()) if (state === "alive") ids.push(origin);
      ids.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
      this.#slotCache = { index: ids.indexOf(this.#origin), count: ids.length };
      this.#slotAtMs = now;
    }
    return this.#slotCache;
  }

  // ------------------------------------------------------------------ outbound

  #enqueue(e: Parameters<OutboundQueue["push"]>[0]): void {
    if (this.#closed) return;
    this.#queue.push(e);
    if (this.#flushScheduled) return;
    this.#flushScheduled = true;
    const waitMs = this.#lastFlushAtMs + this.#flushIntervalMs - this.#clock.now();
    // setImmediate, not a microtask: a burst of selections in one tick coalesces into one batch;
    // within the flush interval of the previous flush, a timer lets more of them share it.
    if (waitMs > 0) setTimeout(this.#startFlush, waitMs);
    else setImmediate(this.#startFlush);
  }

  readonly #startFlush = (): void => {
    this.#flushScheduled = false;
    this.#lastFlushAtMs = this.#clock.now();
    // While a flush runs, its loop picks up what arrives; it ends only with the queue empty.
    this.#flushing ??= this.#flush().finally(() => {
      this.#flushing = undefined;
    });
  };

  async #flush(): Promise<void> {
    while (this.#queue.size > 0 && !this.#closed) {
      const batches = this.#queue.drainBatches();
      // A shed event is repaired by snapshot: skipping a seq makes every receiver see a gap.
      if (this.#queue.takeShedSinceLastDrain() > 0) this.#seq++;
      for (const events of batches) {
        const batch: MeshBatch = { v: 1, origin: this.#origin, epoch: this.#epoch, seq: ++this.#seq, sentAtMs: this.#clock.now(), events };
        try {
          await this.#transport.publish(TOPIC_BATCH, encodeBatch(batch));
          this.stats.batchesSent++;
          this.stats.eventsSent += events.length;
        } catch (err) {
          if (this.#closed) return;
          this.#log.warn({ err, seq: batch.seq }, "mesh publish failed (peers will re-snapshot on the gap)");
        }
      }
    }
  }

  #sendHeartbeat(): void {
    if (this.#closed) return;
    const hb: Heartbeat = {
      v: 1,
      origin: this.#origin,
      epoch: this.#epoch,
      seq: this.#seq,
      sentAtMs: this.#clock.now(),
      controlEndpoint: controlEndpointFor(this.#advertise),
      publishEndpoint: this.#advertise,
      bookings: this.#service.countOwnedBy(this.#origin),
    };
    this.#transport.publish(TOPIC_HEARTBEAT, encodeHeartbeat(hb)).then(
      () => {
        this.stats.heartbeatsSent++;
      },
      (err: unknown) => {
        if (!this.#closed) this.#log.debug({ err }, "heartbeat publish failed");
      },
    );
  }

  // ------------------------------------------------------------------ inbound

  #onMessage(topic: string, payload: Buffer, frames: number): void {
    if (frames !== 2) {
      this.stats.malformed++;
      return;
    }
    try {
      if (topic === TOPIC_BATCH) this.#onBatch(decodeBatch(payload));
      else if (topic === TOPIC_HEARTBEAT) this.#onHeartbeat(decodeHeartbeat(payload));
      else this.stats.malformed++;
    } catch (err) {
      this.stats.malformed++;
      if (err instanceof MeshWireError) this.#log.debug({ field: err.field, topic }, `malformed mesh frame: ${err.message}`);
      else this.#log.error({ err, topic }, "mesh frame handling failed");
    }
  }

  #onBatch(b: MeshBatch): void {
    if (b.origin === this.#origin) return;
    // The receiver first: an origin it refuses (table full) leaves no state here either.
    const action = this.#receiver.onBatch(b);
    if (action.action === "refused") return;
    this.#health.observe(b.origin, this.#clock.now());
    if (action.action === "apply") this.#apply(b);
    else if (action.action === "resync") this.#resync(b.origin, action.reason);
  }

  #onHeartbeat(hb: Heartbeat): void {
    if (hb.origin === this.#origin) return;
    const action = this.#receiver.onHeartbeat(hb);
    // Refused (origin table full) or from a dead epoch (a late or replayed frame): it says
    // nothing about the origin's current process, so it changes no liveness, endpoint or peering.
    if (action.action === "refused" || action.action === "drop-stale") return;
    this.#health.observe(hb.origin, this.#clock.now());
    this.#control.set(hb.origin, hb.controlEndpoint);
    const known = this.#peers.get(hb.publishEndpoint);
    if (known !== undefined) {
      // A registered peer we have not been peered back by, or one that restarted (a new origin
      // at the same endpoint has lost its membership): ask it to connect back.
      if (known !== hb.origin && known !== null) this.#peeredBack.delete(hb.publishEndpoint);
      this.#peers.set(hb.publishEndpoint, hb.origin);
      if (!this.#peeredBack.has(hb.publishEndpoint)) this.#askPeerBack(hb.publishEndpoint);
    }
    if (action.action === "resync") {
      this.#resync(hb.origin, action.reason);
      return;
    }
    // Divergence check: with every batch up to hb.seq applied, we must mirror exactly the
    // bookings the origin owns. Two disagreeing heartbeats in a row force a snapshot.
    const t = this.#receiver.tracker(hb.origin);
    if (t?.state === "live" && t.lastAppliedSeq === hb.seq) {
      const mirrored = this.#service.countOwnedBy(hb.origin);
      const n = mirrored === hb.bookings ? 0 : (this.#mismatch.get(hb.origin) ?? 0) + 1;
      this.#mismatch.set(hb.origin, n);
      if (n >= 2) {
        this.stats.divergenceResyncs++;
        this.#mismatch.set(hb.origin, 0);
        this.#log.info({ origin: hb.origin.toString(), mirrored, theirs: hb.bookings }, "mirrored bookings diverged: re-snapshotting");
        this.#pullSnapshot(hb.controlEndpoint, hb.origin, true);
      }
    }
  }

  #apply(b: MeshBatch): void {
    for (const e of b.events) {
      if (e.kind === "load") this.#service.applyLoadEvent(e.event);
      else this.#service.applyBindingEvent(e.event);
    }
    this.stats.batchesApplied++;
    this.stats.eventsApplied += b.events.length;
  }

  #resync(origin: bigint, reason: string): void {
    const control = this.#control.get(origin);
    this.#log.debug({ origin: origin.toString(), reason }, "mesh resync");
    // Without a control endpoint yet, the origin's next heartbeat (<= 500 ms) brings one and
    // housekeeping sends the request then.
    if (control !== undefined) this.#pullSnapshot(control, origin);
  }

  #housekeeping(): void {
    const now = this.#clock.now();
    // Registered peers' origins first: they must not queue behind origins nobody registered.
    const registered = new Set(this.#peers.values());
    const due = this.#receiver.snapshotsDue(now).sort((x, y) => Number(registered.has(y)) - Number(registered.has(x)));
    for (const origin of due) {
      const control = this.#control.get(origin);
      if (control !== undefined) this.#pullSnapshot(control, origin);
    }
    for (const t of this.#health.tick(now)) {
      this.#log.info({ origin: t.origin.toString(), from: t.from, to: t.to }, "mesh peer state changed");
    }
    this.#redialSilentPeers(now);
  }

  /**
   * Redials registered peers we have not heard from in a while. libzmq reconnects a SUB after a
   * dropped connection by itself, but not after a ZMTP protocol error (corrupted bytes on the
   * link): it terminates that connection's session for good, and the peer would stay silent
   * forever (test/faults/mesh-link-faults). Redialing a peer that is merely slow or gone costs a
   * reconnect attempt, so it backs off from SILENT_PEER_REDIAL_MS to SILENT_PEER_REDIAL_MAX_MS.
   */
  #redialSilentPeers(now: number): void {
    if (this.#closed) return;
    const states = this.#health.states();
    for (const ep of this.#redial.keys()) if (!this.#peers.has(ep)) this.#redial.delete(ep);
    for (const [ep, origin] of this.#peers) {
      const state = origin === null ? undefined : states.get(origin);
      if (state === "alive") {
        this.#redial.delete(ep);
        continue;
      }
      const r = this.#redial.get(ep);
      if (r === undefined) {
        // Suspect or down means already silent past the suspect timeout: redial at once. Never
        // heard from (not up yet, or cut off from the start): give it the timeout first.
        this.#redial.set(ep, { atMs: state === undefined ? now + SILENT_PEER_REDIAL_MS : now, backoffMs: SILENT_PEER_REDIAL_MS });
        if (state === undefined) continue;
      } else if (now < r.atMs) continue;
      const next = this.#redial.get(ep) as { atMs: number; backoffMs: number };
      next.atMs = now + next.backoffMs;
      next.backoffMs = Math.min(next.backoffMs * 2, SILENT_PEER_REDIAL_MAX_MS);
      this.stats.redials++;
      this.#log.info({ peer: ep, state: state ?? "never heard" }, "mesh peer silent: redialing");
      this.#transport.disconnectPeer(ep);
      this.#transport.connectPeer(ep);
    }
  }

  /**
   * Requests a snapshot; `origin` null when it is not known yet (first contact by endpoint).
   * `refresh`: a live origin's state is re-read (divergence, or workers that registered since),
   * outside the tracker's resync protocol.
   */
  #pullSnapshot(controlEndpoint: string, origin: bigint | null, refresh = false): void {
    if (this.#closed) return;
    if (origin !== null) {
      if (this.#inflightSnapshots.has(origin) || this.#inflightSnapshots.size >= MAX_CONCURRENT_SNAPSHOT_PULLS) return;
      this.#inflightSnapshots.add(origin);
      if (!refresh) this.#receiver.snapshotRequested(origin, this.#clock.now());
    }
    this.#requestControl(controlEndpoint, { type: "snapshot", from: this.#origin })
      .then((reply) => {
        if (reply.type !== "snapshot") throw new Error(`unexpected control reply ${reply.type}`);
        this.#installSnapshot(reply.snapshot, controlEndpoint, refresh);
      })
      .catch((err: unknown) => {
        this.stats.snapshotFailures++;
        if (!this.#closed) this.#log.debug({ err, control: controlEndpoint }, "snapshot request failed (retried)");
      })
      .finally(() => {
        if (origin !== null) this.#inflightSnapshots.delete(origin);
      });
  }

  #installSnapshot(s: Snapshot, controlEndpoint: string, refresh: boolean): void {
    if (this.#closed || s.origin === this.#origin) return;
    this.#control.set(s.origin, controlEndpoint);
    for (const ep of this.#peers.keys()) {
      if (controlEndpointFor(ep) === controlEndpoint) this.#peers.set(ep, s.origin);
    }
    const t = this.#receiver.tracker(s.origin);
    if (refresh && t?.state === "live" && t.epoch === s.epoch) {
      // Only a snapshot at least as new as what was applied may replace it; batches after it
      // re-apply idempotently.
      if (s.seq < t.lastAppliedSeq) return;
      this.#service.replaceOrigin(s.origin, s.bookings);
      for (const b of s.bindings) this.#service.applyBindingEvent(b);
      this.stats.snapshotsInstalled++;
      return;
    }
    if (!this.#receiver.wantsSnapshot(s)) return;
    this.#service.replaceOrigin(s.origin, s.bookings);
    for (const b of s.bindings) this.#service.applyBindingEvent(b);
    this.stats.snapshotsInstalled++;
    this.#health.observe(s.origin, this.#clock.now());
    for (const b of this.#receiver.onSnapshot(s)) this.#apply(b);
  }

  // ------------------------------------------------------------------ control server

  async #onControl(raw: Buffer): Promise<Buffer> {
    let req: ControlRequest;
    try {
      req = decodeControlRequest(raw);
    } catch (err) {
      this.stats.malformed++;
      return encodeControlReply({ type: "error", message: err instanceof Error ? err.message : "malformed request" });
    }
    switch (req.type) {
      case "snapshot": {
        this.stats.snapshotsServed++;
        // Taken synchronously, so it is consistent with #seq: every batch numbered up to it
        // was built from events emitted before this point.
        await this.#flushing;
        const snapshot: Snapshot = {
          v: 1,
          origin: this.#origin,
          epoch: this.#epoch,
          seq: this.#seq,
          bookings: this.#service.bookingsSnapshot(),
          bindings: this.#service.bindingsSnapshot(),
        };
        return encodeControlReply({ type: "snapshot", snapshot });
      }
      case "peer": {
        const ep = parsePeerEndpoint(req.publishEndpoint);
        if (ep !== parsePeerEndpoint(this.#advertise) && this.#connect(ep)) {
          this.#log.info({ peer: ep }, "peered back on request");
          this.#pullSnapshot(controlEndpointFor(ep), null);
        } else if (this.#peers.has(ep) && this.#peers.get(ep) !== req.from) {
          // Known endpoint, process we have not heard from: a restart at the same address. Our SUB
          // may sit in libzmq's reconnect backoff (doubling to 5 s) since the old one died, so the
          // restarted replica would go unheard that long (2 s measured, test/faults/replica-kill).
          this.#log.info({ peer: ep }, "peer restarted: redialing it now");
          this.#transport.disconnectPeer(ep);
          this.#transport.connectPeer(ep);
        }
        return encodeControlReply({ type: "ok" });
      }
      case "unpeer": {
        const ep = parsePeerEndpoint(req.publishEndpoint);
        if (this.#peers.has(ep)) {
          this.#peers.delete(ep);
          this.#peeredBack.delete(ep);
          this.#transport.disconnectPeer(ep);
        }
        this.#forgetOrigin(req.from);
        return encodeControlReply({ type: "ok" });
      }
    }
  }

  async #requestControl(endpoint: string, req: ControlRequest): Promise<ReturnType<typeof decodeControlReply>> {
    const reply = decodeControlReply(await this.#transport.request(endpoint, encodeControlRequest(req), this.#controlTimeoutMs));
    if (reply.type === "error") throw new MeshRemoteError(endpoint, reply.message);
    return reply;
  }

  // ------------------------------------------------------------------ metrics and shutdown

  /** Prometheus text for the mesh (appended to /metrics). */
  metricsText(): string {
    const lines: string[] = [];
    const counter = (name: string, help: string, v: number): void => {
      lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} counter`, `${name} ${v}`);
    };
    counter("kvmesh_mesh_batches_sent_total", "Batches published to peers.", this.stats.batchesSent);
    counter("kvmesh_mesh_events_sent_total", "Events published to peers.", this.stats.eventsSent);
    counter("kvmesh_mesh_batches_applied_total", "Peer batches applied.", this.stats.batchesApplied);
    counter("kvmesh_mesh_events_applied_total", "Peer events applied.", this.stats.eventsApplied);
    counter("kvmesh_mesh_events_shed_total", "Outbound events shed by the bounded queue (repaired by snapshot).", this.#queue.shed);
    counter("kvmesh_mesh_malformed_frames_total", "Mesh frames or control requests that failed to decode.", this.stats.malformed);
    counter("kvmesh_mesh_origins_evicted_total", "Tracked origins evicted (never synced, or silent) to make room for new ones.", this.#receiver.evicted);
    counter("kvmesh_mesh_origins_refused_total", "Frames from new origins ignored because the origin table was full of live ones.", this.#receiver.refused);
    counter("kvmesh_mesh_snapshots_served_total", "Snapshots served to peers.", this.stats.snapshotsServed);
    counter("kvmesh_mesh_snapshots_installed_total", "Peer snapshots installed.", this.stats.snapshotsInstalled);
    counter("kvmesh_mesh_snapshot_failures_total", "Snapshot requests that failed or timed out (retried).", this.stats.snapshotFailures);
    counter("kvmesh_mesh_divergence_resyncs_total", "Snapshots forced by heartbeat count mismatches.", this.stats.divergenceResyncs);
    counter("kvmesh_mesh_peer_redials_total", "Silent registered peers redialed (a SUB session libzmq gave up on, or a peer that is down).", this.stats.redials);
    const origins = this.#receiver.stats();
    lines.push("# HELP kvmesh_mesh_gaps_total Sequence gaps detected per origin.", "# TYPE kvmesh_mesh_gaps_total counter");
    for (const o of origins) lines.push(`kvmesh_mesh_gaps_total{origin="${o.origin}"} ${o.gaps}`);
    lines.push("# HELP kvmesh_mesh_last_seq Last batch seq applied per origin.", "# TYPE kvmesh_mesh_last_seq gauge");
    for (const o of origins) lines.push(`kvmesh_mesh_last_seq{origin="${o.origin}"} ${o.lastAppliedSeq}`);
    lines.push("# HELP kvmesh_mesh_replication_lag_seconds Publish-to-receive lag of peer batches and heartbeats, all peers.", "# TYPE kvmesh_mesh_replication_lag_seconds histogram");
    histogramLines(lines, "kvmesh_mesh_replication_lag_seconds", "", this.#receiver.lagHistogram);
    // Per peer as well: one slow link hides in the aggregate when the other peers are fast. Keyed by
    // origin (GET /replica_sync/peers maps origin to endpoint); a forgotten origin's series ends.
    lines.push("# HELP kvmesh_mesh_peer_replication_lag_seconds Publish-to-receive lag per origin (peer).", "# TYPE kvmesh_mesh_peer_replication_lag_seconds histogram");
    for (const origin of this.#receiver.origins()) {
      const t = this.#receiver.tracker(origin);
      if (t !== undefined) histogramLines(lines, "kvmesh_mesh_peer_replication_lag_seconds", `origin="${origin}",`, t.lagHistogram);
    }
    const counts = this.#health.counts();
    lines.push("# HELP kvmesh_mesh_peers Peers by state.", "# TYPE kvmesh_mesh_peers gauge");
    for (const [state, n] of Object.entries(counts)) lines.push(`kvmesh_mesh_peers{state="${state}"} ${n}`);
    return lines.join("\n") + "\n" + this.#transport.metricsText();
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    // Flush what is queued so peers see the last frees before we go.
    await this.#flushing;
    if (this.#queue.size > 0) await this.#flush();
    this.#closed = true;
    this.#service.setReplicaSlot(null);
    for (const t of this.#timers) clearInterval(t);
    if (this.#resnapshotTimer !== undefined) clearTimeout(this.#resnapshotTimer);
    await this.#transport.close();
  }
}

/** Prometheus histogram sample lines; `labels` is empty or ends with a comma. */
function histogramLines(lines: string[], name: string, labels: string, h: LagHistogram): void {
  const cum = h.cumulative();
  LAG_BUCKETS_MS.forEach((b, i) => lines.push(`${name}_bucket{${labels}le="${b / 1000}"} ${cum[i] ?? 0}`));
  lines.push(`${name}_bucket{${labels}le="+Inf"} ${h.count}`);
  const sel = labels === "" ? "" : `{${labels.slice(0, -1)}}`;
  lines.push(`${name}_sum${sel} ${h.sum / 1000}`, `${name}_count${sel} ${h.count}`);
}

function flushIntervalOf(o: ReplicaMeshOptions): number {
  const ms = o.flushIntervalMs ?? DEFAULT_MESH_FLUSH_INTERVAL_MS;
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`flushIntervalMs must be a finite number >= 0, got ${ms}`);
  return ms;
}

function randomU64(random: Random | undefined): bigint {
  const r = (): bigint => BigInt(Math.floor((random?.next() ?? Math.random()) * 0x1_0000_0000));
  for (;;) {
    const v = (r() << 32n) | r();
    if (v !== 0n) return v;
  }
}
