/**
 * The receiving side of a CURVE mesh: one SUB per peer, each connected with that peer's server
 * key (found by the ServerKeyDirectory). A plain mesh uses one SUB for every peer, but a CURVE
 * client names the server key in a socket option that libzmq applies at connect time, so one
 * socket per peer keeps each peer's key with its connection (changing the option on a connected
 * socket also makes zeromq.js print a process warning on every change) and lets a peer that
 * changes keys be re-keyed alone.
 *
 * Per peer: look the key up -> connect -> watch the handshakes:
 * - handshake ok: connected (backoff reset);
 * - refused by the peer (its ZAP said 400) or the peer dropped CURVE: libzmq does not reconnect
 *   after these, so the socket is closed and the lookup retried with backoff (a peer restarted
 *   with our key in its allow list is picked up within DEFAULT_CURVE_RETRY_MAX_MS);
 * - STALE_KEY_HANDSHAKE_FAILURES failed handshakes in a row (the peer restarted with another key
 *   pair): the cached key is forgotten and looked up again, and the socket replaced;
 * - lookup found no usable key (peer not listed, plain, or down): retried with backoff.
 */
import type { Logger } from "pino";
import { Subscriber, type Context, type Event } from "zeromq";

import type { MeshKeyPair } from "./curve.js";
import type { ServerKeyDirectory } from "./curve-key-directory.js";
import { isIpv6Endpoint } from "./endpoints.js";
import { observe, retireObserver, type IteratedObserver } from "../src/util/zmq-observers.js";

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

/** Socket options shared with the transport's other sockets (heartbeats, reconnect, HWM). */
export type SubscriberBaseOptions = Readonly<Record<string, number>>;

export interface CurveSubscribersOptions {
  readonly context: Context;
  readonly keyPair: MeshKeyPair;
  readonly directory: ServerKeyDirectory;
  readonly socketOptions: SubscriberBaseOptions;
  readonly topics: readonly string[];
  readonly onFrames: (frames: Buffer[]) => void;
  readonly logger: Logger;
  readonly retryMinMs?: number;
  readonly retryMaxMs?: number;
}

interface Peer {
  readonly endpoint: string;
  state: CurvePeerState;
  sub: Subscriber | null;
  /** The sub's event observer, closed with it (see #drop). */
  events: IteratedObserver | null;
  key: string | null;
  failures: number;
  retryMs: number;
  timer: NodeJS.Timeout | undefined;
  /** Bumped whenever the peer's socket is replaced or dropped: stale callbacks compare it. */
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
  readonly #topics: readonly string[];
  readonly #loops = new Set<Promise<void>>();
  readonly #retryMinMs: number;
  readonly #retryMaxMs: number;
  readonly #stats: CurveSubscriberStats = { rekeys: 0, refusedByPeer: 0 };
  /** Peers are only looked up once started: until the transport has a message handler, nothing may be received. */
  #started = false;
  #closed = false;

  constructor(o: CurveSubscribersOptions) {
    this.#o = o;
    this.#topics = [...o.topics];
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
    const peer: Peer = { endpoint, state: "looking_up", sub: null, events: null, key: null, failures: 0, retryMs: this.#retryMinMs, timer: undefined, generation: 0, announcedKey: null };
    this.#peers.set(endpoint, peer);
    if (this.#started) this.#lookup(peer);
    return true;
  }

  /** Starts connecting to the peers known so far and to later ones (the transport's onMessage). */
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
    const sub = new Subscriber({
      ...this.#o.socketOptions,
      context: this.#o.context,
      ipv6: isIpv6Endpoint(peer.endpoint),
      curveServerKey: key,
      curvePublicKey: this.#o.keyPair.publicKey,
      curveSecretKey: this.#o.keyPair.secretKey,
    });
    for (const t of this.#topics) sub.subscribe(t);
    let events: IteratedObserver;
    try {
      events = observe(sub);
    } catch (err) {
      sub.close();
      this.#o.logger.warn({ err, peer: peer.endpoint }, "mesh CURVE socket observer failed (retried)");
      this.#retryLater(peer);
      return;
    }
    peer.sub = sub;
    peer.events = events;
    peer.key = key;
    peer.failures = 0;
    peer.state = "connecting";
    const generation = peer.generation;
    sub.connect(peer.endpoint);
    this.#track(this.#readLoop(sub));
    this.#track(this.#watchLoop(peer, sub, events, key, generation));
  }

  #track(loop: Promise<void>): void {
    this.#loops.add(loop);
    void loop.finally(() => this.#loops.delete(loop));
  }

  async #readLoop(sub: Subscriber): Promise<void> {
    try {
      for await (const frames of sub) this.#o.onFrames(frames);
    } catch (err) {
      if (!sub.closed) this.#o.logger.error({ err }, "mesh CURVE SUB loop stopped");
    }
  }

  async #watchLoop(peer: Peer, sub: Subscriber, events: IteratedObserver, key: string, generation: number): Promise<void> {
    try {
      for await (const e of events) {
        // A receive pending when the observer is closed resolves with undefined or rejects (ENOTSOCK).
        const event = e as Event | undefined;
        if (event === undefined || this.#stale(peer, generation)) return;
        if (event.type === "handshake") {
          peer.state = "connected";
          peer.failures = 0;
          peer.retryMs = this.#retryMinMs;
          if (peer.announcedKey !== key) {
            peer.announcedKey = key;
            this.#o.logger.info({ peer: peer.endpoint, peer_key: key }, "mesh peer connected over CURVE");
          }
        } else if (event.type === "handshake:error:auth") {
          // libzmq gives up on a connection its peer refused: retry ourselves, with backoff.
          this.#stats.refusedByPeer++;
          this.#o.logger.warn({ peer: peer.endpoint, our_key: this.#o.keyPair.publicKey }, "mesh peer refused our CURVE key (retrying with backoff)");
          this.#replace(peer, false);
          return;
        } else if (event.type === "handshake:error:protocol" || event.type === "handshake:error:other") {
          const mechanism = event.type === "handshake:error:protocol" && event.error.code === "ERR_ZMTP_MECHANISM_MISMATCH";
          peer.failures++;
          if (mechanism || peer.failures >= STALE_KEY_HANDSHAKE_FAILURES) {
            this.#o.directory.forget(peer.endpoint, key);
            this.#stats.rekeys++;
            this.#replace(peer, true);
            return;
          }
        }
      }
    } catch (err) {
      if (!sub.closed && !events.closed) this.#o.logger.debug({ err, peer: peer.endpoint }, "mesh CURVE handshake watcher stopped");
    } finally {
      retireObserver(events);
    }
  }

  /** Closes the peer's socket and looks its key up again (now, or after the backoff). */
  #replace(peer: Peer, now: boolean): void {
    this.#drop(peer);
    if (now) this.#lookup(peer);
    else this.#retryLater(peer);
  }

  #drop(peer: Peer): void {
    peer.generation++;
    if (peer.timer !== undefined) clearTimeout(peer.timer);
    peer.timer = undefined;
    const sub = peer.sub;
    const events = peer.events;
    peer.sub = null;
    peer.events = null;
    peer.key = null;
    if (sub !== null && !sub.closed) sub.close();
    // Explicitly: an observer does not always see its socket's "end" event (zmq-observers.ts).
    if (events !== null) retireObserver(events);
  }

  async close(): Promise<void> {
    this.#closed = true;
    for (const p of this.#peers.values()) this.#drop(p);
    this.#peers.clear();
    await Promise.all([...this.#loops]);
  }
}
