/**
 * The daemon end to end on loopback: real HTTP, real ZeroMQ KV-event publishers (a mock engine
 * per worker) in both wire encodings, a gap repaired through replay, then selection by overlap.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { hashListToBigInts } from "../../../src/core/index.js";
import { computeBlockHashes, computeSequenceHashes } from "../../../src/core/index.js";
import { parseJson, stringifyJson } from "../../../src/http/json.js";
import { MockKvPublisher, type KvWireEncoding } from "../../helpers/kv-publisher.js";
import { waitFor } from "../../helpers/wait.js";

const BS = 16;
const log = pino({ level: "silent" });

let daemon: Daemon | undefined;
const publishers: MockKvPublisher[] = [];
afterEach(async () => {
  await daemon?.close();
  daemon = undefined;
  await Promise.all(publishers.splice(0).map((p) => p.close()));
});

async function call(method: string, path: string, body?: unknown): Promise<{ status: number; json: unknown }> {
  if (daemon === undefined) throw new Error("no daemon");
  const res = await fetch(`http://${daemon.host}:${daemon.port}${path}`, {
    method,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    ...(body === undefined ? {} : { body: stringifyJson(body) }),
  });
  const text = await res.text();
  return { status: res.status, json: text === "" ? null : parseJson(text) };
}

const prompt = (blocks: number, seed: number): number[] => Array.from({ length: blocks * BS }, (_, i) => seed * 1_000_000 + i);

/** The chain of BlockStored events an engine publishes for `tokens`, one block per event. */
function storedEvents(tokens: number[], fromBlock = 0, toBlock?: number) {
  const seq = hashListToBigInts(computeSequenceHashes(computeBlockHashes(tokens, BS)));
  const end = toBlock ?? seq.length;
  const out = [];
  for (let b = fromBlock; b < end; b++) {
    out.push({ type: "stored" as const, blockHashes: [seq[b] as bigint], parentHash: b === 0 ? null : (seq[b - 1] as bigint), tokenIds: tokens.slice(b * BS, (b + 1) * BS), blockSize: BS });
  }
  return out;
}

async function engine(encoding: KvWireEncoding): Promise<MockKvPublisher> {
  const p = await MockKvPublisher.create({ encoding });
  publishers.push(p);
  return p;
}

describe("kvmesh daemon", () => {
  it("--workers-file: registers the file's workers before serving, and refuses to start on a bad file naming line and field", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kvmesh-daemon-workers-"));
    try {
      const file = join(dir, "workers.yaml");
      writeFileSync(file, "- worker_id: 5\n  endpoint: http://w5\n  block_size: 16\n");
      daemon = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false, workersFile: file }, log);
      expect((await call("GET", "/ready")).json).toMatchObject({ ready: true, schedulable_workers: 1 });
      expect(((await call("GET", "/workers")).json as { worker_id: number }[]).map((w) => w.worker_id)).toEqual([5]);
      await daemon.close();
      daemon = undefined;

      writeFileSync(file, "- worker_id: 5\n  endpoint: http://w5\n  block_size: sixteen\n");
      await expect(startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false, workersFile: file }, log)).rejects.toThrow(/workers\.yaml:3: \[0\]\.block_size: /);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("ingests KV events in both encodings, repairs a gap through replay, and routes by overlap", async () => {
    daemon = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0 }, log);
    const engines = [await engine("map"), await engine("array")];
    for (const [i, e] of engines.entries()) {
      const r = await call("POST", "/workers", { worker_id: i + 1, endpoint: `http://w${i + 1}`, block_size: BS, kv_events_endpoint: e.endpoint, replay_endpoint: e.replayEndpoint });
      expect(r.status).toBe(201);
      expect((r.json as { lifecycle: string }).lifecycle).toBe("schedulable");
    }
    await Promise.all(engines.map((e) => e.waitForSubscribers(1)));

    const a = prompt(6, 1);
    const b = prompt(6, 2);
    const [e1, e2] = engines as [MockKvPublisher, MockKvPublisher];
    // Engine 1 (map encoding) caches prompt a live.
    await e1.publish(storedEvents(a));
    // Engine 2 (array encoding, signed hashes) caches prompt b, but blocks 2..3 are "lost" on the
    // live socket: the daemon sees seq 3 after seq 0 and must replay 1..2 before applying it.
    const evs = storedEvents(b);
    await e2.publish(evs.slice(0, 2), { signedHashes: true });
    await e2.publish(evs.slice(2, 3), { deliver: false, signedHashes: true });
    await e2.publish(evs.slice(3, 4), { deliver: false, signedHashes: true });
    await e2.publish(evs.slice(4), { signedHashes: true });

    const overlap = async (tokens: number[]) => {
      const r = await call("POST", "/overlap_scores", { token_ids: tokens });
      return (r.json as { workers: { worker_id: number; device_blocks: number }[] }).workers.map((w) => [w.worker_id, w.device_blocks]);
    };
    await waitFor(async () => JSON.stringify(await overlap(b)) === JSON.stringify([[1, 0], [2, 6]]), 5_000, "engine 2's blocks after replay");
    await waitFor(async () => JSON.stringify(await overlap(a)) === JSON.stringify([[1, 6], [2, 0]]), 5_000, "engine 1's blocks");
    expect(e2.replayRequests).toEqual([1n]);

    for (const [tokens, want] of [[a, 1], [b, 2]] as const) {
      const r = await call("POST", "/select", { token_ids: tokens });
      expect(r.status).toBe(200);
      expect(r.json).toMatchObject({ worker_id: want, overlap: { gpu: 6 * BS } });
    }

    const metrics = await (await fetch(`http://${daemon.host}:${daemon.port}/metrics`)).text();
    expect(metrics).toMatch(/kvmesh_kv_batches_replayed_total\{[^}]*worker_id="2"[^}]*\} 2/);
  });

  it("a worker's publisher restarting from seq 0 rebuilds its index instead of keeping stale blocks", async () => {
    daemon = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0 }, log);
    const e = await engine("map");
    await call("POST", "/workers", { worker_id: 7, endpoint: "http://w7", block_size: BS, kv_events_endpoint: e.endpoint, replay_endpoint: e.replayEndpoint });
    await e.waitForSubscribers(1);
    const a = prompt(4, 3);
    for (const ev of storedEvents(a)) await e.publish([ev]);
    const blocks = async () => ((await call("POST", "/overlap_scores", { token_ids: a })).json as { workers: { device_blocks: number }[] }).workers[0]?.device_blocks;
    await waitFor(async () => (await blocks()) === 4, 5_000, "4 blocks indexed");
    e.restart();
    await e.publish(storedEvents(a, 0, 1));
    await waitFor(async () => (await blocks()) === 1, 5_000, "index rebuilt from the restarted publisher");
  });

  it("shuts down promptly and frees its port", async () => {
    daemon = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0 }, log);
    const { port } = daemon;
    expect((await call("GET", "/health")).json).toEqual({ status: "ok" });
    await daemon.close();
    daemon = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port }, log);
    expect(daemon.port).toBe(port);
  });
});
