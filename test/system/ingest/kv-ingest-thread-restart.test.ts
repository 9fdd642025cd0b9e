/**
 * The KV ingest thread dying (#29): before, a thread that exited or threw was not restarted and
 * nothing said so (and one that threw with its sockets open aborted the whole process: zeromq's
 * teardown of a socket with a receive pending throws a Napi::Error no frame catches). Now it
 * closes its sockets, ends, is counted and started again, and its ranks resume from the index's
 * position: batches published while it was down are replayed from the engine.
 */
import { afterEach, describe, expect, it } from "vitest";

import { KvIngestWorker } from "../../../src/ingest/kv-ingest-worker.js";
import { MockKvPublisher, type MockKvEvent } from "../../helpers/kv-publisher.js";
import { waitFor } from "../../helpers/wait.js";

/** Liveness deadlines for a loaded machine (a thread starts through tsx), not speed targets. */
const WAIT_MS = 20_000;

const stored = (h: bigint): MockKvEvent[] => [{ type: "stored", blockHashes: [h], parentHash: null, tokenIds: Array.from({ length: 16 }, (_, i) => i), blockSize: 16 }];

let cleanup: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanup.reverse()) await c();
  cleanup = [];
});

describe("KvIngestWorker: a thread that dies", () => {
  it("is counted, started again, and resumes each rank from the index's position, replaying what it missed", async () => {
    const pub = await MockKvPublisher.create();
    cleanup.push(() => pub.close());
    const applied: { seq: bigint; replayed: boolean }[] = [];
    let resets = 0;
    const ingest = new KvIngestWorker({
      onBatch: (_ref, _batch, seq, replayed) => {
        applied.push({ seq, replayed });
      },
      onReset: () => {
        resets++;
      },
    });
    cleanup.push(() => ingest.close());
    await ingest.upsert("w1", [{ rank: 0, endpoint: pub.endpoint, replayEndpoint: pub.replayEndpoint }]);
    await pub.waitForSubscribers(1, WAIT_MS);
    for (let i = 0; i < 5; i++) await pub.publish(stored(BigInt(i + 1)));
    await waitFor(() => ingest.position("w1", 0)?.seq === 4n, WAIT_MS, "seqs 0-4 applied");

    ingest.crashThreadForTest();
    await waitFor(() => ingest.restarts === 1, WAIT_MS, "the restart to be counted");
    // Published while no thread reads: the new thread's listener must replay them.
    for (let i = 5; i < 10; i++) await pub.publish(stored(BigInt(i + 1)));
    await waitFor(() => ingest.up && pub.subscriptions >= 2, WAIT_MS, "the new thread to subscribe");
    await pub.publish(stored(11n));
    await waitFor(() => ingest.position("w1", 0)?.seq === 10n, WAIT_MS, () => `seq 10 applied (applied: ${applied.map((a) => a.seq).join(",")})`);

    const seqs = new Set(applied.map((a) => a.seq));
    for (let s = 0n; s <= 10n; s++) expect(seqs.has(s), `seq ${s} applied`).toBe(true);
    expect(applied.filter((a) => a.replayed).length).toBeGreaterThanOrEqual(5);
    // Resumed, not started over: the rank's blocks were kept, and seqs 0-4 were not applied again.
    expect(resets).toBe(0);
    expect(applied.filter((a) => a.seq <= 4n)).toHaveLength(5);
    // Counters carry over the restart (the dead thread's and the new one's).
    const stats = ingest.stats().find((r) => r.workerId === "w1" && r.rank === 0);
    expect(stats?.stats.applied).toBeGreaterThanOrEqual(11);
    expect(ingest.terminations).toBe(0);
  }, 60_000);

  it("answers a call in flight when it died from the restarted thread, and closes cleanly afterwards", async () => {
    const pub = await MockKvPublisher.create();
    cleanup.push(() => pub.close());
    const ingest = new KvIngestWorker({ onBatch: () => undefined, onReset: () => undefined });
    await ingest.upsert("w1", [{ rank: 0, endpoint: pub.endpoint, replayEndpoint: pub.replayEndpoint }]);
    ingest.crashThreadForTest();
    // Sent while the thread dies or restarts: it is answered by the next thread.
    await ingest.upsert("w2", [{ rank: 0, endpoint: pub.endpoint, replayEndpoint: pub.replayEndpoint }]);
    await waitFor(() => ingest.up && ingest.restarts === 1, WAIT_MS, "the restart");
    await waitFor(() => ingest.stats().length === 2, WAIT_MS, () => `both workers' ranks open (${JSON.stringify(ingest.stats().map((s) => s.workerId))})`);
    await ingest.close();
    expect(ingest.terminations).toBe(0);
    expect(ingest.stats()).toEqual([]);
  }, 60_000);
});
