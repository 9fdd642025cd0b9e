/**
 * The ingest thread's hand-over window (src/ingest/kv-ingest-window.ts), with the real thread and
 * real ZeroMQ sockets: a main thread made slow (its onBatch spins) no longer lets the thread's
 * reports pile up without limit. What the thread reads past the window is shed and counted, the
 * rank's cursor stays where the index is, and once the main thread keeps up again the rank's next
 * message replays every shed batch from the engine: nothing lost, nothing applied twice.
 */
import { afterEach, describe, expect, it } from "vitest";

import { KvIngestWorker } from "../../../src/ingest/kv-ingest-worker.js";
import { MockKvPublisher, type MockKvEvent } from "../../helpers/kv-publisher.js";
import { waitFor } from "../../helpers/wait.js";

/** Liveness deadlines for a loaded machine (a thread starts through tsx), not speed targets. */
const WAIT_MS = 30_000;
/** How long the slow main thread spends on each batch, ms: far slower than the thread prepares one. */
const SLOW_APPLY_MS = 5;
const WINDOW_BATCHES = 8;
const WINDOW_BYTES = 1024 * 1024;
const FLOOD_BATCHES = 200;

const stored = (h: bigint): MockKvEvent[] => [{ type: "stored", blockHashes: [h], parentHash: null, tokenIds: Array.from({ length: 16 }, (_, i) => i), blockSize: 16 }];

const show = (v: unknown): string => JSON.stringify(v, (_k, x: unknown) => (typeof x === "bigint" ? String(x) : x));

function spin(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) {
    // A main thread busy elsewhere (a test seam for a slow index).
  }
}

let cleanup: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanup.reverse()) await c();
  cleanup = [];
});

describe("KvIngestWorker: the hand-over window", () => {
  it("holds a flood to the window while the main thread is slow, counts what it sheds, and replays it once the main thread keeps up", async () => {
    const pub = await MockKvPublisher.create();
    cleanup.push(() => pub.close());
    let slow = true;
    const applied: { seq: bigint; replayed: boolean }[] = [];
    let resets = 0;
    let maxPending = 0;
    const ingest: KvIngestWorker = new KvIngestWorker({
      window: { maxBatches: WINDOW_BATCHES, maxBytes: WINDOW_BYTES },
      onBatch: (_ref, _batch, seq, replayed) => {
        maxPending = Math.max(maxPending, ingest.window.pendingBatches);
        applied.push({ seq, replayed });
        if (slow) spin(SLOW_APPLY_MS);
      },
      onReset: () => {
        resets++;
      },
    });
    cleanup.push(() => ingest.close());
    await ingest.upsert("w1", [{ rank: 0, endpoint: pub.endpoint, replayEndpoint: pub.replayEndpoint }]);
    await pub.waitForSubscribers(1, WAIT_MS);

    for (let i = 0; i < FLOOD_BATCHES; i++) await pub.publish(stored(BigInt(i + 1)));
    const rank = () => ingest.stats().find((r) => r.workerId === "w1" && r.rank === 0)?.stats;
    await waitFor(() => (rank()?.received ?? 0) === FLOOD_BATCHES, WAIT_MS, () => `the flood read (${show(rank())})`);
    await waitFor(() => ingest.window.pendingBatches === 0, WAIT_MS, "the window to drain");
    const shed = rank()?.shed ?? 0;
    expect(shed).toBeGreaterThan(0);
    // The bound: never more than the window (and the one batch checked before it is read) pending.
    expect(ingest.window.peakBatches).toBeLessThanOrEqual(WINDOW_BATCHES + 1);
    expect(maxPending).toBeLessThanOrEqual(WINDOW_BATCHES + 1);
    expect(ingest.window.peakBytes).toBeLessThanOrEqual(WINDOW_BYTES);
    // Every batch read was shed or handed on. A shed gap can already be replayed during the flood
    // (a message read while the window had room finds it), so replayed batches are apart.
    expect(applied.filter((x) => !x.replayed).length).toBe(FLOOD_BATCHES - shed);

    // The main thread keeps up again: the rank's next message repairs the gap from the engine.
    slow = false;
    await pub.publish(stored(BigInt(FLOOD_BATCHES + 1)));
    await waitFor(() => ingest.position("w1", 0)?.seq === BigInt(FLOOD_BATCHES), WAIT_MS, () => `seq ${FLOOD_BATCHES} applied (${show(rank())})`);
    const seqs = applied.map((a) => a.seq);
    expect(new Set(seqs).size).toBe(seqs.length);
    for (let s = 0n; s <= BigInt(FLOOD_BATCHES); s++) expect(seqs.includes(s), `seq ${s} applied`).toBe(true);
    expect(rank()).toMatchObject({ lost: 0, replayed: shed, applied: FLOOD_BATCHES + 1 });
    expect(resets).toBe(0);
  }, 90_000);

  it("counts what was shed as lost where the engine cannot replay it", async () => {
    const pub = await MockKvPublisher.create({ replay: "none" });
    cleanup.push(() => pub.close());
    let slow = true;
    let appliedCount = 0;
    const ingest = new KvIngestWorker({
      window: { maxBatches: WINDOW_BATCHES, maxBytes: WINDOW_BYTES },
      onBatch: () => {
        appliedCount++;
        if (slow) spin(SLOW_APPLY_MS);
      },
      onReset: () => undefined,
    });
    cleanup.push(() => ingest.close());
    await ingest.upsert("w1", [{ rank: 0, endpoint: pub.endpoint, replayEndpoint: null }]);
    await pub.waitForSubscribers(1, WAIT_MS);
    for (let i = 0; i < FLOOD_BATCHES; i++) await pub.publish(stored(BigInt(i + 1)));
    const rank = () => ingest.stats().find((r) => r.workerId === "w1")?.stats;
    await waitFor(() => (rank()?.received ?? 0) === FLOOD_BATCHES && ingest.window.pendingBatches === 0, WAIT_MS, "the flood read and applied");
    slow = false;
    await pub.publish(stored(BigInt(FLOOD_BATCHES + 1)));
    await waitFor(() => ingest.position("w1", 0)?.seq === BigInt(FLOOD_BATCHES), WAIT_MS, () => `the last seq applied (${show(rank())})`);
    const s = rank();
    expect(s?.shed).toBeGreaterThan(0);
    // Every shed seq is accounted for: lost (no replay endpoint) is at least what was shed.
    expect(s?.lost).toBeGreaterThanOrEqual(s?.shed ?? 0);
    expect(appliedCount + (s?.lost ?? 0)).toBe(FLOOD_BATCHES + 1);
  }, 90_000);
});
