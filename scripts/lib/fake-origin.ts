/**
 * A fake origin replica for bench:scale --stress: it speaks the mesh protocol over the real
 * sockets (mesh/transport.ts: an XPUB and a control ROUTER, bound like a replica's, the control
 * port being the publish port + 1) so a real `kvmesh serve` peer mirrors it exactly as it
 * mirrors a replica, while the bookings come from SyntheticBookings instead of HTTP traffic.
 *
 * It publishes numbered batches (seq 1, 2, ... per (origin, epoch)) and a heartbeat every 500 ms
 * carrying the last seq and a booking count that a peer compares with what it mirrors, answers
 * `snapshot` at the current seq, and `peer` by connecting its SUB to the asking replica
 * (symmetric peering, as a replica does; what arrives is only counted). Two load replication
 * modes, as a replica (src/core/replica-events.ts LoadReplication):
 * - exact (`bookings`): the caller publishes every booking's events (`publish`); heartbeats count
 *   the live bookings; a snapshot carries every live booking;
 * - aggregate (`aggregates`): the caller reports changes (`loadChanged`) and, as the real
 *   publisher (mesh/publisher.ts), the fake origin flushes at most once per `intervalMs`: one
 *   batch with a `loads` event of the changed ranks' totals and the ids booked and ended since;
 *   heartbeats count the requests of the totals published so far; a snapshot carries the totals
 *   of every rank with load and every live id, and no bookings.
 *
 * Mesh exports used (keep them for this bench): transport.ts MeshTransport (bind, publish,
 * onControl, onMessage, connectPeer, disconnectPeer, publishEndpoint, controlEndpoint, stats, close); wire.ts
 * encodeBatch, encodeHeartbeat, encodeControlReply, decodeControlRequest; types.ts TOPIC_BATCH,
 * TOPIC_HEARTBEAT, PROTOCOL_VERSION and the MeshEvent (its "loads" kind too), MeshBatch,
 * Heartbeat, Snapshot (its `aggregates` too), SnapshotBooking types; src/core/replica-events.ts
 * LoadAggregates.
 */
import { systemClock, type Clock } from "../../src/core/index.js";
import type { Random } from "../../src/core/index.js";
import type { MeshCurveConfig } from "../../mesh/curve.js";
import { MeshTransport } from "../../mesh/transport.js";
import type { LoadAggregates } from "../../src/core/index.js";
import { PROTOCOL_VERSION, TOPIC_BATCH, TOPIC_HEARTBEAT, type MeshBatch, type MeshEvent, type SnapshotBooking } from "../../mesh/types.js";
import { decodeControlRequest, encodeBatch, encodeControlReply, encodeHeartbeat } from "../../mesh/wire.js";

/** A replica's heartbeat period (mesh/replica-mesh.ts DEFAULT_MESH_HEARTBEAT_INTERVAL_MS). */
export const FAKE_ORIGIN_HEARTBEAT_MS = 500;
/** Events per batch: the real publisher's cap (mesh/outbound-queue.ts default). */
export const FAKE_ORIGIN_MAX_EVENTS_PER_BATCH = 256;

export interface FakeOriginOptions {
  /** Loopback port P: the XPUB binds P, the control ROUTER P + 1 (see freePortPair). */
  readonly port: number;
  /** Exact load replication: the live bookings (heartbeat count, snapshots). Exactly one of bookings and aggregates. */
  readonly bookings?: { snapshotBookings(): SnapshotBooking[]; readonly live: number };
  /** Aggregate load replication: where flushes take the changed totals from (aggregate-bookings.ts). */
  readonly aggregates?: FakeAggregateSource;
  /** Aggregate mode: minimum spacing of flushes, ms (a replica's --mesh-aggregate-interval-ms). */
  readonly intervalMs?: number;
  /** Monotonic, ms: flush pacing (default performance.now). */
  readonly monotonic?: Clock;
  /** Wall clock, ms since the Unix epoch: peers measure lag against sentAtMs. */
  readonly wallClock: Clock;
  /** This fake replica's id (non-zero u64): origin and owner of its bookings. */
  readonly origin: bigint;
  /** Random per start, as a replica's: a new epoch tells peers the old state is gone. */
  readonly epoch: bigint;
  /** Mesh over CURVE with this key pair and allow list (bench:scale --curve). */
  readonly curve?: MeshCurveConfig;
}

/** What the fake origin publishes in aggregate mode: AggregateBookings' take, snapshot and count. */
export interface FakeAggregateSource {
  take(): LoadAggregates[];
  snapshot(): LoadAggregates[];
  readonly publishedRequests: number;
}

export interface FakeOriginStats {
  batches: number;
  events: number;
  heartbeats: number;
  /** Publishes that failed (the transport closed, or ZeroMQ refused the send). */
  publishFailures: number;
  /** Publishes handed to the transport and not yet queued by ZeroMQ; and the most seen at once. */
  pendingPublishes: number;
  maxPendingPublishes: number;
  snapshotsServed: number;
  peerRequests: number;
  /** Messages from the peers we connected back to (their heartbeats). */
  received: number;
}

/** A non-zero u64 from `r` (replica ids and epochs). */
export function randomU64(r: Random): bigint {
  for (;;) {
    const v = (BigInt(Math.floor(r.next() * 0x1_0000_0000)) << 32n) | BigInt(Math.floor(r.next() * 0x1_0000_0000));
    if (v !== 0n) return v;
  }
}

export class FakeOrigin {
  readonly origin: bigint;
  readonly epoch: bigint;
  readonly stats: FakeOriginStats = { batches: 0, events: 0, heartbeats: 0, publishFailures: 0, pendingPublishes: 0, maxPendingPublishes: 0, snapshotsServed: 0, peerRequests: 0, received: 0 };
  readonly #transport: MeshTransport;
  readonly #o: FakeOriginOptions;
  readonly #heartbeat: NodeJS.Timeout;
  readonly #mono: Clock;
  /** Publish endpoints that asked us to peer back (what a status request answers). */
  readonly #peers = new Set<string>();
  #seq = 0;
  /** Aggregate mode: monotonic ms of the last flush (-Infinity: the first change goes out at once), and the one scheduled. */
  #lastFlushAtMs = -Infinity;
  #scheduled: { cancel(): void } | undefined;
  #closed = false;

  private constructor(transport: MeshTransport, o: FakeOriginOptions) {
    if ((o.bookings === undefined) === (o.aggregates === undefined)) throw new RangeError("a fake origin needs exactly one of bookings (exact) and aggregates (aggregate)");
    this.#transport = transport;
    this.#mono = o.monotonic ?? systemClock;
    this.#o = o;
    this.origin = o.origin;
    this.epoch = o.epoch;
    transport.onControl((raw) => this.#onControl(raw));
    transport.onMessage(() => {
      this.stats.received++;
    });
    this.#heartbeat = setInterval(() => {
      this.#sendHeartbeat();
    }, FAKE_ORIGIN_HEARTBEAT_MS);
  }

  static async bind(o: FakeOriginOptions): Promise<FakeOrigin> {
    const transport = await MeshTransport.bind({ publishBind: `tcp://127.0.0.1:${o.port}`, ...(o.curve === undefined ? {} : { curve: o.curve }) });
    return new FakeOrigin(transport, o);
  }

  get publishEndpoint(): string {
    return this.#transport.publishEndpoint;
  }

  /** The last batch seq published. */
  get seq(): number {
    return this.#seq;
  }

  get mode(): "exact" | "aggregate" {
    return this.#o.aggregates === undefined ? "exact" : "aggregate";
  }

  /**
   * Aggregate mode: our totals changed. As the real publisher: a flush on the next turn if the
   * last one is at least an interval old, else when the interval ends (changes meanwhile share it).
   */
  loadChanged(): void {
    if (this.#closed || this.#scheduled !== undefined || this.#o.aggregates === undefined) return;
    const waitMs = this.#lastFlushAtMs + (this.#o.intervalMs ?? 0) - this.#mono.now();
    if (waitMs > 0) {
      const t = setTimeout(this.#flushAggregates, waitMs);
      this.#scheduled = {
        cancel: () => {
          clearTimeout(t);
        },
      };
    } else {
      const t = setImmediate(this.#flushAggregates);
      this.#scheduled = {
        cancel: () => {
          clearImmediate(t);
        },
      };
    }
  }

  readonly #flushAggregates = (): void => {
    this.#scheduled = undefined;
    this.#lastFlushAtMs = this.#mono.now();
    const taken = this.#o.aggregates?.take() ?? [];
    if (taken.length > 0 && !this.#closed) this.publish(taken.map((event): MeshEvent => ({ kind: "loads", event })));
  };

  /** Publishes `events` as batches of at most FAKE_ORIGIN_MAX_EVENTS_PER_BATCH, numbered in order. */
  publish(events: readonly MeshEvent[]): void {
    for (let i = 0; i < events.length; i += FAKE_ORIGIN_MAX_EVENTS_PER_BATCH) {
      const batch: MeshBatch = {
        v: PROTOCOL_VERSION,
        origin: this.origin,
        epoch: this.epoch,
        seq: ++this.#seq,
        sentAtMs: this.#o.wallClock.now(),
        events: events.slice(i, i + FAKE_ORIGIN_MAX_EVENTS_PER_BATCH),
      };
      this.stats.batches++;
      this.stats.events += batch.events.length;
      this.#send(TOPIC_BATCH, encodeBatch(batch));
    }
  }

  #send(topic: string, payload: Buffer): void {
    const s = this.stats;
    s.pendingPublishes++;
    if (s.pendingPublishes > s.maxPendingPublishes) s.maxPendingPublishes = s.pendingPublishes;
    this.#transport.publish(topic, payload).then(
      () => {
        s.pendingPublishes--;
      },
      () => {
        s.pendingPublishes--;
        s.publishFailures++;
      },
    );
  }

  #sendHeartbeat(): void {
    this.stats.heartbeats++;
    this.#send(
      TOPIC_HEARTBEAT,
      encodeHeartbeat({
        v: PROTOCOL_VERSION,
        origin: this.origin,
        epoch: this.epoch,
        seq: this.#seq,
        sentAtMs: this.#o.wallClock.now(),
        controlEndpoint: this.#transport.controlEndpoint,
        publishEndpoint: this.#transport.publishEndpoint,
        bookings: this.#o.aggregates?.publishedRequests ?? this.#o.bookings?.live ?? 0,
      }),
    );
  }

  /** Synchronous, so a snapshot is consistent with #seq: every batch up to it carried what it holds. */
  #onControl(raw: Buffer): Buffer {
    let req: ReturnType<typeof decodeControlRequest>;
    try {
      req = decodeControlRequest(raw);
    } catch (err) {
      return encodeControlReply({ type: "error", message: err instanceof Error ? err.message : "malformed request" });
    }
    switch (req.type) {
      case "snapshot":
        this.stats.snapshotsServed++;
        return encodeControlReply({
          type: "snapshot",
          snapshot:
            this.#o.aggregates === undefined
              ? { v: PROTOCOL_VERSION, origin: this.origin, epoch: this.epoch, seq: this.#seq, bookings: this.#o.bookings?.snapshotBookings() ?? [], bindings: [] }
              : { v: PROTOCOL_VERSION, origin: this.origin, epoch: this.epoch, seq: this.#seq, bookings: [], bindings: [], aggregates: this.#o.aggregates.snapshot() },
        });
      case "status":
        return encodeControlReply({ type: "status", origin: this.origin, peers: [...this.#peers] });
      case "lifecycle":
        return encodeControlReply({ type: "error", message: "the fake origin takes no lifecycle calls" });
      case "bindings":
        // Its snapshots are never paged (it hands out no binding cursor).
        return encodeControlReply({ type: "error", message: "the fake origin hands out no binding cursor" });
      case "peer":
        this.stats.peerRequests++;
        this.#peers.add(req.publishEndpoint);
        this.#transport.connectPeer(req.publishEndpoint);
        return encodeControlReply({ type: "ok" });
      case "unpeer":
        this.#peers.delete(req.publishEndpoint);
        this.#transport.disconnectPeer(req.publishEndpoint);
        return encodeControlReply({ type: "ok" });
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#scheduled?.cancel();
    this.#scheduled = undefined;
    clearInterval(this.#heartbeat);
    await this.#transport.close();
  }
}
