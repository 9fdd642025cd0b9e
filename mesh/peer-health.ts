/**
 * Peer liveness from application traffic (heartbeats and batches), not from socket events: a
 * SUB reconnects to a frozen peer's listening socket and reports `connect` while the peer is
 * stopped (zeromq 6.8: a SIGSTOPped peer still accepts the TCP connect), and ZMTP heartbeats
 * only prove its I/O thread runs. Clock driven
 * by the caller (nats.js Heartbeat style), so tests use plain numbers.
 *
 * A peer goes suspect after 3 s without traffic (six missed heartbeats at the default 500 ms,
 * DEFAULT_MESH_HEARTBEAT_INTERVAL_MS) and down after 10 s; any message brings it back to alive.
 * What is mirrored of a down peer is dropped then
 * (MeshInbound#originDown says why).
 */
import { xxh3 } from "@node-rs/xxhash";

import { MeshOptionError } from "./errors.js";

export const DEFAULT_SUSPECT_AFTER_MS = 3_000;
export const DEFAULT_DOWN_AFTER_MS = 10_000;

export type PeerState = "alive" | "suspect" | "down";

export interface PeerTransition<K = bigint> {
  readonly origin: K;
  /** null: the peer was not tracked before (first heard). */
  readonly from: PeerState | null;
  readonly to: PeerState;
}

export interface PeerHealthOptions {
  readonly suspectAfterMs?: number;
  readonly downAfterMs?: number;
}

interface Peer {
  state: PeerState;
  lastSeenMs: number;
}

/** Keyed by origin id by default; any key works (e.g. an endpoint before its id is known). */
export class PeerHealth<K = bigint> {
  readonly suspectAfterMs: number;
  readonly downAfterMs: number;
  readonly #peers = new Map<K, Peer>();

  constructor(options: PeerHealthOptions = {}) {
    this.suspectAfterMs = options.suspectAfterMs ?? DEFAULT_SUSPECT_AFTER_MS;
    this.downAfterMs = options.downAfterMs ?? DEFAULT_DOWN_AFTER_MS;
    if (!(this.suspectAfterMs > 0)) throw new MeshOptionError("suspectAfterMs", `must be positive, got ${this.suspectAfterMs}`);
    if (!(this.downAfterMs > this.suspectAfterMs)) {
      throw new MeshOptionError("downAfterMs", `${this.downAfterMs} must exceed suspectAfterMs (${this.suspectAfterMs})`);
    }
  }

  /** A heartbeat or batch from `origin` at `nowMs`; returns the transition it caused, if any. */
  observe(origin: K, nowMs: number): PeerTransition<K> | null {
    const p = this.#peers.get(origin);
    if (p === undefined) {
      this.#peers.set(origin, { state: "alive", lastSeenMs: nowMs });
      return { origin, from: null, to: "alive" };
    }
    // Messages may be handled slightly out of clock order; never move lastSeen backwards.
    if (nowMs > p.lastSeenMs) p.lastSeenMs = nowMs;
    if (p.state === "alive") return null;
    const from = p.state;
    p.state = "alive";
    return { origin, from, to: "alive" };
  }

  /** Moves silent peers to suspect or down; call it on a timer (e.g. every 500 ms). */
  tick(nowMs: number): PeerTransition<K>[] {
    const out: PeerTransition<K>[] = [];
    for (const [origin, p] of this.#peers) {
      const silentMs = nowMs - p.lastSeenMs;
      const to: PeerState = silentMs >= this.downAfterMs ? "down" : silentMs >= this.suspectAfterMs ? "suspect" : "alive";
      // Only observe() revives a peer; a tick only ever makes a state worse.
      if (to === p.state || to === "alive" || (p.state === "down" && to === "suspect")) continue;
      out.push({ origin, from: p.state, to });
      p.state = to;
    }
    return out;
  }

  state(origin: K): PeerState | undefined {
    return this.#peers.get(origin)?.state;
  }

  states(): Map<K, PeerState> {
    const out = new Map<K, PeerState>();
    for (const [origin, p] of this.#peers) out.set(origin, p.state);
    return out;
  }

  lastSeenMs(origin: K): number | undefined {
    return this.#peers.get(origin)?.lastSeenMs;
  }

  counts(): Record<PeerState, number> {
    const c: Record<PeerState, number> = { alive: 0, suspect: 0, down: 0 };
    for (const p of this.#peers.values()) c[p.state]++;
    return c;
  }

  /** Stop tracking (deregistered); true if it was tracked. */
  remove(origin: K): boolean {
    return this.#peers.delete(origin);
  }
}

const U64_MASK = (1n << 64n) - 1n;
// Distinct seeds keep a booking id from colliding with a binding whose text happens to match.
const BOOKING_SEED = 0x6b766d6573682d62n; // "kvmesh-b"
const BINDING_SEED = 0x6b766d6573682d73n; // "kvmesh-s"

export interface DigestBinding {
  readonly sessionId: string;
  readonly sequence: bigint;
  readonly writerId: bigint;
}

/** One booking's term of the digest sum (for a running digest: add on book, subtract on free). */
export const bookingDigestTerm = (bookingId: string): bigint => xxh3.xxh64(bookingId, BOOKING_SEED);

// NUL separators: the two decimal numbers contain none, so the split is unambiguous.
/** One binding version's term of the digest sum. */
export const bindingDigestTerm = (b: DigestBinding): bigint => xxh3.xxh64(`${b.sessionId}\u0000${b.sequence}\u0000${b.writerId}`, BINDING_SEED);

/** A digest sum (any bigint: it is reduced mod 2^64, so a running sum may go negative) as 16 hex digits. */
export const formatDigest = (sum: bigint): string => (sum & U64_MASK).toString(16).padStart(16, "0");

/**
 * Order-independent digest of what an origin owns: the sum mod 2^64 of one XXH3-64 per booking
 * id and per binding version, as 16 hex digits. Two replicas mirroring the same state compute
 * the same digest whatever order they learned it in. A sum rather than XOR, so a duplicated
 * item changes the digest instead of cancelling out, and so a running digest can subtract.
 * ~0.9 us per item here (100k bookings: ~90 ms): for large tables keep a running sum of the
 * terms instead of recomputing per heartbeat.
 */
export function stateDigest(bookingIds: Iterable<string>, bindings: Iterable<DigestBinding>): string {
  let sum = 0n;
  for (const id of bookingIds) sum += bookingDigestTerm(id);
  for (const b of bindings) sum += bindingDigestTerm(b);
  return formatDigest(sum);
}
