/**
 * Who this replica peers with. register/deregister connect or disconnect our SUB, and ask the
 * peer (over its control ROUTER) to do the same towards us, so one command forms or breaks both
 * directions. A registered peer that goes silent is redialed with backoff; a deregistered
 * origin's mirrored bookings are dropped; and the replica's slot among its live peers feeds tie
 * spreading (src/core/tie-spread.ts).
 *
 * Deadlines read the injected monotonic clock (redial backoff, slot refresh).
 */
import type { Logger } from "pino";
import type { Clock } from "../src/core/index.js";
import type { ControlClient, PeeringRequests } from "./control.js";
import { controlEndpointFor, parsePeerEndpoint } from "./endpoints.js";
import { KvmeshError } from "../src/core/index.js";
import type { InboundMembership, MeshInbound } from "./inbound.js";
import type { PeerState } from "./peer-health.js";
import type { OriginFacts, ReplicaPort, ReplicaSlot } from "./replica-port.js";

/** How long a computed replica slot (for tie spreading) is reused, ms: membership moves slowly. */
export const SLOT_REFRESH_MS = 250;
/** A registered peer silent this long (the suspect timeout) is redialed; then backoff to the max, ms. */
export const SILENT_PEER_REDIAL_MS = 3_000;
export const SILENT_PEER_REDIAL_MAX_MS = 30_000;
/**
 * Status checks of peering and snapshot requests in flight at once; past it a request is refused
 * at once. Each check may wait for the control timeout (2 s) on an endpoint that never answers,
 * and the control ROUTER serves 64 requests at a time: without this cap, requests naming dead
 * endpoints could hold every slot and stall peers' snapshot pulls.
 */
export const MAX_CONCURRENT_STATUS_CHECKS = 8;

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
  /**
   * What this replica holds of the peer's origin, as the core's replicated kinds tell it (the
   * bookings it owns here, whether it said it is leaving, ...); absent until its origin is known.
   */
  held?: OriginFacts;
}

/** Our SUB's connections (MeshTransport in production). */
export interface PeerLinks {
  connectPeer(publishEndpoint: string): boolean;
  disconnectPeer(publishEndpoint: string): boolean;
}

export interface MembershipStats {
  /** Silent registered peers redialed (see SILENT_PEER_REDIAL_MS). */
  redials: number;
}

export interface MembershipOptions {
  readonly origin: bigint;
  /** Our PUB endpoint as peers reach it. */
  readonly advertise: string;
  readonly links: PeerLinks;
  readonly control: Pick<ControlClient, "request">;
  readonly inbound: Pick<MeshInbound, "peerStates" | "originStats" | "forget" | "pullSnapshot" | "welcome">;
  readonly port: Pick<ReplicaPort, "dropOrigin" | "describe">;
  readonly logger: Logger;
  /** Monotonic, ms. */
  readonly clock: Clock;
}

export class Membership implements InboundMembership, PeeringRequests {
  readonly stats: MembershipStats = { redials: 0 };
  readonly #o: MembershipOptions;
  readonly #log: Logger;
  readonly #self: string;
  /** Registered peers (their publish endpoints) -> origin once learned. */
  readonly #peers = new Map<string, bigint | null>();
  /**
   * Registered peers that are here only because they asked (a peer-back request), not through
   * register(): DNS discovery may take them over (registerDiscovered), and so remove them.
   */
  readonly #byRequest = new Set<string>();
  /** Registered peers that confirmed they connect back to us, and requests in flight. */
  readonly #peeredBack = new Set<string>();
  readonly #askingPeerBack = new Set<string>();
  /** Silent registered peers: when to redial each next, and the backoff after that. */
  readonly #redial = new Map<string, { atMs: number; backoffMs: number }>();
  #checking = 0;
  #slot: ReplicaSlot = { index: 0, count: 1 };
  #slotAtMs = -Infinity;
  #closed = false;

  constructor(o: MembershipOptions) {
    this.#o = o;
    this.#log = o.logger;
    this.#self = parsePeerEndpoint(o.advertise);
  }

  register(endpoint: string): boolean {
    const ep = parsePeerEndpoint(endpoint);
    if (ep === this.#self) throw new KvmeshError("KVMESH_BAD_REQUEST", `endpoint ${ep} is this replica itself`, { details: { field: "endpoint" } });
    const added = this.#connect(ep);
    this.#byRequest.delete(ep);
    this.#o.inbound.welcome(this.#peers.get(ep) ?? null);
    // Ask the peer to connect back (symmetric peering) and pull its state. A peer that is not up
    // yet is asked again on its first heartbeat, and its state arrives through first contact.
    this.#askPeerBack(ep);
    this.#o.inbound.pullSnapshot(controlEndpointFor(ep), null);
    return added;
  }

  /**
   * register() for DNS discovery (mesh/dns-peers.ts): whether the peer is now discovery's to
   * deregister when DNS stops returning it. It is when it was not registered, and also when it
   * was here only because it asked to peer back: with replicas that start together, a peer's
   * request often comes before our first DNS round, and such a peer, once gone from DNS, stayed
   * registered (and redialed) forever. One registered by hand or by --peers stays.
   */
  registerDiscovered(endpoint: string): boolean {
    const byRequest = this.#byRequest.has(parsePeerEndpoint(endpoint));
    return this.register(endpoint) || byRequest;
  }

  async deregister(endpoint: string): Promise<boolean> {
    const ep = parsePeerEndpoint(endpoint);
    if (!this.#peers.has(ep)) return false;
    const origin = this.#peers.get(ep) ?? null;
    this.#drop(ep);
    await this.#o.control.request(controlEndpointFor(ep), { type: "unpeer", from: this.#o.origin, publishEndpoint: this.#o.advertise }).catch((err: unknown) => {
      this.#log.debug({ err, peer: ep }, "unpeer request failed");
    });
    if (origin !== null) this.forgetOrigin(origin);
    return true;
  }

  list(): PeerView[] {
    const states = this.#o.inbound.peerStates();
    return [...this.#peers.entries()]
      .map(([endpoint, origin]) => {
        const s = origin === null ? undefined : this.#o.inbound.originStats(origin);
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
          ...(origin === null ? {} : { held: this.#o.port.describe(origin) }),
        } satisfies PeerView;
      })
      .sort((a, b) => (a.endpoint < b.endpoint ? -1 : a.endpoint > b.endpoint ? 1 : 0));
  }

  // ------------------------------------------------------------------ requests from peers

  /**
   * A peer-back request: carried out once the replica at `ep` answers as `from` (so nobody can
   * make us subscribe to an endpoint in another process's name); a known (endpoint, origin) pair
   * is not asked again.
   */
  async onPeerRequest(ep: string, from: bigint): Promise<string | null> {
    if (ep === this.#self) return null;
    if (this.#peers.get(ep) !== from) {
      const status = await this.#status(ep, from);
      if (typeof status === "string") return status;
    }
    if (this.#closed) return "this replica is closing";
    this.#o.inbound.welcome(from);
    if (this.#connect(ep)) {
      this.#byRequest.add(ep);
      this.#log.info({ peer: ep }, "peered back on request");
      this.#o.inbound.pullSnapshot(controlEndpointFor(ep), null);
    } else if (this.#peers.has(ep) && this.#peers.get(ep) !== from) {
      // Known endpoint, process we have not heard from: a restart at the same address. Our SUB
      // may sit in libzmq's reconnect backoff (doubling to 5 s) since the old one died, so the
      // restarted replica would go unheard that long (2 s measured, test/system/faults/replica-kill).
      this.#log.info({ peer: ep }, "peer restarted: redialing it now");
      this.#o.links.disconnectPeer(ep);
      this.#o.links.connectPeer(ep);
    }
    // What checkSnapshot accepts from now on: the snapshot pull that follows a peer-back.
    if (this.#peers.get(ep) === null) this.#peers.set(ep, from);
    return null;
  }

  /**
   * An unpeer request: carried out only when the replica at `ep` answers as `from` and no longer
   * lists us among its peers, which is what its own deregistration does before it asks. A forged
   * unpeer naming a live peer used to drop that peer and every booking mirrored of it (#17 F13).
   */
  async onUnpeerRequest(ep: string, from: bigint): Promise<string | null> {
    const status = await this.#status(ep, from);
    if (typeof status === "string") return status;
    if (status.peers.includes(this.#self)) return `${ep} still lists ${this.#self} among its peers`;
    if (this.#peers.has(ep)) this.#drop(ep);
    this.forgetOrigin(from);
    return null;
  }

  /** A registered peer's origin may read our snapshot; another replica only once its endpoint answers as `from` (#17 F14). */
  async checkSnapshot(from: bigint, ep: string | undefined): Promise<string | null> {
    if (this.knows(from)) return null;
    if (ep === undefined) return `origin ${from} is not a registered peer and gave no endpoint to check`;
    const status = await this.#status(parsePeerEndpoint(ep), from);
    return typeof status === "string" ? status : null;
  }

  knows(from: bigint): boolean {
    for (const origin of this.#peers.values()) if (origin === from) return true;
    return this.#o.inbound.peerStates().has(from);
  }

  peerEndpoints(): string[] {
    return [...this.#peers.keys()].sort();
  }

  /** Asks the replica at `ep` who it is: its status, or why it is not `from`. */
  async #status(ep: string, from: bigint): Promise<{ origin: bigint; peers: readonly string[] } | string> {
    if (this.#checking >= MAX_CONCURRENT_STATUS_CHECKS) return `${MAX_CONCURRENT_STATUS_CHECKS} other requests are being checked (retry later)`;
    this.#checking++;
    try {
      const reply = await this.#o.control.request(controlEndpointFor(ep), { type: "status", from: this.#o.origin });
      if (reply.type !== "status") return `${ep} answered a status request with ${reply.type}`;
      if (reply.origin !== from) return `${ep} is origin ${reply.origin}, not ${from}`;
      return reply;
    } catch (err) {
      return `${ep} could not be checked: ${err instanceof Error ? err.message : String(err)}`;
    } finally {
      this.#checking--;
    }
  }

  // ------------------------------------------------------------------ what inbound reports

  peerHeard(publishEndpoint: string, origin: bigint): void {
    const known = this.#peers.get(publishEndpoint);
    if (known === undefined) return;
    // A registered peer we have not been peered back by, or one that restarted (a new origin
    // at the same endpoint has lost its membership): ask it to connect back.
    if (known !== origin && known !== null) this.#peeredBack.delete(publishEndpoint);
    this.#peers.set(publishEndpoint, origin);
    if (!this.#peeredBack.has(publishEndpoint)) this.#askPeerBack(publishEndpoint);
  }

  snapshotFrom(controlEndpoint: string, origin: bigint): void {
    for (const ep of this.#peers.keys()) {
      if (controlEndpointFor(ep) === controlEndpoint) this.#peers.set(ep, origin);
    }
  }

  registeredOrigins(): ReadonlySet<bigint | null> {
    return new Set(this.#peers.values());
  }

  // ------------------------------------------------------------------ upkeep

  /**
   * Redials registered peers we have not heard from in a while. libzmq reconnects a SUB after a
   * dropped connection by itself, but not after a ZMTP protocol error (corrupted bytes on the
   * link): it terminates that connection's session for good, and the peer would stay silent
   * forever (test/system/faults/mesh-link-faults). Redialing a peer that is merely slow or gone costs a
   * reconnect attempt, so it backs off from SILENT_PEER_REDIAL_MS to SILENT_PEER_REDIAL_MAX_MS.
   */
  redialSilentPeers(nowMs: number): void {
    if (this.#closed) return;
    const states = this.#o.inbound.peerStates();
    for (const ep of this.#redial.keys()) if (!this.#peers.has(ep)) this.#redial.delete(ep);
    for (const [ep, origin] of this.#peers) {
      const state = origin === null ? undefined : states.get(origin);
      if (state === "alive") {
        this.#redial.delete(ep);
        continue;
      }
      let r = this.#redial.get(ep);
      if (r === undefined) {
        // Suspect or down means already silent past the suspect timeout: redial at once. Never
        // heard from (not up yet, or cut off from the start): give it the timeout first.
        r = { atMs: state === undefined ? nowMs + SILENT_PEER_REDIAL_MS : nowMs, backoffMs: SILENT_PEER_REDIAL_MS };
        this.#redial.set(ep, r);
        if (state === undefined) continue;
      } else if (nowMs < r.atMs) continue;
      r.atMs = nowMs + r.backoffMs;
      r.backoffMs = Math.min(r.backoffMs * 2, SILENT_PEER_REDIAL_MAX_MS);
      this.stats.redials++;
      this.#log.info({ peer: ep, state: state ?? "never heard" }, "mesh peer silent: redialing");
      this.#o.links.disconnectPeer(ep);
      this.#o.links.connectPeer(ep);
    }
  }

  /**
   * Forgets a deregistered origin and drops the bookings we mirror of it, unless it said it was
   * leaving (G8): a replica that shut down cleanly vanishes from DNS, and its peers deregister it,
   * while the requests it routed still run; their bookings stay until freed or expired.
   */
  forgetOrigin(origin: bigint): void {
    this.#o.inbound.forget(origin);
    if (this.#o.port.describe(origin).draining === true) {
      this.#log.info({ origin: origin.toString() }, "peer deregistered after saying it was leaving: its mirrored bookings kept until freed or expired");
      return;
    }
    const dropped = this.#o.port.dropOrigin(origin);
    this.#log.info({ origin: origin.toString(), dropped }, "peer deregistered: its mirrored bookings dropped");
  }

  /** This replica's position among itself and its live peers, by replica id. */
  slot(): ReplicaSlot {
    const now = this.#o.clock.now();
    if (now - this.#slotAtMs >= SLOT_REFRESH_MS) {
      const ids = [this.#o.origin];
      for (const [origin, state] of this.#o.inbound.peerStates()) if (state === "alive") ids.push(origin);
      ids.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
      this.#slot = { index: ids.indexOf(this.#o.origin), count: ids.length };
      this.#slotAtMs = now;
    }
    return this.#slot;
  }

  close(): void {
    this.#closed = true;
  }

  // ------------------------------------------------------------------ internals

  #connect(ep: string): boolean {
    if (this.#peers.has(ep)) return false;
    this.#peers.set(ep, null);
    this.#o.links.connectPeer(ep);
    return true;
  }

  #drop(ep: string): void {
    this.#peers.delete(ep);
    this.#byRequest.delete(ep);
    this.#peeredBack.delete(ep);
    this.#o.links.disconnectPeer(ep);
  }

  /** Asks the replica at `ep` to connect its SUB to us, once per (endpoint, process). */
  #askPeerBack(ep: string): void {
    if (this.#closed || this.#askingPeerBack.has(ep)) return;
    this.#askingPeerBack.add(ep);
    this.#o.control
      .request(controlEndpointFor(ep), { type: "peer", from: this.#o.origin, publishEndpoint: this.#o.advertise })
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
}
