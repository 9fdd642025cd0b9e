import { describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/index.js";
import { hashListToBigInts } from "../../../src/core/index.js";
import { computeBlockHashes, computeSequenceHashes } from "../../../src/core/index.js";
import type { MockKvEvent } from "../../../src/mock/kv-event-publisher.js";
import { MockEngine, type EngineResult, type EngineStepInfo, type MockEngineConfig } from "../../../src/mock/mock-engine.js";
import { ManualTimers, type Timers } from "../../../src/core/index.js";

const BLOCK = 4;

/** Distinct prompts: `base` picks the content, so equal bases share prefixes. */
const prompt = (length: number, base = 1): Uint32Array => Uint32Array.from({ length }, (_, i) => base * 100_000 + i);

interface Harness {
  engine: MockEngine;
  timers: ManualTimers;
  steps: EngineStepInfo[];
  batches: MockKvEvent[][];
}

function harness(config: Partial<MockEngineConfig> = {}): Harness {
  const timers = new ManualTimers();
  const steps: EngineStepInfo[] = [];
  const batches: MockKvEvent[][] = [];
  const engine = new MockEngine({
    workerId: 7n,
    blockSize: BLOCK,
    kvBlocks: 64,
    maxBatchTokens: 16,
    prefillMsPerToken: 1,
    decodeMsPerToken: 10,
    // The linear model the timings below are worked out with; step-time.test.ts covers the rest.
    prefillMsPerTokenPair: 0,
    decodeMsPerSequence: 0,
    decodeMsPerContextToken: 0,
    clock: timers,
    timers,
    events: {
      publish: (events) => {
        batches.push([...events]);
        return undefined;
      },
    },
    onStep: (s) => steps.push(s),
    ...config,
  });
  return { engine, timers, steps, batches };
}

/** Runs the engine's timers until every promise settled. */
async function settle<T>(h: Harness, promises: Promise<T>[]): Promise<T[]> {
  h.timers.runAll();
  return Promise.all(promises);
}

describe("MockEngine scheduler", () => {
  it("keeps every step within the token budget, chunking long prefills", async () => {
    const h = harness();
    const results = await settle(h, [
      h.engine.submit({ requestId: "a", tokens: prompt(40, 1), outputTokens: 3 }),
      h.engine.submit({ requestId: "b", tokens: prompt(10, 2), outputTokens: 2 }),
      h.engine.submit({ requestId: "c", tokens: prompt(6, 3), outputTokens: 1 }),
    ]);
    for (const s of h.steps) expect(s.prefillTokens + (s.decodeSteps > 0 ? s.decodeRequests : 0)).toBeLessThanOrEqual(16);
    // a's 40 tokens take three steps (16 + 16 + 8); b and c wait behind it in FIFO order.
    expect(h.steps.slice(0, 3).map((s) => s.prefillTokens)).toEqual([16, 16, 16]);
    expect(h.steps[0]?.admitted).toBe(1);
    expect(h.steps[2]?.admitted).toBe(1);
    expect(results.map((r) => r.promptTokens)).toEqual([40, 10, 6]);
    expect(results.map((r) => r.outputTokens)).toEqual([3, 2, 1]);
    const stats = h.engine.stats();
    expect(stats).toMatchObject({ requests: 3, submitted: 3, running: 0, waiting: 0, promptTokens: 56, cachedTokens: 0 });
    // Nothing is pinned once everything finished; the prompts' full blocks stay cached.
    expect(stats.kvPinnedBlocks).toBe(0);
    expect(stats.kvCachedBlocks).toBe(10 + 2 + 1);
  });

  it("grows TTFT with queueing: later requests wait for the ones ahead", async () => {
    const h = harness({ maxBatchTokens: 8 });
    const results = await settle(
      h,
      [1, 2, 3, 4].map((b) => h.engine.submit({ requestId: `r${b}`, tokens: prompt(8, b), outputTokens: 1 })),
    );
    // One 8-token prefill per 8 ms step: TTFT 8, 16, 24, 32 ms, all of it queueing but the last 8.
    expect(results.map((r) => r.ttftMs)).toEqual([8, 16, 24, 32]);
    expect(results.map((r) => r.queueMs)).toEqual([0, 8, 16, 24]);
    expect(results.map((r) => r.prefillMs)).toEqual([8, 8, 8, 8]);
    for (const r of results) expect(r.ttftMs).toBe(r.queueMs + r.prefillMs);
  });

  it("shortens the prefill by the cached prefix (and recomputes the last token of a fully cached prompt)", async () => {
    const h = harness({ maxBatchTokens: 1_000 });
    const base = prompt(64, 5);
    const [cold] = await settle(h, [h.engine.submit({ requestId: "cold", tokens: base, outputTokens: 1 })]);
    expect(cold).toMatchObject({ cachedTokens: 0, prefillMs: 64 });

    const extended = Uint32Array.from([...base, ...prompt(8, 6)]);
    const [warm] = await settle(h, [h.engine.submit({ requestId: "warm", tokens: extended, outputTokens: 1 })]);
    expect(warm).toMatchObject({ promptTokens: 72, cachedTokens: 64, prefillMs: 8 });

    const [fresh] = await settle(h, [h.engine.submit({ requestId: "fresh", tokens: prompt(72, 7), outputTokens: 1 })]);
    expect(fresh).toMatchObject({ cachedTokens: 0, prefillMs: 72 });

    // The same 64 tokens again: the last block is recomputed, as vLLM does, so 60 tokens hit.
    const [again] = await settle(h, [h.engine.submit({ requestId: "again", tokens: base, outputTokens: 1 })]);
    expect(again).toMatchObject({ cachedTokens: 60, prefillMs: 4 });
    expect(h.engine.stats().hitRatio).toBeCloseTo((64 + 60) / (64 + 72 + 72 + 64), 10);
  });

  it("scales wall time by the speedup while reporting trace time", async () => {
    const run = async (speedup: number): Promise<{ result: EngineResult; wallMs: number }> => {
      const h = harness({ speedup });
      const [result] = await settle(h, [h.engine.submit({ requestId: "x", tokens: prompt(16, 1), outputTokens: 5 })]);
      return { result: result as EngineResult, wallMs: h.timers.now() };
    };
    const slow = await run(1);
    const fast = await run(10);
    // 16 prefill tokens (16 ms) then 4 decode steps (40 ms), in trace time either way.
    expect(slow.result).toMatchObject({ ttftMs: 16, totalMs: 56 });
    expect(fast.result.ttftMs).toBeCloseTo(16, 9);
    expect(fast.result.totalMs).toBeCloseTo(56, 9);
    expect(slow.wallMs).toBeCloseTo(56, 9);
    expect(fast.wallMs).toBeCloseTo(5.6, 9);
  });

  it("keeps the engine's timeline when the host fires its timers late", async () => {
    const run = async (lateMs: number): Promise<{ results: EngineResult[]; maxLagMs: number }> => {
      const timers = new ManualTimers();
      // Every timer fires `lateMs` after it was due, as on an overloaded host.
      const late: Pick<Timers, "setTimeout"> = { setTimeout: (fn, ms) => timers.setTimeout(fn, ms + lateMs) };
      const engine = new MockEngine({ workerId: 1n, blockSize: BLOCK, kvBlocks: 64, maxBatchTokens: 16, prefillMsPerToken: 1, decodeMsPerToken: 10, clock: timers, timers: late });
      const promises = [prompt(40, 1), prompt(12, 2), prompt(20, 3)].map((tokens, i) => engine.submit({ requestId: `r${i}`, tokens, outputTokens: 4 + i }));
      timers.runAll();
      return { results: await Promise.all(promises), maxLagMs: engine.stats().maxLagMs };
    };
    const punctual = await run(0);
    const late = await run(7);
    expect(late.results).toEqual(punctual.results);
    expect(punctual.maxLagMs).toBe(0);
    expect(late.maxLagMs).toBeGreaterThanOrEqual(7);
  });

  it("runs a decode stretch as one timer but admits a new request at the next step boundary", async () => {
    const h = harness({ maxBatchTokens: 64 });
    const firstTokens: string[] = [];
    const a = h.engine.submit({ requestId: "a", tokens: prompt(8, 1), outputTokens: 100, onFirstToken: () => firstTokens.push(`a@${h.timers.now()}`) });
    h.timers.advance(63);
    // a: first token at 8 ms, then one decode step per 10 ms; b arrives inside the step [58, 68).
    const b = h.engine.submit({ requestId: "b", tokens: prompt(8, 2), outputTokens: 3, onFirstToken: () => firstTokens.push(`b@${h.timers.now()}`) });
    const [ra, rb] = await settle(h, [a, b]);
    expect(firstTokens).toEqual(["a@8", "b@86"]);
    // b waits for the boundary at 68, then shares a step with a's decode: 8 prefill ms + 10 decode ms.
    expect(rb).toMatchObject({ queueMs: 5, prefillMs: 18, ttftMs: 23, totalMs: 43 });
    // a: 8 tokens by 86 ms, then 92 more decode steps.
    expect(ra?.totalMs).toBe(86 + 92 * 10);
    // The stretch before b arrived was one step, not 5.
    expect(h.steps.filter((s) => s.decodeSteps > 1).length).toBeGreaterThanOrEqual(2);
    expect(h.engine.stats().steps).toBeLessThan(20);
  });

  it("publishes BlockStored chained to the parent, and BlockRemoved for evictions, one batch per step", async () => {
    const h = harness({ kvBlocks: 6, maxBatchTokens: 8 });
    const p1 = prompt(16, 1);
    await settle(h, [h.engine.submit({ requestId: "p1", tokens: p1, outputTokens: 1 })]);
    const seq1 = hashListToBigInts(computeSequenceHashes(computeBlockHashes(p1, BLOCK)));
    // 16 tokens in two 8-token steps: blocks 0-1, then 2-3 chained to block 1.
    expect(h.batches).toHaveLength(2);
    expect(h.batches[0]).toEqual([{ type: "stored", blockHashes: seq1.slice(0, 2), parentHash: null, tokenIds: [...p1.subarray(0, 8)], blockSize: BLOCK, medium: "GPU" }]);
    expect(h.batches[1]).toEqual([{ type: "stored", blockHashes: seq1.slice(2, 4), parentHash: seq1[1], tokenIds: [...p1.subarray(8, 16)], blockSize: BLOCK, medium: "GPU" }]);

    // A second prompt needs 4 blocks + 1 scratch: with 6 blocks, 3 of p1's must go (leaves first).
    h.batches.length = 0;
    const p2 = prompt(16, 2);
    await settle(h, [h.engine.submit({ requestId: "p2", tokens: p2, outputTokens: 1 })]);
    const seq2 = hashListToBigInts(computeSequenceHashes(computeBlockHashes(p2, BLOCK)));
    const removed = h.batches.flat().filter((e) => e.type === "removed").flatMap((e) => e.blockHashes);
    expect(removed).toEqual([seq1[3], seq1[2], seq1[1]]);
    const stored = h.batches.flat().filter((e) => e.type === "stored").flatMap((e) => e.blockHashes);
    expect(stored).toEqual(seq2);
    expect(h.engine.cache.match(computeSequenceHashes(computeBlockHashes(p1, BLOCK)))).toBe(1);
    expect(h.engine.stats()).toMatchObject({ evictions: 3, eventsPublished: 6, batchesPublished: 4 });
  });

  it("rejects what can never run and what is malformed, and rejects pending requests on close", async () => {
    const h = harness({ kvBlocks: 4 });
    const tooBig = h.engine.submit({ requestId: "big", tokens: prompt(20, 1), outputTokens: 1 });
    const fits = h.engine.submit({ requestId: "ok", tokens: prompt(8, 2), outputTokens: 4 });
    h.timers.runAll();
    await expect(tooBig).rejects.toThrow(/needs 6 KV blocks, engine 7\/0 holds 4/);
    await expect(fits).resolves.toMatchObject({ requestId: "ok" });
    expect(h.engine.stats().rejected).toBe(1);

    await expect(h.engine.submit({ requestId: "empty", tokens: new Uint32Array(0), outputTokens: 1 })).rejects.toThrow(/tokens must not be empty/);
    await expect(h.engine.submit({ requestId: "neg", tokens: prompt(4), outputTokens: -1 })).rejects.toThrow(/outputTokens/);

    const pending = h.engine.submit({ requestId: "late", tokens: prompt(8, 3), outputTokens: 8 });
    h.timers.advance(20);
    h.engine.close();
    const err: unknown = await pending.catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KvmeshError);
    expect((err as KvmeshError).code).toBe("KVMESH_SHUTTING_DOWN");
    expect(h.timers.pending).toBe(0);
    await expect(h.engine.submit({ requestId: "after", tokens: prompt(4), outputTokens: 1 })).rejects.toThrow(/closed/);
  });

  it("waits for KV room instead of overcommitting, and admits once a request frees it", async () => {
    const h = harness({ kvBlocks: 8, maxBatchTokens: 64 });
    // Each needs 4 prompt blocks + 1 scratch (its output): two cannot run at once in 8 blocks.
    const a = h.engine.submit({ requestId: "a", tokens: prompt(16, 1), outputTokens: 3 });
    const b = h.engine.submit({ requestId: "b", tokens: prompt(16, 2), outputTokens: 3 });
    const [ra, rb] = await settle(h, [a, b]);
    expect(ra?.queueMs).toBe(0);
    // a: 16 ms prefill + 2 decode steps = 36 ms; b is admitted by the first step after that.
    expect(rb?.queueMs).toBe(36);
    expect(h.engine.cache.pinnedBlocks).toBe(0);
  });
});
