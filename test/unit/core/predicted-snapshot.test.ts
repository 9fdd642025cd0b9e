/**
 * The predicted cache in snapshots (src/core/predicted-snapshot.ts): a replica that joins (or
 * restarts) takes its peers' predictions, freed bookings' included, each with the time it has
 * left; rows for workers it does not know are counted and skipped; the bound is counted.
 */
import { describe, expect, it } from "vitest";
import { ManualClock, seededRandom, SelectionService } from "../../../src/core/index.js";
import type { Fleet } from "../../../src/core/fleet.js";
import { PredictedCache } from "../../../src/core/predicted-cache.js";
import { exportPredictions } from "../../../src/core/predicted-snapshot.js";
import { RankRegistry } from "../../../src/core/rank-registry.js";
import { ServiceCounters } from "../../../src/core/service-stats.js";
import { BLOCK, tokens, worker } from "../../helpers/core-fixtures.js";

const APPROX_TTL_MS = 120_000;

function replica(id: number, clock: ManualClock, ttlMs = APPROX_TTL_MS): SelectionService {
  const s = new SelectionService({ clock, random: seededRandom(40 + id), replicaId: BigInt(id), wallClockNs: () => 5_000n, predictedCache: { ttlMs } });
  for (const w of [1, 2, 3, 4]) s.upsertWorker(worker(w));
  return s;
}

/** Conversations booked and freed on `a`: prompt seed -> the worker it went to. */
function routeAndFree(a: SelectionService, seeds: readonly number[]): Map<number, bigint> {
  const placed = new Map<number, bigint>();
  for (const seed of seeds) {
    const r = a.selectAndReserve({ token_ids: tokens(40, seed), selection_id: `r${seed}` });
    placed.set(seed, r.worker_id);
    a.freeReservation(`r${seed}`);
  }
  return placed;
}

describe("predicted cache in snapshots", () => {
  it("a restarted replica routes a freed conversation's next turn where its peer predicts it", () => {
    const clock = new ManualClock(1_000);
    const a = replica(1, clock);
    const seeds = [1, 2, 3, 4, 5, 6, 7, 8];
    const placed = routeAndFree(a, seeds);
    expect(new Set(placed.values()).size).toBeGreaterThan(1);
    clock.advance(30_000);

    const fresh = replica(2, clock);
    // Before: the fresh replica sees no overlap for any of them.
    for (const seed of seeds) expect(fresh.select({ token_ids: tokens(44, seed) }).overlap.gpu).toBe(0);
    const snap = a.replication.snapshot();
    expect(snap.predictions?.length).toBe(seeds.length);
    fresh.replication.install(1n, snap);
    for (const seed of seeds) {
      const r = fresh.select({ token_ids: tokens(44, seed) });
      expect(r.worker_id).toBe(placed.get(seed));
      expect(r.overlap.gpu).toBe(40 * BLOCK);
    }
    // They expire on the joiner when they do on the peer (120 s after booking, 30 s of it gone).
    clock.advance(APPROX_TTL_MS - 30_000 + 1);
    expect(fresh.select({ token_ids: tokens(44, 1) }).overlap.gpu).toBe(0);
  });

  it("skips and counts rows for workers this replica does not know; a replica with predictions off takes none", () => {
    const clock = new ManualClock(1_000);
    const a = replica(1, clock);
    a.upsertWorker(worker(9));
    // Book until worker 9 holds a prediction (the least loaded worker takes each new prompt).
    for (let seed = 1; seed <= 5; seed++) a.selectAndReserve({ token_ids: tokens(20, seed), selection_id: `r${seed}` });
    const snap = a.replication.snapshot();
    expect(snap.predictions?.some((r) => r.worker_id === 9n)).toBe(true);
    const b = replica(2, clock);
    // Without the catalogue's part (a joiner sees workers before predictions; this one never heard of 9).
    b.replication.install(1n, { ...snap, catalog: [] });
    expect(b.stats.predictedSnapshotUnplaced).toBe(snap.predictions?.filter((r) => r.worker_id === 9n).length);
    const off = replica(3, clock, 0);
    off.replication.install(1n, snap);
    expect(off.stats.predictedBlocksAdded).toBe(0);
    expect(off.replication.snapshot().predictions).toBeUndefined();
  });

  it("a snapshot lists the newest first, with the time each has left", () => {
    const clock = new ManualClock(1_000);
    const a = replica(1, clock);
    routeAndFree(a, [1, 2, 3]);
    clock.advance(1_000);
    routeAndFree(a, [4]);
    const rows = a.replication.snapshot().predictions ?? [];
    expect(rows.length).toBe(4);
    expect(rows[0]?.ttl_ms).toBe(APPROX_TTL_MS);
    expect(rows.slice(1).every((r) => r.ttl_ms === APPROX_TTL_MS - 1_000)).toBe(true);
  });

  it("past its bound a snapshot leaves the oldest out, and counts them", () => {
    const clock = new ManualClock(1_000);
    const counters = new ServiceCounters();
    const cache = new PredictedCache(clock, counters, { ttlMs: APPROX_TTL_MS, maxBlocksPerRank: 1_000 });
    const ranks = new RankRegistry();
    const r7 = ranks.intern(7n, 0);
    cache.add(r7, Uint32Array.of(1, 1, 2, 2));
    clock.advance(10);
    cache.add(r7, Uint32Array.of(3, 3));
    const partition = { predicted: cache, ranks };
    const fleet = { partitions: () => [partition][Symbol.iterator]() } as unknown as Fleet;
    const rows = exportPredictions(fleet, counters, 2);
    expect(rows.map((r) => [r.worker_id, r.dp_rank, r.hashes.length / 2])).toEqual([[7n, 0, 1]]);
    expect(counters.predictedSnapshotLeft).toBe(2);
  });
});
