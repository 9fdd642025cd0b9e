/**
 * A fault-injecting TCP proxy (node:net) for the mesh fault scenarios: these kernels have no
 * `netem`, so delay, loss, stalls and cuts are injected by a proxy of our own between replicas.
 *
 * One FaultProxy owns any number of routes (listener -> target). `startMeshPeerProxy` covers one
 * replica's mesh endpoint `tcp://host:P`: a listener for the XPUB port P and one for the control
 * ROUTER at P + 1 (mesh/endpoints.ts CONTROL_PORT_OFFSET), so a daemon given the proxy's
 * endpoint in `--peers` reaches both through it.
 *
 * Knobs, changeable at run time with `setFaults` (every knob applies per chunk, i.e. per
 * `data` event of the source socket, which on loopback is usually one ZMTP write or a coalesced
 * run of them):
 *  - delayMs (+ jitterMs): each chunk is held this long; order within a connection and
 *    direction is kept (a chunk never overtakes the one before it), so jitter only bunches.
 *  - dropRate: a chunk is discarded. On a TCP stream this corrupts ZMTP framing, which is the
 *    point: libzmq sees garbage, drops the connection and reconnects, and the mesh must repair
 *    what was lost through its sequence gaps and snapshots.
 *  - truncateRate: only a random prefix of the chunk is forwarded (same effect, subtler bytes).
 *  - direction: which way the faults apply ("both", or only "to-target" / "to-client").
 * And three actions:
 *  - stall(ms?): stop forwarding and stop reading (TCP backpressure reaches the sender, as
 *    with a frozen peer); resume() or the timer ends it, held chunks then flow in order.
 *  - cut(): reset every connection (RST) and refuse new ones (accepted, then reset at once)
 *    until heal().
 *  - clearFaults(): back to a transparent proxy.
 * Counters (`counters()`) say what was done, so a test can tell "no fault happened" from "the
 * fault was survived".
 *
 * Randomness and time are injected (src/core/time.ts, src/core/random.ts), so a seeded run drops the same chunks.
 */
import { createServer, Socket, type AddressInfo, type Server } from "node:net";

import { systemClock, type Clock } from "../../src/core/index.js";
import { mathRandom, type Random } from "../../src/core/index.js";
import { CONTROL_PORT_OFFSET, parsePeerEndpoint, parseEndpoint } from "../../mesh/endpoints.js";

/**
 * Bytes held per connection and direction (delayed or stalled) before the source socket is
 * paused: 1 MiB is ~100 ms of a saturated mesh link here, and keeps a stalled proxy from
 * buffering without bound (the sender's kernel buffers and ZeroMQ HWM take over).
 */
export const DEFAULT_MAX_HELD_BYTES = 1024 * 1024;
/** How long close() waits for sockets to end before resetting them, ms. */
const CLOSE_GRACE_MS = 200;

export type FaultDirection = "both" | "to-target" | "to-client";

export interface FaultSettings {
  /** Added delay per chunk, ms (>= 0). */
  readonly delayMs: number;
  /** Uniform extra delay in [0, jitterMs), ms (>= 0). */
  readonly jitterMs: number;
  /** Probability in [0, 1] that a chunk is discarded. */
  readonly dropRate: number;
  /** Probability in [0, 1] that only a prefix of a chunk is forwarded. */
  readonly truncateRate: number;
  readonly direction: FaultDirection;
}

export const NO_FAULTS: FaultSettings = Object.freeze({ delayMs: 0, jitterMs: 0, dropRate: 0, truncateRate: 0, direction: "both" });

export interface FaultProxyCounters {
  connectionsAccepted: number;
  /** Accepted while cut, and reset at once. */
  connectionsRefused: number;
  /** Connections to the target that failed (refused, unreachable). */
  upstreamErrors: number;
  connectionsActive: number;
  /** Connections reset by cut(). */
  connectionsCut: number;
  chunksForwarded: number;
  bytesForwarded: number;
  chunksDelayed: number;
  chunksDropped: number;
  bytesDropped: number;
  chunksTruncated: number;
  bytesTruncated: number;
  stalls: number;
  cuts: number;
  /** Times a source socket was paused because its held bytes passed maxHeldBytes. */
  backpressurePauses: number;
  /** Largest number of bytes held in one direction of one connection. */
  maxHeldBytes: number;
}

export interface FaultProxyRoute {
  /** Default 127.0.0.1. */
  readonly listenHost?: string;
  /** 0 (default): an ephemeral port. */
  readonly listenPort?: number;
  readonly targetHost: string;
  readonly targetPort: number;
}

export interface FaultProxyOptions {
  readonly routes: readonly FaultProxyRoute[];
  readonly faults?: Partial<FaultSettings>;
  readonly clock?: Clock;
  readonly random?: Random;
  readonly maxHeldBytes?: number;
}

interface Held {
  readonly data: Buffer;
  readonly releaseAtMs: number;
}

/** One direction of one proxied connection: a FIFO of chunks waiting for their release time. */
class Pipe {
  readonly #proxy: FaultProxy;
  readonly #src: Socket;
  readonly #dst: Socket;
  readonly #dir: "to-target" | "to-client";
  #queue: Held[] = [];
  #heldBytes = 0;
  #lastReleaseAtMs = 0;
  #timer: NodeJS.Timeout | undefined;
  #pausedForBackpressure = false;

  constructor(proxy: FaultProxy, src: Socket, dst: Socket, dir: "to-target" | "to-client") {
    this.#proxy = proxy;
    this.#src = src;
    this.#dst = dst;
    this.#dir = dir;
    src.on("data", (chunk: Buffer) => {
      this.#onData(chunk);
    });
    dst.on("drain", () => {
      this.pump();
    });
  }

  get heldBytes(): number {
    return this.#heldBytes;
  }

  /** After a stall: reads again, unless this pipe still holds too much. */
  resumeSource(): void {
    if (!this.#pausedForBackpressure) this.#src.resume();
  }

  #onData(chunk: Buffer): void {
    const p = this.#proxy;
    const faulty = p.appliesTo(this.#dir);
    const f = p.faults;
    let data = chunk;
    if (faulty && f.dropRate > 0 && p.random() < f.dropRate) {
      p.count("chunksDropped", 1);
      p.count("bytesDropped", chunk.length);
      return;
    }
    if (faulty && f.truncateRate > 0 && chunk.length > 1 && p.random() < f.truncateRate) {
      const keep = Math.floor(p.random() * (chunk.length - 1)) + 1;
      data = chunk.subarray(0, keep);
      p.count("chunksTruncated", 1);
      p.count("bytesTruncated", chunk.length - keep);
    }
    const now = p.now();
    const delay = faulty ? f.delayMs + (f.jitterMs > 0 ? p.random() * f.jitterMs : 0) : 0;
    if (delay > 0) p.count("chunksDelayed", 1);
    // FIFO: never release before the chunk ahead of it (TCP order), even with jitter.
    const releaseAtMs = Math.max(now + delay, this.#lastReleaseAtMs);
    this.#lastReleaseAtMs = releaseAtMs;
    this.#queue.push({ data, releaseAtMs });
    this.#heldBytes += data.length;
    p.noteHeld(this.#heldBytes);
    if (this.#heldBytes > p.maxHeldBytes && !this.#pausedForBackpressure) {
      this.#pausedForBackpressure = true;
      p.count("backpressurePauses", 1);
      this.#src.pause();
    }
    this.pump();
  }

  /** Forwards every chunk that is due, unless stalled or the destination is full. */
  pump(): void {
    if (this.#timer !== undefined) {
      clearTimeout(this.#timer);
      this.#timer = undefined;
    }
    const p = this.#proxy;
    if (p.stalled || this.#dst.destroyed) return;
    const now = p.now();
    while (this.#queue.length > 0) {
      const head = this.#queue[0] as Held;
      if (head.releaseAtMs > now) {
        this.#timer = setTimeout(() => {
          this.#timer = undefined;
          this.pump();
        }, Math.max(1, Math.ceil(head.releaseAtMs - now)));
        break;
      }
      this.#queue.shift();
      this.#heldBytes -= head.data.length;
      p.count("chunksForwarded", 1);
      p.count("bytesForwarded", head.data.length);
      if (!this.#dst.write(head.data)) break; // resumed on "drain"
    }
    if (this.#pausedForBackpressure && this.#heldBytes <= p.maxHeldBytes / 2 && !p.stalled) {
      this.#pausedForBackpressure = false;
      this.#src.resume();
    }
  }

  dispose(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#queue = [];
    this.#heldBytes = 0;
  }
}

interface Conn {
  readonly client: Socket;
  readonly upstream: Socket;
  readonly pipes: readonly Pipe[];
  /** The upstream connection is up (until then the client is not read). */
  connected: boolean;
}

export class FaultProxy {
  readonly maxHeldBytes: number;
  readonly #servers: Server[];
  readonly #clock: Clock;
  readonly #random: Random;
  readonly #conns = new Set<Conn>();
  #faults: FaultSettings;
  #stalled = false;
  #stallTimer: NodeJS.Timeout | undefined;
  #cut = false;
  #closed = false;
  readonly #c: FaultProxyCounters = {
    connectionsAccepted: 0,
    connectionsRefused: 0,
    upstreamErrors: 0,
    connectionsActive: 0,
    connectionsCut: 0,
    chunksForwarded: 0,
    bytesForwarded: 0,
    chunksDelayed: 0,
    chunksDropped: 0,
    bytesDropped: 0,
    chunksTruncated: 0,
    bytesTruncated: 0,
    stalls: 0,
    cuts: 0,
    backpressurePauses: 0,
    maxHeldBytes: 0,
  };
  /** The port each route listens on, in route order. */
  readonly listenPorts: readonly number[];

  private constructor(o: FaultProxyOptions, servers: Server[], ports: number[]) {
    this.#servers = servers;
    this.listenPorts = ports;
    this.#clock = o.clock ?? systemClock;
    this.#random = o.random ?? mathRandom;
    this.maxHeldBytes = o.maxHeldBytes ?? DEFAULT_MAX_HELD_BYTES;
    this.#faults = validateFaults({ ...NO_FAULTS, ...o.faults });
    servers.forEach((s, i) => {
      s.on("connection", (client: Socket) => {
        this.#accept(client, o.routes[i] as FaultProxyRoute);
      });
    });
  }

  /** Listens on every route (rejects, with every listener closed, if one cannot bind). */
  static async start(o: FaultProxyOptions): Promise<FaultProxy> {
    if (o.routes.length === 0) throw new RangeError("FaultProxy needs at least one route");
    validateFaults({ ...NO_FAULTS, ...o.faults });
    if (o.maxHeldBytes !== undefined && !(Number.isInteger(o.maxHeldBytes) && o.maxHeldBytes > 0)) {
      throw new RangeError(`maxHeldBytes must be a positive integer, got ${o.maxHeldBytes}`);
    }
    const servers: Server[] = [];
    const ports: number[] = [];
    try {
      for (const r of o.routes) {
        const s = createServer({ noDelay: true, pauseOnConnect: true });
        servers.push(s);
        await new Promise<void>((resolve, reject) => {
          s.once("error", reject);
          s.listen(r.listenPort ?? 0, r.listenHost ?? "127.0.0.1", () => {
            s.off("error", reject);
            resolve();
          });
        });
        ports.push((s.address() as AddressInfo).port);
      }
    } catch (err) {
      await Promise.all(servers.map((s) => closeServer(s)));
      throw err;
    }
    return new FaultProxy(o, servers, ports);
  }

  get faults(): FaultSettings {
    return this.#faults;
  }
  get stalled(): boolean {
    return this.#stalled;
  }
  get isCut(): boolean {
    return this.#cut;
  }

  /** Replaces the fault settings (unspecified knobs go back to none). */
  setFaults(f: Partial<FaultSettings>): void {
    this.#faults = validateFaults({ ...NO_FAULTS, ...f });
  }

  clearFaults(): void {
    this.#faults = NO_FAULTS;
  }

  /** Stops forwarding and reading; with `ms`, resumes by itself after that long. */
  stall(ms?: number): void {
    if (this.#closed) return;
    if (!this.#stalled) this.#c.stalls++;
    this.#stalled = true;
    for (const c of this.#conns) {
      c.client.pause();
      c.upstream.pause();
    }
    if (this.#stallTimer !== undefined) clearTimeout(this.#stallTimer);
    this.#stallTimer = undefined;
    if (ms !== undefined) {
      if (!(Number.isFinite(ms) && ms >= 0)) throw new RangeError(`stall ms must be a finite number >= 0, got ${ms}`);
      this.#stallTimer = setTimeout(() => {
        this.resume();
      }, ms);
    }
  }

  resume(): void {
    if (this.#stallTimer !== undefined) clearTimeout(this.#stallTimer);
    this.#stallTimer = undefined;
    if (!this.#stalled) return;
    this.#stalled = false;
    for (const c of this.#conns) {
      if (!c.connected) continue;
      for (const p of c.pipes) {
        p.resumeSource();
        p.pump();
      }
    }
  }

  /** Resets every connection and refuses new ones until heal(). */
  cut(): void {
    if (this.#closed) return;
    this.#c.cuts++;
    this.#cut = true;
    for (const c of [...this.#conns]) {
      this.#c.connectionsCut++;
      this.#drop(c, true);
    }
  }

  heal(): void {
    this.#cut = false;
  }

  counters(): FaultProxyCounters {
    return { ...this.#c, connectionsActive: this.#conns.size };
  }

  /** Closes the listeners and every connection (reset after a short grace). Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#stallTimer !== undefined) clearTimeout(this.#stallTimer);
    const done = Promise.all(this.#servers.map((s) => closeServer(s)));
    for (const c of [...this.#conns]) this.#drop(c, true);
    await Promise.race([done, new Promise((resolve) => setTimeout(resolve, CLOSE_GRACE_MS))]);
  }

  // ---------------------------------------------------------------- used by Pipe

  appliesTo(dir: "to-target" | "to-client"): boolean {
    return this.#faults.direction === "both" || this.#faults.direction === dir;
  }
  random(): number {
    return this.#random.next();
  }
  now(): number {
    return this.#clock.now();
  }
  count(k: Exclude<keyof FaultProxyCounters, "connectionsActive" | "maxHeldBytes">, n: number): void {
    this.#c[k] += n;
  }
  noteHeld(bytes: number): void {
    if (bytes > this.#c.maxHeldBytes) this.#c.maxHeldBytes = bytes;
  }

  // ---------------------------------------------------------------- connections

  #accept(client: Socket, route: FaultProxyRoute): void {
    if (this.#cut || this.#closed) {
      this.#c.connectionsRefused++;
      client.on("error", () => undefined);
      client.resetAndDestroy();
      return;
    }
    this.#c.connectionsAccepted++;
    client.setNoDelay(true);
    const upstream = new Socket();
    upstream.setNoDelay(true);
    const conn: Conn = { client, upstream, pipes: [new Pipe(this, client, upstream, "to-target"), new Pipe(this, upstream, client, "to-client")], connected: false };
    this.#conns.add(conn);
    // An error on either side resets both (as a broken link would); an orderly close of one
    // side closes the other once what is queued has been written.
    const fail = (): void => {
      this.#drop(conn, true);
    };
    const closed = (): void => {
      this.#drop(conn, false);
    };
    client.on("error", fail);
    client.on("close", closed);
    upstream.on("error", () => {
      if (!conn.connected) this.#c.upstreamErrors++;
      fail();
    });
    upstream.on("close", closed);
    // Half-closes pass through, so a peer's FIN reaches the other side.
    client.on("end", () => upstream.end());
    upstream.on("end", () => client.end());
    upstream.connect(route.targetPort, route.targetHost, () => {
      conn.connected = true;
      if (this.#stalled) upstream.pause();
      else client.resume();
    });
  }

  #drop(c: Conn, reset: boolean): void {
    if (!this.#conns.delete(c)) return;
    for (const p of c.pipes) p.dispose();
    for (const s of [c.client, c.upstream]) {
      if (s.destroyed) continue;
      if (reset) s.resetAndDestroy();
      else s.destroySoon();
    }
  }
}

function validateFaults(f: FaultSettings): FaultSettings {
  const rate = (name: string, v: number): void => {
    if (!(Number.isFinite(v) && v >= 0 && v <= 1)) throw new RangeError(`${name} must be in [0, 1], got ${v}`);
  };
  const ms = (name: string, v: number): void => {
    if (!(Number.isFinite(v) && v >= 0)) throw new RangeError(`${name} must be a finite number >= 0, got ${v}`);
  };
  ms("delayMs", f.delayMs);
  ms("jitterMs", f.jitterMs);
  rate("dropRate", f.dropRate);
  rate("truncateRate", f.truncateRate);
  if (f.direction !== "both" && f.direction !== "to-target" && f.direction !== "to-client") throw new RangeError(`direction must be both, to-target or to-client`);
  return Object.freeze({ ...f });
}

function closeServer(s: Server): Promise<void> {
  return new Promise((resolve) => {
    if (!s.listening) {
      resolve();
      return;
    }
    s.close(() => {
      resolve();
    });
  });
}

export interface MeshPeerProxyOptions {
  /** The replica's mesh endpoint, tcp://host:P (its control ROUTER is at P + 1). */
  readonly target: string;
  /** Default 127.0.0.1. A second loopback address (127.0.0.2) lets the proxy keep the port numbers. */
  readonly listenHost?: string;
  /**
   * Port for the XPUB listener (the control listener takes the next one). Default: the target's
   * port when listenHost differs from the target host (so a replica can advertise
   * `--replica-sync-advertise-host listenHost` and every peer reaches it through the proxy), else
   * an ephemeral pair.
   */
  readonly listenPort?: number;
  readonly faults?: Partial<FaultSettings>;
  readonly clock?: Clock;
  readonly random?: Random;
  readonly maxHeldBytes?: number;
}

export interface MeshPeerProxy {
  readonly proxy: FaultProxy;
  /** What to give a daemon in --peers (or register_peer): tcp://listenHost:P'. */
  readonly endpoint: string;
}

/** Two listeners, P' -> P and P' + 1 -> P + 1, in front of one replica's mesh endpoint. */
export async function startMeshPeerProxy(o: MeshPeerProxyOptions): Promise<MeshPeerProxy> {
  const target = parseEndpoint(parsePeerEndpoint(o.target));
  if (target.scheme !== "tcp" || target.port === "*") throw new RangeError(`target must be tcp://host:port, got ${o.target}`);
  const listenHost = o.listenHost ?? "127.0.0.1";
  const common = {
    ...(o.faults === undefined ? {} : { faults: o.faults }),
    ...(o.clock === undefined ? {} : { clock: o.clock }),
    ...(o.random === undefined ? {} : { random: o.random }),
    ...(o.maxHeldBytes === undefined ? {} : { maxHeldBytes: o.maxHeldBytes }),
  };
  const targetHost = target.ipv6 ? target.host.slice(1, -1) : target.host;
  const targetPort = target.port;
  const fixed = o.listenPort ?? (listenHost !== targetHost ? targetPort : undefined);
  const routesAt = (p: number): FaultProxyRoute[] => [
    { listenHost, listenPort: p, targetHost, targetPort },
    { listenHost, listenPort: p + CONTROL_PORT_OFFSET, targetHost, targetPort: targetPort + CONTROL_PORT_OFFSET },
  ];
  if (fixed !== undefined) {
    const proxy = await FaultProxy.start({ routes: routesAt(fixed), ...common });
    return { proxy, endpoint: `tcp://${listenHost}:${fixed}` };
  }
  // An ephemeral pair: the OS picks P', and P' + 1 must be free too; retry on a collision.
  for (let attempt = 0; ; attempt++) {
    const probe = await FaultProxy.start({ routes: [{ listenHost, listenPort: 0, targetHost, targetPort: target.port }] });
    const p = probe.listenPorts[0] as number;
    await probe.close();
    try {
      const proxy = await FaultProxy.start({ routes: routesAt(p), ...common });
      return { proxy, endpoint: `tcp://${listenHost}:${p}` };
    } catch (err) {
      if (attempt >= 20) throw err;
    }
  }
}
