/**
 * Registers single-rank workers 1..n (block size 64, no KV-event endpoint) on a replica, as the
 * bench fleets run them with --no-kv-events: routable, with load and no cache awareness.
 */
import { BENCH_BLOCK_SIZE } from "./bench-prompts.js";
import { mapLimited } from "../../src/bench/bounded.js";
import type { RouterClient } from "../../src/bench/router-client.js";

/** Registration requests in flight per replica: enough to hide the round trip, not a burst. */
export const REGISTER_CONCURRENCY = 16;

export async function registerBenchWorkers(client: RouterClient, workers: number): Promise<void> {
  const ids = Array.from({ length: workers }, (_, i) => i + 1);
  await mapLimited(ids, REGISTER_CONCURRENCY, async (w) => {
    await client.ok("POST", "/workers", JSON.stringify({ worker_id: w, endpoint: `http://w${w}`, block_size: BENCH_BLOCK_SIZE }));
  });
}
