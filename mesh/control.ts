/**
 * The mesh's control channel (ROUTER/DEALER, see transport.ts): requests this replica sends to a
 * peer (snapshot, status, peer, unpeer) and the handling of the ones peers send to it. A snapshot
 * is served from the core's live state, consistent with the publisher's seq; peering requests go
 * to membership.
 *
 * Without CURVE anyone who reaches the control port can send these, so membership checks each
 * request's claims before acting (membership.ts `checkSnapshot`, `onPeerRequest`,
 * `onUnpeerRequest`): a refused request gets an error reply and is counted by kind. The checks
 * stop blind and forged requests (an unpeer naming a live peer, a snapshot from a process that
 * is no replica); they cannot stop a reachable rogue replica, which only CURVE keeps out.
 */
import type { BindingEvent, Clock, Timers } from "../src/core/index.js";
import { systemClock, systemTimers } from "../src/core/index.js";
import type { BindingCursors } from "./binding-cursors.js";
import { parsePeerEndpoint } from "./endpoints.js";
import { MeshRemoteError } from "./errors.js";
import type { MeshPublisher } from "./publisher.js";
import type { ReplicaPort } from "./replica-port.js";
import type { SnapshotDecoder } from "./snapshot-decoder.js";
import { encodeSnapshotReplyInSlices, SlicePacer } from "./snapshot-reply-encoder.js";
import type { ControlReply, ControlRequest, Snapshot } from "./types.js";
import { decodeControlReply, decodeControlRequest, encodeControlReply, encodeControlRequest, type SkipSink } from "./wire.js";

/** Control requests (snapshot, peer, unpeer) give up after this long, ms. */
export const DEFAULT_CONTROL_TIMEOUT_MS = 2_000;
/**
 * Bindings per page this replica asks for (at most MAX_SNAPSHOT_PAGE_BINDINGS, wire.ts): 16,384
 * are ~1.4 MB and take the serving peer's main thread ~20 ms to encode, so a page costs its
 * /select one short stall; 1,000,000 bindings take 62 pages.
 */
export const DEFAULT_SNAPSHOT_PAGE_BINDINGS = 16_384;
/**
 * How long one page may take, ms: longer than the control timeout (2 s), since the serving peer
 * walks and encodes the page on its main thread between its own requests; a pull of 1,000,000
 * bindings on a loaded 2-core machine timed pages out at 2 s and started over.
 */
export const DEFAULT_BINDING_PAGE_TIMEOUT_MS = 10_000;

/** A control reply other than "error" (an error reply throws MeshRemoteError). */
export type ControlAnswer = Exclude<ControlReply, { type: "error" }>;

/** One request/reply to a peer's control ROUTER (MeshTransport.request in production). */
export interface ControlLink {
  request(controlEndpoint: string, payload: Buffer, timeoutMs: number): Promise<Buffer>;
}

export class ControlClient {
  readonly #link: ControlLink;
  readonly #timeoutMs: number;
  readonly #advertise: string | undefined;
  readonly #skip: SkipSink | undefined;
  readonly #decoder: Pick<SnapshotDecoder, "decode"> | undefined;

  /**
   * `advertise`: our PUB as peers reach it, sent with snapshot requests for the peer's check of who
   * asks. `skip`: where a snapshot's bad entries go (the rest installs; entry-skips.ts).
   * `decoder`: where snapshot replies are decoded (off the main thread, snapshot-decoder.ts);
   * without it, here.
   */
  constructor(link: ControlLink, timeoutMs = DEFAULT_CONTROL_TIMEOUT_MS, advertise?: string, skip?: SkipSink, decoder?: Pick<SnapshotDecoder, "decode">) {
    this.#link = link;
    this.#timeoutMs = timeoutMs;
    this.#advertise = advertise;
    this.#skip = skip;
    this.#decoder = decoder;
  }

  /** Sends `req`; rejects with MeshRemoteError on an error reply, as the transport does on failures. */
  async request(endpoint: string, req: ControlRequest, timeoutMs = this.#timeoutMs): Promise<ControlAnswer> {
    const reply = decodeControlReply(await this.#link.request(endpoint, encodeControlRequest(req), timeoutMs), this.#skip);
    if (reply.type === "error") throw new MeshRemoteError(endpoint, reply.message);
    return reply;
  }

  /**
   * Asks `endpoint` for a snapshot of its origin (`timeoutMs`: shorter for a first-contact probe,
   * snapshot-pulls.ts), its bindings in pages of DEFAULT_SNAPSHOT_PAGE_BINDINGS (a replica of an
   * earlier version ignores the offer and answers whole).
   */
  async snapshot(endpoint: string, from: bigint, timeoutMs?: number): Promise<Snapshot> {
    const raw = await this.#link.request(endpoint, encodeControlRequest({ type: "snapshot", from, publishEndpoint: this.#advertise, pageBindings: DEFAULT_SNAPSHOT_PAGE_BINDINGS }), timeoutMs ?? this.#timeoutMs);
    const reply = this.#decoder === undefined ? decodeControlReply(raw, this.#skip) : await this.#decoder.decode(endpoint, raw);
    if (reply.type === "error") throw new MeshRemoteError(endpoint, reply.message);
    if (reply.type !== "snapshot") throw new MeshRemoteError(endpoint, `unexpected control reply ${reply.type} to a snapshot request`);
    return reply.snapshot;
  }

  /** The next page of a snapshot's bindings, raw: decoded off this thread (binding-page-decoder.ts). */
  bindingPage(endpoint: string, from: bigint, cursor: bigint): Promise<Buffer> {
    return this.#link.request(endpoint, encodeControlRequest({ type: "bindings", from, cursor, max: DEFAULT_SNAPSHOT_PAGE_BINDINGS }), Math.max(this.#timeoutMs, DEFAULT_BINDING_PAGE_TIMEOUT_MS));
  }
}

/**
 * What the control server asks membership for a peer's request. The handlers check the request
 * first and resolve to null when it was carried out, or to why it was refused.
 */
export interface PeeringRequests {
  /** "Connect your SUB to my PUB at `publishEndpoint`" from the process `from`. */
  onPeerRequest(publishEndpoint: string, from: bigint): Promise<string | null>;
  /** "Stop receiving from me". */
  onUnpeerRequest(publishEndpoint: string, from: bigint): Promise<string | null>;
  /** Whether `from` (whose PUB is `publishEndpoint`, when it says) may read our snapshot. */
  checkSnapshot(from: bigint, publishEndpoint: string | undefined): Promise<string | null>;
  /** The publish endpoints registered here (a status reply). */
  peerEndpoints(): string[];
  /** Whether `from` is a registered or heard peer (a lifecycle request must come from one). */
  knows(from: bigint): boolean;
}

/** Control requests refused by kind (kvmesh_mesh_control_refused_total{request}). */
export interface ControlRefusals {
  snapshot: number;
  peer: number;
  unpeer: number;
  lifecycle: number;
}

/**
 * A request kind served beside the control channel's own (the warm join's index pull,
 * index-sync.ts): its reply, or null when `raw` is not one of its requests. `authorize` is the
 * snapshot check (who may read this replica's state).
 */
export type ControlExtension = (raw: Buffer, authorize: (from: bigint, publishEndpoint: string | undefined) => Promise<string | null>) => Promise<Buffer> | null;

export interface ControlServerOptions {
  readonly port: Pick<ReplicaPort, "snapshot" | "apply" | "bindingCursor">;
  /** Where a paged snapshot's binding cursors live; without it every snapshot goes whole. */
  readonly bindingCursors?: BindingCursors;
  readonly publisher: Pick<MeshPublisher, "origin" | "epoch" | "seq" | "settled">;
  readonly peering: PeeringRequests;
  /** Told of each refusal (the mesh logs them, throttled). */
  readonly onRefused?: (kind: keyof ControlRefusals, reason: string) => void;
  readonly extension?: ControlExtension | undefined;
  /** Paces a snapshot reply's encode (snapshot-reply-encoder.ts); default the process's. */
  readonly clock?: Clock;
  readonly timers?: Timers;
}

export interface ControlServerStats {
  snapshotsServed: number;
  /** Control requests that failed to decode. */
  malformed: number;
  /** Lifecycle calls for our bookings that another replica sent directly (applied; repeats are no-ops). */
  lifecycleReceived: number;
  /** Turns of the event loop given back while encoding snapshot replies (snapshot-reply-encoder.ts). */
  snapshotEncodeYields: number;
  readonly refused: ControlRefusals;
}

/** `head`, then the rest of `walk`. */
function* prepend<T>(head: T, walk: Iterator<T, void, void>): Generator<T, void, void> {
  yield head;
  for (let r = walk.next(); r.done !== true; r = walk.next()) yield r.value;
}

export class ControlServer {
  readonly stats: ControlServerStats = { snapshotsServed: 0, malformed: 0, lifecycleReceived: 0, snapshotEncodeYields: 0, refused: { snapshot: 0, peer: 0, unpeer: 0, lifecycle: 0 } };
  readonly #o: ControlServerOptions;

  constructor(o: ControlServerOptions) {
    this.#o = o;
  }

  /** One request from a peer; the reply is encoded (a malformed request gets an error reply). */
  async handle(raw: Buffer): Promise<Buffer> {
    const extended = this.#o.extension?.(raw, (from, pe) => this.#o.peering.checkSnapshot(from, pe));
    if (extended !== undefined && extended !== null) return extended;
    let req: ControlRequest;
    try {
      req = decodeControlRequest(raw);
    } catch (err) {
      this.stats.malformed++;
      return encodeControlReply({ type: "error", message: err instanceof Error ? err.message : "malformed request" });
    }
    const peering = this.#o.peering;
    switch (req.type) {
      case "status":
        return encodeControlReply({ type: "status", origin: this.#o.publisher.origin, peers: peering.peerEndpoints() });
      case "snapshot": {
        const refused = await peering.checkSnapshot(req.from, req.publishEndpoint);
        if (refused !== null) return this.#refuse("snapshot", refused);
        this.stats.snapshotsServed++;
        const p = this.#o.publisher;
        await p.settled();
        // Taken synchronously after the flush in progress, so it is consistent with seq. A
        // requester that takes pages gets the bindings through a cursor (binding-cursors.ts).
        const cursors = req.pageBindings === undefined ? undefined : this.#o.bindingCursors;
        const snapshot: Snapshot = { ...this.#o.port.snapshot({ pagedBindings: cursors !== undefined }), v: 1, origin: p.origin, epoch: p.epoch, seq: p.seq };
        if (cursors === undefined || req.pageBindings === undefined) return this.#encodeSnapshot(snapshot);
        // The first page rides in the reply: a snapshot of up to a page of bindings (most) needs
        // no cursor, no further request and no decoding thread on the puller.
        const walk = this.#o.port.bindingCursor();
        const first: BindingEvent[] = [];
        let next = walk.next();
        while (next.done !== true && first.length < req.pageBindings) {
          first.push(next.value);
          next = walk.next();
        }
        if (next.done === true) return this.#encodeSnapshot({ ...snapshot, bindings: first });
        const rest = prepend(next.value, walk);
        return this.#encodeSnapshot({ ...snapshot, bindings: first, bindingCursor: cursors.open(req.from, rest) });
      }
      case "bindings": {
        const cursors = this.#o.bindingCursors;
        if (cursors === undefined) return this.#refuse("snapshot", "this replica hands out no binding cursor");
        // The check was made when the cursor was handed out (to `from`, with the snapshot); its
        // random id is what a third party cannot name (binding-cursors.ts).
        const page = cursors.page(req.from, req.cursor, req.max);
        if ("refused" in page) return this.#refuse("snapshot", page.refused);
        return encodeControlReply({ type: "bindings", bindings: page.bindings, more: page.more });
      }
      case "lifecycle": {
        const e = req.event;
        if (e.owner !== this.#o.publisher.origin) return this.#refuse("lifecycle", `booking ${e.request_id} is owned by ${e.owner}, not this replica`);
        if (e.origin !== req.from || !peering.knows(req.from)) return this.#refuse("lifecycle", `origin ${req.from} is not a registered or heard peer`);
        // The same path as the event in the sender's stream: idempotent, so both may arrive.
        this.#o.port.apply(req.from, [{ kind: "load", event: e }]);
        this.stats.lifecycleReceived++;
        return encodeControlReply({ type: "ok" });
      }
      case "peer": {
        const refused = await peering.onPeerRequest(parsePeerEndpoint(req.publishEndpoint), req.from);
        return refused === null ? encodeControlReply({ type: "ok" }) : this.#refuse("peer", refused);
      }
      case "unpeer": {
        const refused = await peering.onUnpeerRequest(parsePeerEndpoint(req.publishEndpoint), req.from);
        return refused === null ? encodeControlReply({ type: "ok" }) : this.#refuse("unpeer", refused);
      }
    }
  }

  /**
   * The reply to a snapshot request, encoded in slices (snapshot-reply-encoder.ts): the snapshot
   * was taken whole in one step; its encode lets this replica's requests run between slices.
   */
  async #encodeSnapshot(snapshot: Snapshot): Promise<Buffer> {
    const pacer = new SlicePacer(this.#o.clock ?? systemClock, this.#o.timers ?? systemTimers);
    try {
      return await encodeSnapshotReplyInSlices(snapshot, pacer);
    } finally {
      this.stats.snapshotEncodeYields += pacer.yields;
    }
  }

  #refuse(kind: keyof ControlRefusals, reason: string): Buffer {
    this.stats.refused[kind]++;
    this.#o.onRefused?.(kind, reason);
    return encodeControlReply({ type: "error", message: `${kind} refused: ${reason}` });
  }
}
