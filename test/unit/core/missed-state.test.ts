/**
 * Issue 29's G6: a worker change asks the replicator to re-pull only the peers whose load for that
 * worker could not be placed here, and nobody on an idempotent re-registration or a PATCH.
 */
import { describe, expect, it } from "vitest";
import { ManualClock } from "../../../src/core/time.js";
import { seededRandom } from "../../../src/core/random.js";
import type { LoadAggregates, LoadEvent, LoadReplication } from "../../../src/core/replica-events.js";
import { MAX_MISSED_PAIRS, MissedPeerState } from "../../../src/core/replication/missed-state.js";
import { SelectionService } from "../../../src/core/selection-service.js";
import { BLOCK, worker } from "../../helpers/core-fixtures.js";

const PEER = 0x22n;
const OTHER = 0x33n;

/** A service with one link attached, recording what each worker change asks it to re-pull. */
function serviceWithLink(mode: LoadReplication) {
  const s = new SelectionService({ clock: new ManualClock(1_000), random: seededRandom(5), replicaId: 1n, wallClockNs: () => 5_000n, loadReplication: mode });
  const repulls: bigint[][] = [];
  s.replication.attach({ event: () => undefined, workersChanged: (origins) => repulls.push([...origins]) });
  return { s, repulls };
}

const add = (workerId: bigint, id: string, origin = PEER): LoadEvent => ({
  type: "add",
  origin,
  owner: origin,
  request_id: id,
  partition: { model_name: "default", routing_group: "default" },
  worker_id: workerId,
  dp_rank: 0,
  block_size: BLOCK,
  sequence_hashes: new Uint32Array([1, 0, 2, 0]),
  prefill_tokens: 32,
  track_prefill: true,
  prefill_duration_ms: null,
  expected_output_tokens: null,
});

const totals = (workerId: bigint, requests: number): LoadAggregates => ({
  partition: { model_name: "default", routing_group: "default" },
  block_size: BLOCK,
  rows: [{ worker_id: workerId, dp_rank: 0, prefill_tokens: requests * 10, blocks: requests, requests }],
  added: [],
  removed: [],
});

describe("missed peer state: what a worker change re-pulls (G6)", () => {
  it("nothing on a first registration, an identical re-registration or a PATCH when nothing was missed", () => {
    const { s, repulls } = serviceWithLink("exact");
    s.upsertWorker(worker(1));
    for (let i = 0; i < 10; i++) s.upsertWorker(worker(1));
    s.patchWorker(1n, { endpoint: "http://w1-moved" });
    expect(repulls).toEqual([]);
  });

  it("exact: the peer whose booking named an unknown worker, once, when that worker registers", () => {
    const { s, repulls } = serviceWithLink("exact");
    s.upsertWorker(worker(1));
    s.replication.apply(PEER, [{ kind: "load", event: add(2n, "r1") }]);
    s.replication.apply(OTHER, [{ kind: "load", event: add(1n, "r2", OTHER) }]);
    s.upsertWorker(worker(1));
    expect(repulls).toEqual([]);
    s.upsertWorker(worker(2));
    expect(repulls).toEqual([[PEER]]);
    s.upsertWorker(worker(2));
    expect(repulls).toEqual([[PEER]]);
  });

  it("aggregate: a peer's non-zero totals for an unknown worker, from its stream or its snapshot; a zero row is nothing missed", () => {
    const { s, repulls } = serviceWithLink("aggregate");
    s.upsertWorker(worker(1));
    s.replication.apply(PEER, [{ kind: "loads", event: totals(2n, 0) }]);
    s.upsertWorker(worker(2));
    expect(repulls).toEqual([]);
    s.replication.install(OTHER, { bookings: [], bindings: [], aggregates: [totals(3n, 2)] });
    s.upsertWorker(worker(3));
    expect(repulls).toEqual([[OTHER]]);
  });

  it("remembers an origin for every worker past its bound, so nothing is forgotten", () => {
    const m = new MissedPeerState();
    for (let i = 0; i < MAX_MISSED_PAIRS; i++) m.note(PEER, BigInt(i));
    m.note(OTHER, 99_999_999n);
    expect(m.take(123_456_789n)).toEqual([OTHER]);
    expect(m.take(5n)).toEqual([PEER]);
  });
});
