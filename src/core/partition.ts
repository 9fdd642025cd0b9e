/**
 * One routing partition `(model_name, routing_group)`: its prefix index, load ledger, optional
 * session-affinity table, the interned ranks of its workers and the reusable buffers a
 * selection scores candidates in. Created with the first schedulable worker; the fleet deletes
 * it when its last member leaves (src/core/fleet.ts).
 */
import type { AffinityTable } from "./affinity-table.js";
import type { Clock } from "./time.js";
import type { Random } from "./random.js";
import { LoadLedger } from "./load-ledger.js";
import { MirroredLoad } from "./mirrored-load.js";
import { PredictedCache, type PredictedCacheOptions } from "./predicted-cache.js";
import { PrefixIndex } from "./prefix-index.js";
import { RankRegistry } from "./rank-registry.js";
import type { LoadAggregateRow, PartitionRef } from "./replica-events.js";
import { createCandidateTable, type CandidateTable } from "./selector.js";
import { ServiceCounters } from "./service-stats.js";
import type { WorkerCatalogRecord, WorkerId } from "./types.js";
import { ranksOf } from "./worker-catalog.js";
import { ttftOwnPrefillMs, type TtftCostParams } from "./ttft-cost.js";

export interface PartitionMember {
  record: WorkerCatalogRecord;
  /** Rank keys of this worker's dp ranks, in dp-rank order. */
  ranks: number[];
}

/** How replica events name a partition. */
export function partitionRef(p: Partition): PartitionRef {
  return { model_name: p.modelName, routing_group: p.routingGroup };
}

/** One rank's totals as a load-aggregates row names it: by worker id and dp rank, not rank key. */
export function aggregateRow(p: Partition, rank: number, prefillTokens: number, blocks: number, requests: number): LoadAggregateRow {
  return { worker_id: p.ranks.workerOf(rank), dp_rank: p.ranks.dpRankOf(rank), prefill_tokens: prefillTokens, blocks, requests };
}

const PREDICTIONS_OFF: PredictedCacheOptions = { ttlMs: 0, maxBlocksPerRank: 1 };

export class Partition {
  readonly key: string;
  readonly modelName: string;
  readonly routingGroup: string;
  readonly blockSize: number;
  readonly isEagle: boolean;
  readonly index = new PrefixIndex();
  /** In-flight prefixes, and the whole cache of engines without KV events (predicted-cache.ts). */
  readonly predicted: PredictedCache;
  /** This replica's bookings (and, in exact replication, its peers' mirrored bookings). */
  readonly ledger: LoadLedger;
  /** Peers' load as per-(origin, rank) aggregates (aggregate replication; empty in exact mode). */
  readonly mirrored = new MirroredLoad();
  readonly ranks = new RankRegistry();
  readonly members = new Map<WorkerId, PartitionMember>();
  affinity: AffinityTable | undefined;
  /** When the affinity reaper runs next (a quarter of the TTL apart, at most 30 s), clock ms. */
  nextAffinitySweepMs = 0;
  #schedulable: number[] = [];
  readonly #schedulableSet = new Set<number>();
  /**
   * Members changed since the schedulable list was built. The rebuild sorts every member, so it
   * waits for the next read: registering 16,384 workers one by one used to rebuild on each
   * (5.3 ms per registration at the end, 43 s in all); now a burst of registrations costs one.
   */
  #membersChanged = false;
  readonly #scratch = new SelectionScratch();

  /** `prefillTiming`: the ttft model's engine timing, whose prefill estimate decays booked prefill (load-ledger.ts); undefined: the reference's decay. */
  constructor(
    model: string,
    group: string,
    blockSize: number,
    isEagle: boolean,
    clock: Clock,
    random: Random,
    expiryMs: number,
    predicted: PredictedCacheOptions = PREDICTIONS_OFF,
    counters: ServiceCounters = new ServiceCounters(),
    prefillTiming?: TtftCostParams,
  ) {
    this.key = `${model}:${group}`;
    this.modelName = model;
    this.routingGroup = group;
    this.blockSize = blockSize;
    this.isEagle = isEagle;
    const prefillMs =
      prefillTiming === undefined
        ? undefined
        : (prefillTokens: number, promptBlocks: number): number => ttftOwnPrefillMs(prefillTokens, Math.max(0, promptBlocks * blockSize - prefillTokens), prefillTiming);
    this.ledger = new LoadLedger({ clock, random, expiryMs, prefillMs });
    this.predicted = new PredictedCache(clock, counters, predicted);
  }

  /** A rank's prefill tokens still owed, booked here and by peers. */
  activePrefillTokens(rank: number): number {
    return this.ledger.activePrefillTokens(rank) + this.mirrored.prefillTokens(rank);
  }

  /** A rank's active blocks, booked here and by peers. */
  activeBlocks(rank: number): number {
    return this.ledger.activeBlocks(rank) + this.mirrored.blocks(rank);
  }

  /** A rank's requests in flight, booked here and by peers. */
  activeRequests(rank: number): number {
    return this.ledger.activeRequests(rank) + this.mirrored.requests(rank);
  }

  /**
   * LoadLedger.fillCandidateLoads plus peers' aggregates. Peers' blocks are added whole: which
   * of the prompt's blocks they hold is not known here (the exactness trade-off, mirrored-load.ts).
   */
  fillCandidateLoads(candidates: Int32Array, n: number, promptBlocks: number, held: Int32Array, prefillOut: Float64Array, decodeOut: Float64Array, requestsOut: Float64Array): void {
    this.ledger.fillCandidateLoads(candidates, n, promptBlocks, held, prefillOut, decodeOut, requestsOut);
    const m = this.mirrored;
    if (m.loadedRanks > 0) {
      for (let i = 0; i < n; i++) {
        const rank = candidates[i] as number;
        prefillOut[i] = (prefillOut[i] as number) + m.prefillTokens(rank);
        decodeOut[i] = (decodeOut[i] as number) + m.blocks(rank);
        requestsOut[i] = (requestsOut[i] as number) + m.requests(rank);
      }
    }
    if (this.predicted.enabled) this.#joinInflight(candidates, n, promptBlocks, held, prefillOut, decodeOut, requestsOut);
  }

  /**
   * A rank with some of the prompt's blocks in flight (predicted past its index overlap, recently:
   * predicted-cache.ts) is already prefilling them and holds them for other requests: joining adds
   * neither that prefill nor those blocks. Which of its requests share them is not known (peers'
   * aggregates carry no hashes), so up to the in-flight blocks' prefill per request on the rank is
   * taken off its prefill (the racing replicas of a burst's first wave each booked the whole new
   * prefix there), and as many copies of the in-flight blocks off the blocks it holds (each peer's
   * aggregate counts them once more; the new request adds only its other blocks). Without this, a
   * burst sharing a new 8k-token prefix saw the first requests' prefill as load on their rank and
   * spread over every idle worker (8 of 8 in test/system/mesh/new-prefix-burst.test.ts).
   */
  #joinInflight(candidates: Int32Array, n: number, promptBlocks: number, held: Int32Array, prefillOut: Float64Array, decodeOut: Float64Array, requestsOut: Float64Array): void {
    const inflight = this.#scratch.inflight;
    for (let i = 0; i < n; i++) {
      const rank = candidates[i] as number;
      const b = rank < inflight.length ? (inflight[rank] as number) : 0;
      if (b === 0) continue;
      prefillOut[i] = Math.max(0, (prefillOut[i] as number) - (requestsOut[i] as number) * b * this.blockSize);
      const h = held[rank] as number;
      const active = (decodeOut[i] as number) - promptBlocks + h;
      decodeOut[i] = active + promptBlocks - Math.min(active, Math.max(h, (requestsOut[i] as number) * b));
    }
  }

  /** Rank keys of schedulable workers, ascending by (worker id, dp rank). */
  get schedulable(): readonly number[] {
    if (this.#membersChanged) this.#rebuildSchedulable();
    return this.#schedulable;
  }

  /** Reusable buffers for one selection (single-threaded: no selection overlaps another), sized for the members. */
  get scratch(): SelectionScratch {
    if (this.#membersChanged) this.#rebuildSchedulable();
    return this.#scratch;
  }

  isSchedulable(rank: number): boolean {
    if (this.#membersChanged) this.#rebuildSchedulable();
    return this.#schedulableSet.has(rank);
  }

  /** Adds or updates a member; returns rank keys that the update removed (their state must go). */
  upsertMember(record: WorkerCatalogRecord): number[] {
    const wanted = ranksOf(record);
    const prev = this.members.get(record.worker_id);
    const removed: number[] = [];
    if (prev !== undefined) {
      for (const rank of prev.ranks) {
        if (!wanted.includes(this.ranks.dpRankOf(rank))) removed.push(rank);
      }
    }
    const ranks = wanted.map((dp) => this.ranks.intern(record.worker_id, dp));
    this.members.set(record.worker_id, { record, ranks });
    this.#membersChanged = true;
    return removed;
  }

  /** Removes a member; returns its rank keys (callers clear index/ledger state, then release). */
  removeMember(workerId: WorkerId): number[] {
    const m = this.members.get(workerId);
    if (m === undefined) return [];
    this.members.delete(workerId);
    this.#membersChanged = true;
    return m.ranks;
  }

  #rebuildSchedulable(): void {
    this.#membersChanged = false;
    const out: number[] = [];
    const ids = [...this.members.keys()].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    for (const id of ids) {
      const m = this.members.get(id);
      if (m !== undefined && m.record.lifecycle === "schedulable") out.push(...m.ranks);
    }
    this.#schedulable = out;
    this.#schedulableSet.clear();
    for (const r of out) this.#schedulableSet.add(r);
    this.#scratch.ensure(this.ranks.capacity, out.length);
  }
}

/** Typed buffers reused across selections; grown when the partition grows. */
export class SelectionScratch {
  candidates: Int32Array = new Int32Array(0);
  table: CandidateTable = createCandidateTable(0);
  costs = new Float64Array(0);
  /** Per candidate row: summed weights of the request's preferred taints the rank carries. */
  taintWeights = new Float64Array(0);
  /** Indexed by rank key: overlap and ledger scratch, reset after each use via `touched`. */
  heldBlocks = new Int32Array(0);
  touched: number[] = [];
  device = new Int32Array(0);
  host = new Int32Array(0);
  disk = new Int32Array(0);
  /** Indexed by rank key: the prompt's predicted blocks past the index's overlap (in flight), reset with `device`. */
  inflight = new Int32Array(0);

  ensure(rankCapacity: number, candidateCount: number): void {
    if (this.heldBlocks.length < rankCapacity) {
      const n = Math.max(rankCapacity, this.heldBlocks.length * 2, 16);
      this.heldBlocks = new Int32Array(n);
      this.device = new Int32Array(n);
      this.host = new Int32Array(n);
      this.disk = new Int32Array(n);
      this.inflight = new Int32Array(n);
    }
    if (this.candidates.length < candidateCount) {
      const n = Math.max(candidateCount, this.candidates.length * 2, 16);
      this.candidates = new Int32Array(n);
      this.table = createCandidateTable(n);
      this.costs = new Float64Array(n);
      this.taintWeights = new Float64Array(n);
    }
  }
}
