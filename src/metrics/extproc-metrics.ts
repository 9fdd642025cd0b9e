/** The endpoint picker's series (src/extproc/), read at scrape time from its plain counters. */
import { Histogram, type Registry } from "prom-client";

import { BOOKING_ENDS, type ExtProcStats } from "../extproc/ext-proc-stats.js";
import { collectedCounter, collectedGauge, collectedLabelledCounter, type LabelledSample } from "./collected.js";

const COUNTERS: readonly (readonly [name: string, help: string, key: "streams" | "picks" | "picksWithoutPrompt" | "tokenizeFailures" | "moves" | "servedUnknown" | "unresolvedEndpoints" | "lifecycleErrors"])[] = [
  ["kvmesh_extproc_streams_total", "ext_proc streams (one per HTTP request through the gateway).", "streams"],
  ["kvmesh_extproc_picks_total", "Requests routed with a prompt (a booking made).", "picks"],
  ["kvmesh_extproc_picks_without_prompt_total", "Requests without a body to route (GET /v1/models, other paths): sent to any ready worker, not booked.", "picksWithoutPrompt"],
  ["kvmesh_extproc_tokenize_failures_total", "Tokenizations that failed: routed by session and load alone, or 503 with --tokenizer-failure reject.", "tokenizeFailures"],
  ["kvmesh_extproc_booking_moves_total", "Bookings moved to the endpoint the gateway reported as served (differing from the pick).", "moves"],
  ["kvmesh_extproc_served_unknown_total", "Served endpoints reported by the gateway that match no worker rank (the booking stays on the pick).", "servedUnknown"],
  ["kvmesh_extproc_unresolved_endpoints_total", "Picks whose worker endpoint did not resolve to an address (the request was re-picked without that worker).", "unresolvedEndpoints"],
  ["kvmesh_extproc_lifecycle_errors_total", "prefill_complete, free or move calls from a stream that found the booking gone (expired, worker removed).", "lifecycleErrors"],
];

/**
 * Pick duration buckets, seconds: 250 us (a token-id body of a few KB) .. 5 s (an engine
 * tokenizer's call near its 2 s timeout, retried once).
 */
export const EXT_PROC_PICK_BUCKETS_SECONDS = [0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5] as const;

export function registerExtProcMetrics(registry: Registry, stats: ExtProcStats): void {
  const picks = new Histogram({
    name: "kvmesh_extproc_pick_duration_seconds",
    help: "Routed picks: from the message that ends the request (its body's end) to the picker's answer, tokenization included.",
    buckets: [...EXT_PROC_PICK_BUCKETS_SECONDS],
    registers: [registry],
  });
  stats.onPick = (ms) => {
    picks.observe(ms / 1_000);
  };
  for (const [name, help, key] of COUNTERS) collectedCounter(registry, { name, help }, () => stats[key]);
  collectedGauge(registry, { name: "kvmesh_extproc_active_streams", help: "ext_proc streams open now." }, () => stats.activeStreams);
  collectedLabelledCounter(registry, { name: "kvmesh_extproc_rejected_total", help: "Requests answered with an ImmediateResponse, by reason and HTTP status." }, ["reason", "status"] as const, () => {
    const out: LabelledSample<"reason" | "status">[] = [];
    for (const [key, n] of stats.rejected) {
      const [reason = "", status = ""] = key.split("\u0000");
      out.push([{ reason, status }, n]);
    }
    return out;
  });
  collectedLabelledCounter(registry, { name: "kvmesh_extproc_bookings_freed_total", help: "Stream bookings freed, by how the stream ended (end_of_stream, cancelled, error, server_closed)." }, ["how"] as const, () =>
    BOOKING_ENDS.map((how): LabelledSample<"how"> => [{ how }, stats.bookingEnds.get(how) ?? 0]),
  );
}
