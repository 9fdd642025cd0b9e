/**
 * The receiving side of a CURVE mesh, as decisions: one SUB per peer, each connected with that
 * peer's server key (found by the ServerKeyDirectory). A plain mesh uses one SUB for every peer,
 * but a CURVE client names the server key in a socket option that libzmq applies at connect
 * time, so one socket per peer keeps each peer's key with its connection (changing the option on
 * a connected socket also makes zeromq.js print a process warning on every change) and lets a
 * peer that changes keys be re-keyed alone.
 *
 * The sockets themselves live behind a CurveSocketHost (curve-sockets.ts): on this thread, or on
 * the receive thread, whose message channel carries open/close down and handshake events back.
 * This state machine, the key lookups and the counters stay on the main thread either way.
 *
 * Per peer: look the key up -> open -> follow the handshakes:
 * - handshake ok: connected (backoff reset);
 * - refused by the peer (its ZAP said 400) or the peer dropped CURVE: libzmq does not reconnect
 *   after these, so the socket is closed and the lookup retried with backoff (a peer restarted
 *   with our key in its allow list is picked up within DEFAULT_CURVE_RETRY_MAX_MS);
 * - STALE_KEY_HANDSHAKE_FAILURES failed handshakes in a row (the peer restarted with another key
 *   pair): the cached key is forgotten and looked up again, and the socket replaced;
 * - lookup found no usable key (peer not listed, plain, or down): retried with backoff.
 */
import type { Logger } from "pino";

import type { MeshKeyPair } from "./curve.js";
import type { ServerKeyDirectory } from "./curve-key-directory.js";
import type { CurveSocketEvent, CurveSocketHost } from "./curve-sockets.js";

/** First retry of a failed lookup or a refused connection, ms; doubles per failure. */
export const DEFAULT_CURVE_RETRY_MIN_MS = 250;
/** Retry ceiling, ms: a peer fixed by its operator is picked up within this. */
export const DEFAULT_CURVE_RETRY_MAX_MS = 5_000;
/**
 * Failed handshakes in a row before the cached key is suspected stale. One failure can be a
 * peer restarting mid-handshake; a wrong key fails every reconnect (~100 ms apart).
 */
export const STALE_KEY_HANDSHAKE_FAILURES = 2;

export type CurvePeerState = "looking_up" | "connecting" | "connected" | "waiting";

export interface CurveSubscribersOptions {
  readonly keyPair: MeshKeyPair;
  /** Where peers' keys are found, and forgotten when they stop working. */
  readonly directory: Pick<ServerKeyDirectory, "lookup" | "forget">;
  /** Where the SUBs are opened and closed (their handshake events come back through event()). */
  readonly sockets: CurveSocketHost;
  readonly logger: Logger;
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
}

interface Peer {
  readonly endpoint: string;
  state: CurvePeerState;
  /** The key of the open socket; null while none is open. */
  key: string | null;
  failures: number;
  retryMs: number;
  timer: NodeJS.Timeout | undefined;
  /**
   * Changed whenever the peer's socket is replaced or dropped: stale callbacks and events compare
   * it. Drawn from one counter for all peers, so a peer removed and added again never reuses one.
   */
  generation: number;
  /** Logged "connected" once per key, not on every reconnect. */
  announcedKey: string | null;
}

export interface CurveSubscriberStats {
  /** Sockets replaced after the peer's key stopped working. */
  rekeys: number;
  /** Handshakes the peers refused (our key not in their allow list). */
  refusedByPeer: number;
}

export class CurvePeerSubscribers {
  readonly #o: CurveSubscribersOptions;
  readonly #peers = new Map<string, Peer>();
  readonly #retryMinMs: number;
  readonly #retryMaxMs: number;
  readonly #stats: CurveSubscriberStats = { rekeys: 0, refusedByPeer: 0 };
  /** Peers are only looked up once started: until the transport has a message handler, nothing may be received. */
  #started = false;
  #closed = false;
  #generations = 0;

  constructor(o: CurveSubscribersOptions) {
    this.#o = o;
    this.#retryMinMs = o.retryMinMs ?? DEFAULT_CURVE_RETRY_MIN_MS;
    this.#retryMaxMs = o.retryMaxMs ?? DEFAULT_CURVE_RETRY_MAX_MS;
  }

  get stats(): CurveSubscriberStats {
    return { ...this.#stats };
  }

  /** endpoint -> state, for diagnostics and tests. */
  states(): Map<string, CurvePeerState> {
    return new Map([...this.#peers].map(([ep, p]) => [ep, p.state]));
  }

  /** Starts receiving from `endpoint` (canonical); false if already known. */
  connect(endpoint: string): boolean {
    if (this.#closed || this.#peers.has(endpoint)) return false;
    const peer: Peer = { endpoint, state: "looking_up", key: null, failures: 0, retryMs: this.#retryMinMs, timer: undefined, generation: ++this.#generations, announcedKey: null };
    this.#peers.set(endpoint, peer);
    if (this.#started) this.#lookup(peer);
    return true;
  }

  /** Starts connecting to the peers known so far and to later ones (the transport's message handler). */
  start(): void {
    if (this.#started || this.#closed) return;
    this.#started = true;
    for (const p of this.#peers.values()) this.#lookup(p);
  }

  /** Stops receiving from `endpoint`; false if it was not known. */
  disconnect(endpoint: string): boolean {
    const peer = this.#peers.get(endpoint);
    if (peer === undefined) return false;
    this.#peers.delete(endpoint);
    this.#drop(peer);
    return true;
  }

  #lookup(peer: Peer): void {
    if (this.#closed) return;
    peer.state = "looking_up";
    const generation = peer.generation;
    this.#o.directory.lookup(peer.endpoint, "sub").then(
      (r) => {
        if (this.#stale(peer, generation)) return;
        if (r.outcome === "found") this.#open(peer, r.key);
        else {
          if (r.outcome === "rejected") this.#stats.refusedByPeer++;
          this.#retryLater(peer);
        }
      },
      (err: unknown) => {
        if (this.#stale(peer, generation)) return;
        this.#o.logger.warn({ err, peer: peer.endpoint }, "mesh key lookup failed (retried)");
        this.#retryLater(peer);
      },
    );
  }

  #stale(peer: Peer, generation: number): boolean {
    return this.#closed || this.#peers.get(peer.endpoint) !== peer || peer.generation !== generation;
  }

  #retryLater(peer: Peer): void {
    peer.state = "waiting";
    const delay = peer.retryMs;
    peer.retryMs = Math.min(this.#retryMaxMs, peer.retryMs * 2);
    const generation = peer.generation;
    peer.timer = setTimeout(() => {
      peer.timer = undefined;
      if (!this.#stale(peer, generation)) this.#lookup(peer);
    }, delay);
    peer.timer.unref();
  }

  #open(peer: Peer, key: string): void {
    peer.key = key;
    peer.failures = 0;
    peer.state = "connecting";
    // The host may answer at once (no observer): the peer is in its "connecting" state by then.
    this.#o.sockets.open(peer.endpoint, key, peer.generation);
  }

  /** A handshake event of the SUB opened for `endpoint` at `generation` (older sockets' events are ignored). */
  event(endpoint: string, generation: number, event: CurveSocketEvent): void {
    const peer = this.#peers.get(endpoint);
    if (peer === undefined || this.#stale(peer, generation)) return;
    const key = peer.key;
    if (key === null) return;
    switch (event) {
      case "connected":
        peer.state = "connected";
        peer.failures = 0;
        peer.retryMs = this.#retryMinMs;
        if (peer.announcedKey !== key) {
          peer.announcedKey = key;
          this.#o.logger.info({ peer: endpoint, peer_key: key }, "mesh peer connected over CURVE");
        }
        return;
      case "refused":
        // libzmq gives up on a connection its peer refused: retry ourselves, with backoff.
        this.#stats.refusedByPeer++;
        this.#o.logger.warn({ peer: endpoint, our_key: this.#o.keyPair.publicKey }, "mesh peer refused our CURVE key (retrying with backoff)");
        this.#replace(peer, false);
        return;
      case "unobservable":
        this.#o.logger.warn({ peer: endpoint }, "mesh CURVE socket observer failed (retried)");
        this.#replace(peer, false);
        return;
      case "no_curve":
      case "failed":
        peer.failures++;
        if (event === "no_curve" || peer.failures >= STALE_KEY_HANDSHAKE_FAILURES) {
          this.#o.directory.forget(endpoint, key);
          this.#stats.rekeys++;
          this.#replace(peer, true);
        }
        return;
    }
  }

  /** Closes the peer's socket and looks its key up again (now, or after the backoff). */
  #replace(peer: Peer, now: boolean): void {
    this.#drop(peer);
    if (now) this.#lookup(peer);
    else this.#retryLater(peer);
  }

  #drop(peer: Peer): void {
    peer.generation = ++this.#generations;
    if (peer.timer !== undefined) clearTimeout(peer.timer);
    peer.timer = undefined;
    if (peer.key !== null) this.#o.sockets.close(peer.endpoint);
    peer.key = null;
  }

  /** Closes every peer's socket (the host's closeAll waits for them); idempotent. */
  close(): void {
    this.#closed = true;
    for (const p of this.#peers.values()) this.#drop(p);
    this.#peers.clear();
  }
}
