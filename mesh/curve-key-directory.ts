/**
 * Which public key does the replica at this endpoint hold? A CURVE client must name the server's
 * public key before it connects, but mesh peers are plain `tcp://host:port` endpoints (in
 * `--peers`, `register_peer` and the peer-back request) that name no key. The answer is found by
 * trying the listed keys: a CURVE handshake completes only with the server's real key, and the
 * outcome of one handshake per candidate tells the cases apart (measured, zeromq 6.8):
 *
 *   handshake                                   -> this candidate is the server's key, and it admits us
 *   handshake:error:auth (ZAP 400)              -> right key, but the server does not list OUR key
 *   handshake:error:protocol MECHANISM_MISMATCH -> the server runs without CURVE
 *   handshake:error:other (EPIPE), repeatedly   -> wrong candidate: the server could not decrypt our HELLO
 *   nothing before the timeout                  -> nobody answered (not up yet, or filtered)
 *
 * A server without CURVE also often shows EPIPE first (measured: 49 of 60 first attempts against
 * a plain ROUTER, and 9 of 60 showed EPIPE three times in a row before MECHANISM_MISMATCH), so a
 * candidate counts as wrong only after AMBIGUOUS_FAILURES_FOR_WRONG_KEY EPIPEs, and any
 * candidate seeing the mismatch makes the lookup "no_curve"; with two or more listed keys a
 * plain peer is still reported as not_listed in ~2% of lookups (a diagnostic difference only:
 * both mean "do not connect").
 *
 * Only keys from our own allow list are ever tried, so a replica we do not list can never become
 * a server we subscribe to or send control requests to, whatever it claims. All candidates are
 * tried at once (a p-queue bounded by MAX_PARALLEL_KEY_PROBES) so a lookup costs about one round trip;
 * the server counts each wrong candidate as a `wrong_server_key` handshake failure.
 *
 * Found keys are cached per endpoint. A cached key goes stale when the peer restarts with another
 * key pair; users of a key report handshake failures (`forget`) and the next lookup probes again.
 * Negative outcomes are cached briefly (NEGATIVE_KEY_CACHE_MS) so a burst of requests to a peer
 * that refuses us costs one round of probes, not one per request.
 */
import PQueue from "p-queue";
import type { Logger } from "pino";
import { Dealer, Subscriber, type Context, type Event, type Socket } from "zeromq";

import { systemClock, type Clock } from "../src/core/index.js";
import type { MeshKeyPair } from "./curve.js";
import { isIpv6Endpoint } from "./endpoints.js";
import { observe, retireObserver, type IteratedObserver } from "../src/util/zmq-observers.js";

/** One handshake takes ~2 ms on loopback and one RTT plus crypto across a WAN; 1 s leaves room. */
export const DEFAULT_KEY_PROBE_TIMEOUT_MS = 1_000;
/** Sockets opened at once while probing one endpoint (each is one TCP connection to the peer). */
export const MAX_PARALLEL_KEY_PROBES = 32;
/** How long a failed lookup is reused before probing again, ms. */
export const NEGATIVE_KEY_CACHE_MS = 1_000;
/** Libzmq's retry spacing inside one probe, ms: a peer that comes up mid-probe is still found. */
const PROBE_RECONNECT_INTERVAL_MS = 50;
/** EPIPE-like handshake failures before a candidate is taken as the wrong key (see above). */
export const AMBIGUOUS_FAILURES_FOR_WRONG_KEY = 3;

/**
 * - found: `key` is the server's public key and the server admits us.
 * - rejected: `key` is the server's key, but its allow list does not hold our public key.
 * - not_listed: the server speaks CURVE, but none of our allowed keys is its key.
 * - no_curve: the server runs without CURVE (a plain replica).
 * - unreachable: no handshake completed or failed within the probe timeout.
 */
export type KeyLookupOutcome = "found" | "rejected" | "not_listed" | "no_curve" | "unreachable";
export const KEY_LOOKUP_OUTCOMES: readonly KeyLookupOutcome[] = ["found", "rejected", "not_listed", "no_curve", "unreachable"];

export type KeyLookup = { readonly outcome: "found" | "rejected"; readonly key: string } | { readonly outcome: "not_listed" | "no_curve" | "unreachable" };

/** The socket type to probe with: it must be one the server's socket type accepts. */
export type ProbeSocketKind = "sub" | "dealer";

type CandidateResult = "ok" | "auth" | "mechanism" | "wrong" | "timeout";

export interface ProbeOptions {
  readonly context: Context;
  readonly keyPair: MeshKeyPair;
  readonly candidates: readonly string[];
  readonly socket: ProbeSocketKind;
  readonly timeoutMs?: number;
  /** Aborting closes every probe socket (transport shutdown). */
  readonly signal?: AbortSignal;
}

/** Tries one candidate server key against `endpoint`; settles on the first decisive event. */
async function probeOne(endpoint: string, candidate: string, o: ProbeOptions): Promise<CandidateResult> {
  const options = {
    context: o.context,
    linger: 0,
    ipv6: isIpv6Endpoint(endpoint),
    reconnectInterval: PROBE_RECONNECT_INTERVAL_MS,
    curveServerKey: candidate,
    curvePublicKey: o.keyPair.publicKey,
    curveSecretKey: o.keyPair.secretKey,
  };
  const socket: Socket = o.socket === "sub" ? new Subscriber(options) : new Dealer(options);
  let events: IteratedObserver;
  try {
    events = observe(socket);
  } catch {
    socket.close();
    return "timeout";
  }
  let ambiguous = 0;
  const close = (): void => {
    if (!socket.closed) socket.close();
    retireObserver(events);
  };
  const timer = setTimeout(close, o.timeoutMs ?? DEFAULT_KEY_PROBE_TIMEOUT_MS);
  o.signal?.addEventListener("abort", close, { once: true });
  try {
    socket.connect(endpoint);
    for await (const e of events) {
      // A receive pending when the observer is closed resolves with undefined or rejects (ENOTSOCK).
      const event = e as Event | undefined;
      if (event === undefined) break;
      if (event.type === "handshake") return "ok";
      if (event.type === "handshake:error:auth") return "auth";
      if (event.type === "handshake:error:protocol" && event.error.code === "ERR_ZMTP_MECHANISM_MISMATCH") return "mechanism";
      if (event.type === "handshake:error:protocol" || event.type === "handshake:error:other") {
        if (++ambiguous >= AMBIGUOUS_FAILURES_FOR_WRONG_KEY) return "wrong";
      }
    }
    return ambiguous > 0 ? "wrong" : "timeout";
  } catch {
    return ambiguous > 0 ? "wrong" : "timeout";
  } finally {
    clearTimeout(timer);
    o.signal?.removeEventListener("abort", close);
    close();
  }
}

/**
 * Probes every candidate (MAX_PARALLEL_KEY_PROBES at a time) and combines the outcomes. The
 * first candidate the server recognises (handshake or ZAP refusal) ends the others at once.
 */
export async function probeServerKey(endpoint: string, o: ProbeOptions): Promise<KeyLookup> {
  const results: { key: string; r: CandidateResult }[] = [];
  const done = new AbortController();
  const stopAll = (): void => {
    done.abort();
  };
  o.signal?.addEventListener("abort", stopAll, { once: true });
  const each: ProbeOptions = { ...o, signal: done.signal };
  const probes = new PQueue({ concurrency: MAX_PARALLEL_KEY_PROBES });
  try {
    // Candidates still queued when one is decisive (or the transport closes) are not probed:
    // the lookup's outcome is known, nothing is lost.
    await Promise.all(
      o.candidates.map((key) =>
        probes.add(async () => {
          if (done.signal.aborted) return;
          const r = await probeOne(endpoint, key, each);
          results.push({ key, r });
          if (r === "ok" || r === "auth") stopAll();
        }),
      ),
    );
  } finally {
    o.signal?.removeEventListener("abort", stopAll);
  }
  const ok = results.find((x) => x.r === "ok");
  if (ok !== undefined) return { outcome: "found", key: ok.key };
  const auth = results.find((x) => x.r === "auth");
  if (auth !== undefined) return { outcome: "rejected", key: auth.key };
  if (results.some((x) => x.r === "mechanism")) return { outcome: "no_curve" };
  if (results.length > 0 && results.every((x) => x.r === "wrong")) return { outcome: "not_listed" };
  return { outcome: "unreachable" };
}

export interface KeyDirectoryOptions {
  readonly context: Context;
  readonly keyPair: MeshKeyPair;
  /** Z85 public keys we accept; the only keys ever tried as a server key. */
  readonly allow: readonly string[];
  readonly logger: Logger;
  readonly probeTimeoutMs?: number;
  readonly clock?: Clock;
}

export interface KeyDirectoryStats {
  /** Lookups that ran probes, by outcome. */
  lookups: Record<KeyLookupOutcome, number>;
  /** Cached keys dropped after handshake failures (a peer that changed keys). */
  forgotten: number;
}

/** endpoint -> server public key, learned by probing; see the module comment. */
export class ServerKeyDirectory {
  readonly #o: KeyDirectoryOptions;
  readonly #clock: Clock;
  readonly #keys = new Map<string, string>();
  readonly #negative = new Map<string, { lookup: KeyLookup; atMs: number }>();
  readonly #inflight = new Map<string, Promise<KeyLookup>>();
  /** Last outcome logged per endpoint: a lookup is logged when its outcome changes, not on every retry. */
  readonly #lastLogged = new Map<string, KeyLookupOutcome>();
  readonly #abort = new AbortController();
  readonly #stats: KeyDirectoryStats = { lookups: { found: 0, rejected: 0, not_listed: 0, no_curve: 0, unreachable: 0 }, forgotten: 0 };

  constructor(o: KeyDirectoryOptions) {
    this.#o = o;
    this.#clock = o.clock ?? systemClock;
  }

  get stats(): KeyDirectoryStats {
    return { lookups: { ...this.#stats.lookups }, forgotten: this.#stats.forgotten };
  }

  /** The cached key of `endpoint`, if one was found. */
  cached(endpoint: string): string | undefined {
    return this.#keys.get(endpoint);
  }

  /**
   * The server key of `endpoint`: cached, or probed (concurrent lookups of one endpoint share
   * one probe). `socket` must suit the server: "sub" for a PUB, "dealer" for a ROUTER.
   */
  lookup(endpoint: string, socket: ProbeSocketKind): Promise<KeyLookup> {
    const key = this.#keys.get(endpoint);
    if (key !== undefined) return Promise.resolve({ outcome: "found", key });
    const neg = this.#negative.get(endpoint);
    if (neg !== undefined && this.#clock.now() - neg.atMs < NEGATIVE_KEY_CACHE_MS) return Promise.resolve(neg.lookup);
    let p = this.#inflight.get(endpoint);
    if (p === undefined) {
      p = this.#probe(endpoint, socket).finally(() => this.#inflight.delete(endpoint));
      this.#inflight.set(endpoint, p);
    }
    return p;
  }

  async #probe(endpoint: string, socket: ProbeSocketKind): Promise<KeyLookup> {
    const r = await probeServerKey(endpoint, {
      context: this.#o.context,
      keyPair: this.#o.keyPair,
      candidates: this.#o.allow,
      socket,
      ...(this.#o.probeTimeoutMs === undefined ? {} : { timeoutMs: this.#o.probeTimeoutMs }),
      signal: this.#abort.signal,
    });
    if (this.#abort.signal.aborted) return { outcome: "unreachable" };
    this.#stats.lookups[r.outcome]++;
    if (r.outcome === "found") {
      this.#keys.set(endpoint, r.key);
      this.#negative.delete(endpoint);
    } else {
      this.#negative.set(endpoint, { lookup: r, atMs: this.#clock.now() });
    }
    this.#logOutcome(endpoint, r);
    return r;
  }

  #logOutcome(endpoint: string, r: KeyLookup): void {
    if (this.#lastLogged.get(endpoint) === r.outcome) return;
    this.#lastLogged.set(endpoint, r.outcome);
    const log = this.#o.logger;
    switch (r.outcome) {
      case "found":
        log.info({ peer: endpoint, peer_key: r.key }, "mesh peer's CURVE key found");
        break;
      case "rejected":
        log.warn({ peer: endpoint, peer_key: r.key, our_key: this.#o.keyPair.publicKey }, "mesh peer refuses our CURVE key: add our .pub to its --mesh-allow");
        break;
      case "not_listed":
        log.warn({ peer: endpoint }, "mesh peer's CURVE key is not in --mesh-allow: not connecting to it");
        break;
      case "no_curve":
        log.warn({ peer: endpoint }, "mesh peer runs without CURVE (no --mesh-key): not connecting to it");
        break;
      case "unreachable":
        log.debug({ peer: endpoint }, "mesh peer did not answer a CURVE handshake (retried)");
        break;
    }
  }

  /**
   * Drops `endpoint`'s cached key after a handshake with it failed; with `key`, only if that is
   * still the cached one (a late report about an older key must not drop a newer one).
   */
  forget(endpoint: string, key?: string): boolean {
    const cached = this.#keys.get(endpoint);
    if (cached === undefined || (key !== undefined && cached !== key)) return false;
    this.#keys.delete(endpoint);
    this.#lastLogged.delete(endpoint);
    this.#stats.forgotten++;
    this.#o.logger.info({ peer: endpoint, peer_key: cached }, "mesh peer's CURVE key no longer works: looking it up again");
    return true;
  }

  /** Stops probes in flight (their lookups resolve "unreachable"). */
  close(): void {
    this.#abort.abort();
  }
}
