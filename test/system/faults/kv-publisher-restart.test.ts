/**
 * Fault scenario 5: a worker's KV-event publisher restarts and the index for that worker must be
 * rebuilt, not left stale. First at the listener (which batches it hands on, when it resets),
 * then end to end on two replicas (what /overlap_scores says the worker holds).
 *
 * Before the fix in src/ingest/kv-event-listener.ts two restarts went unnoticed: a new process at
 * the same address whose first batches were published before the SUB reconnected (its seq 1, 2 ...
 * were at or below the old cursor and dropped as stale: the old blocks stayed, the new ones never
 * came), and a publisher that restarted after a single batch (seq 0 again was "stale").
 */
import { afterEach, describe, expect, it } from "vitest";

import { KvEventListener } from "../../../src/ingest/kv-event-listener.js";
import type { KvEventBatch } from "../../../src/ingest/kv-event-decoder.js";
import { PUBLISHER_SHORT, scenarioPublisherRestart } from "../../../scripts/lib/fault-scenarios.js";
import { freePortPair } from "../../helpers/ports.js";
import { RestartableKvPublisher } from "../../../scripts/lib/restartable-kv-publisher.js";
import { waitFor } from "../../helpers/wait.js";
import { SCENARIO_TEST_TIMEOUT_MS } from "../../helpers/timeouts.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const stored = (h: bigint) => ({ type: "stored" as const, blockHashes: [h], parentHash: null, tokenIds: Array.from({ length: 16 }, (_, i) => i), blockSize: 16 });
const firstHash = (b: KvEventBatch): bigint | undefined => {
  const e = b.events[0];
  return e?.type === "stored" ? e.blockHashes[0] : undefined;
};

async function setup(): Promise<{ pub: RestartableKvPublisher; got: bigint[]; resets: number[]; listener: KvEventListener }> {
  const port = await freePortPair();
  const pub = await RestartableKvPublisher.create(port, port + 1);
  const got: bigint[] = [];
  const resets: number[] = [];
  const listener = new KvEventListener({
    endpoint: pub.endpoint,
    replayEndpoint: pub.replayEndpoint,
    replayTimeoutMs: 2_000,
    onBatch: (b) => got.push(firstHash(b) ?? -1n),
    onReset: () => resets.push(got.length),
  });
  await listener.start();
  cleanups.push(async () => {
    await listener.close();
    await pub.close();
  });
  await waitFor(() => pub.subscriptions >= 1, 5_000, "the listener to subscribe");
  return { pub, got, resets, listener };
}

describe("fault: KV-event publisher restart at the listener", () => {
  it("a new process at the same address, publishing before the SUB is back: reset, then replay from 0", async () => {
    const { pub, got, resets, listener } = await setup();
    for (const h of [1n, 2n, 3n]) await pub.publish([stored(h)]);
    await waitFor(() => got.length === 3, 5_000, "old batches");
    await pub.restartProcess();
    // Seq 0 goes out before the SUB has reconnected: lost live, only replay can bring it back.
    await pub.publish([stored(100n)]);
    await waitFor(() => pub.subscriptions >= 1, 5_000, "the SUB to reconnect");
    await pub.publish([stored(101n)]);
    await waitFor(() => got.includes(101n), 5_000, () => `the new batch, got ${got.join(",")}`);
    expect(resets).toEqual([3]);
    // Everything the new process published, in order, after the reset.
    expect(got.slice(3)).toEqual([100n, 101n]);
    expect(listener.stats).toMatchObject({ resets: 1, lost: 0, lastSeq: 1n });
  });

  // Issue #14: vLLM numbers from 0 again after a restart and keeps publishing while the SUB backs
  // off; once it has counted past the old cursor, the first seq seen looks like a gap of the old
  // process. Before, the gap was replayed from the new process on top of the old blocks (its seq
  // 0 .. old cursor never applied, the old blocks never cleared). The listener now asks the replay
  // buffer for the batch it applied last: a new process does not hold it, so the rank resets.
  it("a new process that counts past the old seq before the SUB is back: reset, then replay from 0", async () => {
    const { pub, got, resets, listener } = await setup();
    for (const h of [1n, 2n, 3n]) await pub.publish([stored(h)]);
    await waitFor(() => got.length === 3, 5_000, "old batches");
    await pub.restartProcess();
    // Seqs 0-4 of the new process go out while the SUB is still reconnecting.
    for (const h of [100n, 101n, 102n, 103n, 104n]) await pub.publish([stored(h)]);
    await waitFor(() => pub.subscriptions >= 1, 5_000, "the SUB to reconnect");
    await pub.publish([stored(105n)]);
    await waitFor(() => got.includes(105n), 5_000, () => `the new batch, got ${got.join(",")}`);
    expect(resets).toEqual([3]);
    expect(got.slice(3)).toEqual([100n, 101n, 102n, 103n, 104n, 105n]);
    expect(listener.stats).toMatchObject({ resets: 1, lost: 0, lastSeq: 5n });
  });

  it("a reconnection to the same process with a gap replays the gap without a reset", async () => {
    const { pub, got, resets, listener } = await setup();
    for (const h of [1n, 2n, 3n]) await pub.publish([stored(h)]);
    await waitFor(() => got.length === 3, 5_000, "first batches");
    // The connection drops while the process keeps its replay buffer: emulated by a restart that
    // re-publishes the same batches as seqs 0-2 (byte for byte, unseen by the reconnecting SUB),
    // then seqs 3-4 go out before the SUB is back.
    await pub.restartProcess();
    for (const h of [1n, 2n, 3n, 4n, 5n]) await pub.publish([stored(h)]);
    await waitFor(() => pub.subscriptions >= 1, 5_000, "the SUB to reconnect");
    await pub.publish([stored(6n)]);
    await waitFor(() => got.includes(6n), 5_000, () => `the live batch, got ${got.join(",")}`);
    expect(resets).toEqual([]);
    expect(got).toEqual([1n, 2n, 3n, 4n, 5n, 6n]);
    expect(listener.stats).toMatchObject({ resets: 0, lost: 0, lastSeq: 5n });
  });

  it("a restart after a single batch (seq 0, then seq 0 again) resets", async () => {
    const { pub, got, resets } = await setup();
    await pub.publish([stored(1n)]);
    await waitFor(() => got.length === 1, 5_000, "the only old batch");
    pub.restartInPlace();
    await pub.publish([stored(200n)]);
    await waitFor(() => got.length === 2, 5_000, "the new seq 0");
    expect(resets).toEqual([1]);
    expect(got).toEqual([1n, 200n]);
  });

  it("still drops a stale seq on a connection that never broke", async () => {
    const { pub, got, listener } = await setup();
    for (const h of [1n, 2n, 3n]) await pub.publish([stored(h)]);
    await waitFor(() => got.length === 3, 5_000, "three batches");
    // Seq 1 again on the same connection: not a restart (no reconnect, not seq 0), so stale.
    await pub.publish([stored(99n)], 1n);
    await pub.publish([stored(4n)], 3n);
    await waitFor(() => got.length === 4, 5_000, "seq 3");
    expect(got).toEqual([1n, 2n, 3n, 4n]);
    expect(listener.stats).toMatchObject({ resets: 0, stale: 1 });
  });
});

describe("fault: KV-event publisher restart on replicas", () => {
  it("rebuilds the worker's index on every replica for each kind of restart", async () => {
    const row = await scenarioPublisherRestart(PUBLISHER_SHORT);
    for (const c of row.checks) expect(c.ok, `${c.name}: ${c.value}`).toBe(true);
    expect(row.checks).toHaveLength(PUBLISHER_SHORT.cases.length);
    expect(row.failures).toBe(0);
  }, SCENARIO_TEST_TIMEOUT_MS);
});
