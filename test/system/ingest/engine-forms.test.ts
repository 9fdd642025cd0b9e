/**
 * Engines as they ship today: every form vLLM and SGLang put on the wire, byte for byte as their
 * msgspec encoders write it, through real ZeroMQ sockets on 127.0.0.1 into a real daemon, checked
 * by what routing sees (the overlap a /select reports).
 *
 * Sources: vLLM vllm/distributed/kv_events.py (EventBatch and KVCacheEvent are msgspec Structs
 * with omit_defaults and tag=True, not array_like: maps; BlockStored's current optional fields
 * extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window; ZmqEventPublisher offsets
 * the PUB and replay ports by the DP rank and answers replay with `[id, "", seq, payload]`, then
 * seq -1 and an empty payload) and vllm/v1/core/kv_cache_utils.py (ExternalBlockHash = bytes | int,
 * bytes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0); SGLang python/sglang/srt/disaggregation/
 * kv_events.py (array_like=True: `[ts, events, attn_dp_rank]`, older releases `[ts, events]`;
 * BlockStored `[tag, block_hashes, parent, token_ids, block_size, lora_id]`, BlockRemoved
 * `[tag, block_hashes]`; hashes from Python's hash(), so signed).
 */
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { parseJson, stringifyJson } from "../../../src/http/json.js";
import { MockKvPublisher, packMsgpack } from "../../helpers/kv-publisher.js";
import { waitFor } from "../../helpers/wait.js";

const BS = 16;
const log = pino({ level: "silent" });
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function daemon(): Promise<Daemon> {
  const d = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0 }, log);
  cleanups.push(() => d.close());
  return d;
}

async function engine(): Promise<MockKvPublisher> {
  const p = await MockKvPublisher.create();
  cleanups.push(() => p.close());
  return p;
}

async function call(d: Daemon, method: string, path: string, body?: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await fetch(`http://${d.host}:${d.port}${path}`, {
    method,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    ...(body === undefined ? {} : { body: stringifyJson(body) }),
  });
  return { status: res.status, json: parseJson(await res.text()) as Record<string, unknown> };
}

/** Registers worker `id` on one publisher (and its replay ROUTER) and waits until the daemon subscribed. */
async function register(d: Daemon, id: number, pub: MockKvPublisher, extra: Record<string, unknown> = {}): Promise<void> {
  const r = await call(d, "POST", "/workers", { worker_id: id, endpoint: `http://w${id}`, block_size: BS, kv_events_endpoint: pub.endpoint, replay_endpoint: pub.replayEndpoint, ...extra });
  expect(r.status).toBe(201);
  expect(r.json.lifecycle).toBe("schedulable");
  await pub.waitForSubscribers(1);
}

const prompt = (blocks: number, seed: number): number[] => Array.from({ length: blocks * BS }, (_, i) => seed * 1_000 + i);
const block = (toks: number[], b: number): number[] => toks.slice(b * BS, (b + 1) * BS);

/** The overlap /select reports for `toks` restricted to worker `id`: device tokens, and per dp rank. */
async function overlapOn(d: Daemon, id: number, toks: number[]): Promise<{ gpu: number; dp: Record<string, number>; dpRank: number }> {
  const r = await call(d, "POST", "/select", { token_ids: toks, allowed_worker_ids: [id] });
  expect(r.status).toBe(200);
  const o = r.json.overlap as { gpu: number; dp: Record<string, number> };
  return { gpu: o.gpu, dp: o.dp, dpRank: r.json.dp_rank as number };
}

const waitOverlap = (d: Daemon, id: number, toks: number[], gpu: number): Promise<void> =>
  waitFor(async () => (await overlapOn(d, id, toks)).gpu === gpu, 5_000, `worker ${id} overlap ${gpu}`);

/** vLLM's BlockStored as msgspec writes it: every field without a default, plus the optional ones given. */
function vllmStored(hashes: unknown[], parent: unknown, tokens: number[], optional: Record<string, unknown> = {}): Record<string, unknown> {
  return { type: "BlockStored", block_hashes: hashes, parent_block_hash: parent, token_ids: tokens, block_size: BS, lora_id: null, medium: "GPU", lora_name: null, ...optional };
}

describe("engines as they ship today: vLLM (map batches)", () => {
  it("integer hashes above 2^63 with the current optional fields; a hybrid model's other KV-cache groups are ignored", async () => {
    const d = await daemon();
    const pub = await engine();
    await register(d, 1, pub);
    const toks = prompt(3, 1);
    const h = [(1n << 63n) + 5n, (1n << 64n) - 2n, 42n];
    // Main attention group (group_idx 0, full_attention): indexed. extra_keys one entry per block.
    await pub.publishPayload(
      packMsgpack({
        ts: 1_700_000_000.5,
        events: [vllmStored(h.slice(0, 2), null, toks.slice(0, 2 * BS), { extra_keys: [null, null], group_idx: 0, kv_cache_spec_kind: "full_attention" })],
        data_parallel_rank: 0,
      }),
    );
    // A sliding-window group's copy of block 3 (group_idx 1): not part of the prefix index.
    await pub.publishPayload(
      packMsgpack({
        ts: 1_700_000_000.6,
        events: [vllmStored([h[2]], h[1], block(toks, 2), { group_idx: 1, kv_cache_spec_kind: "sliding_window", kv_cache_spec_sliding_window: 128 })],
        data_parallel_rank: 0,
      }),
    );
    await waitOverlap(d, 1, toks, 2 * BS);
    // BlockRemoved of the main group drops the tail block.
    await pub.publishPayload(packMsgpack({ ts: 1_700_000_000.7, events: [{ type: "BlockRemoved", block_hashes: [h[1]], medium: "GPU", group_idx: 0 }], data_parallel_rank: 0 }));
    await waitOverlap(d, 1, toks, BS);
    expect(pub.nextSeq).toBe(3n); // three batches, seqs 0-2, none lost
    expect(pub.replayRequests).toEqual([]);
  });

  it("bytes hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), a gap repaired through the replay ROUTER, then removal by the same bytes", async () => {
    const d = await daemon();
    const pub = await engine();
    await register(d, 1, pub);
    const toks = prompt(3, 2);
    // sha256-sized block hashes (32 bytes), as vLLM's default prefix_caching_hash_algo gives.
    const sha = (b: number): Buffer => Buffer.alloc(32, b + 1);
    const batch = (b: number): Buffer =>
      packMsgpack({ ts: 1_700_000_001 + b, events: [vllmStored([sha(b)], b === 0 ? null : sha(b - 1), block(toks, b))], data_parallel_rank: 0 });
    await pub.publishPayload(batch(0));
    // Seq 1 never arrives live: seq 2 reveals the gap, the daemon asks the replay ROUTER from 1.
    await pub.publishPayload(batch(1), { deliver: false });
    await pub.publishPayload(batch(2));
    await waitOverlap(d, 1, toks, 3 * BS);
    expect(pub.replayRequests).toEqual([1n]);
    await pub.publishPayload(packMsgpack({ ts: 1_700_000_010, events: [{ type: "BlockRemoved", block_hashes: [sha(1), sha(2)], medium: "GPU" }], data_parallel_rank: 0 }));
    await waitOverlap(d, 1, toks, BS);
  });

  // vLLM stamps a request's cache_salt only in its first block's extra_keys, and a multimodal
  // object's identifier in the extra_keys of the blocks it covers (vllm/v1/core/kv_cache_utils.py);
  // the reference folds both into its block hashes (Dynamo's zmq wire types). Before, kvmesh
  // indexed such blocks unsalted and text-only, so salted and multimodal prompts never matched.
  it("a salted request's chain (salt in the first block's extra_keys, inherited by later events) and a multimodal block match the prompts that name them", async () => {
    const d = await daemon();
    const pub = await engine();
    await register(d, 1, pub);
    const toks = prompt(3, 6);
    await pub.publishPayload(packMsgpack({ ts: 1, events: [vllmStored([101n, 102n], null, toks.slice(0, 2 * BS), { extra_keys: [["tenant-a"], null] })], data_parallel_rank: 0 }));
    await pub.publishPayload(packMsgpack({ ts: 2, events: [vllmStored([103n], 102n, block(toks, 2), { extra_keys: [null] })], data_parallel_rank: 0 }));
    const salted = async (): Promise<number> => {
      const r = await call(d, "POST", "/select", { token_ids: toks, cache_salt: "tenant-a", allowed_worker_ids: [1] });
      return (r.json.overlap as { gpu: number }).gpu;
    };
    await waitFor(async () => (await salted()) === 3 * BS, 5_000, "salted overlap");
    // The same tokens without the salt are another tenant's: nothing cached for them.
    expect((await overlapOn(d, 1, toks)).gpu).toBe(0);

    const img = "ab".repeat(32); // a 64-hex-digit mm identifier: the prompt's mm_hash is its first 16 digits
    const mmToks = prompt(2, 7);
    await pub.publishPayload(packMsgpack({ ts: 3, events: [vllmStored([201n, 202n], null, mmToks, { extra_keys: [null, [[img, 0]]] })], data_parallel_rank: 0 }));
    const mmOverlap = async (infos: unknown): Promise<number> => {
      const r = await call(d, "POST", "/select", { token_ids: mmToks, block_mm_infos: infos, allowed_worker_ids: [1] });
      return (r.json.overlap as { gpu: number }).gpu;
    };
    const withImage = [null, { mm_objects: [{ mm_hash: BigInt(`0x${img.slice(0, 16)}`), offsets: [[0, 4]] }] }];
    await waitFor(async () => (await mmOverlap(withImage)) === 2 * BS, 5_000, "multimodal overlap");
    // Text only, the second block is another block: only the first matches.
    expect(await mmOverlap([null, null])).toBe(BS);
  });

  it("a data-parallel engine: one publisher per rank on its own port (vLLM offsets them by rank), each batch naming its rank", async () => {
    const d = await daemon();
    const [p0, p1] = [await engine(), await engine()];
    const r = await call(d, "POST", "/workers", { worker_id: 7, endpoint: "http://w7", block_size: BS, data_parallel_size: 2, kv_events_endpoints: { "0": p0.endpoint, "1": p1.endpoint } });
    expect(r.json.lifecycle).toBe("schedulable");
    await Promise.all([p0.waitForSubscribers(1), p1.waitForSubscribers(1)]);
    const a = prompt(2, 3);
    const b = prompt(2, 4);
    await p0.publishPayload(packMsgpack({ ts: 1, events: [vllmStored([11n, 12n], null, a)], data_parallel_rank: 0 }));
    await p1.publishPayload(packMsgpack({ ts: 1, events: [vllmStored([11n, 12n], null, b)], data_parallel_rank: 1 }));
    await waitOverlap(d, 7, a, 2 * BS);
    await waitOverlap(d, 7, b, 2 * BS);
    // Each prompt is cached on its own rank only (the same engine hashes on both ranks do not mix).
    expect(await overlapOn(d, 7, a)).toEqual({ gpu: 2 * BS, dp: { "0": 2 * BS, "1": 0 }, dpRank: 0 });
    expect(await overlapOn(d, 7, b)).toEqual({ gpu: 2 * BS, dp: { "0": 0, "1": 2 * BS }, dpRank: 1 });
  });
});

describe("engines as they ship today: data-parallel replay", () => {
  // A DP engine runs one replay ROUTER per rank next to its publisher (vLLM's ZmqEventPublisher
  // offsets both ports by the rank). The reference takes a replay endpoint for single-rank workers
  // only (a multi-rank worker with `replay_endpoint` is incomplete), so a rank's gaps were lost;
  // kvmesh's `replay_endpoints` (rank -> endpoint) repairs each rank's gaps from its own ROUTER.
  it("replay_endpoints: a gap on one rank is repaired from that rank's replay ROUTER", async () => {
    const d = await daemon();
    const [p0, p1] = [await engine(), await engine()];
    const r = await call(d, "POST", "/workers", {
      worker_id: 8,
      endpoint: "http://w8",
      block_size: BS,
      data_parallel_size: 2,
      kv_events_endpoints: { "0": p0.endpoint, "1": p1.endpoint },
      replay_endpoints: { "0": p0.replayEndpoint, "1": p1.replayEndpoint },
    });
    expect(r.json).toMatchObject({ lifecycle: "schedulable", replay_endpoints: { "0": p0.replayEndpoint, "1": p1.replayEndpoint } });
    await Promise.all([p0.waitForSubscribers(1), p1.waitForSubscribers(1)]);
    const toks = prompt(3, 9);
    const batch = (b: number): Buffer => packMsgpack({ ts: b, events: [vllmStored([BigInt(300 + b)], b === 0 ? null : BigInt(299 + b), block(toks, b))], data_parallel_rank: 1 });
    await p1.publishPayload(batch(0));
    await p1.publishPayload(batch(1), { deliver: false });
    await p1.publishPayload(batch(2));
    await waitFor(async () => (await overlapOn(d, 8, toks)).dp["1"] === 3 * BS, 5_000, "rank 1 repaired");
    expect(p1.replayRequests).toEqual([1n]);
    expect(p0.replayRequests).toEqual([]);
    // The reference's single replay_endpoint stays refused for a multi-rank worker.
    const single = await call(d, "PATCH", "/workers/8", { replay_endpoint: p0.replayEndpoint });
    expect(single.json.lifecycle).toBe("incomplete");
  });
});

describe("engines as they ship today: SGLang (array batches)", () => {
  it("current `[ts, events, attn_dp_rank]` and older `[ts, events]` batches, signed hashes, the minimal positional BlockStored and BlockRemoved", async () => {
    const d = await daemon();
    const pub = await engine();
    await register(d, 2, pub);
    const toks = prompt(2, 5);
    // Python's hash() is signed: negative values arrive as msgpack int64.
    const h0 = -6_917_529_027_641_081_856n;
    const h1 = -1n;
    await pub.publishPayload(packMsgpack([1_700_000_000.25, [["BlockStored", [h0], null, block(toks, 0), BS, null]], 0]));
    await pub.publishPayload(packMsgpack([1_700_000_000.5, [["BlockStored", [h1], h0, block(toks, 1), BS, null]]]));
    await waitOverlap(d, 2, toks, 2 * BS);
    await pub.publishPayload(packMsgpack([1_700_000_001, [["BlockRemoved", [h1]]], 0]));
    await waitOverlap(d, 2, toks, BS);
    await pub.publishPayload(packMsgpack([1_700_000_002, [["AllBlocksCleared"]], 0]));
    await waitOverlap(d, 2, toks, 0);
  });
});
