/**
 * The warm join end to end (issue 25): real daemons in this process, real ZeroMQ on loopback, a
 * mock engine publishing KV events with a short replay buffer. A replica that starts after the
 * engine stored a shared system prompt can no longer replay it; with the warm join it installs
 * its peer's index before `/ready` turns 200, and that index equals its peer's.
 */
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { parseJson, stringifyJson } from "../../../src/http/json.js";
import { MockKvPublisher } from "../../helpers/kv-publisher.js";
import { freePortPair, withFreePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

const log = pino({ level: "silent" });
const BS = 16;
const running: Daemon[] = [];
const engines: MockKvPublisher[] = [];

afterEach(async () => {
  await Promise.all(running.splice(0).map((d) => d.close()));
  await Promise.all(engines.splice(0).map((e) => e.close()));
});

async function replica(peers: string[], indexSyncSecs: number, meshStartupSyncSecs = 5): Promise<{ d: Daemon; sync: string }> {
  let port = 0;
  const d = await withFreePortPair(async (p) => {
    port = p;
    return startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, replicaSyncPort: p, peers, indexSyncSecs, meshStartupSyncSecs }, log);
  });
  running.push(d);
  return { d, sync: `tcp://127.0.0.1:${port}` };
}

async function ready(d: Daemon): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await fetch(`http://${d.host}:${d.port}/ready`);
  return { status: res.status, json: parseJson(await res.text()) as Record<string, unknown> };
}

/** Engine block hashes of a chain: `seed`'s blocks 0..n-1 (any distinct u64 values do). */
const hashes = (seed: number, from: number, to: number): bigint[] => Array.from({ length: to - from }, (_, i) => BigInt(seed) * 1_000_000n + BigInt(from + i) + 1n);
const toks = (seed: number, from: number, to: number): number[] => Array.from({ length: (to - from) * BS }, (_, i) => seed * 100_000 + from * BS + i);

/** A turn: blocks [4, 4 + n) of conversation `seed`, below the shared 4-block system prompt (seed 0). */
async function turn(e: MockKvPublisher, seed: number, n: number): Promise<void> {
  // The conversation's blocks continue the system prompt's token stream and hash chain.
  const sys = hashes(0, 0, 4);
  const blockHashes = Array.from({ length: n }, (_, i) => BigInt(seed) * 1_000_000n + BigInt(i) + 1n);
  const tokenIds = Array.from({ length: n * BS }, (_, i) => seed * 100_000 + i);
  await e.publish([{ type: "stored", blockHashes, parentHash: sys[3] as bigint, tokenIds, blockSize: BS }]);
}

const indexBlocks = (d: Daemon): number => d.service.sizes().indexedBlocks;

describe("warm join", () => {
  it("a replica started after the engine's replay buffer moved on installs its peer's index before /ready turns 200; without it the index stays short", async () => {
    const engine = await MockKvPublisher.create({ historySize: 4 });
    engines.push(engine);
    const a = await replica([], 10);
    const reg = await fetch(`http://${a.d.host}:${a.d.port}/workers`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: stringifyJson({ worker_id: 1, endpoint: "http://w1", block_size: BS, kv_events_endpoint: engine.endpoint, replay_endpoint: engine.replayEndpoint }),
    });
    expect(reg.status).toBe(201);
    await engine.waitForSubscribers(1);
    // The shared system prompt, then 10 conversations below it: the prompt leaves the replay buffer.
    await engine.publish([{ type: "stored", blockHashes: hashes(0, 0, 4), parentHash: null, tokenIds: toks(0, 0, 4), blockSize: BS }]);
    for (let s = 1; s <= 10; s++) await turn(engine, s, 2);
    await waitFor(() => indexBlocks(a.d) === 4 + 20, 5_000, "A indexes the system prompt and 10 conversations");

    // B joins with the warm join, C without (--index-sync-secs 0).
    const b = await replica([a.sync], 30);
    const c = await replica([a.sync], 0);
    let answer = await ready(b.d);
    await waitFor(
      async () => {
        answer = await ready(b.d);
        if (answer.status === 200) return true;
        // Held only by the syncs.
        expect(answer.json.index_syncing === true || answer.json.mesh_syncing === true).toBe(true);
        return false;
      },
      20_000,
      () => `B ready: ${JSON.stringify(answer.json)}`,
    );
    // At the moment /ready turned 200, B's index is its peer's.
    expect(stringifyJson(b.d.service.dump())).toBe(stringifyJson(a.d.service.dump()));
    expect(answer.json).not.toHaveProperty("index_sync");
    // B's own join is over: the threads that would serve the next joiner from B start now, not
    // 30 s after its mesh (the snapshot decode) or at the first index request (the export).
    expect(b.d.indexExportThread()).not.toBe("idle");
    await waitFor(() => b.d.mesh?.snapshotDecoding.threadReady === true, 15_000, "B's snapshot decoding thread is up once B's join is over");

    // Later conversations, each below the prompt neither B nor C could replay: B follows live.
    await engine.waitForSubscribers(3);
    for (let s = 11; s <= 14; s++) await turn(engine, s, 2);
    await waitFor(() => indexBlocks(a.d) === 4 + 28, 5_000, "A indexes the later conversations");
    await waitFor(() => stringifyJson(b.d.service.dump()) === stringifyJson(a.d.service.dump()), 5_000, "B follows the live stream past the snapshot");

    // C only has what the short replay and the live stream gave it: chains it parks, below a root it never sees.
    await waitFor(() => c.d.service.sizes().detachedBlocks > 0, 5_000, "C parks the conversations it cannot chain");
    expect(indexBlocks(c.d)).toBeLessThan(indexBlocks(a.d));
    const metrics = await (await fetch(`http://${b.d.host}:${b.d.port}/metrics`)).text();
    expect(metrics).toMatch(/kvmesh_index_sync_ranks_installed_total 1/);

    // B's pull started A's export thread; once it has loaded, the next joiner's chunks are walked
    // and encoded there, and that joiner's index is A's too when its /ready turns 200.
    await waitFor(() => a.d.indexExportThread() === "ready", 20_000, "A's index export thread loads");
    const d = await replica([a.sync], 30);
    await waitFor(async () => (await ready(d.d)).status === 200, 20_000, "D ready");
    expect(stringifyJson(d.d.service.dump())).toBe(stringifyJson(a.d.service.dump()));
    const exported = await (await fetch(`http://${a.d.host}:${a.d.port}/metrics`)).text();
    expect(exported).toMatch(/kvmesh_index_export_chunks_total\{path="thread"\} [1-9]/);
    expect(exported).toMatch(/kvmesh_index_export_thread_failures_total 0/);
  });

  it("with no reachable peer, /ready says so (index_sync: no_peer) and is not held past it", async () => {
    const gone = `tcp://127.0.0.1:${await freePortPair()}`;
    const b = await replica([gone], 30, 1);
    let answer = await ready(b.d);
    await waitFor(
      async () => {
        answer = await ready(b.d);
        return answer.json.index_sync === "no_peer";
      },
      15_000,
      () => `B ready: ${JSON.stringify(answer.json)}`,
    );
    expect(answer.json).not.toHaveProperty("index_syncing");
  });
});
