/**
 * The predicted cache in a replica's snapshot (issue 25): what a joining or restarted replica
 * takes from its peers besides their bookings and bindings.
 *
 * Without KV events the predicted cache IS the cache (the approximate mode, 120 s by default): a
 * replica that restarts would otherwise route the next turn of every conversation booked in the
 * last two minutes on load alone, until new bookings refill it. Bookings still in flight already
 * travel (an exact peer's add, an aggregate peer's `ah` column); what a snapshot adds is the
 * predictions of bookings already freed, each with the time it has left, so it expires on the
 * joiner when it does on its peers.
 *
 * Rows name their rank by (worker_id, dp_rank): rank keys are this replica's own numbering. A row
 * whose worker is not known here (not registered yet, or gone) is counted and skipped.
 */
import type { Fleet } from "./fleet.js";
import type { HashList } from "./hash64.js";
import { hashCount } from "./hash64.js";
import type { ServiceCounters } from "./service-stats.js";
import type { WorkerId } from "./types.js";

/** One booking's predicted checkpoints on one rank, with the time they have left. */
export interface PredictionSnapshotRow {
  readonly worker_id: WorkerId;
  readonly dp_rank: number;
  /** Time left before the prediction expires on the sender, ms (> 0). */
  readonly ttl_ms: number;
  /** Checkpoint sequence hashes (predicted-cache.ts predictionOf). */
  readonly hashes: HashList;
}

/**
 * Checkpoint pairs one snapshot carries at most, newest first: 262,144 (2 MiB of hashes, ~2.4 MB
 * encoded) is 120 s of approximate cache at ~66 bookings/s of 512-block prompts (33 checkpoints
 * each). Past it the oldest are left out (counted: kvmesh_predicted_blocks_snapshot_left_total);
 * they are the ones nearest their expiry.
 */
export const MAX_SNAPSHOT_PREDICTED_PAIRS = 262_144;

/** This replica's predictions of every partition, newest first, at most `maxPairs` pairs. */
export function exportPredictions(fleet: Fleet, counters: ServiceCounters, maxPairs = MAX_SNAPSHOT_PREDICTED_PAIRS): PredictionSnapshotRow[] {
  const rows: PredictionSnapshotRow[] = [];
  let budget = maxPairs;
  for (const p of fleet.partitions()) {
    if (!p.predicted.enabled || p.predicted.size === 0) continue;
    const { rows: part, left } = p.predicted.exportRecords(budget);
    counters.predictedSnapshotLeft += left;
    for (const r of part) {
      budget -= hashCount(r.hashes);
      // Whole ms on the wire (the clock reads fractions); a live record has > 0 left.
      rows.push({ worker_id: p.ranks.workerOf(r.rank), dp_rank: p.ranks.dpRankOf(r.rank), ttl_ms: Math.ceil(r.ttlMs), hashes: r.hashes });
    }
  }
  return rows;
}

/** A peer's predictions, added to what is held (predictions are not per origin: a merge, never a replace). Returns the rows taken. */
export function installPredictions(fleet: Fleet, counters: ServiceCounters, rows: readonly PredictionSnapshotRow[]): number {
  let taken = 0;
  for (const row of rows) {
    const located = fleet.locateRank(row.worker_id, row.dp_rank);
    if (located === undefined) {
      counters.predictedSnapshotUnplaced++;
      continue;
    }
    const { partition: p, rank } = located;
    if (!p.predicted.enabled) continue;
    if (p.predicted.add(rank, row.hashes, row.ttl_ms)) taken++;
  }
  return taken;
}
