/**
 * A buggy or hostile engine through real ZeroMQ sockets on 127.0.0.1 into a real daemon (#17 F8):
 * one message of 500,000 block hashes used to be indexed whole (and stalled every /select for up
 * to 726 ms); now it is refused at the per-message cap and counted, and the rank goes on.
 */
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { parseJson, stringifyJson } from "../../../src/http/json.js";
import { MAX_KV_EVENTS_PER_MESSAGE, MAX_KV_HASHES_PER_MESSAGE } from "../../../src/ingest/kv-event-decoder.js";
import { MockKvPublisher, packMsgpack } from "../../helpers/kv-publisher.js";
import { waitFor } from "../../helpers/wait.js";

const BS = 16;
const log = pino({ level: "silent" });
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function call(d: Daemon, method: string, path: string, body?: unknown): Promise<{ status: number; text: string }> {
  const res = await fetch(`http://${d.host}:${d.port}${path}`, {
    method,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    ...(body === undefined ? {} : { body: stringifyJson(body) }),
  });
  return { status: res.status, text: await res.text() };
}

/** The value of one unlabelled or labelled sample in a scrape (the first line that names it). */
async function metric(d: Daemon, name: string): Promise<number> {
  const text = (await call(d, "GET", "/metrics")).text;
  const line = text.split("\n").find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`));
  return line === undefined ? NaN : Number(line.slice(line.lastIndexOf(" ") + 1));
}

const stored = (hashes: bigint[], parent: bigint | null, tokens: number[]): Record<string, unknown> => ({
  type: "BlockStored",
  block_hashes: hashes,
  parent_block_hash: parent,
  token_ids: tokens,
  block_size: BS,
  lora_id: null,
  medium: "GPU",
  lora_name: null,
});
const hashesFrom = (start: number, n: number): bigint[] => Array.from({ length: n }, (_, i) => BigInt(start + i) + (1n << 40n));
const tokensOf = (blocks: number, seed: number): number[] => Array.from({ length: blocks * BS }, (_, i) => (seed * 7_919 + i) % 100_000);

describe("a hostile engine over real sockets (#17 F8)", () => {
  it("a 500,000-hash message is refused and counted; the next message applies and /select sees it", async () => {
    const d = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0 }, log);
    cleanups.push(() => d.close());
    const pub = await MockKvPublisher.create();
    cleanups.push(() => pub.close());
    const r = await call(d, "POST", "/workers", { worker_id: 1, endpoint: "http://w1", block_size: BS, kv_events_endpoint: pub.endpoint });
    expect(r.status).toBe(201);
    await pub.waitForSubscribers(1);

    const huge = 500_000;
    // 34 MB: refused before it is decoded (decoding it took 636 ms).
    await pub.publishPayload(packMsgpack({ ts: 1, events: [stored(hashesFrom(0, huge), null, tokensOf(huge, 1))], data_parallel_rank: 0 }));
    // 140,000 hashes in 11 MB: decoded, the event past the hash cap refused.
    const over = MAX_KV_HASHES_PER_MESSAGE + 8_928;
    await pub.publishPayload(packMsgpack({ ts: 1, events: [stored(hashesFrom(0, over), null, tokensOf(over, 2))], data_parallel_rank: 0 }));
    // Then a message of 16,390 small events: the first 16,384 apply, 6 are cut.
    const events = Array.from({ length: MAX_KV_EVENTS_PER_MESSAGE + 6 }, (_, i) => stored([BigInt(10_000_000 + i)], null, tokensOf(1, 1_000 + i)));
    await pub.publishPayload(packMsgpack({ ts: 2, events, data_parallel_rank: 0 }));
    const normal = tokensOf(8, 3);
    await pub.publishPayload(packMsgpack({ ts: 3, events: [stored(hashesFrom(huge, 8), null, normal)], data_parallel_rank: 0 }));
    await waitFor(async () => (await metric(d, "kvmesh_kv_batches_applied_total")) === 3, 30_000, "3 batches applied");

    // Before: the index grew by 500,000 blocks from the first message.
    expect(await metric(d, "kvmesh_index_blocks")).toBe(MAX_KV_EVENTS_PER_MESSAGE + 8);
    expect(await metric(d, "kvmesh_kv_batches_oversized_total")).toBe(3);
    expect(await metric(d, "kvmesh_kv_events_shed_total")).toBe(1 + 6);
    const sel = await call(d, "POST", "/select", { token_ids: normal });
    expect(sel.status).toBe(200);
    expect((parseJson(sel.text) as { overlap: { gpu: number } }).overlap.gpu).toBe(8 * BS);
    expect(huge).toBeGreaterThan(MAX_KV_HASHES_PER_MESSAGE);
  }, 60_000);
});
