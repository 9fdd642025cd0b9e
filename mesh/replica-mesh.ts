/**
 * The replica mesh: attaches to a ReplicaPort (the selection core's replication port) and carries
 * its event stream to and from its peers. A thin facade over
 *
 *   publisher.ts   local events -> bounded queue -> paced, numbered batches; heartbeats
 *   inbound.ts     peers' batches and heartbeats -> the core; snapshot pulls and installs;
 *                  peer health; the divergence check
 *   membership.ts  register/deregister (both directions), peer-back, redial of silent peers,
 *                  forgetting an origin, the slot for tie spreading
 *   control.ts     the control channel: requests we send, requests peers send us
 *   mesh-metrics.ts  the mesh's series on the daemon's metrics registry
 *
 * over one MeshTransport (sockets). Time is injected: a monotonic clock for every interval and
 * deadline, the wall clock only for lag stamps, and Timers for every wake-up.
 */
import type { Logger } from "pino";
import type { Registry } from "prom-client";
import { systemClock, systemWallClock, type Clock, systemTimers, type TimerHandle, type Timers } from "../src/core/index.js";
import type { Random } from "../src/core/index.js";
import type { LoadMarkEvent } from "../src/core/index.js";
import { LogThrottle } from "../src/util/log-throttle.js";
import { ControlClient, ControlServer, DEFAULT_CONTROL_TIMEOUT_MS, type ControlExtension, type ControlLink } from "./control.js";
import type { MeshCurveConfig } from "./curve.js";
import { DEFAULT_PEER_DNS_INTERVAL_SECS, DnsPeerDiscovery, type DnsPeerEntry } from "./dns-peers.js";
import { addSkipCounts, EntrySkips, zeroSkipCounts } from "./entry-skips.js";
import { BindingCursors } from "./binding-cursors.js";
import { BindingPageDecoder } from "./binding-page-decoder.js";
import { SNAPSHOT_DECODE_THREAD_START_MS, SnapshotDecoder, type SnapshotDecoderStats } from "./snapshot-decoder.js";
import { MeshInbound, type MeshApplyTracer } from "./inbound.js";
import { SnapshotBindingPages } from "./snapshot-binding-pages.js";
import { registerLagMetrics, registerMeshMetrics, type MeshStats } from "./mesh-metrics.js";
import { Membership, type PeerView } from "./membership.js";
import { flushIntervalOf, MeshPublisher } from "./publisher.js";
import type { ReplicaAttachment, ReplicaPort } from "./replica-port.js";
import { controlEndpointFor } from "./endpoints.js";
import { MeshTransport } from "./transport.js";
import { DEFAULT_MESH_STARTUP_SYNC_SECS, StartupSync, type StartupSyncOutcome } from "./startup-sync.js";

export { DEFAULT_CONTROL_TIMEOUT_MS } from "./control.js";
export { DEFAULT_MESH_APPLY_INTERVAL_MS } from "./receive-worker.js";
export { MAX_CONCURRENT_SNAPSHOT_PULLS, WORKER_CHANGE_RESNAPSHOT_DELAY_MS } from "./inbound.js";
export type { MeshStats } from "./mesh-metrics.js";
export { SILENT_PEER_REDIAL_MAX_MS, SILENT_PEER_REDIAL_MS, type PeerView } from "./membership.js";
export { DEFAULT_MESH_AGGREGATE_FLUSH_INTERVAL_MS, DEFAULT_MESH_FLUSH_INTERVAL_MS, DEFAULT_MESH_HEARTBEAT_INTERVAL_MS } from "./publisher.js";

/** Lifecycle calls being sent to their bookings' owners at once (see ReplicaMesh#forwardToOwner); past it the stream alone carries them. */
export const MAX_LIFECYCLE_FORWARDS_IN_FLIGHT = 256;

/**
 * How often due snapshot retries, peer-health transitions and silent-peer redials are checked, ms.
 * Each tick wakes the main thread, idle or not: at 100 ms an idle peer's main thread cost
 * noticeably more than at 250 ms, and at low request rates that difference alone was a large
 * part of the peer/origin budget `npm run bench:scale` checks (it reports the idle rate). What
 * it paces is timed in seconds (snapshot timeouts 1 s and up, suspect 3 s, redial 3 s).
 */
export const MESH_HOUSEKEEPING_INTERVAL_MS = 250;
/**
 * Default longest wait, ms, before the receive thread's hand-overs that no decision pulled (the
 * core drains them before each one) are applied anyway, on the housekeeping tick: what peer health, gap detection, snapshot repair and
 * the divergence check lag by on a replica that serves no requests. The tick, not a timer of its
 * own: every timer is a wake-up of the main thread, and an idle replica had ~33 a second.
 */
export const DEFAULT_MESH_APPLY_MAX_DELAY_MS = MESH_HOUSEKEEPING_INTERVAL_MS;
const MS_PER_SECOND = 1_000;

export interface ReplicaMeshOptions {
  /** The core's replication port (SelectionService.replication). */
  readonly service: ReplicaPort;
  /** Tracing on: spans for applied peer batches, linked to the requests that caused them. */
  readonly applyTracer?: MeshApplyTracer | undefined;
  /** Where the PUB binds, e.g. tcp://0.0.0.0:7100; the control ROUTER binds on the next port. */
  readonly publishBind: string;
  /** How peers reach this replica's PUB (needed when publishBind is a wildcard). */
  readonly advertiseEndpoint?: string | undefined;
  readonly peers?: readonly string[];
  /** Peers found by DNS (`dns:NAME:PORT`), re-resolved every `peerDnsIntervalMs` (mesh/dns-peers.ts). */
  readonly dnsPeers?: readonly DnsPeerEntry[];
  readonly peerDnsIntervalMs?: number;
  readonly logger: Logger;
  /** Wall clock (ms since the Unix epoch): lag is publish-to-apply across processes. Lag stamps only. */
  readonly wallClock?: Clock;
  /** Monotonic clock, ms: flush pacing, peer health, snapshot timeouts, redial backoff. Default performance.now. */
  readonly clock?: Clock;
  /** Timers for every wake-up (default Node's, unref'd). */
  readonly timers?: Timers;
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
  /** The registry the mesh registers its series on (the daemon's); none registered without one. */
  readonly metrics?: Registry | undefined;
  /**
   * Read peers on a receive thread that hands over once per this many ms (mesh/receive-worker.ts);
   * unset: on the main thread, per message. Ignored with `curve` (see MeshTransportOptions).
   */
  readonly receiveThreadApplyIntervalMs?: number | undefined;
  /** With the receive thread: hand-overs nobody pulled (applyReceived) are applied after this long, ms. */
  readonly receiveThreadMaxApplyDelayMs?: number | undefined;
  /** Longest `/ready` waits for the peers' first snapshots after the start, ms (mesh/startup-sync.ts); 0 = not at all. */
  readonly startupSyncMs?: number;
  /** Requests served beside the control channel's own (the warm join's index pull, index-sync.ts). */
  readonly controlExtension?: ControlExtension | undefined;
  /**
   * Peers' snapshot replies are decoded on a thread started this long after the mesh, ms, and
   * used once it is up (snapshot-decoder.ts); null: never (on the main thread). Default
   * SNAPSHOT_DECODE_THREAD_START_MS.
   */
  readonly snapshotDecodeThreadStartMs?: number | null;
}

export class ReplicaMesh {
  readonly #attachment: ReplicaAttachment;
  readonly #transport: MeshTransport;
  readonly #advertise: string;
  readonly #publisher: MeshPublisher;
  readonly #inbound: MeshInbound;
  readonly #membership: Membership;
  readonly #control: ControlServer;
  readonly #housekeeping: TimerHandle;
  #dns: DnsPeerDiscovery | undefined;
  readonly #startupSync: StartupSync;
  #closed = false;
  readonly #log: Logger;
  readonly #forwards = { sent: 0, failed: 0, skipped: 0 };
  #forwardsInFlight = 0;
  readonly #forwardLog = new LogThrottle();
  /** Entries left out of peers' snapshots (and batches, without the receive thread) decoded here. */
  readonly #skips: EntrySkips;
  readonly #clock: Clock;
  /** A paged snapshot: pages pulled (decoded on a thread, applied in slices) and cursors served. */
  readonly #pageDecoder = new BindingPageDecoder();
  /** Peers' snapshot replies, decoded off this thread once it is up (snapshot-decoder.ts). */
  readonly #snapshotDecoder: SnapshotDecoder;
  #decoderStart: TimerHandle | undefined;
  readonly #pages: SnapshotBindingPages;
  readonly #bindingCursors: BindingCursors;
  /** When the receive thread's hand-overs were last applied, monotonic ms. */
  #appliedAtMs = -Infinity;

  private constructor(o: ReplicaMeshOptions, transport: MeshTransport) {
    const clock = o.clock ?? systemClock;
    const wallClock = o.wallClock ?? systemWallClock;
    const timers = o.timers ?? systemTimers;
    const logger = o.logger;
    const service = o.service;
    const origin = service.replicaId;
    this.#transport = transport;
    this.#log = logger;
    this.#skips = new EntrySkips(logger);
    this.#advertise = o.advertiseEndpoint ?? transport.publishEndpoint;
    // eslint-disable-next-line @typescript-eslint/no-this-alias -- the publisher's source reads the attachment made after it
    const self = this;
    this.#snapshotDecoder = new SnapshotDecoder(this.#skips, this.#skips.sink);
    const client = new ControlClient(transport, o.controlTimeoutMs ?? DEFAULT_CONTROL_TIMEOUT_MS, this.#advertise, this.#skips.sink, this.#snapshotDecoder);
    this.#publisher = new MeshPublisher({
      origin,
      epoch: randomU64(o.random),
      advertise: this.#advertise,
      link: transport,
      ownedBookings: () => service.describe(origin).bookings,
      logger,
      clock,
      wallClock,
      timers,
      ...(o.flushIntervalMs === undefined ? {} : { flushIntervalMs: o.flushIntervalMs }),
      ...(o.heartbeatIntervalMs === undefined ? {} : { heartbeatIntervalMs: o.heartbeatIntervalMs }),
      flushIntervalMs: flushIntervalOf(o.flushIntervalMs, service.loadReplication === "aggregate"),
      // Coalesced events (aggregate totals) are collected from the core at each flush.
      coalesced: {
        collect: () => self.#attachment.collect(),
        get decaying() {
          return self.#attachment.decaying;
        },
      },
    });
    const lagObserver = o.metrics === undefined ? undefined : registerLagMetrics(o.metrics);
    this.#pages = new SnapshotBindingPages({
      port: service,
      decoder: this.#pageDecoder,
      skips: this.#skips,
      logger,
      clock,
      timers,
      repull: (origin, ep) => {
        this.#inbound.pullSnapshot(ep, origin, true);
      },
      closed: () => this.#closed,
    });
    this.#bindingCursors = new BindingCursors(clock, () => randomU64(o.random));
    this.#inbound = new MeshInbound({
      origin,
      port: service,
      control: client,
      pages: this.#pages,
      logger,
      clock,
      wallClock,
      timers,
      ...(lagObserver === undefined ? {} : { lagObserver }),
      ...(o.applyTracer === undefined ? {} : { applyTracer: o.applyTracer }),
      skip: this.#skips.sink,
    });
    this.#membership = new Membership({ origin, advertise: this.#advertise, links: transport, control: client, inbound: this.#inbound, port: service, logger, clock });
    this.#inbound.bindMembership(this.#membership);
    this.#startupSync = new StartupSync({
      clock,
      timeoutMs: o.startupSyncMs ?? DEFAULT_MESH_STARTUP_SYNC_SECS * MS_PER_SECOND,
      peers: () => this.#membership.list(),
      discovered: () => this.#dns?.resolvedOnce ?? true,
      unreachable: (ep) => this.#inbound.unreachable(controlEndpointFor(ep)),
      paging: (p) => this.#inbound.paging(controlEndpointFor(p.endpoint), p.origin === null ? null : BigInt(p.origin)),
      onDone: (r: StartupSyncOutcome) => {
        if (r.reason === "synced") logger.info({ after_ms: Math.round(r.afterMs) }, "mesh startup sync done: every reachable peer's snapshot is in");
        else logger.warn({ after_ms: Math.round(r.afterMs), unsynced: r.unsynced }, "mesh startup sync timed out: ready without these peers' snapshots");
      },
    });
    const refusalLog = new LogThrottle();
    this.#control = new ControlServer({
      port: service,
      publisher: this.#publisher,
      peering: this.#membership,
      bindingCursors: this.#bindingCursors,
      extension: o.controlExtension,
      clock,
      timers,
      onRefused: (kind, reason) => {
        refusalLog.hit((suppressed) => {
          logger.warn({ request: kind, suppressed }, `mesh control request refused: ${reason}`);
        });
      },
    });
    if (o.metrics !== undefined) {
      registerMeshMetrics(o.metrics, { stats: () => this.stats, shed: () => this.#publisher.shed, receiver: this.#inbound.receiver, health: this.#inbound.health, curve: () => transport.curveStats });
    }

    const membership = this.#membership;
    this.#attachment = service.attach({
      event: (e) => {
        this.#publisher.enqueue(e);
        // A lifecycle call taken here for a peer's booking: to its owner directly too.
        if (e.kind === "load" && e.event.type !== "add" && e.event.origin === origin && e.event.owner !== origin) this.#forwardToOwner(e.event, client);
      },
      pending: () => {
        this.#publisher.pending();
      },
      workersChanged: (origins) => {
        this.#inbound.refreshSoon(origins);
      },
      // The core applies what the receive thread handed over before each decision and view.
      drainInbound: () => {
        this.applyReceived();
      },
      ...(o.tieSpread === false ? {} : { slot: () => membership.slot() }),
    });
    if (transport.receivesInThread) {
      transport.onEntries((entries) => {
        this.#inbound.onEntries(entries);
      });
    } else {
      transport.onMessage((topic, payload, frames) => {
        this.#inbound.onMessage(topic, payload, frames);
      });
    }
    transport.onControl((req) => this.#control.handle(req));
    this.#publisher.start();
    const maxApplyDelayMs = o.receiveThreadMaxApplyDelayMs ?? DEFAULT_MESH_APPLY_MAX_DELAY_MS;
    this.#clock = clock;
    this.#housekeeping = timers.setInterval(
      () => {
        const now = clock.now();
        // Hand-overs no decision pulled since the last apply (the core drains them before each one).
        if (now - this.#appliedAtMs >= maxApplyDelayMs) this.applyReceived();
        this.#inbound.housekeeping(now);
        this.#membership.redialSilentPeers(now);
      },
      Math.min(MESH_HOUSEKEEPING_INTERVAL_MS, maxApplyDelayMs),
    );
    // Not at the start: the thread's module loading would compete with this replica's own join.
    const decoderStartMs = o.snapshotDecodeThreadStartMs === undefined ? SNAPSHOT_DECODE_THREAD_START_MS : o.snapshotDecodeThreadStartMs;
    if (decoderStartMs !== null) {
      this.#decoderStart = timers.setTimeout(() => {
        if (!this.#closed) this.#snapshotDecoder.start();
      }, decoderStartMs);
    }
  }

  static async start(o: ReplicaMeshOptions): Promise<ReplicaMesh> {
    // Before binding: a throw after it would leave the sockets open.
    flushIntervalOf(o.flushIntervalMs, o.service.loadReplication === "aggregate");
    const transport = await MeshTransport.bind({
      publishBind: o.publishBind,
      logger: o.logger,
      ...(o.curve === undefined ? {} : { curve: o.curve }),
      ...(o.receiveThreadApplyIntervalMs === undefined ? {} : { receiveThread: { applyIntervalMs: o.receiveThreadApplyIntervalMs, self: o.service.replicaId } }),
    });
    const mesh = new ReplicaMesh(o, transport);
    for (const p of o.peers ?? []) await mesh.registerPeer(p);
    if (o.dnsPeers !== undefined && o.dnsPeers.length > 0) {
      const dns = new DnsPeerDiscovery({
        entries: o.dnsPeers,
        intervalMs: o.peerDnsIntervalMs ?? DEFAULT_PEER_DNS_INTERVAL_SECS * MS_PER_SECOND,
        self: mesh.publishEndpoint,
        register: (ep) => Promise.resolve(mesh.#membership.registerDiscovered(ep)),
        deregister: (ep) => mesh.deregisterPeer(ep),
        timers: o.timers ?? systemTimers,
        logger: o.logger.child({ component: "peer-dns" }),
      });
      mesh.#dns = dns;
      // Not awaited: a slow resolver must not hold the daemon's start (the first round runs now).
      void dns.start();
    }
    return mesh;
  }

  get origin(): bigint {
    return this.#publisher.origin;
  }

  get publishEndpoint(): string {
    return this.#advertise;
  }

  /**
   * Starts the snapshot decoding thread now rather than at snapshotDecodeThreadStartMs (the
   * daemon calls it once this replica's own join is over: in a rolling restart the next replica
   * may join from this one seconds later).
   */
  startSnapshotDecoding(): void {
    if (!this.#closed) this.#snapshotDecoder.start();
  }

  /** Peers' snapshot replies decoded on the thread and here, and whether the thread is up (snapshot-decoder.ts). */
  get snapshotDecoding(): SnapshotDecoderStats & { readonly threadReady: boolean } {
    return { ...this.#snapshotDecoder.stats, threadReady: this.#snapshotDecoder.ready };
  }

  get shed(): number {
    return this.#publisher.shed;
  }

  get stats(): MeshStats {
    const p = this.#publisher.stats;
    const i = this.#inbound.stats;
    const c = this.#control.stats;
    const r = this.#transport.receiveThreadStats;
    return {
      batchesSent: p.batchesSent,
      eventsSent: p.eventsSent,
      heartbeatsSent: p.heartbeatsSent,
      batchesApplied: i.batchesApplied,
      eventsApplied: i.eventsApplied,
      malformed: i.malformed + c.malformed + (r?.malformed ?? 0),
      snapshotsServed: c.snapshotsServed,
      snapshotsInstalled: i.snapshotsInstalled,
      snapshotFailures: i.snapshotFailures,
      divergenceResyncs: i.divergenceResyncs,
      redials: this.#membership.stats.redials,
      snapshotPullsDeferred: i.snapshotPullsDeferred,
      downOriginsDropped: i.downOriginsDropped,
      leftOriginsKept: i.leftOriginsKept,
      missedStatePulls: i.missedStatePulls,
      traceCausesDropped: p.traceCausesDropped,
      receiveHandovers: r?.handovers ?? 0,
      receiveBatchesMerged: r?.merged ?? 0,
      receiveThreadRestarts: r?.restarts ?? 0,
      peerDnsResolutions: this.#dns?.stats.resolutions ?? 0,
      peerDnsFailures: this.#dns?.stats.failures ?? 0,
      controlRefused: { ...c.refused },
      entriesSkipped: addSkipCounts(this.#skips.counts, r?.skipped ?? zeroSkipCounts()),
      lifecycleForwards: { ...this.#forwards },
      bindingPages: { ...this.#pages.stats },
      bindingCursors: { ...this.#bindingCursors.stats, open: this.#bindingCursors.size },
    };
  }

  registerPeer(endpoint: string): Promise<boolean> {
    return Promise.resolve(this.#membership.register(endpoint));
  }

  deregisterPeer(endpoint: string): Promise<boolean> {
    return this.#membership.deregister(endpoint);
  }

  /** The control channel's request link and our PUB as peers reach it (the warm join's pull, index-sync.ts). */
  get controlLink(): ControlLink {
    return this.#transport;
  }

  get advertiseEndpoint(): string {
    return this.#advertise;
  }

  listPeers(): PeerView[] {
    return this.#membership.list();
  }

  startupSyncPending(): string[] | null {
    return this.#closed ? null : this.#startupSync.pending();
  }

  /**
   * A lifecycle call taken here for a peer's booking goes to its owner directly too, acknowledged
   * on the control channel: the stream alone loses it when the owner is not subscribed to us yet
   * (just after peering, or while its SUB reconnects), and the owner would then keep the booking,
   * and republish it to everyone, until it expires (300 s). Best effort: at most
   * MAX_LIFECYCLE_FORWARDS_IN_FLIGHT at once, the rest left to the stream, all counted.
   */
  #forwardToOwner(event: LoadMarkEvent, client: ControlClient): void {
    const f = this.#forwards;
    const endpoint = this.#inbound.controlEndpointOf(event.owner);
    if (endpoint === undefined || this.#closed) return;
    if (this.#forwardsInFlight >= MAX_LIFECYCLE_FORWARDS_IN_FLIGHT) {
      f.skipped++;
      return;
    }
    this.#forwardsInFlight++;
    client
      .request(endpoint, { type: "lifecycle", from: event.origin, event })
      .then(
        () => {
          f.sent++;
        },
        (err: unknown) => {
          f.failed++;
          this.#forwardLog.hit((suppressed) => {
            this.#log.warn({ err, owner: event.owner.toString(), request_id: event.request_id, suppressed }, "could not send a lifecycle call to the booking's owner (the stream still carries it)");
          });
        },
      )
      .finally(() => {
        this.#forwardsInFlight--;
      });
  }

  #applying = false;

  applyReceived(): void {
    // Not re-entered: applying a hand-over reaches the core, which drains inbound before a
    // decision or view; a nested apply would read later hand-overs ahead of the rest of this one.
    if (this.#closed || this.#applying) return;
    this.#applying = true;
    try {
      this.#appliedAtMs = this.#clock.now();
      this.#transport.applyReceived();
    } finally {
      this.#applying = false;
    }
  }

  catchUp(): Promise<void> {
    return this.#closed ? Promise.resolve() : this.#transport.catchUp();
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    // Flush what is queued so peers see the last frees before we go, and say we are leaving:
    // peers then keep our bookings until they are freed or expire, instead of dropping them once
    // we are down (G8). A shutdown through drain() said so already; saying it again is harmless.
    this.#dns?.close();
    this.#publisher.enqueue({ kind: "drain", event: { draining: true } });
    await this.#publisher.close();
    this.#housekeeping.cancel();
    this.#decoderStart?.cancel();
    this.#inbound.close();
    this.#membership.close();
    this.#attachment.detach();
    await this.#pageDecoder.close();
    await this.#snapshotDecoder.close();
    await this.#transport.close();
  }
}

function randomU64(random: Random | undefined): bigint {
  const r = (): bigint => BigInt(Math.floor((random?.next() ?? Math.random()) * 0x1_0000_0000));
  for (;;) {
    const v = (r() << 32n) | r();
    if (v !== 0n) return v;
  }
}
