/**
 * kvmesh_active_blocks_fallbacks_total's source: a booking whose client-supplied sequence hashes
 * repeat one breaks the active blocks' prefix tree (active-prefix-trie.ts), and the service's
 * sizes() count it; chained prompts never do, and the count survives its partition's removal.
 */
import { describe, expect, it } from "vitest";

import { createMetricsRegistry } from "../../../src/metrics/registry.js";
import { registerServiceMetrics } from "../../../src/metrics/service-metrics.js";
import { makeService, worker } from "../../helpers/core-fixtures.js";

describe("active blocks' prefix-tree fallbacks", () => {
  it("counts a booking whose sequence hashes repeat one, not chained prompts, and exports the count", async () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const registry = createMetricsRegistry();
    registerServiceMetrics(registry, svc);
    // Token ids: chained sequence hashes, the tree's own case.
    svc.selectAndReserve({ token_ids: Array.from({ length: 64 }, (_, i) => i), request_id: "chained" } as never);
    svc.selectAndReserve({ token_ids: Array.from({ length: 80 }, (_, i) => i), request_id: "chained-2" } as never);
    expect(svc.sizes().activeBlockFallbacks).toBe(0);
    // A client's own hashes, one repeated: the tree cannot hold it.
    const repeated = [7n, 8n, 7n];
    svc.selectAndReserve({ block_hashes: repeated, sequence_hashes: repeated, isl_tokens: 48, request_id: "repeated" } as never);
    expect(svc.sizes().activeBlockFallbacks).toBe(1);
    expect(await registry.metrics()).toMatch(/^kvmesh_active_blocks_fallbacks_total 1$/m);
    // A counter: the partition leaves with its last worker, the count stays.
    svc.deleteWorker(1n);
    expect(svc.sizes().partitions).toBe(0);
    expect(svc.sizes().activeBlockFallbacks).toBe(1);
  });
});
