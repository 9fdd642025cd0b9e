/**
 * A worker's catalogue endpoint (`http://host:port/...` or `host:port`) -> the `ip:port` Envoy's
 * ORIGINAL_DST cluster takes, per data-parallel rank. Host names are resolved through an injected
 * resolver and cached: a hit costs a Map lookup on the pick path; a miss resolves once, while
 * concurrent picks share the lookup. A name that does not resolve is remembered as such for
 * UNRESOLVED_TTL_MS (the picker then routes elsewhere and counts it).
 *
 * Data-parallel ranks: rank r of a worker whose ranks start at s listens on the endpoint's port
 * + (r - s) x rankPortStride, on the endpoint's address (GIE's conformance test
 * gateway_following_epp_routing_dp gives each rank its own port on one IP).
 */
import { lookup } from "node:dns/promises";
import { isIP } from "node:net";

import type { Clock } from "../core/index.js";
import type { WorkerCatalogRecord } from "../core/index.js";
import { DEFAULT_DP_RANK_PORT_STRIDE } from "./defaults.js";

/** Host name -> one address (v4 or v6). Rejects, or resolves undefined, when it does not resolve. */
export type HostResolver = (host: string) => Promise<string | undefined>;

export const systemResolver: HostResolver = async (host) => (await lookup(host)).address;

/** How long a resolved address is used before it is looked up again, ms (pods keep their IP for life; a restarted one gets a new name lookup within this). */
export const RESOLVED_TTL_MS = 30_000;
/** How long a name that did not resolve is not asked again, ms. */
export const UNRESOLVED_TTL_MS = 2_000;
/** Host names cached at most; past it, expired answers are dropped (the catalogue's names are far fewer). */
export const MAX_CACHED_HOSTS = 4_096;
const DEFAULT_PORTS: Readonly<Record<string, number>> = { "http:": 80, "https:": 443 };
const MAX_PORT = 65_535;

/** `ip:port` with an IPv6 address bracketed. */
export function joinHostPort(ip: string, port: number): string {
  return ip.includes(":") ? `[${ip}]:${port}` : `${ip}:${port}`;
}

/** `ip`, `ip:port`, `[v6]`, `[v6]:port` -> address and optional port (undefined: not an endpoint). */
export function splitHostPort(entry: string): { host: string; port: number | undefined } | undefined {
  const s = entry.trim();
  const v6 = /^\[([^\]]+)\](?::(\d+))?$/.exec(s);
  if (v6 !== null) return { host: v6[1] ?? "", port: v6[2] === undefined ? undefined : Number(v6[2]) };
  if (isIP(s) === 6) return { host: s, port: undefined };
  const m = /^([^:]+)(?::(\d+))?$/.exec(s);
  if (m === null) return undefined;
  return { host: m[1] ?? "", port: m[2] === undefined ? undefined : Number(m[2]) };
}

/** A catalogue endpoint -> its host and port; undefined when it has none usable. */
export function parseWorkerEndpoint(endpoint: string | null): { host: string; port: number } | undefined {
  if (endpoint === null || endpoint.trim() === "") return undefined;
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(endpoint) ? endpoint : `http://${endpoint}`;
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    return undefined;
  }
  const port = url.port === "" ? DEFAULT_PORTS[url.protocol] : Number(url.port);
  const host = url.hostname.replace(/^\[|\]$/g, "");
  if (port === undefined || host === "") return undefined;
  return { host, port };
}

export interface RankDestination {
  /** `ip:port` of the rank: where Envoy sends the request. */
  readonly endpoint: string;
  readonly ip: string;
  readonly port: number;
}

/** A parsed catalogue endpoint, and whether its host is already an address. */
interface ParsedEndpoint {
  readonly host: string;
  readonly port: number;
  readonly isAddress: boolean;
}

interface CacheEntry {
  address: string | undefined;
  expiresAtMs: number;
  pending: Promise<string | undefined> | undefined;
}

export interface WorkerEndpointsOptions {
  readonly resolve: HostResolver;
  readonly clock: Clock;
  readonly rankPortStride?: number;
}

export class WorkerEndpoints {
  readonly #resolve: HostResolver;
  readonly #clock: Clock;
  readonly #stride: number;
  readonly #cache = new Map<string, CacheEntry>();
  /**
   * Catalogue endpoint -> parsed (null: none usable). Parsing through URL on every pick and
   * fallback was ~1% of the picker's main thread at bench:epp's 150 streams; a fleet has few
   * endpoints. Cleared when it passes MAX_CACHED_HOSTS entries (re-parsing is only slower).
   */
  readonly #parsed = new Map<string, ParsedEndpoint | null>();
  #unresolved = 0;

  constructor(options: WorkerEndpointsOptions) {
    this.#resolve = options.resolve;
    this.#clock = options.clock;
    this.#stride = options.rankPortStride ?? DEFAULT_DP_RANK_PORT_STRIDE;
  }

  /** Lookups that found no address (each counted once per attempt, not per pick). */
  get unresolvedLookups(): number {
    return this.#unresolved;
  }

  /** The rank's destination from the cache alone (undefined: not resolved yet, or not resolvable). */
  cached(record: WorkerCatalogRecord, dpRank: number): RankDestination | undefined {
    const ep = this.#endpointOf(record);
    if (ep === undefined) return undefined;
    const ip = ep.isAddress ? ep.host : this.#fresh(ep.host)?.address;
    return ip === undefined ? undefined : this.#rank(record, dpRank, ip, ep.port);
  }

  /** The rank's destination, resolving the host when the cache has no fresh answer. */
  async resolve(record: WorkerCatalogRecord, dpRank: number): Promise<RankDestination | undefined> {
    const hit = this.cached(record, dpRank);
    if (hit !== undefined) return hit;
    const ep = this.#endpointOf(record);
    if (ep === undefined || ep.isAddress) return undefined;
    const entry = this.#fresh(ep.host);
    if (entry !== undefined && entry.pending === undefined) return undefined; // known unresolvable
    const ip = await this.#lookup(ep.host);
    return ip === undefined ? undefined : this.#rank(record, dpRank, ip, ep.port);
  }

  #endpointOf(record: WorkerCatalogRecord): ParsedEndpoint | undefined {
    const key = record.endpoint;
    if (key === null) return undefined;
    let ep = this.#parsed.get(key);
    if (ep === undefined) {
      const p = parseWorkerEndpoint(key);
      ep = p === undefined ? null : { ...p, isAddress: isIP(p.host) !== 0 };
      if (this.#parsed.size >= MAX_CACHED_HOSTS) this.#parsed.clear();
      this.#parsed.set(key, ep);
    }
    return ep ?? undefined;
  }

  #rank(record: WorkerCatalogRecord, dpRank: number, ip: string, basePort: number): RankDestination | undefined {
    const port = basePort + (dpRank - record.data_parallel_start_rank) * this.#stride;
    if (port < 1 || port > MAX_PORT) return undefined;
    return { endpoint: joinHostPort(ip, port), ip, port };
  }

  #dropExpired(): void {
    const now = this.#clock.now();
    for (const [host, e] of this.#cache) if (e.pending === undefined && e.expiresAtMs <= now) this.#cache.delete(host);
  }

  #fresh(host: string): CacheEntry | undefined {
    const e = this.#cache.get(host);
    return e !== undefined && (e.pending !== undefined || e.expiresAtMs > this.#clock.now()) ? e : undefined;
  }

  #lookup(host: string): Promise<string | undefined> {
    const existing = this.#cache.get(host);
    if (existing?.pending !== undefined) return existing.pending;
    if (this.#cache.size >= MAX_CACHED_HOSTS) this.#dropExpired();
    const entry: CacheEntry = { address: undefined, expiresAtMs: 0, pending: undefined };
    const pending = this.#resolve(host)
      .catch(() => undefined)
      .then((address) => {
        const ok = address !== undefined && isIP(address) !== 0;
        if (!ok) this.#unresolved++;
        entry.address = ok ? address : undefined;
        entry.expiresAtMs = this.#clock.now() + (ok ? RESOLVED_TTL_MS : UNRESOLVED_TTL_MS);
        entry.pending = undefined;
        return entry.address;
      });
    entry.pending = pending;
    this.#cache.set(host, entry);
    return pending;
  }
}
