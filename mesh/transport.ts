/**
 * The replica mesh's socket layer, sockets only. Payloads are opaque Buffers: encoding,
 * sequencing, snapshots and membership decisions belong to the codec and the mesh components.
 *
 *   PUB    bind  publishBind      [topic, payload]
 *   ROUTER bind  controlBind      [identity, "", request] -> [identity, "", "OK"|"ERR", body]
 *   SUB    connect to every peer  [topic, payload] -> onMessage, or decoded -> onEntries
 *   DEALER one per request()      ["", request] -> ["", "OK"|"ERR", body]
 *
 * The SUB side is the peer reader (peer-reader.ts), chosen once at bind: on this thread or on a
 * receive thread, one plain SUB or one CURVE SUB per peer. Nothing below asks which.
 *
 * zeromq.js allows one send and one receive in flight per socket and throws EBUSY synchronously
 * on a second, so every socket has exactly one reader loop and one writer (a FIFO for the PUB,
 * a promise chain for ROUTER replies).
 *
 * With `curve` set, every socket lives in a private zmq Context whose ZAP handler admits only
 * the listed public keys, and the PUB and ROUTER are CURVE servers with this replica's key; the
 * CURVE runtime (curve-runtime.ts) holds that context, the ZAP handler, the directory of peers'
 * keys and the state machine of the per-peer SUBs. Peers are still plain endpoints, so the
 * connecting side looks up which listed key the peer at an endpoint holds (curve-key-directory.ts)
 * and connects with it: one SUB per peer (curve-subscribers.ts, in whichever thread the reader
 * reads) and one DEALER per request, as without CURVE. An unlisted replica can therefore neither
 * subscribe to our PUB nor reach our ROUTER (ZAP refuses its key), and we never subscribe to or
 * query a server whose key we do not list.
 */
import PQueue from "p-queue";
import { pino, type Logger } from "pino";
import { Dealer, Publisher, Router, type MessageLike } from "zeromq";

import type { MeshCurveConfig } from "./curve.js";
import { CurveReader } from "./curve-reader.js";
import { CurveRuntime, type MeshCurveStats } from "./curve-runtime.js";
import { controlEndpointFor, isIpv6Endpoint, parseBindEndpoint, parsePeerEndpoint } from "./endpoints.js";
import { MeshAuthError, MeshClosedError, MeshRemoteError, MeshRequestTimeoutError, type MeshAuthFailure } from "./errors.js";
import type { PeerReader, PeerReaderOptions } from "./peer-reader.js";
import type { ReceivedEntry } from "./receive-coalescer.js";
import type { ReceiveWorkerStats } from "./receive-worker.js";
import { SubReader } from "./sub-reader.js";
import { ThreadReader } from "./thread-reader.js";
import { LogThrottle } from "../src/util/log-throttle.js";
import { TOPIC_BATCH, TOPIC_HEARTBEAT } from "./types.js";

export { MeshAuthError, MeshClosedError, MeshRemoteError, MeshRequestTimeoutError, type MeshAuthFailure, type MeshCurveStats };

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
/**
 * Control handlers run concurrently (a slow snapshot must not stall a peering request) up to this.
 * Past it the ROUTER is not read until one ends: later requests wait in libzmq's queue (and the
 * peer's DEALER times out), nothing is dropped here.
 */
export const MAX_CONCURRENT_CONTROL_REQUESTS = 64;
export const DEFAULT_MESH_TOPICS: readonly string[] = [TOPIC_BATCH, TOPIC_HEARTBEAT];

const REPLY_OK = "OK";
const REPLY_ERR = "ERR";

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
  /** Topics the SUB subscribes to. Default DEFAULT_MESH_TOPICS. */
  readonly topics?: readonly string[];
  /**
   * CURVE: encrypt the mesh and accept only the listed replicas' keys (see the module comment).
   * Unset: plain TCP, where anyone who can connect can read the stream and send control requests.
   */
  readonly curve?: MeshCurveConfig | undefined;
  /** With `curve`: how long one lookup of a peer's key waits for handshakes, ms (default 1 s). */
  readonly keyProbeTimeoutMs?: number;
  /**
   * Read peers' PUBs on a receive thread (receive-worker.ts) that decodes and folds what arrives
   * and hands it over once per `applyIntervalMs`, instead of on this thread through onMessage.
   * What it hands over reaches onEntries when applyReceived() is called (the owner calls it
   * often enough: the core before each decision, through the replication link, and ReplicaMesh on
   * each housekeeping tick). With `curve` too, the
   * thread holds the per-peer CURVE SUBs; their key lookups stay here (thread-reader.ts).
   */
  readonly receiveThread?: { readonly applyIntervalMs: number; readonly self: bigint } | undefined;
}

export interface MeshTransportStats {
  /** Messages handed to the PUB (libzmq may still drop them per peer at the HWM). */
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
/** What the receive thread hands over, decoded and folded, in arrival order. */
export type EntriesHandler = (entries: ReceivedEntry[]) => void;
export type ControlHandler = (request: Buffer) => Promise<Buffer> | Buffer;

interface QueuedSend {
  readonly frames: MessageLike[];
  readonly resolve: () => void;
  readonly reject: (err: Error) => void;
}

/** Chooses the transport's one peer reader (the table in peer-reader.ts). */
async function openPeerReader(o: PeerReaderOptions): Promise<PeerReader> {
  if (o.receiveThread !== null) return ThreadReader.start(o, o.receiveThread);
  if (o.curve !== null) return new CurveReader(o, o.curve);
  return new SubReader(o);
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
  // Assertion (a programming error): the daemon's options are checked where they are parsed (src/app/config.ts).
  if (!Number.isInteger(v) || v <= 0) throw new RangeError(`${name} must be a positive integer, got ${v}`);
  return v;
}

const toError = (err: unknown): Error => (err instanceof Error ? err : new Error(String(err)));

/** How long the PUB's last queued frames may take to leave at close, ms (see #close). */
export const LAST_BATCH_LINGER_MS = 250;

export class MeshTransport {
  readonly publishEndpoint: string;
  readonly controlEndpoint: string;

  readonly #pub: Publisher;
  readonly #router: Router;
  /** Reads the peers' PUBs: chosen once, at bind (peer-reader.ts). */
  readonly #reader: PeerReader;
  readonly #curve: CurveRuntime | null;
  readonly #common: CommonSocketOptions;
  readonly #log: Logger;
  /** Control failures a remote party controls (20,000 malformed requests wrote 60 MB of warn lines, #29 G14): one line per 10 s, every one counted in stats.controlErrors. */
  readonly #controlFailLog = new LogThrottle();
  readonly #replyFailLog = new LogThrottle();
  readonly #peers = new Set<string>();
  readonly #dealers = new Set<Dealer>();
  readonly #controlQueue = new PQueue({ concurrency: MAX_CONCURRENT_CONTROL_REQUESTS });
  readonly #stats: Omit<MeshTransportStats, "received" | "malformedFrames"> = {
    published: 0,
    publishErrors: 0,
    controlRequests: 0,
    controlErrors: 0,
    requestTimeouts: 0,
  };

  #outbox: QueuedSend[] = [];
  #draining: Promise<void> | null = null;
  #replyTail: Promise<void> = Promise.resolve();
  #onMessage: MessageHandler | null = null;
  #onEntries: EntriesHandler | null = null;
  /** Hand-overs that came before onEntries was set. */
  #early: ReceivedEntry[][] = [];
  #onControl: ControlHandler | null = null;
  #routerLoop: Promise<void> | null = null;
  #closed = false;
  #closing: Promise<void> | null = null;

  private constructor(pub: Publisher, router: Router, reader: PeerReader, endpoints: { publish: string; control: string }, common: CommonSocketOptions, log: Logger, curve: CurveRuntime | null) {
    this.#pub = pub;
    this.#router = router;
    this.#reader = reader;
    this.#curve = curve;
    this.publishEndpoint = endpoints.publish;
    this.controlEndpoint = endpoints.control;
    this.#common = common;
    this.#log = log;
  }

  /** Binds the PUB and the control ROUTER; rejects (with every socket closed) if either bind fails. */
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
    const keyProbeTimeoutMs = o.keyProbeTimeoutMs === undefined || o.curve === undefined ? undefined : positiveInt("keyProbeTimeoutMs", o.keyProbeTimeoutMs, o.keyProbeTimeoutMs);
    const topics = o.topics ?? DEFAULT_MESH_TOPICS;
    const log = o.logger ?? pino({ enabled: false });

    // CURVE: the runtime's ZAP handler is bound before any CURVE socket binds (curve-runtime.ts).
    const curve = o.curve === undefined ? null : await CurveRuntime.start(o.curve, log);
    const server = curve?.serverOptions ?? {};
    const pub = new Publisher({ ...common, ...server, sendHighWaterMark: hwm, ipv6: isIpv6Endpoint(publishBind) });
    const router = new Router({ ...common, ...server, ipv6: isIpv6Endpoint(controlBind) });
    let reader: PeerReader | null = null;
    try {
      await pub.bind(publishBind);
      await router.bind(controlBind);
      const endpoints = { publish: pub.lastEndpoint ?? publishBind, control: router.lastEndpoint ?? controlBind };
      curve?.attach({ publish: pub, control: router, ...(keyProbeTimeoutMs === undefined ? {} : { keyProbeTimeoutMs }) });
      // The reader delivers to the transport built below (nothing is read before its handler is set).
      const built: { transport: MeshTransport | undefined } = { transport: undefined };
      reader = await openPeerReader({
        topics,
        socket: { ...common, receiveHighWaterMark: hwm },
        curve,
        receiveThread: o.receiveThread ?? null,
        logger: log,
        sink: {
          message: (frames) => {
            if (built.transport !== undefined) built.transport.#deliver(frames);
          },
          entries: (entries) => {
            if (built.transport !== undefined) built.transport.#deliverEntries(entries);
          },
        },
      });
      const transport = new MeshTransport(pub, router, reader, endpoints, common, log, curve);
      built.transport = transport;
      log.info(
        { ...endpoints, reader: reader.name, curve: curve === null ? false : { public_key: curve.config.keyPair.publicKey, allowed_keys: curve.config.allow.length } },
        "mesh transport bound",
      );
      return transport;
    } catch (err) {
      pub.close();
      router.close();
      curve?.closeProbes();
      await reader?.close();
      await curve?.closeWatchers();
      await curve?.closeZap();
      throw toError(err);
    }
  }

  /** This replica's CURVE public key (null without CURVE). */
  get curvePublicKey(): string | null {
    return this.#curve?.config.keyPair.publicKey ?? null;
  }

  /** CURVE counters, or null without CURVE (mesh-metrics.ts writes them). */
  get curveStats(): MeshCurveStats | null {
    return this.#curve?.stats ?? null;
  }

  /** Per-peer CURVE connection states (endpoint -> state); empty without CURVE. */
  curvePeerStates(): Map<string, string> {
    return this.#curve?.peerStates() ?? new Map<string, string>();
  }

  get stats(): MeshTransportStats {
    return { ...this.#stats, ...this.#reader.counts };
  }

  /** The receive thread's counters (null when peers are read on this thread). */
  get receiveThreadStats(): ReceiveWorkerStats | null {
    return this.#reader.threadStats;
  }

  /** Which peer reader this transport uses (peer-reader.ts), for logs and diagnostics. */
  get readerName(): string {
    return this.#reader.name;
  }

  /** Delivers, synchronously, what the receive thread has handed over so far (nothing without one). */
  applyReceived(): void {
    this.#reader.applyReceived();
  }

  /** Resolves once what the receive thread holds has been delivered (at once without one). */
  catchUp(): Promise<void> {
    return this.#reader.catchUp();
  }

  /** Whether peers' messages arrive through onEntries (a receive thread) rather than onMessage. */
  get receivesInThread(): boolean {
    return this.#reader.delivers === "entries";
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
            await this.#pub.send(item.frames);
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

  /** Sets the handler for peers' messages; the reader starts on the first call (libzmq queues until then). */
  onMessage(handler: MessageHandler): void {
    this.#onMessage = handler;
    if (!this.#closed) this.#reader.start();
  }

  /** Sets the handler for the receive thread's hand-overs (see receivesInThread); the reader starts. */
  onEntries(handler: EntriesHandler): void {
    this.#onEntries = handler;
    const early = this.#early;
    this.#early = [];
    for (const entries of early) this.#deliverEntries(entries);
    if (!this.#closed) this.#reader.start();
  }

  #deliverEntries(entries: ReceivedEntry[]): void {
    if (this.#closed) return;
    if (this.#onEntries === null) {
      this.#early.push(entries);
      return;
    }
    try {
      this.#onEntries(entries);
    } catch (err) {
      this.#log.error({ err }, "mesh entries handler threw");
    }
  }

  /** Sets the control request handler; starts the ROUTER loop on the first call. */
  onControl(handler: ControlHandler): void {
    this.#onControl = handler;
    if (!this.#closed) this.#routerLoop ??= this.#readRouter();
  }

  /**
   * Reads a peer's PUB (all mesh topics); false if already read. With CURVE, its SUB opens once
   * its key is known (curve-subscribers.ts).
   */
  connectPeer(publishEndpoint: string): boolean {
    if (this.#closed) throw new MeshClosedError("connectPeer");
    const ep = parsePeerEndpoint(publishEndpoint);
    if (this.#peers.has(ep)) return false;
    this.#reader.connect(ep);
    this.#peers.add(ep);
    this.#log.info({ peer: ep, reader: this.#reader.name }, "mesh peer added");
    return true;
  }

  /** Stops reading a peer's PUB; false if it was not read. */
  disconnectPeer(publishEndpoint: string): boolean {
    const ep = parsePeerEndpoint(publishEndpoint);
    if (!this.#peers.delete(ep)) return false;
    if (this.#closed) return true;
    this.#reader.disconnect(ep);
    this.#log.info({ peer: ep }, "mesh peer disconnected");
    return true;
  }

  peers(): string[] {
    return [...this.#peers].sort();
  }

  /** One message from a peer (read on this thread) to the handler. */
  #deliver(frames: Buffer[]): void {
    if (this.#closed) return;
    const topic = frames[0]?.toString("utf8") ?? "";
    const payload = frames[1] ?? Buffer.alloc(0);
    try {
      this.#onMessage?.(topic, payload, frames.length);
    } catch (err) {
      this.#log.error({ err, topic }, "mesh message handler threw");
    }
  }

  async #readRouter(): Promise<void> {
    try {
      for await (const frames of this.#router) {
        this.#stats.controlRequests++;
        void this.#controlQueue.add(() => this.#serveControl(frames));
        // With every slot busy the request just added waits in the queue: stop reading until it
        // starts, so at most one waits here and the rest stay in libzmq's queue.
        await this.#controlQueue.onSizeLessThan(1);
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
        // Assertion (a programming error): the owner sets onControl before peering; answered ERR.
        if (handler === null) throw new Error("no control handler");
        reply = [REPLY_OK, await handler(request)];
      } catch (err) {
        this.#stats.controlErrors++;
        const message = toError(err).message;
        this.#controlFailLog.hit((suppressed) => {
          this.#log.warn({ err, suppressed }, "mesh control handler failed");
        });
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
        if (!this.#closed) {
          this.#replyFailLog.hit((suppressed) => {
            this.#log.warn({ err, suppressed }, "mesh control reply failed");
          });
        }
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
    // Assertion (a programming error): callers pass their own named defaults.
    if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) throw new RangeError(`timeoutMs must be positive, got ${timeoutMs}`);
    const startedMs = performance.now();
    const serverKey = this.#curve === null ? null : await this.#controlServerKey(this.#curve, ep, timeoutMs);
    if (this.#closed) throw new MeshClosedError("request");
    const curveClient = serverKey === null || this.#curve === null ? {} : this.#curve.clientOptions(serverKey);
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
        if (serverKey !== null) this.#curve?.forgetKey(ep, serverKey);
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
  async #controlServerKey(curve: CurveRuntime, ep: string, timeoutMs: number): Promise<string> {
    const key = await curve.controlServerKey(ep, timeoutMs);
    if (this.#closed) throw new MeshClosedError("request");
    if (key === null) {
      this.#stats.requestTimeouts++;
      throw new MeshRequestTimeoutError(ep, timeoutMs);
    }
    return key;
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
    this.#curve?.closeProbes();
    const reader = this.#reader.close();
    // The last batch (a leaving replica's drain flag, its last frees) may still sit in the PUB's
    // pipes: give it this long to leave, not libzmq's forever (linger -1 on a dead peer).
    this.#pub.linger = LAST_BATCH_LINGER_MS;
    this.#pub.close();
    this.#router.close();
    const watchers = this.#curve?.closeWatchers();
    await Promise.all([this.#routerLoop, this.#draining, reader, watchers]);
    // Last: the ZAP handler serves the CURVE sockets closed above.
    await this.#curve?.closeZap();
    this.#log.info({ publish: this.publishEndpoint }, "mesh transport closed");
  }
}
