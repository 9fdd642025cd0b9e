/**
 * Peers found by DNS: a `--peers` entry `dns:NAME:PORT` (e.g. a Kubernetes headless Service,
 * `dns:kvmesh-mesh.default.svc.cluster.local:7100`) is resolved every interval through the system
 * resolver (`dns.lookup` with `all: true`, so cluster DNS and /etc/hosts both answer), and the
 * difference from the last answer goes through the same register/deregister path as
 * `kvmesh peers add/remove`: new addresses are registered, vanished ones deregistered.
 *
 * - This replica's own endpoint is never registered: its advertised endpoint, and any local
 *   interface address at its own mesh port (a pod's own IP is in its Service's answer). A local
 *   address at another port is another replica on this host, and is registered.
 * - A failed resolution (NXDOMAIN while the Service has no ready pod yet, a resolver timeout) is
 *   logged (throttled), counted, and keeps the last known set: a DNS hiccup must not unpeer a
 *   healthy mesh.
 * - Only what discovery registered is deregistered by it: a peer added by hand (or a static
 *   `--peers` endpoint) that DNS also returned stays when DNS stops returning it.
 */
import { lookup } from "node:dns/promises";
import { networkInterfaces } from "node:os";
import type { Logger } from "pino";

import { badRequest } from "../src/core/index.js";
import { LogThrottle } from "../src/util/log-throttle.js";
import { parsePeerEndpoint } from "./endpoints.js";
import type { TimerHandle, Timers } from "../src/core/index.js";

/** Default re-resolution interval, s (`--peer-dns-interval-secs`): a pod that joins is peered within it. */
export const DEFAULT_PEER_DNS_INTERVAL_SECS = 5;
/** Addresses taken from one name's answer: a Service of more replicas than this is a mistake. */
export const MAX_DNS_PEERS_PER_NAME = 256;
const DNS_PREFIX = "dns:";

export interface DnsPeerEntry {
  readonly name: string;
  readonly port: number;
}

/** Whether a `--peers` item is a DNS entry (`dns:NAME:PORT`) rather than an endpoint. */
export function isDnsPeer(item: string): boolean {
  return item.startsWith(DNS_PREFIX);
}

/** Parses `dns:NAME:PORT`; throws a RangeError naming what is wrong. */
export function parseDnsPeer(item: string): DnsPeerEntry {
  if (!isDnsPeer(item)) throw badRequest(`${JSON.stringify(item)} is not a dns:NAME:PORT entry`, "peers");
  const rest = item.slice(DNS_PREFIX.length);
  const colon = rest.lastIndexOf(":");
  const name = colon < 0 ? "" : rest.slice(0, colon);
  const portText = colon < 0 ? "" : rest.slice(colon + 1);
  if (name === "" || portText === "") throw badRequest(`${JSON.stringify(item)}: expected dns:NAME:PORT, e.g. dns:kvmesh-mesh.default.svc.cluster.local:7100`, "peers");
  if (!/^[A-Za-z0-9._-]{1,253}$/.test(name)) throw badRequest(`${JSON.stringify(item)}: ${JSON.stringify(name)} is not a DNS name`, "peers");
  const port = Number(portText);
  if (!/^\d+$/.test(portText) || !Number.isInteger(port) || port < 1 || port > 65_535) throw badRequest(`${JSON.stringify(item)}: port must be 1 ... 65535`, "peers");
  return { name, port };
}

/** Resolves a name to its addresses (the system resolver by default). */
export type Resolve = (name: string) => Promise<string[]>;

export const systemResolve: Resolve = async (name) => (await lookup(name, { all: true, verbatim: true })).map((a) => a.address);

/** This host's interface addresses (an address there at our mesh port is ourselves). */
export function localAddresses(): Set<string> {
  const out = new Set<string>();
  for (const list of Object.values(networkInterfaces())) for (const a of list ?? []) out.add(a.address);
  return out;
}

export interface DnsPeerStats {
  resolutions: number;
  failures: number;
  registered: number;
  deregistered: number;
}

export interface DnsPeerOptions {
  readonly entries: readonly DnsPeerEntry[];
  readonly intervalMs: number;
  /** This replica's advertised endpoint (never registered). */
  readonly self: string;
  /** Local interface addresses (default: this host's). */
  readonly localAddresses?: ReadonlySet<string>;
  readonly resolve?: Resolve;
  /** Registers a peer; resolves false when it is not discovery's to remove (registered already, by hand or by --peers). */
  readonly register: (endpoint: string) => Promise<boolean>;
  readonly deregister: (endpoint: string) => Promise<unknown>;
  readonly timers: Timers;
  readonly logger: Logger;
}

const endpointOf = (address: string, port: number): string => parsePeerEndpoint(`tcp://${address.includes(":") ? `[${address}]` : address}:${port}`);

export class DnsPeerDiscovery {
  readonly stats: DnsPeerStats = { resolutions: 0, failures: 0, registered: 0, deregistered: 0 };
  readonly #o: DnsPeerOptions;
  readonly #resolve: Resolve;
  readonly #local: ReadonlySet<string>;
  /** This replica's mesh port (from `self`): a local address there is this replica. */
  readonly #ownPort: number;
  /** What each entry resolved to last (kept through failures). */
  readonly #known = new Map<string, Set<string>>();
  /** Endpoints handled since they appeared in DNS (registered, or found registered already). */
  readonly #handled = new Set<string>();
  /** Of those, the ones this discovery registered (and so may deregister). */
  readonly #mine = new Set<string>();
  readonly #failLog = new LogThrottle();
  #timer: TimerHandle | undefined;
  #running: Promise<void> | undefined;
  #closed = false;
  #rounds = 0;

  constructor(o: DnsPeerOptions) {
    this.#o = o;
    this.#resolve = o.resolve ?? systemResolve;
    this.#local = o.localAddresses ?? localAddresses();
    this.#ownPort = Number(/:(\d+)$/.exec(o.self)?.[1] ?? Number.NaN);
  }

  /** Resolves once now (awaited, so start-up peers come from it), then every interval. */
  async start(): Promise<void> {
    await this.refresh();
    this.#schedule();
  }

  /** One round: resolve every entry, register what appeared, deregister what vanished. */
  refresh(): Promise<void> {
    this.#running ??= this.#round().finally(() => {
      this.#rounds++;
      this.#running = undefined;
    });
    return this.#running;
  }

  /** Whether a round has finished (its answers registered, or its failures logged). */
  get resolvedOnce(): boolean {
    return this.#rounds > 0;
  }

  /** Endpoints DNS currently gives (every entry, self excluded). */
  current(): string[] {
    const all = new Set<string>();
    for (const set of this.#known.values()) for (const ep of set) all.add(ep);
    return [...all].sort();
  }

  close(): void {
    this.#closed = true;
    this.#timer?.cancel();
  }

  #schedule(): void {
    if (this.#closed) return;
    this.#timer = this.#o.timers.setTimeout(() => {
      void this.refresh().finally(() => {
        this.#schedule();
      });
    }, this.#o.intervalMs);
  }

  async #round(): Promise<void> {
    for (const e of this.#o.entries) {
      const key = `${e.name}:${e.port}`;
      try {
        const addresses = await this.#resolve(e.name);
        this.stats.resolutions++;
        const eps = new Set<string>();
        for (const a of addresses.slice(0, MAX_DNS_PEERS_PER_NAME)) {
          const ep = endpointOf(a, e.port);
          if (ep === this.#o.self || (this.#local.has(a) && e.port === this.#ownPort)) continue;
          eps.add(ep);
        }
        this.#known.set(key, eps);
      } catch (err) {
        this.stats.failures++;
        this.#failLog.hit((suppressed) => {
          this.#o.logger.warn({ err, name: e.name, port: e.port, kept: this.#known.get(key)?.size ?? 0, suppressed }, "peer DNS resolution failed: keeping the last known peers");
        });
      }
    }
    if (this.#closed) return;
    const now = new Set(this.current());
    // A registration that failed last round was not marked handled: it is retried.
    for (const ep of now) if (!this.#handled.has(ep)) await this.#apply(ep, "register");
    for (const ep of [...this.#handled]) {
      if (now.has(ep)) continue;
      this.#handled.delete(ep);
      if (this.#mine.has(ep)) await this.#apply(ep, "deregister");
    }
  }

  async #apply(ep: string, op: "register" | "deregister"): Promise<void> {
    try {
      if (op === "register") {
        const added = await this.#o.register(ep);
        this.#handled.add(ep);
        if (!added) return;
        this.#mine.add(ep);
        this.stats.registered++;
        this.#o.logger.info({ peer: ep }, "peer found by DNS: registered");
      } else {
        this.#mine.delete(ep);
        await this.#o.deregister(ep);
        this.stats.deregistered++;
        this.#o.logger.info({ peer: ep }, "peer gone from DNS: deregistered");
      }
    } catch (err) {
      // Not remembered as registered: the next round tries again.
      this.#o.logger.warn({ err, peer: ep, op }, `peer found by DNS: ${op} failed (retried next round)`);
    }
  }
}
