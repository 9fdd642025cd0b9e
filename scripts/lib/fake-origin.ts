/**
 * A fake origin replica for bench:scale --stress: it speaks the mesh protocol over the real
 * sockets (mesh/transport.ts: an XPUB and a control ROUTER, bound like a replica's, the control
 * port being the publish port + 1) so a real `kvmesh serve` peer mirrors it exactly as it
 * mirrors a replica, while the bookings come from SyntheticBookings instead of HTTP traffic.
 *
 * It publishes numbered batches (seq 1, 2, ... per (origin, epoch)) and a heartbeat every 500 ms
 * carrying the last seq and the live booking count (a peer compares it with what it mirrors),
 * answers `snapshot` with every live booking at the current seq, and `peer` by connecting its SUB
 * to the asking replica (symmetric peering, as a replica does; what arrives is only counted).
 *
 * Mesh exports used (keep them for this bench): transport.ts MeshTransport (bind, publish,
 * onControl, onMessage, connectPeer, disconnectPeer, publishEndpoint, controlEndpoint, stats, close); wire.ts
 * encodeBatch, encodeHeartbeat, encodeControlReply, decodeControlRequest; types.ts TOPIC_BATCH,
 * TOPIC_HEARTBEAT, PROTOCOL_VERSION and the MeshEvent, MeshBatch, Heartbeat, Snapshot,
 * SnapshotBooking types.
 */
import type { Clock, Random } from "../../src/core/clock.js";
import { MeshTransport } from "../../mesh/transport.js";
import { PROTOCOL_VERSION, TOPIC_BATCH, TOPIC_HEARTBEAT, type MeshBatch, type MeshEvent, type SnapshotBooking } from "../../mesh/types.js";
import { decodeControlRequest, encodeBatch, encodeControlReply, encodeHeartbeat } from "../../mesh/wire.js";

/** A replica's heartbeat period (mesh/replica-mesh.ts DEFAULT_MESH_HEARTBEAT_INTERVAL_MS). */
export const FAKE_ORIGIN_HEARTBEAT_MS = 500;
/** Events per batch: the real publisher's cap (mesh/outbound-queue.ts default). */
export const FAKE_ORIGIN_MAX_EVENTS_PER_BATCH = 256;

export interface FakeOriginOptions {
  /** Loopback port P: the XPUB binds P, the control ROUTER P + 1 (see freePortPair). */
  readonly port: number;
  readonly bookings: { snapshotBookings(): SnapshotBooking[]; readonly live: number };
  /** Wall clock, ms since the Unix epoch: peers measure lag against sentAtMs. */
  readonly wallClock: Clock;
  /** This fake replica's id (non-zero u64): origin and owner of its bookings. */
  readonly origin: bigint;
  /** Random per start, as a replica's: a new epoch tells peers the old state is gone. */
  readonly epoch: bigint;
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
  #seq = 0;

  private constructor(transport: MeshTransport, o: FakeOriginOptions) {
    this.#transport = transport;
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
    const transport = await MeshTransport.bind({ publishBind: `tcp://127.0.0.1:${o.port}` });
    return new FakeOrigin(transport, o);
  }

  get publishEndpoint(): string {
    return this.#transport.publishEndpoint;
  }

  /** The last batch seq published. */
  get seq(): number {
    return this.#seq;
  }

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
        bookings: this.#o.bookings.live,
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
          snapshot: { v: PROTOCOL_VERSION, origin: this.origin, epoch: this.epoch, seq: this.#seq, bookings: this.#o.bookings.snapshotBookings(), bindings: [] },
        });
      case "peer":
        this.stats.peerRequests++;
        this.#transport.connectPeer(req.publishEndpoint);
        return encodeControlReply({ type: "ok" });
      case "unpeer":
        this.#transport.disconnectPeer(req.publishEndpoint);
        return encodeControlReply({ type: "ok" });
    }
  }

  async close(): Promise<void> {
    clearInterval(this.#heartbeat);
    await this.#transport.close();
  }
}
