/**
 * The scale-out model of `npm run bench:scale`: N replicas, each routing 1/N of the traffic and
 * mirroring what the other N - 1 route. If routing one request costs a replica's main thread
 * `origin` and mirroring one costs `peer`, N replicas fit N / (1 + (N - 1) x peer / origin) times
 * one replica's traffic into the same main-thread time each (the main thread is what saturates:
 * one event loop per replica). At ratio 0 capacity is N (linear); at ratio 1 it stays 1.
 *
 * A replica's main thread also spends a fixed time per second whatever the traffic (V8 GC, the
 * loop's own work, timers, heartbeats): measured over an idle window as ms of CPU per second.
 * Per-request figures divided from a window hold that fixed part too, so at low rates they
 * overstate what one more request costs. The marginal cost per request takes it out:
 * (CPU over the window - idle rate x window) / requests. For replicas at saturation, each with
 * the same fixed rate f, 1 core = f + r x origin + (N - 1) x r x peer with marginal costs, and one
 * replica alone saturates at r1 = (1 core - f) / origin: f cancels, and N r / r1 is the same
 * N / (1 + (N - 1) x ratio) with ratio = peer marginal / origin marginal.
 */
import type { ThreadCpu } from "./thread-cpu.js";

export interface ReplicaCpu {
  /** Main thread (event loop) CPU per routed request, us. */
  readonly mainUs: number;
  /** All threads' CPU per routed request, us. */
  readonly allUs: number;
  /** Over the window: main-thread cores busy (ms of CPU per ms of wall). */
  readonly mainCores: number;
  /** Live threads' CPU over the window by thread name, ms. */
  readonly byThreadMs: Readonly<Record<string, number>>;
  /** The replica's idle rates, measured before the traffic (absent with --idle-seconds 0 and in older reports). */
  readonly idle?: IdleCpu;
  /** Per request beyond the idle rates: (CPU - idle rate x window) / requests (absent with idle). */
  readonly marginal?: MarginalCpu;
}

/** CPU of a replica over a window with no traffic, per second of wall. */
export interface IdleCpu {
  readonly windowMs: number;
  readonly mainMsPerS: number;
  readonly allMsPerS: number;
}

/** us per request beyond the idle rate, clamped at 0 (the flag says it was). */
export interface MarginalCpu {
  readonly mainUs: number;
  readonly allUs: number;
  readonly mainClamped: boolean;
  readonly allClamped: boolean;
}

/** Replica counts the model is printed and plotted for. */
export const MODEL_REPLICA_COUNTS: readonly number[] = Object.freeze([2, 4, 8, 16]);

/** Capacity of `n` replicas in units of one replica's, at mirror-to-route cost `ratio` (>= 0). */
export function modelledCapacity(n: number, ratio: number): number {
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`replica count must be a positive integer, got ${n}`);
  if (!(ratio >= 0) || !Number.isFinite(ratio)) throw new RangeError(`ratio must be a finite number >= 0, got ${ratio}`);
  return n / (1 + (n - 1) * ratio);
}

/** Peer main-thread time per replicated request over origin main-thread time per routed request. */
export function mirrorRatio(peerMainUs: number, originMainUs: number): number {
  if (!(originMainUs > 0)) return Number.NaN;
  return peerMainUs / originMainUs;
}

/** [n, capacity] for n = 1 and each of `counts`: the curve the SVG draws (NaN ratio: none). */
export function capacityCurve(ratio: number, counts: readonly number[] = MODEL_REPLICA_COUNTS): [number, number][] {
  if (!Number.isFinite(ratio)) return [];
  return [1, ...counts].map((n) => [n, modelledCapacity(n, ratio)]);
}

/** Mean over peers of peer / origin main-thread us per request; null without peers or when undefined (origin 0). */
export function meanMirrorRatio(peerMainUs: readonly number[], originMainUs: number): number | null {
  if (peerMainUs.length === 0) return null;
  const r = peerMainUs.reduce((s, p) => s + mirrorRatio(p, originMainUs), 0) / peerMainUs.length;
  return Number.isFinite(r) ? r : null;
}

/** CPU of a replica over an idle window (no traffic) of `windowMs`, as ms of CPU per second of wall. */
export function idleCpu(delta: Pick<ThreadCpu, "mainMs" | "allMs">, windowMs: number): IdleCpu {
  if (!(windowMs > 0)) throw new RangeError(`idle window must be > 0 ms, got ${windowMs}`);
  return { windowMs, mainMsPerS: (delta.mainMs * 1000) / windowMs, allMsPerS: (delta.allMs * 1000) / windowMs };
}

/**
 * (CPU over the window - idle rate x window length) / requests, us per request: what the requests
 * cost beyond the fixed per-second part. Below 0 (the window's CPU under the idle rate: noise, or a
 * GC that fell in the idle window) it is clamped to 0 and `clamped` says so.
 */
export function marginalUs(windowCpuMs: number, windowMs: number, idleMsPerS: number, requests: number): { us: number; clamped: boolean } {
  const us = ((windowCpuMs - (idleMsPerS * windowMs) / 1000) * 1000) / Math.max(1, requests);
  if (Number.isNaN(us)) return { us, clamped: false };
  return us < 0 ? { us: 0, clamped: true } : { us, clamped: false };
}

/** Marginal main-thread and all-thread us per request of one replica over a window, given its idle rates. */
export function marginalCpu(delta: Pick<ThreadCpu, "mainMs" | "allMs">, requests: number, windowMs: number, idle: IdleCpu): MarginalCpu {
  const main = marginalUs(delta.mainMs, windowMs, idle.mainMsPerS, requests);
  const all = marginalUs(delta.allMs, windowMs, idle.allMsPerS, requests);
  return { mainUs: main.us, allUs: all.us, mainClamped: main.clamped, allClamped: all.clamped };
}

/** A replica's CPU per request over a window, with its idle rates and marginal costs when an idle window was measured. */
export function replicaCpu(delta: ThreadCpu, requests: number, windowMs: number, idle: IdleCpu | null): ReplicaCpu {
  const n = Math.max(1, requests);
  const base: ReplicaCpu = { mainUs: (delta.mainMs * 1000) / n, allUs: (delta.allMs * 1000) / n, mainCores: delta.mainMs / windowMs, byThreadMs: delta.byName };
  return idle === null ? base : { ...base, idle, marginal: marginalCpu(delta, requests, windowMs, idle) };
}
