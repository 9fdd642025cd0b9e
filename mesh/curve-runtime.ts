/**
 * What a CURVE mesh transport holds besides its sockets: a private zmq Context whose ZAP handler
 * admits only the listed public keys (zap-handler.ts), the directory of peers' server keys
 * (curve-key-directory.ts), the state machine of the per-peer SUBs (curve-subscribers.ts; the
 * transport's peer reader decides where their sockets live), and the watchers counting inbound
 * handshakes on our PUB and ROUTER. The transport (sockets only) asks it for socket options and
 * for the key of a control server.
 *
 * Two phases, because of an ordering rule: the ZAP handler must be bound before any CURVE server
 * socket binds (a server bound first would admit every client key until the handler appears), so
 * `start` runs before the transport creates its sockets and `attach` after they are bound.
 */
import type { Logger } from "pino";
import { Context, type Socket } from "zeromq";

import type { MeshCurveConfig } from "./curve.js";
import { ServerKeyDirectory, type KeyDirectoryStats } from "./curve-key-directory.js";
import { CurvePeerSubscribers, type CurvePeerState, type CurveSubscriberStats } from "./curve-subscribers.js";
import type { CurveSocketHost } from "./curve-sockets.js";
import { MeshAuthError } from "./errors.js";
import { MESH_ZAP_DOMAIN, newHandshakeCounters, watchServerHandshakes, ZapHandler, type HandshakeCounters, type HandshakeWatcher, type ZapStats } from "./zap-handler.js";

/** CURVE counters (null without CURVE): inbound handshakes, ZAP decisions, key lookups. */
export interface MeshCurveStats {
  /** Inbound handshakes on the PUB and ROUTER, accepted and rejected by reason. */
  readonly inbound: HandshakeCounters;
  readonly zap: ZapStats;
  readonly keyLookups: KeyDirectoryStats;
  readonly subscribers: CurveSubscriberStats;
  /** Control requests that failed because the peer refused us or holds no key we list. */
  readonly requestAuthFailures: number;
}

/** Socket options that make a socket a CURVE server under our key, in our context. */
export interface CurveServerOptions {
  readonly context: Context;
  readonly curveServer: true;
  readonly curveSecretKey: string;
  readonly zapDomain: string;
}

/** Socket options that make a DEALER a CURVE client of the server holding `curveServerKey`. */
export interface CurveClientOptions {
  readonly context: Context;
  readonly curveServerKey: string;
  readonly curvePublicKey: string;
  readonly curveSecretKey: string;
}

export interface CurveAttachOptions {
  /** The bound PUB and ROUTER: their inbound handshakes are counted. */
  readonly publish: Socket;
  readonly control: Socket;
  /** With CURVE: how long one lookup of a peer's key waits for handshakes, ms. */
  readonly keyProbeTimeoutMs?: number;
}

interface Attached {
  readonly keys: ServerKeyDirectory;
  readonly watchers: HandshakeWatcher[];
}

const NO_SUBSCRIBER_STATS: CurveSubscriberStats = { rekeys: 0, refusedByPeer: 0 };

export class CurveRuntime {
  readonly config: MeshCurveConfig;
  readonly context: Context;
  readonly #zap: ZapHandler;
  readonly #log: Logger;
  readonly #inbound = newHandshakeCounters();
  #attached: Attached | null = null;
  #subs: CurvePeerSubscribers | null = null;
  #requestAuthFailures = 0;

  private constructor(config: MeshCurveConfig, context: Context, zap: ZapHandler, log: Logger) {
    this.config = config;
    this.context = context;
    this.#zap = zap;
    this.#log = log;
  }

  /** A private context with its ZAP handler bound; call before creating any CURVE socket. */
  static async start(config: MeshCurveConfig, log: Logger): Promise<CurveRuntime> {
    const context = new Context();
    const zap = await ZapHandler.start({ context, allow: config.allow, logger: log });
    return new CurveRuntime(config, context, zap, log);
  }

  get serverOptions(): CurveServerOptions {
    return { context: this.context, curveServer: true, curveSecretKey: this.config.keyPair.secretKey, zapDomain: MESH_ZAP_DOMAIN };
  }

  clientOptions(serverKey: string): CurveClientOptions {
    return { context: this.context, curveServerKey: serverKey, curvePublicKey: this.config.keyPair.publicKey, curveSecretKey: this.config.keyPair.secretKey };
  }

  /** Starts key lookups and the handshake watchers, once the servers are bound. */
  attach(o: CurveAttachOptions): void {
    const keys = new ServerKeyDirectory({
      context: this.context,
      keyPair: this.config.keyPair,
      allow: this.config.allow,
      logger: this.#log,
      ...(o.keyProbeTimeoutMs === undefined ? {} : { probeTimeoutMs: o.keyProbeTimeoutMs }),
    });
    const watchers = [watchServerHandshakes(o.publish, "publish", this.#inbound, this.#log), watchServerHandshakes(o.control, "control", this.#inbound, this.#log)];
    this.#attached = { keys, watchers };
  }

  get #parts(): Attached {
    // Assertion (a programming error): MeshTransport.bind attaches before anything asks.
    if (this.#attached === null) throw new Error("CurveRuntime: attach() was not called");
    return this.#attached;
  }

  /**
   * The state machine of the per-peer SUBs, driving the sockets of `sockets` (after attach; once:
   * the transport's one peer reader calls it).
   */
  peerSubscribers(sockets: CurveSocketHost): CurvePeerSubscribers {
    // Assertion (a programming error): the transport's one reader asks once.
    if (this.#subs !== null) throw new Error("CurveRuntime: peerSubscribers() was already called");
    this.#subs = new CurvePeerSubscribers({ keyPair: this.config.keyPair, directory: this.#parts.keys, sockets, logger: this.#log });
    return this.#subs;
  }

  /** Per-peer connection states (endpoint -> state). */
  peerStates(): Map<string, CurvePeerState> {
    return this.#subs?.states() ?? new Map<string, CurvePeerState>();
  }

  /**
   * The server key of the control ROUTER at `ep`: null when no handshake answered within
   * `timeoutMs` (the caller reports a timeout); throws MeshAuthError when the peer refuses us or
   * holds no key we list.
   */
  async controlServerKey(ep: string, timeoutMs: number): Promise<string | null> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<null>((resolve) => {
      timer = setTimeout(() => {
        resolve(null);
      }, timeoutMs);
    });
    const lookup = await Promise.race([this.#parts.keys.lookup(ep, "dealer"), timeout]).finally(() => {
      clearTimeout(timer);
    });
    if (lookup === null || lookup.outcome === "unreachable") return null;
    if (lookup.outcome === "found") return lookup.key;
    this.#requestAuthFailures++;
    throw new MeshAuthError(ep, lookup.outcome);
  }

  /** A request with `key` to `ep` timed out: the key may be stale, look it up again next time. */
  forgetKey(ep: string, key: string): void {
    this.#parts.keys.forget(ep, key);
  }

  get stats(): MeshCurveStats {
    const p = this.#parts;
    return {
      inbound: { accepted: this.#inbound.accepted, rejected: { ...this.#inbound.rejected } },
      zap: this.#zap.stats,
      keyLookups: p.keys.stats,
      subscribers: this.#subs?.stats ?? { ...NO_SUBSCRIBER_STATS },
      requestAuthFailures: this.#requestAuthFailures,
    };
  }

  /** Stops key probes in flight (the peer reader closes the per-peer SUBs). */
  closeProbes(): void {
    this.#attached?.keys.close();
  }

  /** Stops the handshake watchers (after the server sockets closed); resolves when they end. */
  async closeWatchers(): Promise<void> {
    const watchers = this.#attached?.watchers ?? [];
    for (const w of watchers) w.stop();
    await Promise.all(watchers.map((w) => w.done));
  }

  /** Last: the ZAP handler serves the CURVE sockets, so it closes after them. */
  closeZap(): Promise<void> {
    return this.#zap.close();
  }
}
