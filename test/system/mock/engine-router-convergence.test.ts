/**
 * The router's view of a worker converges to the engine's actual cache: mock engines publish their
 * KV events over real ZeroMQ (loopback), the daemon's ingest path (KvIngest -> SelectionService)
 * applies them, and after every wave of requests (with plenty of evictions) the router's overlap
 * for any prompt equals the engine's own match, and its dump holds exactly the engine's blocks.
 */
import { afterEach, describe, expect, it } from "vitest";

import { seededRandom } from "../../../src/core/index.js";
import { computeBlockHashes, computeSequenceHashes } from "../../../src/core/index.js";
import { KvIngest } from "../../../src/ingest/kv-ingest.js";
import { MockKvPublisher } from "../../../src/mock/kv-event-publisher.js";
import { MockEngine } from "../../../src/mock/mock-engine.js";
import { ManualTimers } from "../../../src/core/index.js";
import { SelectionService } from "../../../src/core/index.js";
import { waitFor } from "../../helpers/wait.js";

const BLOCK = 4;
const KV_BLOCKS = 40;
const FAMILIES = 6;

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** Blocks the engine holds that chain back to a first block through cached blocks only: what a router can index. */
function reachableBlocks(engine: MockEngine): Set<bigint> {
  const byHash = new Map(engine.cache.blocks().map((b) => [b.hash, b.parent]));
  const memo = new Map<bigint, boolean>();
  const reachable = (h: bigint): boolean => {
    const known = memo.get(h);
    if (known !== undefined) return known;
    const parent = byHash.get(h);
    const ok = parent === undefined ? false : parent === null ? true : reachable(parent);
    memo.set(h, ok);
    return ok;
  };
  return new Set([...byHash.keys()].filter(reachable));
}

describe("mock engine -> KV events -> router index", () => {
  it("keeps the router's overlap and dump equal to the engines' caches through evictions", async () => {
    const timers = new ManualTimers();
    const svc = new SelectionService({});
    let applied = 0;
    const ingest = new KvIngest({
      onBatch: (ref, batch) => {
        svc.applyKvEvents(BigInt(ref.workerId), ref.rank, batch);
        applied++;
      },
      onReset: (ref) => {
        svc.clearWorkerKv(BigInt(ref.workerId), ref.rank);
      },
    });
    cleanups.push(() => ingest.close());

    const engines: MockEngine[] = [];
    for (const workerId of [1n, 2n]) {
      const pub = await MockKvPublisher.create();
      cleanups.push(() => pub.close());
      svc.upsertWorker({ worker_id: workerId, endpoint: `mock://${workerId}`, block_size: BLOCK, kv_events_endpoint: pub.endpoint, replay_endpoint: pub.replayEndpoint ?? undefined });
      await ingest.upsert(String(workerId), [{ rank: 0, endpoint: pub.endpoint, replayEndpoint: pub.replayEndpoint }]);
      await pub.waitForSubscribers(1);
      const engine = new MockEngine({
        workerId,
        blockSize: BLOCK,
        kvBlocks: KV_BLOCKS,
        maxBatchTokens: 24,
        clock: timers,
        timers,
        events: { publish: (events, dpRank, ts) => pub.publish(events, { dpRank, ts }) },
      });
      cleanups.push(() => {
        engine.close();
        return Promise.resolve();
      });
      engines.push(engine);
    }

    const rng = seededRandom(11);
    let unique = 1_000_000;
    const family = (f: number, blocks: number): number[] => Array.from({ length: blocks * BLOCK }, (_, i) => f * 10_000 + i);
    const makePrompt = (): Uint32Array => {
      const f = Math.floor(rng.next() * FAMILIES);
      const shared = family(f, 2 + Math.floor(rng.next() * 6));
      const own = Array.from({ length: (1 + Math.floor(rng.next() * 3)) * BLOCK + Math.floor(rng.next() * BLOCK) }, () => unique++);
      return Uint32Array.from([...shared, ...own]);
    };
    const probes = [...Array.from({ length: FAMILIES }, (_, f) => Uint32Array.from(family(f, 8))), makePrompt(), makePrompt()];
    const published = (): number => engines.reduce((n, e) => n + e.stats().batchesPublished, 0);

    const check = (): void => {
      for (const probe of [...probes, ...recent]) {
        const seq = computeSequenceHashes(computeBlockHashes(probe, BLOCK));
        const rows = svc.overlapScores({ token_ids: probe }).workers;
        for (const engine of engines) {
          const routerBlocks = rows.find((r) => r.worker_id === engine.workerId)?.device_blocks ?? 0;
          expect(routerBlocks, `worker ${engine.workerId}`).toBe(engine.cache.match(seq));
        }
      }
      const dump = svc.dump()["default:default"]?.events ?? [];
      for (const engine of engines) {
        const indexed = new Set(dump.filter((e) => e.worker_id === engine.workerId).flatMap((e) => e.block_hashes));
        expect(indexed).toEqual(reachableBlocks(engine));
      }
    };

    let recent: Uint32Array[] = [];
    for (let wave = 0; wave < 25; wave++) {
      recent = [];
      const inFlight = engines.flatMap((engine) =>
        Array.from({ length: 1 + Math.floor(rng.next() * 3) }, (_, i) => {
          const tokens = makePrompt();
          recent.push(tokens);
          return engine.submit({ requestId: `w${wave}-${engine.workerId}-${i}`, tokens, outputTokens: 1 + Math.floor(rng.next() * 5) });
        }),
      );
      timers.runAll();
      await Promise.all(inFlight);
      const want = published();
      await waitFor(() => applied === want, 5_000, () => `router applied ${applied}/${want} batches`);
      check();
    }

    const totals = engines.map((e) => e.stats());
    // The scenario must actually exercise evictions and prefix hits, or it proves nothing.
    expect(totals.reduce((n, s) => n + s.evictions, 0)).toBeGreaterThan(100);
    expect(totals.reduce((n, s) => n + s.cachedTokens, 0)).toBeGreaterThan(0);
    expect(svc.stats.kvEventsDropped).toBe(0);
    expect(ingest.stats().every((r) => r.stats.lost === 0 && r.stats.malformed === 0)).toBe(true);
  });
});
