/**
 * Fault scenario 7 (#17): a buggy or hostile engine's KV events into one real replica, each kind
 * bounded in count and time, while a prober keeps calling /select. Reports the replica's RSS
 * before and after, the event-loop lag (the replica's nodejs_eventloop_lag_max_seconds and the
 * prober's slowest /select), the errors /select returned, and the ingest counters:
 * - F8: 5,000 blocks into a worker registered with total_kv_blocks 100; one 500,000-hash message;
 * - F10: a publisher alternating seq 0 and 1;
 * - F11: a parent-hash cycle (A, B under A, A under B).
 */
import { packMsgpack, MockKvPublisher } from "../../src/mock/kv-event-publisher.js";
import { rankIndexBound } from "../../src/core/index.js";
import { MAX_RESETS_PER_WINDOW } from "../../src/ingest/reset-damper.js";
import { freePortPair } from "../../src/bench/ports.js";
import { metricSum } from "../../src/bench/router-client.js";
import { check, figureMs, type ScenarioRow } from "./fault-scenarios.js";
import { httpCall, rssOf, sleep, startReplica, stopReplica, timeUntil, type Replica } from "./replica-cluster.js";

export interface HostileOptions {
  /** Blocks stored into the total_kv_blocks-100 worker, in messages of 500. */
  readonly floodBlocks: number;
  /** Hashes of the one oversized message. */
  readonly hugeHashes: number;
  /** Messages alternating seq 0 and 1. */
  readonly flapMessages: number;
  readonly timeoutMs: number;
}

export const HOSTILE_SHORT: HostileOptions = { floodBlocks: 5_000, hugeHashes: 500_000, flapMessages: 200, timeoutMs: 20_000 };
export const HOSTILE_LONG: HostileOptions = { floodBlocks: 50_000, hugeHashes: 500_000, flapMessages: 5_000, timeoutMs: 60_000 };

const BS = 16;
/** Messages published before the scenario waits for the replica to have applied them. */
const PUBLISH_STEP_MESSAGES = 500;
const TOTAL_KV_BLOCKS = 100;
/** Target for the slowest /select the prober sees while the replica ingests all of it (a reported figure, not a check). */
const MAX_SELECT_MS = 500;
/**
 * RSS the first round may add to the replica: 96 MiB. The oversized message (~30 MB of msgpack,
 * refused unread) stays in ZeroMQ's receive buffer, external memory of the ingest thread, until
 * that thread's GC frees it, and both threads' heaps grow with the 50,000-block flood: 63-70 MiB
 * on main at b3d85d9 (3 runs, load 1.9-4.7), past the 64 MiB this was when ingest ran on the main
 * thread (43 MiB then).
 */
const MAX_RSS_GROWTH_BYTES = 96 * 1024 * 1024;
/** RSS a second round of the same flood and oversized message may add: a leak would add the first round's again. */
const MAX_RSS_REGROWTH_BYTES = 16 * 1024 * 1024;
const FLOOD_MESSAGE_BLOCKS = 500;

const storedEvent = (hashes: bigint[], parent: bigint | null, seed: number): Record<string, unknown> => ({
  type: "BlockStored",
  block_hashes: hashes,
  parent_block_hash: parent,
  token_ids: Array.from({ length: hashes.length * BS }, (_, i) => (seed * 7_919 + i) % 100_000),
  block_size: BS,
  lora_id: null,
  medium: "GPU",
  lora_name: null,
});
const message = (events: unknown[]): Buffer => packMsgpack({ ts: 1, events, data_parallel_rank: 0 });
const hashes = (start: number, n: number): bigint[] => Array.from({ length: n }, (_, i) => (1n << 40n) + BigInt(start + i));

export async function scenarioHostileInputs(o: HostileOptions = HOSTILE_SHORT): Promise<ScenarioRow> {
  let r: Replica | undefined;
  let pub: MockKvPublisher | undefined;
  const latencies: number[] = [];
  const errors = new Map<number, number>();
  let probing = true;
  let published = 0;
  try {
    r = await startReplica({ name: "H", syncPort: await freePortPair(), args: ["--session-affinity-ttl-secs", "600"] });
    const replica = r;
    pub = await MockKvPublisher.create();
    const res = await httpCall(replica, "POST", "/workers", { worker_id: 1, endpoint: "http://w1", block_size: BS, total_kv_blocks: TOTAL_KV_BLOCKS, kv_events_endpoint: pub.endpoint });
    if (res.status !== 201) throw new Error(`POST /workers: ${res.status} ${res.text}`);
    await pub.waitForSubscribers(1);
    // Built before probing: packing 500,000 hashes here would stall this process, not the replica.
    const flood = Array.from({ length: Math.ceil(o.floodBlocks / FLOOD_MESSAGE_BLOCKS) }, (_, k) => message([storedEvent(hashes(k * FLOOD_MESSAGE_BLOCKS, FLOOD_MESSAGE_BLOCKS), null, k)]));
    const huge = message([storedEvent(hashes(10_000_000, o.hugeHashes), null, 1)]);
    const flap = message([{ type: "BlockRemoved", block_hashes: [1], medium: "GPU" }]);
    const [a, b] = [0xa0n, 0xb0n];
    const cycle = [storedEvent([a], null, 1_000_001), storedEvent([b], a, 1_000_002), storedEvent([a], b, 1_000_001)].map((ev) => message([ev]));
    const rssBefore = rssOf(replica.pid);

    const prober = (async () => {
      const body = { token_ids: Array.from({ length: 4 * BS }, (_, i) => i) };
      while (probing) {
        const t0 = performance.now();
        const s = await httpCall(replica, "POST", "/select", body).then((x) => x.status, () => 0);
        latencies.push(performance.now() - t0);
        if (s !== 200) errors.set(s, (errors.get(s) ?? 0) + 1);
        await sleep(10);
      }
    })();

    let metrics = "";
    const readMetrics = async (): Promise<string> => (metrics = (await httpCall(replica, "GET", "/metrics")).text);
    const ingested = (n: number): Promise<number> =>
      timeUntil(async () => metricSum(await readMetrics(), "kvmesh_kv_batches_applied_total") >= n, o.timeoutMs, `${n} messages to be ingested`);
    // Published in steps the replica has taken before the next: a PUB drops what passes its
    // high-water mark (1,000 messages) when the subscriber falls behind, and the scenario counts.
    const paced = async (applied: number): Promise<void> => {
      if (published % PUBLISH_STEP_MESSAGES === 0) await ingested(applied);
    };
    // F8: the index bound.
    for (const payload of flood) {
      await pub.publishPayload(payload);
      published++;
      await paced(published);
    }
    // F8: one message far past the per-message caps.
    await pub.publishPayload(huge);
    published++;
    // Every message but the oversized one, which is refused before decoding.
    await ingested(published - 1);
    const indexBlocks = metricSum(metrics, "kvmesh_index_blocks");
    // F10: flapping between seq 0 and 1.
    for (let i = 0; i < o.flapMessages; i++) {
      await pub.publishPayload(flap, { seq: BigInt(i % 2) });
      published++;
      await paced(published - 1);
    }
    // F11: A, B under A, A under B.
    for (const payload of cycle) {
      await pub.publishPayload(payload);
      published++;
    }

    await ingested(published - 1);
    await sleep(200);
    const firstRound = await readMetrics();
    const rssAfter = rssOf(replica.pid);
    // Bounded, not only small: the flood and the oversized message once more. A leak would add
    // the first round's tens of MiB again; held buffers and heap already grown are reused.
    for (const payload of flood) {
      await pub.publishPayload(payload);
      published++;
      await paced(published - 1);
    }
    await pub.publishPayload(huge);
    published++;
    await ingested(published - 2);
    await sleep(200);
    const rssAgain = rssOf(replica.pid);
    probing = false;
    await prober;

    const m = (name: string): number => metricSum(firstRound, name);
    const bound = rankIndexBound(TOTAL_KV_BLOCKS);
    const resets = m("kvmesh_kv_publisher_resets_total");
    const damped = m("kvmesh_kv_publisher_resets_damped_total");
    const slowestMs = Math.max(0, ...latencies);
    const lagMaxMs = m("nodejs_eventloop_lag_max_seconds") * 1_000;
    const errorCount = [...errors.values()].reduce((x, y) => x + y, 0);
    const summary =
      `RSS ${(rssBefore / 2 ** 20).toFixed(0)} -> ${(rssAfter / 2 ** 20).toFixed(0)} MiB (after a second round ${(rssAgain / 2 ** 20).toFixed(0)} MiB), event-loop lag max ${lagMaxMs.toFixed(0)} ms, ` +
      `/select ${latencies.length} calls, slowest ${slowestMs.toFixed(0)} ms, errors ${errorCount === 0 ? "none" : JSON.stringify(Object.fromEntries(errors))}; ` +
      `index ${indexBlocks} blocks after the flood (bound ${bound}), shed ${m("kvmesh_kv_index_blocks_shed_total")}, oversized messages ${m("kvmesh_kv_batches_oversized_total")}, ` +
      `resets ${resets} (damped ${damped}), cycles ${m("kvmesh_kv_parent_cycles_total")}`;
    return {
      scenario: "7. hostile KV inputs",
      requests: published + latencies.length,
      failures: errorCount,
      convergeMs: null,
      shed: m("kvmesh_kv_index_blocks_shed_total") + m("kvmesh_kv_events_shed_total"),
      gaps: 0,
      snapshots: 0,
      divergence: 0,
      checks: [
        check(`F8: the rank's index stays within its bound (${bound})`, indexBlocks <= bound, indexBlocks),
        check("F8: the oversized message is refused and counted", m("kvmesh_kv_batches_oversized_total") >= 1, m("kvmesh_kv_batches_oversized_total")),
        check(`F10: at most ${MAX_RESETS_PER_WINDOW} resets clear the rank, the rest are damped`, resets - damped <= MAX_RESETS_PER_WINDOW && damped > 0, { resets, damped }),
        check("F11: the parent-hash cycle is refused and counted", m("kvmesh_kv_parent_cycles_total") === 1, m("kvmesh_kv_parent_cycles_total")),
        check("/select never failed", errorCount === 0, Object.fromEntries(errors)),
        check("/select was answered while the replica ingested", latencies.length > 0, `${latencies.length} calls`),
        check(`RSS grew less than ${MAX_RSS_GROWTH_BYTES / 2 ** 20} MiB`, rssAfter - rssBefore < MAX_RSS_GROWTH_BYTES, `${((rssAfter - rssBefore) / 2 ** 20).toFixed(1)} MiB`),
        check(`RSS bounded: a second round added less than ${MAX_RSS_REGROWTH_BYTES / 2 ** 20} MiB`, rssAgain - rssAfter < MAX_RSS_REGROWTH_BYTES, `${((rssAgain - rssAfter) / 2 ** 20).toFixed(1)} MiB`),
      ],
      figures: [figureMs("slowest /select while the replica ingested", latencies.length === 0 ? null : slowestMs, MAX_SELECT_MS)],
      details: { summary, rssBefore, rssAfter, rssAgain, lagMaxMs, slowestSelectMs: slowestMs, selects: latencies.length, errors: Object.fromEntries(errors), published },
    };
  } finally {
    probing = false;
    await stopReplica(r);
    await pub?.close();
  }
}
