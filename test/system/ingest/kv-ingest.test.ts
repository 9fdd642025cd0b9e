import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon } from "../../../src/app/daemon.js";
import { parseJson, stringifyJson } from "../../../src/http/json.js";
import { readPreparedKvBatch } from "../../../src/ingest/kv-batch-reader.js";
import { KvEndpointError, KvIngest, type KvRankRef } from "../../../src/ingest/kv-ingest.js";
import { MockKvPublisher } from "../../helpers/kv-publisher.js";
import { waitFor } from "../../helpers/wait.js";

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
  it("hands the fast path's prepared batches to onPrepared, the rest to onBatch; changedStats reports each change once", async () => {
    const pub = await publisher();
    const prepared: string[] = [];
    const decoded: string[] = [];
    const ingest = new KvIngest({
      onBatch: (ref, batch, seq) => decoded.push(`${ref.workerId}/${ref.rank}#${seq}:${batch.events.length}`),
      onReset: () => undefined,
      fastPath: {
        read: readPreparedKvBatch,
        onPrepared: (ref, batch, seq) => prepared.push(`${ref.workerId}/${ref.rank}#${seq}:${batch.words[0] ?? -1}`),
      },
    });
    cleanups.push(() => ingest.close());
    await ingest.upsert("w1", [{ rank: 0, endpoint: pub.endpoint, replayEndpoint: pub.replayEndpoint }]);
    await pub.waitForSubscribers(1);
    expect(ingest.changedStats().map((s) => s.stats.received)).toEqual([0]);
    expect(ingest.changedStats()).toEqual([]);
    await pub.publish([{ type: "stored", blockHashes: [1n, 2n], parentHash: null, tokenIds: Array.from({ length: 32 }, (_, i) => i), blockSize: 16 }, { type: "removed", blockHashes: [7n] }]);
    // Eagle pairs: only the general decoder takes them.
    await pub.publish([{ type: "stored", blockHashes: [3n], parentHash: 2n, tokenIds: Array.from({ length: 16 }, (_, i) => [i, i + 1] as [number, number]), blockSize: 16 }]);
    await waitFor(() => prepared.length + decoded.length === 2);
    expect(prepared).toEqual(["w1/0#0:2"]);
    expect(decoded).toEqual(["w1/0#1:1"]);
    const changed = ingest.changedStats();
    expect(changed.map((s) => [s.stats.received, s.stats.applied, s.stats.lastSeq])).toEqual([[2, 2, 1n]]);
    expect(ingest.changedStats([{ workerId: "w1", rank: 0 }])).toEqual([]);
  });

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

  it("rejects an endpoint ZeroMQ refuses with a KvEndpointError naming the rank, keeping the ranks started before it", async () => {
    const p0 = await publisher();
    const ingest = new KvIngest({ onBatch: () => undefined, onReset: () => undefined });
    cleanups.push(() => ingest.close());
    // `tcp://*:5557` passes the reference's form check (common/zmq.rs validate_endpoint) but a SUB
    // cannot connect to a wildcard host: libzmq answers EINVAL.
    const err: unknown = await ingest.upsert("w", [{ rank: 0, endpoint: p0.endpoint }, { rank: 1, endpoint: "tcp://*:5557" }]).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KvEndpointError);
    const e = err as KvEndpointError;
    expect([e.rank, e.endpoint, e.detail]).toEqual([1, "tcp://*:5557", "Invalid argument (EINVAL)"]);
    expect(ingest.stats().map((x) => x.rank)).toEqual([0]);
  });

  it("statsOf gives one worker's ranks, as stats() filtered by worker does; none for an unknown worker", async () => {
    const ingest = new KvIngest({ onBatch: () => undefined, onReset: () => undefined });
    cleanups.push(() => ingest.close());
    await ingest.upsert("w1", [{ rank: 0, endpoint: "tcp://127.0.0.1:1" }, { rank: 1, endpoint: "tcp://127.0.0.1:2" }]);
    await ingest.upsert("w2", [{ rank: 0, endpoint: "tcp://127.0.0.1:3" }]);
    for (const w of ["w1", "w2"]) expect(ingest.statsOf(w)).toEqual(ingest.stats().filter((r) => r.workerId === w));
    expect(ingest.statsOf("w1").map((r) => [r.rank, r.endpoint])).toEqual([[0, "tcp://127.0.0.1:1"], [1, "tcp://127.0.0.1:2"]]);
    expect(ingest.statsOf("w3")).toEqual([]);
  });
});

describe("the daemon and an endpoint ZeroMQ refuses", () => {
  // The reference marks the worker incomplete when its ingress registration fails (core/workers.rs
  // reconcile_worker: "reconciliation failed: {error}", after rolling the listeners back); spec
  // §8.3 reconcile_rolls_back_partial_listener_registration: PATCH with a good endpoint fixes it.
  // Before #14 the worker stayed schedulable, counted by /ready and was selected.
  it("turns the worker incomplete with the reason, out of /ready and selection; a PATCH with a good endpoint makes it schedulable", async () => {
    const d = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: true }, pino({ level: "silent" }));
    cleanups.push(() => d.close());
    const call = async (method: string, path: string, body?: unknown): Promise<{ status: number; json: unknown }> => {
      const res = await fetch(`http://${d.host}:${d.port}${path}`, {
        method,
        ...(body === undefined ? {} : { body: stringifyJson(body), headers: { "content-type": "application/json" } }),
      });
      return { status: res.status, json: parseJson(await res.text()) };
    };
    const record = async (): Promise<{ lifecycle: string; not_schedulable_reasons: string[] }> =>
      ((await call("GET", "/workers")).json as { lifecycle: string; not_schedulable_reasons: string[] }[])[0] ?? { lifecycle: "none", not_schedulable_reasons: [] };

    const worker = { worker_id: 7, endpoint: "http://w7", block_size: 16, kv_events_endpoint: "tcp://*:5557" };
    expect((await call("POST", "/workers", worker)).status).toBe(201);
    await waitFor(async () => (await record()).lifecycle === "incomplete", 5_000, "the refused endpoint to make worker 7 incomplete");
    expect((await record()).not_schedulable_reasons).toEqual([
      "reconciliation failed: invalid kv_events endpoint for worker 7 dp_rank 0: ZeroMQ refused `tcp://*:5557`: Invalid argument (EINVAL)",
    ]);
    expect((await call("GET", "/ready")).status).toBe(503);
    expect((await call("POST", "/select", { token_ids: [1, 2, 3] })).status).toBe(503);

    const engine = await publisher();
    expect((await call("PATCH", "/workers/7", { kv_events_endpoint: engine.endpoint })).status).toBe(200);
    await engine.waitForSubscribers(1);
    expect((await record()).lifecycle).toBe("schedulable");
    expect((await call("GET", "/ready")).status).toBe(200);
  });
});
