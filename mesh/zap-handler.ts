/**
 * Inbound authentication of the CURVE mesh: the ZAP handler (ZeroMQ RFC 27) that admits only
 * listed public keys, and a watcher that counts the handshakes ZAP never sees.
 *
 * Without a ZAP handler, a libzmq CURVE server encrypts but accepts ANY client key (measured
 * with zeromq 6.8: a client with an unlisted key completed the handshake and received frames). libzmq asks the handler bound at inproc://zeromq.zap.01 of the
 * socket's own context, so there is exactly one handler per context and it must be bound before
 * the CURVE sockets bind. Each CURVE transport therefore owns a private zmq Context with its own
 * handler: replicas embedded in one process (tests, a host embedding several) keep separate
 * allow lists, and the process's default context (KV-event ingest) stays untouched. A private
 * context also gives the mesh its own I/O thread, so CURVE's encryption does not delay KV-event
 * ingest.
 *
 * What the server side can tell apart (measured with zeromq 6.8 / libzmq 4.3):
 * - client key not in the allow list: ZAP answers 400, both sides get handshake:error:auth, and
 *   the client does NOT reconnect by itself;
 * - client without CURVE (a plain replica): handshake:error:protocol ERR_ZMTP_MECHANISM_MISMATCH;
 * - client holding another server key than ours (a stale key, or a peer probing the listed keys
 *   for ours, see curve-key-directory.ts): handshake:error:protocol ERR_ZMTP_CRYPTOGRAPHIC.
 */
import type { Logger } from "pino";
import { Router, type Context, type Event, type Socket } from "zeromq";

import { systemClock, type Clock } from "../src/core/index.js";
import { LogThrottle } from "../src/util/log-throttle.js";
import { decodeCurveKey, z85Encode } from "./curve.js";
import { observe, retireObserver, type IteratedObserver } from "../src/util/zmq-observers.js";

/** RFC 27: the handler's fixed endpoint, per context. */
export const ZAP_ENDPOINT = "inproc://zeromq.zap.01";
export const ZAP_VERSION = "1.0";
/** The ZAP domain our CURVE server sockets announce; requests for any other domain are denied. */
export const MESH_ZAP_DOMAIN = "kvmesh.mesh";
const ZAP_MECHANISM_CURVE = "CURVE";
const STATUS_OK = "200";
const STATUS_DENIED = "400";
const STATUS_INTERNAL = "500";

export interface ZapStats {
  /** Handshakes whose client key is listed. */
  allowed: number;
  /** Handshakes refused: key not listed, other mechanism, or foreign domain. */
  denied: number;
  /** ZAP requests that did not follow RFC 27 (answered 500). */
  malformed: number;
}

export interface ZapHandlerOptions {
  readonly context: Context;
  /** Z85 public keys admitted. */
  readonly allow: readonly string[];
  readonly logger: Logger;
  readonly domain?: string;
  readonly clock?: Clock;
}

export class ZapHandler {
  readonly #router: Router;
  readonly #allow: ReadonlySet<string>;
  readonly #domain: string;
  readonly #log: Logger;
  readonly #throttle: LogThrottle;
  readonly #stats: ZapStats = { allowed: 0, denied: 0, malformed: 0 };
  #loop: Promise<void> = Promise.resolve();
  #closed = false;

  private constructor(router: Router, o: ZapHandlerOptions) {
    this.#router = router;
    // Compared as hex of the raw 32 bytes: ZAP hands over the client key raw, not as Z85.
    this.#allow = new Set(o.allow.map((k) => decodeCurveKey(k, "allowed key").toString("hex")));
    this.#domain = o.domain ?? MESH_ZAP_DOMAIN;
    this.#log = o.logger;
    this.#throttle = new LogThrottle(undefined, o.clock ?? systemClock);
  }

  /** Binds the handler in `context`; call before binding any CURVE server socket of that context. */
  static async start(o: ZapHandlerOptions): Promise<ZapHandler> {
    const router = new Router({ context: o.context, linger: 0 });
    try {
      await router.bind(ZAP_ENDPOINT);
    } catch (err) {
      router.close();
      throw err;
    }
    const handler = new ZapHandler(router, o);
    handler.#loop = handler.#serve();
    return handler;
  }

  get stats(): ZapStats {
    return { ...this.#stats };
  }

  async #serve(): Promise<void> {
    try {
      // One request at a time: answering is synchronous, so the single send in flight per
      // socket (zeromq.js throws EBUSY on a second) is never exceeded.
      for await (const frames of this.#router) {
        const reply = this.#answer(frames);
        if (reply !== null) await this.#router.send(reply);
      }
    } catch (err) {
      if (!this.#closed) this.#log.error({ err }, "ZAP handler stopped: CURVE handshakes will stall");
    }
  }

  /** RFC 27 request: [routing id, "", version, request id, domain, address, identity, mechanism, credentials...]. */
  #answer(frames: Buffer[]): Buffer[] | null {
    const [routingId, delimiter, version, requestId, domain, address, , mechanism, key] = frames;
    if (routingId === undefined || delimiter === undefined || requestId === undefined) return null;
    const reply = (status: string, text: string, userId = ""): Buffer[] => [
      routingId,
      delimiter,
      Buffer.from(ZAP_VERSION),
      requestId,
      Buffer.from(status),
      Buffer.from(text),
      Buffer.from(userId),
      Buffer.alloc(0),
    ];
    if (version?.toString() !== ZAP_VERSION || domain === undefined || mechanism === undefined) {
      this.#stats.malformed++;
      return reply(STATUS_INTERNAL, "malformed ZAP request");
    }
    const mech = mechanism.toString();
    const ok = mech === ZAP_MECHANISM_CURVE && domain.toString() === this.#domain && key?.length === 32 && this.#allow.has(key.toString("hex"));
    if (ok) {
      this.#stats.allowed++;
      // The user id is the client's Z85 public key (visible as the message's User-Id property).
      return reply(STATUS_OK, "OK", z85Encode(key));
    }
    this.#stats.denied++;
    const peerKey = key?.length === 32 ? z85Encode(key) : null;
    this.#throttle.hit((suppressed) => {
      // Public keys and addresses only: the secret never travels in a handshake.
      this.#log.warn(
        { peer_key: peerKey, address: address?.toString() ?? null, mechanism: mech, suppressed },
        "mesh handshake rejected: the peer's public key is not in --mesh-allow",
      );
    });
    return reply(STATUS_DENIED, "public key not allowed");
  }

  /** Closes the handler; close it after the CURVE sockets it serves. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#router.close();
    await this.#loop;
  }
}

// ---------------------------------------------------------------- handshake accounting

/** Why an inbound handshake failed, as a metric label. */
export type HandshakeRejectReason = "unlisted_key" | "no_curve" | "wrong_server_key" | "other";
export const HANDSHAKE_REJECT_REASONS: readonly HandshakeRejectReason[] = ["unlisted_key", "no_curve", "wrong_server_key", "other"];

export interface HandshakeCounters {
  accepted: number;
  rejected: Record<HandshakeRejectReason, number>;
}

export const newHandshakeCounters = (): HandshakeCounters => ({ accepted: 0, rejected: { unlisted_key: 0, no_curve: 0, wrong_server_key: 0, other: 0 } });

/** Maps a server socket's handshake:error:* event to a reason. */
export function rejectReasonOf(type: string, code: unknown): HandshakeRejectReason {
  if (type === "handshake:error:auth") return "unlisted_key";
  if (code === "ERR_ZMTP_MECHANISM_MISMATCH") return "no_curve";
  if (code === "ERR_ZMTP_CRYPTOGRAPHIC") return "wrong_server_key";
  return "other";
}

/** A running handshake watcher: `stop()` after closing its socket, then await `done`. */
export interface HandshakeWatcher {
  readonly done: Promise<void>;
  stop(): void;
}

/**
 * Counts a CURVE server socket's handshakes until stopped. A plain replica knocking is logged
 * (throttled): it is the one misconfiguration the ZAP handler never hears about. Wrong-server-key
 * failures are only counted: every peer that learns our key causes a few of them by design.
 *
 * Stop it explicitly after closing the socket: an observer does not always see its socket's
 * "end" event (zmq-observers.ts), which would hang the transport's close.
 */
export function watchServerHandshakes(socket: Socket, role: "publish" | "control", counters: HandshakeCounters, log: Logger, clock: Clock = systemClock): HandshakeWatcher {
  const events = observe(socket);
  const stop = (): void => {
    retireObserver(events);
  };
  return { done: countHandshakes(socket, events, role, counters, log, clock), stop };
}

async function countHandshakes(socket: Socket, events: IteratedObserver, role: "publish" | "control", counters: HandshakeCounters, log: Logger, clock: Clock): Promise<void> {
  const plainThrottle = new LogThrottle(undefined, clock);
  try {
    for await (const e of events) {
      // A receive pending when the observer is closed resolves with undefined or rejects (ENOTSOCK).
      const event = e as Event | undefined;
      if (event === undefined) break;
      if (event.type === "handshake") {
        counters.accepted++;
        continue;
      }
      if (event.type !== "handshake:error:auth" && event.type !== "handshake:error:protocol" && event.type !== "handshake:error:other") continue;
      const reason = rejectReasonOf(event.type, "code" in event.error ? event.error.code : undefined);
      counters.rejected[reason]++;
      if (reason === "no_curve") {
        plainThrottle.hit((suppressed) => {
          log.warn({ socket: role, endpoint: event.address, suppressed }, "mesh handshake rejected: a peer without CURVE tried to connect (start it with --mesh-key)");
        });
      }
    }
  } catch (err) {
    if (!socket.closed && !events.closed) log.debug({ err, socket: role }, "mesh handshake watcher stopped");
  } finally {
    retireObserver(events);
  }
}
