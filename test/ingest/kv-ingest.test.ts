import { afterEach, describe, expect, it } from "vitest";

import { KvIngest, type KvRankRef } from "../../src/ingest/kv-ingest.js";
import { MockKvPublisher } from "../helpers/kv-publisher.js";
import { waitFor } from "../helpers/wait.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function publisher(): Promise<MockKvPublisher> {
  const pub = await MockKvPublisher.create();
  cleanups.push(() => pub.close());
  return pub;
}

describe("KvIngest", () => {
  it("runs one listener per rank, keeps unchanged ones and replaces changed ones", async () => {
    const [p0, p1, p1b] = await Promise.all([publisher(), publisher(), publisher()]);
    const batches: string[] = [];
    const resets: KvRankRef[] = [];
    const ingest = new KvIngest({
      onBatch: (ref, batch, seq) => batches.push(`${ref.workerId}/${ref.rank}#${seq}:${batch.dpRank ?? "-"}`),
      onReset: (ref) => resets.push(ref),
    });
    cleanups.push(() => ingest.close());

    const rank0 = { rank: 0, endpoint: p0.endpoint, replayEndpoint: p0.replayEndpoint };
    const ranks = [rank0, { rank: 1, endpoint: p1.endpoint, replayEndpoint: p1.replayEndpoint }];
    await ingest.upsert("w1", ranks);
    await Promise.all([p0.waitForSubscribers(1), p1.waitForSubscribers(1)]);
    await p0.publish([{ type: "cleared" }], { dpRank: 0 });
    await p1.publish([{ type: "cleared" }], { dpRank: 1 });
    await waitFor(() => batches.length === 2);
    expect(batches.sort()).toEqual(["w1/0#0:0", "w1/1#0:1"]);

    // Same endpoints: listeners and cursors survive (seq 1 is applied live, no replay, no reset).
    await ingest.upsert("w1", ranks);
    await p0.publish([{ type: "cleared" }]);
    await waitFor(() => batches.length === 3);
    expect(p0.replayRequests).toEqual([]);
    expect(resets).toEqual([]);
    expect(p0.subscriptions).toBe(1);

    // Rank 1 moved: its old listener is closed, the caller is told to drop its blocks, a new one starts.
    await ingest.upsert("w1", [rank0, { rank: 1, endpoint: p1b.endpoint, replayEndpoint: p1b.replayEndpoint }]);
    expect(resets).toEqual([{ workerId: "w1", rank: 1 }]);
    await p1b.waitForSubscribers(1);
    await p1b.publish([{ type: "cleared" }]);
    await waitFor(() => batches.length === 4);
    expect(batches[3]).toBe("w1/1#0:-");
    expect(ingest.stats().map((s) => [s.workerId, s.rank, s.endpoint, s.stats.lastSeq])).toEqual([
      ["w1", 0, p0.endpoint, 1n],
      ["w1", 1, p1b.endpoint, 0n],
    ]);

    expect(await ingest.remove("w1")).toBe(true);
    expect(await ingest.remove("w1")).toBe(false);
    expect(ingest.stats()).toEqual([]);
  });

  it("rejects duplicate and invalid ranks", async () => {
    const ingest = new KvIngest({ onBatch: () => undefined, onReset: () => undefined });
    cleanups.push(() => ingest.close());
    await expect(ingest.upsert("w", [{ rank: 0, endpoint: "tcp://127.0.0.1:1" }, { rank: 0, endpoint: "tcp://127.0.0.1:2" }])).rejects.toThrow(/duplicate rank 0/);
    await expect(ingest.upsert("w", [{ rank: -1, endpoint: "tcp://127.0.0.1:1" }])).rejects.toThrow(/invalid rank -1/);
    expect(ingest.stats()).toEqual([]);
    await ingest.close();
    await expect(ingest.upsert("w", [])).rejects.toThrow(/closed/);
  });
});
