/**
 * The scale-out model of `npm run bench:scale`: N replicas, each routing 1/N of the traffic and
 * mirroring what the other N - 1 route. If routing one request costs a replica's main thread
 * `origin` and mirroring one costs `peer`, N replicas fit N / (1 + (N - 1) x peer / origin) times
 * one replica's traffic into the same main-thread time each (the main thread is what saturates:
 * one event loop per replica). At ratio 0 capacity is N (linear); at ratio 1 it stays 1.
 */

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
