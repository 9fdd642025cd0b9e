/**
 * The sockets of a CURVE mesh's receiving side, in whichever thread reads peers: one SUB per
 * peer, each a CURVE client of that peer's server key, and an observer per SUB that reports its
 * handshakes. The decisions (which key, when to retry, when a key is stale) are not made here but
 * by CurvePeerSubscribers (curve-subscribers.ts), on the main thread, which drives these sockets
 * directly (curve-reader.ts) or through the receive thread's message channel (thread-reader.ts,
 * receive-thread.ts). Each open SUB carries a generation number, echoed in its events, so the
 * state machine can ignore events of a socket it has already replaced.
 *
 * No ZAP handler is needed where these live: ZAP (RFC 27) is asked by a CURVE *server* about the
 * clients it admits, and these are clients; the server's key they are given is what authenticates
 * the peer (a handshake completes only with the server holding that key's secret), and it comes
 * from our own allow list (curve-key-directory.ts). The ZAP handler stays beside the PUB and
 * ROUTER it guards, on the main thread (curve-runtime.ts).
 *
 * No logger either: the receive thread has none. What is worth saying goes back as an event.
 */
import { Subscriber, type Context, type Event } from "zeromq";

import { isIpv6Endpoint } from "./endpoints.js";
import { observe, retireObserver, type IteratedObserver } from "../src/util/zmq-observers.js";

/**
 * What a per-peer SUB reports about its handshakes (zeromq 6.8's events, classified):
 * - connected: the handshake completed;
 * - refused: the peer's ZAP handler refused our key (handshake:error:auth);
 * - no_curve: the peer runs without CURVE (ERR_ZMTP_MECHANISM_MISMATCH);
 * - failed: another handshake failure (a wrong or stale server key looks like this);
 * - unobservable: no observer could be created, so the SUB was closed at once.
 */
export type CurveSocketEvent = "connected" | "refused" | "no_curve" | "failed" | "unobservable";

/** What the connection state machine needs of the sockets, wherever they live. */
export interface CurveSocketHost {
  /** Opens a SUB to `endpoint` as a client of `serverKey` (replacing any open one); its events carry `generation`. */
  open(endpoint: string, serverKey: string, generation: number): void;
  /** Closes the SUB of `endpoint`, if one is open. */
  close(endpoint: string): void;
}

export interface CurvePeerSocketsOptions {
  /** The context the SUBs live in (a private one: CURVE work gets its own I/O thread, see zap-handler.ts). */
  readonly context: Context;
  /** Our pair, as plain strings (a MeshKeyPair does not cross into a thread). */
  readonly keyPair: { readonly publicKey: string; readonly secretKey: string };
  /** Options shared with the transport's other sockets (heartbeats, reconnect, HWM). */
  readonly socketOptions: Readonly<Record<string, number | boolean>>;
  readonly topics: readonly string[];
  readonly onFrames: (frames: Buffer[]) => void;
  readonly onEvent: (endpoint: string, generation: number, event: CurveSocketEvent) => void;
  /** A SUB's read loop failed while it was open. */
  readonly onReadError: (endpoint: string, err: unknown) => void;
}

interface OpenSocket {
  readonly sub: Subscriber;
  readonly events: IteratedObserver;
}

/** Maps a SUB's handshake event to what the state machine acts on; null for every other event. */
export function curveSocketEventOf(event: Event): CurveSocketEvent | null {
  if (event.type === "handshake") return "connected";
  if (event.type === "handshake:error:auth") return "refused";
  if (event.type === "handshake:error:protocol" && event.error.code === "ERR_ZMTP_MECHANISM_MISMATCH") return "no_curve";
  if (event.type === "handshake:error:protocol" || event.type === "handshake:error:other") return "failed";
  return null;
}

export class CurvePeerSockets implements CurveSocketHost {
  readonly #o: CurvePeerSocketsOptions;
  readonly #open = new Map<string, OpenSocket>();
  readonly #loops = new Set<Promise<void>>();

  constructor(o: CurvePeerSocketsOptions) {
    this.#o = o;
  }

  open(endpoint: string, serverKey: string, generation: number): void {
    this.close(endpoint);
    const sub = new Subscriber({
      ...this.#o.socketOptions,
      context: this.#o.context,
      ipv6: isIpv6Endpoint(endpoint),
      curveServerKey: serverKey,
      curvePublicKey: this.#o.keyPair.publicKey,
      curveSecretKey: this.#o.keyPair.secretKey,
    });
    for (const t of this.#o.topics) sub.subscribe(t);
    let events: IteratedObserver;
    try {
      events = observe(sub);
    } catch {
      sub.close();
      this.#o.onEvent(endpoint, generation, "unobservable");
      return;
    }
    this.#open.set(endpoint, { sub, events });
    sub.connect(endpoint);
    this.#track(this.#readLoop(endpoint, sub));
    this.#track(this.#watchLoop(endpoint, sub, events, generation));
  }

  close(endpoint: string): void {
    const s = this.#open.get(endpoint);
    if (s === undefined) return;
    this.#open.delete(endpoint);
    if (!s.sub.closed) s.sub.close();
    // Explicitly: an observer does not always see its socket's "end" event (zmq-observers.ts).
    retireObserver(s.events);
  }

  /** Closes every SUB; resolves when their loops have ended. */
  async closeAll(): Promise<void> {
    for (const endpoint of [...this.#open.keys()]) this.close(endpoint);
    await Promise.all([...this.#loops]);
  }

  #track(loop: Promise<void>): void {
    this.#loops.add(loop);
    void loop.finally(() => this.#loops.delete(loop));
  }

  async #readLoop(endpoint: string, sub: Subscriber): Promise<void> {
    try {
      for await (const frames of sub) this.#o.onFrames(frames);
    } catch (err) {
      if (!sub.closed) this.#o.onReadError(endpoint, err);
    }
  }

  async #watchLoop(endpoint: string, sub: Subscriber, events: IteratedObserver, generation: number): Promise<void> {
    try {
      for await (const e of events) {
        // A receive pending when the observer is closed resolves with undefined.
        const event = e as Event | undefined;
        if (event === undefined || sub.closed) return;
        const what = curveSocketEventOf(event);
        if (what !== null) this.#o.onEvent(endpoint, generation, what);
      }
    } catch {
      // The socket or its observer closed under the loop: nothing more to report.
    } finally {
      retireObserver(events);
    }
  }
}
