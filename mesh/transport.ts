/**
 * The replica mesh's socket layer. Payloads are opaque Buffers: encoding, sequencing, snapshots
 * and membership decisions belong to the codec and the glue.
 *
 *   XPUB   bind  publishBind      [topic, payload]; subscription notifications -> onSubscription
 *   ROUTER bind  controlBind      [identity, "", request] -> [identity, "", "OK"|"ERR", body]
 *   SUB    connect to every peer  [topic, payload] -> onMessage
 *   DEALER one per request()      ["", request] -> ["", "OK"|"ERR", body]
 *
 * zeromq.js allows one send and one receive in flight per socket and throws EBUSY synchronously
 * on a second, so every socket has exactly one reader loop and one writer (a FIFO for the XPUB,
 * a promise chain for ROUTER replies).
 *
 * With `curve` set, every socket lives in a private zmq Context whose ZAP handler admits only
 * the listed public keys (zap-handler.ts); the XPUB and ROUTER are CURVE servers with this
 * replica's key. Peers are still plain endpoints, so the connecting side looks up which listed
 * key the peer at an endpoint holds (curve-key-directory.ts) and connects with it: one SUB per
 * peer (curve-subscribers.ts) and one DEALER per request, as without CURVE. An unlisted replica
 * can therefore neither subscribe to our XPUB nor reach our ROUTER (ZAP refuses its key), and we
 * never subscribe to or query a server whose key we do not list.
 */
import { pino, type Logger } from "pino";
import { Context, Dealer, Router, Subscriber, XPublisher, type MessageLike } from "zeromq";

import type { MeshCurveConfig } from "./curve.js";
import { KEY_LOOKUP_OUTCOMES, ServerKeyDirectory, type KeyDirectoryStats } from "./curve-key-directory.js";
import { CurvePeerSubscribers, type CurveSubscriberStats } from "./curve-subscribers.js";
import { controlEndpointFor, isIpv6Endpoint, parseBindEndpoint, parsePeerEndpoint } from "./endpoints.js";
import { HANDSHAKE_REJECT_REASONS, MESH_ZAP_DOMAIN, newHandshakeCounters, watchServerHandshakes, ZapHandler, type HandshakeCounters, type HandshakeWatcher, type ZapStats } from "./zap-handler.js";
import { TOPIC_BATCH, TOPIC_HEARTBEAT } from "./types.js";
import { MeshAuthError, MeshClosedError, MeshRemoteError, MeshRequestTimeoutError, type MeshAuthFailure } from "./errors.js";

/** ZMTP heartbeats: a frozen peer is noticed about 3 s after it stops answering. */
export const DEFAULT_HEARTBEAT_INTERVAL_MS = 1_000;
export const DEFAULT_HEARTBEAT_TIMEOUT_MS = 3_000;
/**
 * Per peer pipe, in messages. The publisher batches, so 10 000 messages is seconds of traffic at
 * any realistic rate; a peer that falls further behind loses messages (PUB drops, never blocks)
 * and recovers through a snapshot when it sees the seq gap.
 */
export const DEFAULT_SEND_HWM_MESSAGES = 10_000;
export const DEFAULT_RECONNECT_INTERVAL_MS = 100;
/** libzmq's default 0 means a fixed 100 ms retry forever against a dead peer; back off to 5 s. */
export const DEFAULT_RECONNECT_MAX_INTERVAL_MS = 5_000;
/** Control handlers run concurrently (a slow snapshot must not stall a peering request) up to this. */
export const MAX_CONCURRENT_CONTROL_REQUESTS = 64;
/** A peer subscribes to `J.<its id>` so our XPUB can tell which replica just started receiving. */
export const JOIN_TOPIC_PREFIX = "J.";
export const DEFAULT_MESH_TOPICS: readonly string[] = [TOPIC_BATCH, TOPIC_HEARTBEAT];

const REPLY_OK = "OK";
const REPLY_ERR = "ERR";
const XPUB_UNSUBSCRIBE = 0;
const XPUB_SUBSCRIBE = 1;

export const joinTopic = (id: string): string => `${JOIN_TOPIC_PREFIX}${id}`;

export interface MeshTransportOptions {
  /** e.g. tcp://0.0.0.0:7100; tcp://127.0.0.1:* or ipc://* bind an ephemeral endpoint (read publishEndpoint). */
  readonly publishBind: string;
  /** Default: controlEndpointFor(publishBind) (wildcard port -> wildcard port). */
  readonly controlBind?: string;
  readonly logger?: Logger;
  readonly heartbeatIntervalMs?: number;
  readonly heartbeatTimeoutMs?: number;
  readonly sendHighWaterMark?: number;
  readonly reconnectIntervalMs?: number;
  readonly reconnectMaxIntervalMs?: number;
  /** Topics the SUB subscribes to (besides join topics). Default DEFAULT_MESH_TOPICS. */
  readonly topics?: readonly string[];
  /**
   * CURVE: encrypt the mesh and accept only the listed replicas' keys (see the module comment).
   * Unset: plain TCP, where anyone who can connect can read the stream and send control requests.
   */
  readonly curve?: MeshCurveConfig | undefined;
  /** With `curve`: how long one lookup of a peer's key waits for handshakes, ms (default 1 s). */
  readonly keyProbeTimeoutMs?: number;
}

/** CURVE counters (null without CURVE): inbound handshakes, ZAP decisions, key lookups. */
export interface MeshCurveStats {
  /** Inbound handshakes on the XPUB and ROUTER, accepted and rejected by reason. */
  readonly inbound: HandshakeCounters;
  readonly zap: ZapStats;
  readonly keyLookups: KeyDirectoryStats;
  readonly subscribers: CurveSubscriberStats;
  /** Control requests that failed because the peer refused us or holds no key we list. */
  readonly requestAuthFailures: number;
}

export interface MeshTransportStats {
  /** Messages handed to the XPUB (libzmq may still drop them per peer at the HWM). */
  published: number;
  publishErrors: number;
  /** Messages read from the SUB, well-formed or not. */
  received: number;
  /** Of `received`, messages without exactly two frames. */
  malformedFrames: number;
  /** Requests read by the control ROUTER. */
  controlRequests: number;
  /** Control requests answered with ERR (handler threw, or malformed request). */
  controlErrors: number;
  /** Outgoing request() calls that timed out. */
  requestTimeouts: number;
}

export type MessageHandler = (topic: string, payload: Buffer, frames: number) => void;
export type SubscriptionHandler = (subscribed: boolean, topic: string) => void;
export type ControlHandler = (request: Buffer) => Promise<Buffer> | Buffer;

export { MeshAuthError, MeshClosedError, MeshRemoteError, MeshRequestTimeoutError, type MeshAuthFailure };

/** What a CURVE transport holds besides its sockets. */
interface CurveRuntime {
  readonly context: Context;
  readonly config: MeshCurveConfig;
  readonly zap: ZapHandler;
  readonly keys: ServerKeyDirectory;
  readonly subs: CurvePeerSubscribers;
  readonly inbound: HandshakeCounters;
  readonly watchers: HandshakeWatcher[];
  requestAuthFailures: number;
}

interface QueuedSend {
  readonly frames: MessageLike[];
  readonly resolve: () => void;
  readonly reject: (err: Error) => void;
}

interface CommonSocketOptions {
  readonly linger: number;
  readonly heartbeatInterval: number;
  readonly heartbeatTimeout: number;
  readonly heartbeatTimeToLive: number;
  readonly reconnectInterval: number;
  readonly reconnectMaxInterval: number;
  readonly tcpKeepalive: number;
}

function positiveInt(name: string, value: number | undefined, fallback: number): number {
  const v = value ?? fallback;
  if (!Number.isInteger(v) || v <= 0) throw new RangeError(`${name} must be a positive integer, got ${v}`);
  return v;
}

const toError = (err: unknown): Error => (err instanceof Error ? err : new Error(String(err)));
const errorCode = (err: unknown): unknown => (typeof err === "object" && err !== null && "code" in err ? err.code : undefined);

export class MeshTransport {
  readonly publishEndpoint: string;
  readonly controlEndpoint: string;

  readonly #xpub: XPublisher;
  readonly #router: Router;
  /** The one SUB of a plain mesh; null with CURVE (one SUB per peer in #curve.subs). */
  readonly #sub: Subscriber | null;
  readonly #curve: CurveRuntime | null;
  readonly #common: CommonSocketOptions;
  readonly #log: Logger;
  readonly #peers = new Set<string>();
  readonly #dealers = new Set<Dealer>();
  readonly #controlInFlight = new Set<Promise<void>>();
  readonly #stats: MeshTransportStats = {
    published: 0,
    publishErrors: 0,
    received: 0,
    malformedFrames: 0,
    controlRequests: 0,
    controlErrors: 0,
    requestTimeouts: 0,
  };

  #outbox: QueuedSend[] = [];
  #draining: Promise<void> | null = null;
  #replyTail: Promise<void> = Promise.resolve();
  #onMessage: MessageHandler | null = null;
  #onSubscription: SubscriptionHandler | null = null;
  #onControl: ControlHandler | null = null;
  readonly #loops: Promise<void>[] = [];
  readonly #started = new Set<"sub" | "xpub" | "router">();
  #closed = false;
  #closing: Promise<void> | null = null;

  private constructor(
    xpub: XPublisher,
    router: Router,
    sub: Subscriber | null,
    endpoints: { publish: string; control: string },
    common: CommonSocketOptions,
    log: Logger,
    curve: CurveRuntime | null,
  ) {
    this.#xpub = xpub;
    this.#router = router;
    this.#sub = sub;
    this.#curve = curve;
    this.publishEndpoint = endpoints.publish;
    this.controlEndpoint = endpoints.control;
    this.#common = common;
    this.#log = log;
  }

  /** Binds the XPUB and the control ROUTER; rejects (with every socket closed) if either bind fails. */
  static async bind(o: MeshTransportOptions): Promise<MeshTransport> {
    const publishBind = parseBindEndpoint(o.publishBind);
    const controlBind = o.controlBind === undefined ? controlEndpointFor(publishBind) : parseBindEndpoint(o.controlBind);
    const heartbeatTimeout = positiveInt("heartbeatTimeoutMs", o.heartbeatTimeoutMs, DEFAULT_HEARTBEAT_TIMEOUT_MS);
    const common: CommonSocketOptions = {
      // libzmq's -1 on PUB/DEALER keeps the process alive while anything is queued to a dead peer.
      linger: 0,
      heartbeatInterval: positiveInt("heartbeatIntervalMs", o.heartbeatIntervalMs, DEFAULT_HEARTBEAT_INTERVAL_MS),
      heartbeatTimeout,
      // Tells the connecting side to drop us after this long without traffic, too.
      heartbeatTimeToLive: heartbeatTimeout,
      reconnectInterval: positiveInt("reconnectIntervalMs", o.reconnectIntervalMs, DEFAULT_RECONNECT_INTERVAL_MS),
      reconnectMaxInterval: positiveInt("reconnectMaxIntervalMs", o.reconnectMaxIntervalMs, DEFAULT_RECONNECT_MAX_INTERVAL_MS),
      tcpKeepalive: 1,
    };
    const hwm = positiveInt("sendHighWaterMark", o.sendHighWaterMark, DEFAULT_SEND_HWM_MESSAGES);
    const topics = o.topics ?? DEFAULT_MESH_TOPICS;
    const log = o.logger ?? pino({ enabled: false });

    // CURVE: a private context whose ZAP handler is bound before any CURVE socket binds (a
    // server bound first would admit every client key until the handler appears).
    const curve = o.curve;
    const context = curve === undefined ? undefined : new Context();
    const zap = curve === undefined || context === undefined ? null : await ZapHandler.start({ context, allow: curve.allow, logger: log });
    const server = curve === undefined || context === undefined ? {} : { context, curveServer: true, curveSecretKey: curve.keyPair.secretKey, zapDomain: MESH_ZAP_DOMAIN };
    const xpub = new XPublisher({ ...common, ...server, sendHighWaterMark: hwm, ipv6: isIpv6Endpoint(publishBind) });
    // Default XPUB verbosity reports only the first subscriber per topic, hiding later joiners.
    xpub.verbosity = "allSubsUnsubs";
    const router = new Router({ ...common, ...server, ipv6: isIpv6Endpoint(controlBind) });
    const sub = curve === undefined ? new Subscriber({ ...common, receiveHighWaterMark: hwm }) : null;
    try {
      if (sub !== null) for (const t of topics) sub.subscribe(t);
      await xpub.bind(publishBind);
      await router.bind(controlBind);
      const endpoints = { publish: xpub.lastEndpoint ?? publishBind, control: router.lastEndpoint ?? controlBind };
      // The per-peer SUBs deliver to the transport built below (nothing arrives before onMessage).
      const built: { transport: MeshTransport | undefined } = { transport: undefined };
      let runtime: CurveRuntime | null = null;
      if (curve !== undefined && context !== undefined && zap !== null) {
        const inbound = newHandshakeCounters();
        const keys = new ServerKeyDirectory({
          context,
          keyPair: curve.keyPair,
          allow: curve.allow,
          logger: log,
          ...(o.keyProbeTimeoutMs === undefined ? {} : { probeTimeoutMs: positiveInt("keyProbeTimeoutMs", o.keyProbeTimeoutMs, o.keyProbeTimeoutMs) }),
        });
        const subs = new CurvePeerSubscribers({
          context,
          keyPair: curve.keyPair,
          directory: keys,
          socketOptions: { ...common, receiveHighWaterMark: hwm },
          topics,
          onFrames: (frames) => {
            if (built.transport !== undefined) built.transport.#deliver(frames);
          },
          logger: log,
        });
        const watchers = [watchServerHandshakes(xpub, "publish", inbound, log), watchServerHandshakes(router, "control", inbound, log)];
        runtime = { context, config: curve, zap, keys, subs, inbound, watchers, requestAuthFailures: 0 };
      }
      const transport = new MeshTransport(xpub, router, sub, endpoints, common, log, runtime);
      built.transport = transport;
      log.info({ ...endpoints, curve: curve === undefined ? false : { public_key: curve.keyPair.publicKey, allowed_keys: curve.allow.length } }, "mesh transport bound");
      return transport;
    } catch (err) {
      xpub.close();
      router.close();
      sub?.close();
      await zap?.close();
      throw toError(err);
    }
  }

  /** This replica's CURVE public key (null without CURVE). */
  get curvePublicKey(): string | null {
    return this.#curve?.config.keyPair.publicKey ?? null;
  }

  /** CURVE counters, or null without CURVE. */
  get curveStats(): MeshCurveStats | null {
    const c = this.#curve;
    if (c === null) return null;
    return {
      inbound: { accepted: c.inbound.accepted, rejected: { ...c.inbound.rejected } },
      zap: c.zap.stats,
      keyLookups: c.keys.stats,
      subscribers: c.subs.stats,
      requestAuthFailures: c.requestAuthFailures,
    };
  }

  /** Per-peer CURVE connection states (endpoint -> state); empty without CURVE. */
  curvePeerStates(): Map<string, string> {
    return this.#curve?.subs.states() ?? new Map<string, string>();
  }

  /** Prometheus text for the transport's own counters (CURVE only; "" without it). */
  metricsText(): string {
    const s = this.curveStats;
    if (s === null) return "";
    const lines: string[] = [];
    const family = (name: string, type: "counter" | "gauge", help: string, samples: readonly string[]): void => {
      lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`, ...samples);
    };
    family("kvmesh_mesh_curve_enabled", "gauge", "1 when the mesh uses CURVE (encrypted, listed keys only).", ["kvmesh_mesh_curve_enabled 1"]);
    family("kvmesh_mesh_handshakes_accepted_total", "counter", "Inbound CURVE handshakes accepted (publish and control sockets).", [`kvmesh_mesh_handshakes_accepted_total ${s.inbound.accepted}`]);
    family(
      "kvmesh_mesh_handshakes_rejected_total",
      "counter",
      "Inbound handshakes rejected: unlisted_key (ZAP refused the key), no_curve (a plain peer), wrong_server_key (a stale key, or a peer probing the listed keys for ours), other.",
      HANDSHAKE_REJECT_REASONS.map((r) => `kvmesh_mesh_handshakes_rejected_total{reason="${r}"} ${s.inbound.rejected[r]}`),
    );
    family("kvmesh_mesh_zap_denied_total", "counter", "ZAP requests denied (public key not in --mesh-allow).", [`kvmesh_mesh_zap_denied_total ${s.zap.denied}`]);
    family(
      "kvmesh_mesh_key_lookups_total",
      "counter",
      "Lookups of a peer endpoint's CURVE key by probing the listed keys, by outcome.",
      KEY_LOOKUP_OUTCOMES.map((r) => `kvmesh_mesh_key_lookups_total{outcome="${r}"} ${s.keyLookups.lookups[r]}`),
    );
    family("kvmesh_mesh_key_rekeys_total", "counter", "Peer connections re-keyed after their cached key stopped working.", [`kvmesh_mesh_key_rekeys_total ${s.subscribers.rekeys}`]);
    family(
      "kvmesh_mesh_refused_by_peer_total",
      "counter",
      "Outbound connections and control requests a peer refused or could not authenticate (our key not in its allow list, or no listed key).",
      [`kvmesh_mesh_refused_by_peer_total ${s.subscribers.refusedByPeer + s.requestAuthFailures}`],
    );
    return lines.join("\n") + "\n";
  }

  get stats(): MeshTransportStats {
    return { ...this.#stats };
  }

  get closed(): boolean {
    return this.#closed;
  }

  /**
   * Resolves once libzmq has queued the message for every subscribed peer (a full peer pipe drops
   * it silently: PUB never blocks). Calls may overlap; sends go out one at a time in call order.
   */
  publish(topic: string, payload: Buffer): Promise<void> {
    if (this.#closed) return Promise.reject(new MeshClosedError("publish"));
    return new Promise<void>((resolve, reject) => {
      this.#outbox.push({ frames: [topic, payload], resolve, reject });
      this.#draining ??= this.#drain();
    });
  }

  async #drain(): Promise<void> {
    try {
      while (this.#outbox.length > 0 && !this.#closed) {
        const batch = this.#outbox;
        this.#outbox = [];
        for (const item of batch) {
          if (this.#closed) {
            item.reject(new MeshClosedError("publish"));
            continue;
          }
          try {
            await this.#xpub.send(item.frames);
            this.#stats.published++;
            item.resolve();
          } catch (err) {
            this.#stats.publishErrors++;
            item.reject(this.#closed ? new MeshClosedError("publish") : toError(err));
          }
        }
      }
    } finally {
      this.#draining = null;
    }
  }

  /** Sets the handler for peers' messages; the SUB loop starts on the first call (libzmq queues until then). */
  onMessage(handler: MessageHandler): void {
    this.#onMessage = handler;
    this.#startLoop("sub");
  }

  /** Sets the handler for XPUB (un)subscription notifications; starts the XPUB reader on the first call. */
  onSubscription(handler: SubscriptionHandler): void {
    this.#onSubscription = handler;
    this.#startLoop("xpub");
  }

  /** Sets the control request handler; starts the ROUTER loop on the first call. */
  onControl(handler: ControlHandler): void {
    this.#onControl = handler;
    this.#startLoop("router");
  }

  #startLoop(which: "sub" | "xpub" | "router"): void {
    if (this.#closed || this.#started.has(which)) return;
    this.#started.add(which);
    if (which === "sub" && this.#curve !== null) {
      this.#curve.subs.start();
      return;
    }
    const loop = which === "sub" ? this.#subLoop() : which === "xpub" ? this.#xpubLoop() : this.#routerLoop();
    this.#loops.push(loop);
  }

  /** Connects the SUB to a peer's XPUB (all mesh topics and join topics apply); false if already connected. */
  connectPeer(publishEndpoint: string): boolean {
    if (this.#closed) throw new MeshClosedError("connectPeer");
    const ep = parsePeerEndpoint(publishEndpoint);
    if (this.#peers.has(ep)) return false;
    if (this.#sub === null) {
      // CURVE: the peer's SUB is opened once its key is known (curve-subscribers.ts).
      this.#curve?.subs.connect(ep);
      this.#peers.add(ep);
      this.#log.info({ peer: ep }, "mesh peer added (looking up its CURVE key)");
      return true;
    }
    // The ipv6 option applies to the next connect only; leaving it on for hostnames would let
    // "localhost" resolve to ::1 while the peer listens on 127.0.0.1. zeromq.js prints a process
    // warning on each change after the first connect, so only flip it when it must change.
    const ipv6 = isIpv6Endpoint(ep);
    if (this.#sub.ipv6 !== ipv6) this.#sub.ipv6 = ipv6;
    this.#sub.connect(ep);
    this.#peers.add(ep);
    this.#log.info({ peer: ep }, "mesh peer connected");
    return true;
  }

  /** Disconnects from a peer's XPUB; false if it was not connected. */
  disconnectPeer(publishEndpoint: string): boolean {
    const ep = parsePeerEndpoint(publishEndpoint);
    if (!this.#peers.delete(ep)) return false;
    if (this.#closed) return true;
    if (this.#sub === null) {
      this.#curve?.subs.disconnect(ep);
      this.#log.info({ peer: ep }, "mesh peer disconnected");
      return true;
    }
    try {
      this.#sub.disconnect(ep);
    } catch (err) {
      // libzmq throws ENOENT synchronously for an endpoint it no longer knows.
      if (errorCode(err) !== "ENOENT") throw toError(err);
    }
    this.#log.info({ peer: ep }, "mesh peer disconnected");
    return true;
  }

  peers(): string[] {
    return [...this.#peers].sort();
  }

  /** Subscribes the SUB to `J.<id>` on every peer (current and future): their XPUBs see us join. */
  subscribeJoinTopic(id: string): void {
    if (this.#closed) throw new MeshClosedError("subscribeJoinTopic");
    if (id.length === 0) throw new RangeError("join topic id must be non-empty");
    if (this.#sub === null) this.#curve?.subs.subscribe(joinTopic(id));
    else this.#sub.subscribe(joinTopic(id));
  }

  async #subLoop(): Promise<void> {
    if (this.#sub === null) return;
    try {
      for await (const frames of this.#sub) this.#deliver(frames);
    } catch (err) {
      if (!this.#closed) this.#log.error({ err }, "mesh SUB loop stopped");
    }
  }

  /** One message from a peer (any SUB) to the handler. */
  #deliver(frames: Buffer[]): void {
    if (this.#closed) return;
    this.#stats.received++;
    if (frames.length !== 2) this.#stats.malformedFrames++;
    const topic = frames[0]?.toString("utf8") ?? "";
    const payload = frames[1] ?? Buffer.alloc(0);
    try {
      this.#onMessage?.(topic, payload, frames.length);
    } catch (err) {
      this.#log.error({ err, topic }, "mesh message handler threw");
    }
  }

  async #xpubLoop(): Promise<void> {
    try {
      for await (const [frame] of this.#xpub) {
        const kind = frame?.[0];
        if (frame === undefined || (kind !== XPUB_SUBSCRIBE && kind !== XPUB_UNSUBSCRIBE)) {
          this.#log.debug({ bytes: frame?.length ?? 0 }, "unexpected message on the mesh XPUB ignored");
          continue;
        }
        const topic = frame.toString("utf8", 1);
        try {
          this.#onSubscription?.(kind === XPUB_SUBSCRIBE, topic);
        } catch (err) {
          this.#log.error({ err, topic }, "mesh subscription handler threw");
        }
      }
    } catch (err) {
      if (!this.#closed) this.#log.error({ err }, "mesh XPUB loop stopped");
    }
  }

  async #routerLoop(): Promise<void> {
    try {
      for await (const frames of this.#router) {
        this.#stats.controlRequests++;
        const task = this.#serveControl(frames);
        this.#controlInFlight.add(task);
        void task.finally(() => this.#controlInFlight.delete(task));
        if (this.#controlInFlight.size >= MAX_CONCURRENT_CONTROL_REQUESTS) await Promise.race(this.#controlInFlight);
      }
    } catch (err) {
      if (!this.#closed) this.#log.error({ err }, "mesh ROUTER loop stopped");
    }
  }

  /** Never rejects: every failure becomes an ERR reply or a log line. */
  async #serveControl(frames: Buffer[]): Promise<void> {
    const [identity, delimiter, request] = frames;
    if (identity === undefined) return;
    let reply: [string, Buffer | string];
    if (frames.length !== 3 || delimiter === undefined || delimiter.length !== 0 || request === undefined) {
      this.#stats.controlErrors++;
      reply = [REPLY_ERR, `malformed control request: expected ["", payload], got ${frames.length - 1} frames`];
    } else {
      try {
        const handler = this.#onControl;
        if (handler === null) throw new Error("no control handler");
        reply = [REPLY_OK, await handler(request)];
      } catch (err) {
        this.#stats.controlErrors++;
        const message = toError(err).message;
        this.#log.warn({ err }, "mesh control handler failed");
        reply = [REPLY_ERR, message];
      }
    }
    await this.#reply([identity, "", ...reply]);
  }

  /** ROUTER replies come from concurrent handlers: chain them so only one send is in flight. */
  #reply(frames: MessageLike[]): Promise<void> {
    const sent = this.#replyTail.then(async () => {
      if (this.#closed) return;
      try {
        await this.#router.send(frames);
      } catch (err) {
        if (!this.#closed) this.#log.warn({ err }, "mesh control reply failed");
      }
    });
    this.#replyTail = sent;
    return sent;
  }

  /**
   * One request/reply with a peer's control ROUTER over a fresh DEALER (a late reply to a timed-out
   * request dies with its socket instead of answering the next request).
   */
  async request(controlEndpoint: string, payload: Buffer, timeoutMs: number): Promise<Buffer> {
    if (this.#closed) throw new MeshClosedError("request");
    const ep = parsePeerEndpoint(controlEndpoint);
    if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) throw new RangeError(`timeoutMs must be positive, got ${timeoutMs}`);
    const startedMs = performance.now();
    const serverKey = this.#curve === null ? null : await this.#controlServerKey(ep, timeoutMs);
    if (this.#closed) throw new MeshClosedError("request");
    const curveClient =
      serverKey === null || this.#curve === null
        ? {}
        : { context: this.#curve.context, curveServerKey: serverKey, curvePublicKey: this.#curve.config.keyPair.publicKey, curveSecretKey: this.#curve.config.keyPair.secretKey };
    const dealer = new Dealer({ ...this.#common, ...curveClient, ipv6: isIpv6Endpoint(ep) });
    this.#dealers.add(dealer);
    let timedOut = false;
    // Closing the socket is what unblocks a pending receive (it rejects with EAGAIN).
    const timer = setTimeout(
      () => {
        timedOut = true;
        dealer.close();
      },
      Math.max(1, timeoutMs - (performance.now() - startedMs)),
    );
    try {
      dealer.connect(ep);
      await dealer.send(["", payload]);
      const frames = await dealer.receive();
      const [delimiter, status, body] = frames;
      if (frames.length !== 3 || delimiter?.length !== 0 || status === undefined || body === undefined) {
        throw new MeshRemoteError(ep, `malformed control reply from ${ep}: ${frames.length} frames`);
      }
      const s = status.toString("utf8");
      if (s === REPLY_OK) return body;
      if (s === REPLY_ERR) throw new MeshRemoteError(ep, body.toString("utf8"));
      throw new MeshRemoteError(ep, `malformed control reply from ${ep}: status ${JSON.stringify(s)}`);
    } catch (err) {
      if (err instanceof MeshRemoteError) throw err;
      if (timedOut) {
        this.#stats.requestTimeouts++;
        // No per-request observer tells a stale key from a slow peer (observers are costly and
        // fragile, see zmq-observers.ts): after a timeout the key is looked up again next time,
        // which finds a new key, or reports that the peer now refuses us, within one round trip.
        if (serverKey !== null) this.#curve?.keys.forget(ep, serverKey);
        throw new MeshRequestTimeoutError(ep, timeoutMs);
      }
      if (this.#closed) throw new MeshClosedError("request");
      throw toError(err);
    } finally {
      clearTimeout(timer);
      if (!dealer.closed) dealer.close();
      this.#dealers.delete(dealer);
    }
  }

  /** The server key for a control request to `ep` (CURVE); throws when there is none to use. */
  async #controlServerKey(ep: string, timeoutMs: number): Promise<string> {
    const curve = this.#curve;
    if (curve === null) throw new Error("not a CURVE transport");
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<null>((resolve) => {
      timer = setTimeout(() => {
        resolve(null);
      }, timeoutMs);
    });
    const lookup = await Promise.race([curve.keys.lookup(ep, "dealer"), timeout]).finally(() => {
      clearTimeout(timer);
    });
    if (this.#closed) throw new MeshClosedError("request");
    if (lookup === null || lookup.outcome === "unreachable") {
      this.#stats.requestTimeouts++;
      throw new MeshRequestTimeoutError(ep, timeoutMs);
    }
    if (lookup.outcome === "found") return lookup.key;
    curve.requestAuthFailures++;
    throw new MeshAuthError(ep, lookup.outcome);
  }

  /**
   * Closes every socket with linger 0 (queued messages are dropped), rejects queued publishes and
   * pending requests with MeshClosedError, and waits for the reader loops to end. Idempotent.
   */
  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    this.#closed = true;
    const queued = this.#outbox;
    this.#outbox = [];
    for (const item of queued) item.reject(new MeshClosedError("publish"));
    for (const dealer of this.#dealers) dealer.close();
    this.#curve?.keys.close();
    const curveSubs = this.#curve?.subs.close();
    this.#xpub.close();
    this.#router.close();
    this.#sub?.close();
    for (const w of this.#curve?.watchers ?? []) w.stop();
    await Promise.all([...this.#loops, this.#draining, curveSubs, ...(this.#curve?.watchers ?? []).map((w) => w.done)]);
    // Last: the ZAP handler serves the CURVE sockets closed above.
    await this.#curve?.zap.close();
    this.#log.info({ publish: this.publishEndpoint }, "mesh transport closed");
  }
}
