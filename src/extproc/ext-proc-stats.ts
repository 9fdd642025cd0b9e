/**
 * The endpoint picker's counters, plain numbers bumped on the stream path and read at scrape
 * time (src/metrics/extproc-metrics.ts), as the core's are.
 */

/** Why an ImmediateResponse was sent (the metric's `reason` label; a bounded set). */
export const REJECT_REASONS = ["bad_body", "body_too_large", "no_endpoint", "subset_empty", "overloaded", "tokenize_failed", "unsupported_mode", "session_conflict", "internal"] as const;
export type RejectReason = (typeof REJECT_REASONS)[number];

/** How a stream's booking ended (the `how` label). */
export const BOOKING_ENDS = ["end_of_stream", "cancelled", "error", "server_closed"] as const;
export type BookingEnd = (typeof BOOKING_ENDS)[number];

export class ExtProcStats {
  streams = 0;
  activeStreams = 0;
  /** Requests routed with a prompt (booked), and without one (no body to route: any ready worker). */
  picks = 0;
  picksWithoutPrompt = 0;
  /** Picks made after tokenization failed, by session and load alone. */
  tokenizeFailures = 0;
  /** Bookings moved to the endpoint the gateway served on; served endpoints kvmesh could not map to a worker. */
  moves = 0;
  servedUnknown = 0;
  /** Picks whose worker endpoint did not resolve to an address (re-picked elsewhere). */
  unresolvedEndpoints = 0;
  /** Lifecycle calls that failed (the booking was gone already: expiry, worker removed). */
  lifecycleErrors = 0;
  readonly rejected = new Map<string, number>();
  readonly bookingEnds = new Map<BookingEnd, number>();
  /** Hears each routed pick's duration, ms: from the message that ends the request to its answer (a histogram's observe, when metrics are on). */
  onPick: ((ms: number) => void) | undefined;

  observePick(ms: number): void {
    this.onPick?.(ms);
  }

  reject(reason: RejectReason, status: number): void {
    const key = `${reason}\u0000${status}`;
    this.rejected.set(key, (this.rejected.get(key) ?? 0) + 1);
  }

  bookingEnded(how: BookingEnd): void {
    this.bookingEnds.set(how, (this.bookingEnds.get(how) ?? 0) + 1);
  }
}
