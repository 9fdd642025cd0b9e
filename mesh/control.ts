/**
 * The mesh's control channel (ROUTER/DEALER, see transport.ts): requests this replica sends to a
 * peer (snapshot, peer, unpeer) and the handling of the ones peers send to it. A snapshot is
 * served from the core's live state, consistent with the publisher's seq; peering requests go
 * to membership.
 */
import { parsePeerEndpoint } from "./endpoints.js";
import { MeshRemoteError } from "./errors.js";
import type { MeshPublisher } from "./publisher.js";
import type { ReplicaPort } from "./replica-port.js";
import type { ControlReply, ControlRequest, Snapshot } from "./types.js";
import { decodeControlReply, decodeControlRequest, encodeControlReply, encodeControlRequest } from "./wire.js";

/** Control requests (snapshot, peer, unpeer) give up after this long, ms. */
export const DEFAULT_CONTROL_TIMEOUT_MS = 2_000;

/** A control reply other than "error" (an error reply throws MeshRemoteError). */
export type ControlAnswer = Exclude<ControlReply, { type: "error" }>;

/** One request/reply to a peer's control ROUTER (MeshTransport.request in production). */
export interface ControlLink {
  request(controlEndpoint: string, payload: Buffer, timeoutMs: number): Promise<Buffer>;
}

export class ControlClient {
  readonly #link: ControlLink;
  readonly #timeoutMs: number;

  constructor(link: ControlLink, timeoutMs = DEFAULT_CONTROL_TIMEOUT_MS) {
    this.#link = link;
    this.#timeoutMs = timeoutMs;
  }

  /** Sends `req`; rejects with MeshRemoteError on an error reply, as the transport does on failures. */
  async request(endpoint: string, req: ControlRequest): Promise<ControlAnswer> {
    const reply = decodeControlReply(await this.#link.request(endpoint, encodeControlRequest(req), this.#timeoutMs));
    if (reply.type === "error") throw new MeshRemoteError(endpoint, reply.message);
    return reply;
  }

  /** Asks `endpoint` for a snapshot of its origin. */
  async snapshot(endpoint: string, from: bigint): Promise<Snapshot> {
    const reply = await this.request(endpoint, { type: "snapshot", from });
    if (reply.type !== "snapshot") throw new MeshRemoteError(endpoint, `unexpected control reply ${reply.type} to a snapshot request`);
    return reply.snapshot;
  }
}

/** What the control server asks membership to do for a peer's request. */
export interface PeeringRequests {
  /** "Connect your SUB to my PUB at `publishEndpoint`" from the process `from`. */
  onPeerRequest(publishEndpoint: string, from: bigint): void;
  /** "Stop receiving from me". */
  onUnpeerRequest(publishEndpoint: string, from: bigint): void;
}

export interface ControlServerOptions {
  readonly port: Pick<ReplicaPort, "bookingsSnapshot" | "bindingsSnapshot" | "loadAggregatesSnapshot" | "mirroredAggregatesSnapshot">;
  readonly publisher: Pick<MeshPublisher, "origin" | "epoch" | "seq" | "settled">;
  readonly peering: PeeringRequests;
}

export interface ControlServerStats {
  snapshotsServed: number;
  /** Control requests that failed to decode. */
  malformed: number;
}

export class ControlServer {
  readonly stats: ControlServerStats = { snapshotsServed: 0, malformed: 0 };
  readonly #o: ControlServerOptions;

  constructor(o: ControlServerOptions) {
    this.#o = o;
  }

  /** One request from a peer; the reply is encoded (a malformed request gets an error reply). */
  async handle(raw: Buffer): Promise<Buffer> {
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
        const p = this.#o.publisher;
        await p.settled();
        // Taken synchronously after the flush in progress, so it is consistent with seq.
        const snapshot: Snapshot = {
          v: 1,
          origin: p.origin,
          epoch: p.epoch,
          seq: p.seq,
          bookings: this.#o.port.bookingsSnapshot(),
          bindings: this.#o.port.bindingsSnapshot(),
          aggregates: this.#o.port.loadAggregatesSnapshot(),
          mirrored: this.#o.port.mirroredAggregatesSnapshot(),
        };
        return encodeControlReply({ type: "snapshot", snapshot });
      }
      case "peer":
        this.#o.peering.onPeerRequest(parsePeerEndpoint(req.publishEndpoint), req.from);
        return encodeControlReply({ type: "ok" });
      case "unpeer":
        this.#o.peering.onUnpeerRequest(parsePeerEndpoint(req.publishEndpoint), req.from);
        return encodeControlReply({ type: "ok" });
    }
  }
}
