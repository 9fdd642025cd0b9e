import { afterEach, describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/index.js";
import type { KvEventBatch } from "../../../src/ingest/kv-event-decoder.js";
import { KvIngest } from "../../../src/ingest/kv-ingest.js";
import { MockEngineFleet, descriptorsToWorkerRequests, fleetFdEstimate, openFilesLimit } from "../../../src/mock/engine-fleet.js";
import { promptTokensFor } from "../../../src/mock/token-blocks.js";
import { SelectionService } from "../../../src/core/index.js";
import { waitFor } from "../../helpers/wait.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** Fast engines: 0.001 trace ms per prompt token and 1 ms per decode step, 100x speedup. */
const FAST = { blockSize: 16, kvBlocks: 512, prefillMsPerToken: 0.001, decodeMsPerToken: 1, speedup: 100 } as const;

async function startFleet(engines: number, ranksPerWorker = 1): Promise<MockEngineFleet> {
  const fleet = await MockEngineFleet.start({ engines, ranksPerWorker, firstWorkerId: 10n, ...FAST });
  cleanups.push(() => fleet.close());
  return fleet;
}

describe("MockEngineFleet", () => {
  it("binds one XPUB and one ROUTER per rank and describes each rank for registration", async () => {
    const fleet = await startFleet(4, 2);
    expect(fleet.descriptors.map((d) => [d.workerId, d.dpRank])).toEqual([
      [10n, 0],
      [10n, 1],
      [11n, 0],
      [11n, 1],
    ]);
    const endpoints = fleet.descriptors.flatMap((d) => [d.kvEndpoint, d.replayEndpoint]);
    for (const e of endpoints) expect(e).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    expect(new Set(endpoints).size).toBe(8);

    const requests = descriptorsToWorkerRequests(fleet.descriptors, { modelName: "m", blockSize: 16, totalKvBlocks: 512 });
    expect(requests).toHaveLength(2);
    expect(requests[0]).toEqual({
      worker_id: 10n,
      model_name: "m",
      endpoint: "mock://worker-10",
      block_size: 16,
      data_parallel_start_rank: 0,
      data_parallel_size: 2,
      total_kv_blocks: 512,
      kv_events_endpoints: { "0": fleet.descriptors[0]?.kvEndpoint, "1": fleet.descriptors[1]?.kvEndpoint },
    });
    // The daemon's catalog takes them as schedulable workers.
    const svc = new SelectionService({ requireKvEventsEndpoint: true });
    for (const r of requests) expect(svc.upsertWorker(r)).toMatchObject({ lifecycle: "schedulable", not_schedulable_reasons: [] });
  });

  it("registers a single-rank worker with its replay endpoint", async () => {
    const fleet = await startFleet(1);
    const [req] = descriptorsToWorkerRequests(fleet.descriptors);
    expect(req).toMatchObject({ worker_id: 10n, model_name: "default", block_size: 16, data_parallel_size: 1, kv_events_endpoint: fleet.descriptors[0]?.kvEndpoint, replay_endpoint: fleet.descriptors[0]?.replayEndpoint });
    expect(req?.kv_events_endpoints).toBeUndefined();
    const svc = new SelectionService({ requireKvEventsEndpoint: true });
    expect(svc.upsertWorker(req ?? { worker_id: 0n }).lifecycle).toBe("schedulable");
    expect(() => descriptorsToWorkerRequests([{ workerId: 1n, dpRank: 0, kvEndpoint: "a", replayEndpoint: "b" }, { workerId: 1n, dpRank: 2, kvEndpoint: "c", replayEndpoint: "d" }])).toThrow(/contiguous/);
  });

  it("serves requests on the chosen rank and publishes that rank's KV events in vLLM's format", async () => {
    const fleet = await startFleet(2, 2);
    const batches: { rank: number; batch: KvEventBatch }[] = [];
    const ingest = new KvIngest({
      onBatch: (ref, batch) => batches.push({ rank: ref.rank, batch }),
      onReset: () => undefined,
    });
    cleanups.push(() => ingest.close());
    await ingest.upsert("10", fleet.descriptors.map((d) => ({ rank: d.dpRank, endpoint: d.kvEndpoint })));
    await fleet.waitForSubscribers(1);
    const tokens = promptTokensFor([1, 2], 1_000);
    const first = await fleet.submit(1, { requestId: "a", tokens, outputTokens: 4 });
    expect(first).toMatchObject({ requestId: "a", promptTokens: 1_000, cachedTokens: 0, outputTokens: 4 });
    const again = await fleet.submit(1, { requestId: "b", tokens, outputTokens: 1 });
    // 62 full blocks cached by the first request; the 1,000th token is in a partial block.
    expect(again.cachedTokens).toBe(62 * 16);
    expect(again.prefillMs).toBeLessThan(first.prefillMs);
    const other = await fleet.submit(0, { requestId: "c", tokens, outputTokens: 1 });
    expect(other.cachedTokens).toBe(0);

    const published = (): number => fleet.stats().totals.batchesPublished;
    await waitFor(() => batches.length === published(), 5_000, () => `${batches.length}/${published()} batches`);
    for (const { rank, batch } of batches) expect(batch.dpRank).toBe(rank);
    const storedOn = (rank: number): (KvEventBatch["events"][number] & { type: "stored" })[] =>
      batches.filter((b) => b.rank === rank).flatMap((b) => b.batch.events.filter((e) => e.type === "stored"));
    // Each rank stored the prompt's 62 full blocks once, as one chain with their token ids.
    for (const rank of [0, 1]) {
      const stored = storedOn(rank);
      expect(stored.flatMap((e) => e.blockHashes)).toHaveLength(62);
      expect(stored.flatMap((e) => e.tokenIds)).toEqual([...tokens.subarray(0, 62 * 16)]);
      for (const e of stored) expect(e).toMatchObject({ blockSize: 16, tier: "device" });
    }
    expect(storedOn(0).flatMap((e) => e.blockHashes)).toEqual(storedOn(1).flatMap((e) => e.blockHashes));
    const stats = fleet.stats();
    expect(stats.engines).toHaveLength(2);
    expect(stats.totals).toMatchObject({ requests: 3, promptTokens: 3_000, cachedTokens: 62 * 16, kvCapacityBlocks: 1_024 });
    expect(stats.totals.hitRatio).toBeCloseTo(992 / 3_000, 10);
    expect(stats.engines[1]?.requests).toBe(2);
  });

  it("rejects unfinished requests on close, and bad indexes", async () => {
    const fleet = await MockEngineFleet.start({ engines: 1, ...FAST, speedup: 1, decodeMsPerToken: 1_000 });
    await expect(fleet.submit(1, { requestId: "x", tokens: promptTokensFor([1], 16), outputTokens: 1 })).rejects.toThrow(RangeError);
    const slow = fleet.submit(0, { requestId: "slow", tokens: promptTokensFor([1], 16), outputTokens: 100 });
    await fleet.close();
    const err: unknown = await slow.catch((e: unknown) => e);
    expect((err as KvmeshError).code).toBe("KVMESH_SHUTTING_DOWN");
    await expect(fleet.submit(0, { requestId: "y", tokens: promptTokensFor([1], 16), outputTokens: 1 })).rejects.toThrow(/closed/);
    await fleet.close();
  });

  it("checks the file-descriptor budget before binding anything", async () => {
    const limit = openFilesLimit();
    expect(limit === null || limit > 0).toBe(true);
    expect(fleetFdEstimate(256, 4)).toBe(256 * 8 + 128);
    if (limit !== null && Number.isFinite(limit)) {
      const tooMany = Math.ceil(limit / 8) + 1;
      await expect(MockEngineFleet.start({ engines: tooMany, expectedSubscribers: 4 })).rejects.toThrow(/file descriptors/);
    }
    await expect(MockEngineFleet.start({ engines: 3, ranksPerWorker: 2 })).rejects.toThrow(/ranksPerWorker/);
  });
});
