/**
 * The fleet as this replica sees it: the worker catalogue, the partitions its schedulable
 * workers form, and each rank's prefix index fed by the workers' own KV events. Also the fleet's
 * read-only views: /loads, /dump, table sizes, KV-event endpoints.
 *
 * A partition `(model_name, routing_group)` is created with its first schedulable worker and
 * deleted with its last member (#dropMember), so workers moved through many model names do not
 * leave empty partitions behind. What else lives in a partition (bookings, bindings) is owned by other parts of
 * the core; the fleet tells them through FleetHooks when a rank's state goes or a worker joins.
 */
import type { AffinityTable } from "./affinity-table.js";
import type { Clock } from "./time.js";
import type { Random } from "./random.js";
import { KvmeshError } from "./errors.js";
import { hashCount, hashListFromBigInts } from "./hash64.js";
import { rankCursorKey, type IndexRankKey, type IndexRankSnapshot, type IndexSnapshotSource, type RankViewsOf } from "./index-snapshot.js";
import type { IndexPartitionTree, IndexRankTarget, MergedRank } from "./index-tree-merge.js";
import { storedContentHashes, type KvApplyResult, type KvEventBatch } from "./kv-events.js";
import { Partition } from "./partition.js";
import type { PredictedCacheOptions } from "./predicted-cache.js";
import { PromptHashCache } from "./prompt-hash-cache.js";
import { rankIndexBound } from "./rank-index-bound.js";
import type { ServiceCounters } from "./service-stats.js";
import {
  DEFAULT_MODEL_NAME,
  DEFAULT_ROUTING_GROUP,
  type ModelLoadResponse,
  type WorkerCatalogRecord,
  type WorkerId,
  type WorkerPatchRequest,
  type WorkerRequest,
} from "./types.js";
import { kvEventsEndpointFor, partitionKey, validateWorkerId, WorkerCatalog } from "./worker-catalog.js";
import type { TtftCostParams } from "./ttft-cost.js";

export interface WorkerChange {
  readonly workerId: WorkerId;
  /** The stored record, or null when the worker was deleted. */
  readonly record: WorkerCatalogRecord | null;
}

export interface DumpEvent {
  worker_id: WorkerId;
  dp_rank: number;
  tier: string;
  parent_hash: bigint | null;
  block_hashes: bigint[];
  local_hashes: bigint[];
}

export interface FleetSizes {
  partitions: number;
  indexedBlocks: number;
  indexNodes: number;
  /** Stored blocks parked until their parent is known (detached-chains.ts), now. */
  detachedBlocks: number;
  /** Predicted (rank, block) checkpoint pairs held now (predicted-cache.ts). */
  predictedBlocks: number;
  /** Counters: parked blocks attached once their parent was known, and shed at the bound. */
  detachedAttachedBlocks: number;
  detachedShedBlocks: number;
  affinityEntries: number;
  affinityFallbacks: number;
  affinityEvictions: number;
  affinityRebinds: number;
  affinityConflicts: number;
  affinityUnbindsShed: number;
  /** Counter: booking lists that broke the active blocks' prefix tree (active-prefix-trie.ts), handing its state to the per-hash index. */
  activeBlockFallbacks: number;
}

/** What the fleet tells the parts that keep per-partition state of their own. */
export interface FleetHooks {
  /** The affinity table of a new partition, or undefined without session affinity. */
  createAffinity(p: Partition): AffinityTable | undefined;
  /** `workerId` is now a schedulable member of `p` (bindings parked for it may apply). */
  workerJoined(p: Partition, workerId: WorkerId): void;
  /** These bookings left the ledger with their rank; their reservation rows must go too. */
  bookingsGone(p: Partition, selectionIds: readonly string[]): void;
  /** A partition was created (before any worker joins it). */
  partitionCreated(p: Partition): void;
  /** A partition lost its last worker and left the fleet (its ranks have all left already). */
  partitionRemoved(p: Partition): void;
  /** A rank is leaving `p` (its worker was removed or shrank); its key is still interned. */
  rankLeaving(p: Partition, rank: number): void;
}

/** GET /dump's filters: only this partition's, or this worker's, events. */
export interface DumpFilter {
  readonly modelName?: string | undefined;
  readonly routingGroup?: string | undefined;
  readonly workerId?: WorkerId | undefined;
}

export interface FleetOptions {
  readonly clock: Clock;
  readonly random: Random;
  readonly expiryMs: number;
  /** The ttft cost model's engine timing (its prefill estimate decays booked prefill); undefined with the reference's model. */
  readonly prefillTiming?: TtftCostParams | undefined;
  readonly requireKvEventsEndpoint: boolean;
  /** In-flight prefixes / approximate cache of each partition (predicted-cache.ts). */
  readonly predicted: PredictedCacheOptions;
  /** Most partitions at once (KVMESH_FLEET_LIMIT past it). */
  readonly maxPartitions: number;
  /** Most ranks (sum of data_parallel_size over registered workers) at once (KVMESH_FLEET_LIMIT past it). */
  readonly maxRanks: number;
  readonly counters: ServiceCounters;
  readonly hooks: FleetHooks;
}

export class Fleet {
  readonly #o: FleetOptions;
  readonly #catalog: WorkerCatalog;
  readonly #partitions = new Map<string, Partition>();
  /** One prompt-hash memo per partition (its block size and Eagle mode fix the memo's layout). */
  readonly #promptHashCaches = new Map<Partition, PromptHashCache>();
  readonly #workerListeners = new Set<(c: WorkerChange) => void>();
  /** Sum of data_parallel_size over the catalog's records. */
  #ranks = 0;
  /** The affinity counters of partitions that left the fleet (sizes() keeps its counters monotonic). */
  /** Removed partitions' detached-chain counters (the sizes' counters never go down). */
  readonly #removedDetached = { attached: 0, shed: 0 };
  #removedActiveBlockFallbacks = 0;
  readonly #removedAffinity = { fallbacks: 0, evictions: 0, rebinds: 0, conflicts: 0, unbindsShed: 0 };

  constructor(options: FleetOptions) {
    this.#o = options;
    this.#catalog = new WorkerCatalog({
      requireKvEventsEndpoint: options.requireKvEventsEndpoint,
      partitionBlockSize: (key) => this.#partitions.get(key)?.blockSize,
      partitionIsEagle: (key) => this.#partitions.get(key)?.isEagle,
    });
  }

  onWorkerChange(listener: (c: WorkerChange) => void): () => void {
    this.#workerListeners.add(listener);
    return () => this.#workerListeners.delete(listener);
  }

  // ---------------------------------------------------------------- partitions

  partition(key: string): Partition | undefined {
    return this.#partitions.get(key);
  }

  partitions(): IterableIterator<Partition> {
    return this.#partitions.values();
  }

  get partitionCount(): number {
    return this.#partitions.size;
  }

  /** The request's partition, which must have a schedulable worker (503 otherwise). */
  requirePartition(model: string | undefined, group: string | undefined): Partition {
    const key = partitionKey(model ?? DEFAULT_MODEL_NAME, group ?? DEFAULT_ROUTING_GROUP);
    const p = this.#partitions.get(key);
    if (p === undefined || p.schedulable.length === 0) {
      const any = this.#catalog.list().some((r) => r.lifecycle === "schedulable");
      throw new KvmeshError("KVMESH_NOT_READY", any ? `no schedulable workers for ${key}` : "no schedulable workers are available");
    }
    return p;
  }

  promptHashCache(p: Partition): PromptHashCache | undefined {
    return this.#promptHashCaches.get(p);
  }

  /** Registered ranks (the sum of data_parallel_size), against maxRanks. */
  get rankCount(): number {
    return this.#ranks;
  }

  #createPartition(model: string, group: string, blockSize: number, isEagle: boolean): Partition {
    if (this.#partitions.size >= this.#o.maxPartitions) {
      throw new KvmeshError(
        "KVMESH_FLEET_LIMIT",
        `partition ${partitionKey(model, group)} would be one more than the limit of ${this.#o.maxPartitions} partitions (maxPartitions, serve --max-partitions)`,
        { details: { field: "model_name", limit: "maxPartitions" } },
      );
    }
    const p = new Partition(model, group, blockSize, isEagle, this.#o.clock, this.#o.random, this.#o.expiryMs, this.#o.predicted, this.#o.counters, this.#o.prefillTiming);
    p.affinity = this.#o.hooks.createAffinity(p);
    this.#o.hooks.partitionCreated(p);
    this.#partitions.set(p.key, p);
    this.#promptHashCaches.set(p, new PromptHashCache({ blockSize, isEagle }));
    return p;
  }

  // ---------------------------------------------------------------- workers

  upsertWorker(req: WorkerRequest): WorkerCatalogRecord {
    return this.#storeWorker(this.#catalog.prepareUpsert(req));
  }

  patchWorker(workerId: WorkerId, patch: WorkerPatchRequest): WorkerCatalogRecord {
    validateWorkerId(workerId, "worker_id");
    return this.#storeWorker(this.#catalog.preparePatch(workerId, patch));
  }

  /** A peer's registration as it resolved it (src/core/catalog-replication.ts), evaluated here. */
  applyReplicatedWorker(req: WorkerRequest, draining: boolean): WorkerCatalogRecord {
    return this.#storeWorker(this.#catalog.prepareReplicated(req, draining));
  }

  deleteWorker(workerId: WorkerId): WorkerCatalogRecord {
    validateWorkerId(workerId, "worker_id");
    const removed = this.#catalog.remove(workerId);
    this.#ranks -= removed.data_parallel_size;
    for (const p of [...this.#partitions.values()]) this.#dropMember(p, workerId);
    this.#notifyWorker({ workerId, record: null });
    return removed;
  }

  /**
   * The ingest could not use a KV-event endpoint of `record` (ZeroMQ refused it): the worker
   * becomes incomplete with `reason` and leaves selection, as the reference's failed ingress
   * reconcile does (core/workers.rs: "reconciliation failed: …"). Only if `record` is still the
   * stored one: a newer registration has its own endpoints and its own outcome. Returns the
   * stored record, or undefined when `record` was superseded.
   */
  markKvEndpointUnusable(record: WorkerCatalogRecord, reason: string): WorkerCatalogRecord | undefined {
    const current = this.#catalog.get(record.worker_id);
    if (current !== record) return undefined;
    if (current.not_schedulable_reasons.includes(reason)) return current;
    return this.#storeWorker({ ...current, lifecycle: "incomplete", not_schedulable_reasons: [...current.not_schedulable_reasons, reason] });
  }

  listWorkers(modelName?: string, routingGroup?: string): WorkerCatalogRecord[] {
    return this.#catalog.list(modelName, routingGroup);
  }

  getWorker(workerId: WorkerId): WorkerCatalogRecord | undefined {
    return this.#catalog.get(workerId);
  }

  /** The endpoint requests for a worker go to, if registered with one. */
  endpointOf(workerId: WorkerId): string | null {
    return this.#catalog.get(workerId)?.endpoint ?? null;
  }

  #storeWorker(record: WorkerCatalogRecord): WorkerCatalogRecord {
    // Limits first: nothing has changed yet, so a refusal keeps every accepted worker as it was.
    const previous = this.#catalog.get(record.worker_id);
    const ranks = this.#ranks - (previous?.data_parallel_size ?? 0) + record.data_parallel_size;
    if (ranks > this.#o.maxRanks && record.data_parallel_size > (previous?.data_parallel_size ?? 0)) {
      throw new KvmeshError(
        "KVMESH_FLEET_LIMIT",
        `worker ${record.worker_id} would make ${ranks} registered ranks, over the limit of ${this.#o.maxRanks} (maxRanks, serve --max-ranks)`,
        { details: { field: "data_parallel_size", limit: "maxRanks" } },
      );
    }
    const key = partitionKey(record.model_name, record.routing_group);
    let partition = this.#partitions.get(key);
    if (partition === undefined && record.lifecycle === "schedulable" && record.block_size !== null) {
      partition = this.#createPartition(record.model_name, record.routing_group, record.block_size, record.is_eagle ?? false);
    }
    // A worker that moved partitions leaves its old one entirely.
    for (const p of [...this.#partitions.values()]) {
      if (p !== partition && p.members.has(record.worker_id)) this.#dropMember(p, record.worker_id);
    }
    if (partition !== undefined && record.block_size === partition.blockSize) {
      for (const rank of partition.upsertMember(record)) this.#clearRank(partition, rank);
      if (record.lifecycle !== "schedulable") partition.affinity?.dropWorker(record.worker_id);
      else this.#o.hooks.workerJoined(partition, record.worker_id);
    }
    this.#catalog.store(record);
    this.#ranks = ranks;
    this.#notifyWorker({ workerId: record.worker_id, record });
    return record;
  }

  /** `workerId` leaves `p`; a partition left without workers leaves the fleet (one worker PATCHed through thousands of model names must not leave thousands of empty partitions). */
  #dropMember(p: Partition, workerId: WorkerId): void {
    for (const rank of p.removeMember(workerId)) this.#clearRank(p, rank);
    p.affinity?.dropWorker(workerId);
    if (p.members.size > 0 || this.#partitions.get(p.key) !== p) return;
    this.#partitions.delete(p.key);
    this.#promptHashCaches.delete(p);
    this.#removedDetached.attached += p.index.detached.attachedBlocks;
    this.#removedDetached.shed += p.index.detached.shedBlocks;
    this.#removedActiveBlockFallbacks += p.ledger.activeBlockFallbacks;
    const r = this.#removedAffinity;
    r.fallbacks += p.affinity?.fallbacks ?? 0;
    r.evictions += p.affinity?.evictions ?? 0;
    r.rebinds += p.affinity?.rebinds ?? 0;
    r.conflicts += p.affinity?.conflicts ?? 0;
    r.unbindsShed += p.affinity?.unbindsShed ?? 0;
    this.#o.hooks.partitionRemoved(p);
  }

  /** Removes everything a rank held: indexed blocks, bookings (and their rows), bindings, the rank key. */
  #clearRank(p: Partition, rank: number): void {
    this.#o.hooks.rankLeaving(p, rank);
    p.index.removeRank(rank);
    p.predicted.removeRank(rank);
    this.#o.hooks.bookingsGone(p, p.ledger.removeRank(rank));
    p.affinity?.dropTarget(p.ranks.workerOf(rank), p.ranks.dpRankOf(rank));
    p.ranks.release(rank);
  }

  #notifyWorker(c: WorkerChange): void {
    for (const l of this.#workerListeners) l(c);
  }

  // ---------------------------------------------------------------- KV events from workers

  /**
   * Applies one KV-event batch of a worker rank to its partition's prefix index. Returns how
   * many events applied and how many were dropped (unknown worker, block-size mismatch,
   * a stored block whose parent this rank does not hold, a parent-hash cycle), and the blocks
   * shed at the rank's index bound (rank-index-bound.ts).
   */
  applyKvEvents(workerId: WorkerId, dpRank: number, batch: KvEventBatch): KvApplyResult {
    const c = this.#o.counters;
    const located = this.locateRank(workerId, batch.dpRank ?? dpRank);
    if (located === undefined) {
      c.kvEventsDropped += batch.events.length;
      return { applied: 0, dropped: batch.events.length, parked: 0, shedBlocks: 0, cycles: 0, detachedShed: 0 };
    }
    const { partition: p, rank } = located;
    const bound = rankIndexBound(this.#catalog.get(workerId)?.total_kv_blocks);
    const shed0 = p.index.shedPairs;
    const cycles0 = p.index.cyclesRejected;
    const detachedShed0 = p.index.detached.shedBlocks;
    let applied = 0;
    let dropped = 0;
    let parked = 0;
    for (const ev of batch.events) {
      let ok = true;
      switch (ev.type) {
        case "stored": {
          if (ev.blockSize !== null && ev.blockSize !== p.blockSize) {
            ok = false;
            break;
          }
          // Precomputed by the ingest thread when the event named its block size (equal to ours here).
          const local = ev.localHashes ?? storedContentHashes(ev, p.blockSize);
          const engine = ev.engineHashes ?? hashListFromBigInts(ev.blockHashes);
          if (hashCount(local) !== hashCount(engine)) {
            ok = false;
            break;
          }
          // A parent this rank does not hold yet parks the event until it is known (issue 25).
          const outcome = p.index.applyStoredOrPark(rank, ev.tier, ev.parentHash, engine, local, bound);
          if (outcome === "parked") {
            parked++;
            continue;
          }
          ok = outcome === "stored";
          break;
        }
        case "removed":
          p.index.applyRemoved(rank, ev.tier, ev.engineHashes ?? hashListFromBigInts(ev.blockHashes));
          break;
        case "cleared":
          p.index.applyCleared(rank);
          break;
      }
      if (ok) applied++;
      else dropped++;
    }
    const shedBlocks = p.index.shedPairs - shed0;
    const cycles = p.index.cyclesRejected - cycles0;
    c.kvEventsApplied += applied;
    c.kvEventsDropped += dropped;
    c.kvEventsParked += parked;
    c.kvIndexBlocksShed += shedBlocks;
    c.kvParentCycles += cycles;
    return { applied, dropped, parked, shedBlocks, cycles, detachedShed: p.index.detached.shedBlocks - detachedShed0 };
  }

  /** A rank's KV-event publisher restarted: its old blocks are gone, rebuild from new events. */
  clearWorkerKv(workerId: WorkerId, dpRank: number): void {
    const located = this.locateRank(workerId, dpRank);
    if (located !== undefined) located.partition.index.applyCleared(located.rank);
  }

  // ---------------------------------------------------------------- index snapshots (warm join)

  /** The prefix index as a peer exports it, rank by rank (index-snapshot.ts). */
  readonly indexSnapshotSource: IndexSnapshotSource = {
    rankKeys: (after?: string | null): IndexRankKey[] => {
      const out: IndexRankKey[] = [];
      for (const p of this.#partitions.values()) {
        for (const [workerId, m] of p.members) {
          for (const rank of m.ranks) {
            const dpRank = p.ranks.dpRankOf(rank);
            if (p.index.rankSize(rank) === 0) continue;
            const key = rankCursorKey(p.key, workerId, dpRank);
            // The ranks a joiner has already pulled are not sorted again for each of its requests.
            if (after === undefined || after === null || key > after) out.push({ key, workerId, dpRank });
          }
        }
      }
      return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    },
    exportRank: (key: IndexRankKey): Omit<IndexRankSnapshot, "position"> | null => {
      const located = this.locateRank(key.workerId, key.dpRank);
      if (located === undefined) return null;
      const { partition: p, rank } = located;
      return { modelName: p.modelName, routingGroup: p.routingGroup, blockSize: p.blockSize, workerId: key.workerId, dpRank: key.dpRank, entries: p.index.exportRankEntries(rank) };
    },
    exportViews: (key: IndexRankKey): RankViewsOf | null => {
      const located = this.locateRank(key.workerId, key.dpRank);
      if (located === undefined) return null;
      const { partition: p, rank } = located;
      return { modelName: p.modelName, routingGroup: p.routingGroup, blockSize: p.blockSize, workerId: key.workerId, dpRank: key.dpRank, partition: p.key, views: p.index.exportViews(rank) };
    },
  };

  /**
   * Replaces a rank's blocks with a peer's (the warm join): the rank's index entries are replaced
   * in bulk by the snapshot's (PrefixIndex.importRankEntries), then chains parked below them
   * attach. Refused when this replica does not know the rank in that partition, or knows it with
   * another block size. Returns the blocks installed, or why not.
   */
  importIndexRank(s: IndexRankSnapshot): { installed: number } | { refused: "unknown_rank" | "block_size" } {
    const located = this.locateRank(s.workerId, s.dpRank);
    if (located === undefined || located.partition.modelName !== s.modelName || located.partition.routingGroup !== s.routingGroup) return { refused: "unknown_rank" };
    const { partition: p, rank } = located;
    if (p.blockSize !== s.blockSize) return { refused: "block_size" };
    const bound = rankIndexBound(this.#catalog.get(s.workerId)?.total_kv_blocks);
    p.index.importRankEntries(rank, s.entries, bound);
    p.index.attachWaiting(rank, bound);
    return { installed: p.index.rankSize(rank) };
  }

  /**
   * Every rank this replica knows, where it lives and its index bound now: the warm join's
   * decoding thread merges a peer's ranks into whole partition trees with them (index-tree-merge.ts).
   */
  indexRankTargets(): IndexRankTarget[] {
    const out: IndexRankTarget[] = [];
    for (const p of this.#partitions.values()) {
      for (const [workerId, m] of p.members) {
        const bound = rankIndexBound(this.#catalog.get(workerId)?.total_kv_blocks);
        for (const rank of m.ranks) out.push({ modelName: p.modelName, routingGroup: p.routingGroup, blockSize: p.blockSize, workerId, dpRank: p.ranks.dpRankOf(rank), rank, bound });
      }
    }
    return out;
  }

  /** Whether the snapshot rank `m` merged on the thread is still that rank key here (the worker may have left or re-registered since). */
  mergedRankHolds(m: MergedRank): boolean {
    const located = this.locateRank(m.workerId, m.dpRank);
    return located !== undefined && located.rank === m.rank && located.partition.modelName === m.modelName && located.partition.routingGroup === m.routingGroup && located.partition.blockSize === m.blockSize;
  }

  /**
   * Adopts a partition's tree merged on the warm join's decoding thread (PrefixIndex.adoptTree):
   * its ranks replace their blocks here, except those `keepOwn` names. False (nothing changed)
   * when the partition is gone.
   */
  adoptIndexTree(t: IndexPartitionTree, keepOwn: (rank: number) => boolean): boolean {
    const p = this.#partitions.get(partitionKey(t.modelName, t.routingGroup));
    if (p === undefined) return false;
    p.index.adoptTree(t.image, keepOwn);
    return true;
  }

  /** The partition and rank key of a registered member's dp rank. */
  locateRank(workerId: WorkerId, dpRank: number): { partition: Partition; rank: number } | undefined {
    const r = this.#catalog.get(workerId);
    if (r === undefined) return undefined;
    const p = this.#partitions.get(partitionKey(r.model_name, r.routing_group));
    if (p === undefined || !p.members.has(workerId)) return undefined;
    const rank = p.ranks.get(workerId, dpRank);
    return rank === undefined ? undefined : { partition: p, rank };
  }

  kvEventsEndpointsOf(workerId: WorkerId): { dpRank: number; endpoint: string }[] {
    const r = this.#catalog.get(workerId);
    if (r === undefined) return [];
    const out: { dpRank: number; endpoint: string }[] = [];
    for (let i = 0; i < r.data_parallel_size; i++) {
      const dpRank = r.data_parallel_start_rank + i;
      const endpoint = kvEventsEndpointFor(r, dpRank);
      if (endpoint !== null) out.push({ dpRank, endpoint });
    }
    return out;
  }

  // ---------------------------------------------------------------- views

  /** Whether any worker is schedulable, and the counts (GET /ready). */
  readiness(): { schedulable: number; workers: number } {
    const all = this.#catalog.list();
    return { schedulable: all.filter((r) => r.lifecycle === "schedulable").length, workers: all.length };
  }

  /** Per schedulable rank, the load booked on it now (GET /loads). */
  loads(modelName?: string, routingGroup?: string): ModelLoadResponse[] {
    const out: ModelLoadResponse[] = [];
    for (const p of this.#partitions.values()) {
      if (modelName !== undefined && p.modelName !== modelName) continue;
      if (routingGroup !== undefined && p.routingGroup !== routingGroup) continue;
      out.push({
        model_name: p.modelName,
        routing_group: p.routingGroup,
        loads: p.schedulable.map((rank) => ({
          worker_id: p.ranks.workerOf(rank),
          dp_rank: p.ranks.dpRankOf(rank),
          potential_prefill_tokens: p.activePrefillTokens(rank),
          potential_decode_blocks: p.activeBlocks(rank),
          active_requests: p.activeRequests(rank),
        })),
        // The reference counts requests parked in its admission queue here. kvmesh has no queue:
        // a selection is answered at once (or refused with 429/503), so nothing is ever pending.
        pending_count: 0,
        pending_isl_tokens: 0,
      });
    }
    return out;
  }

  /**
   * The prefix index as KV events per partition (GET /dump): replaying them into an empty
   * service rebuilds the same index. The filters (kvmesh additions) keep one partition or one
   * worker: a whole fleet's index can be hundreds of MB of JSON.
   */
  dump(filter: DumpFilter = {}): Record<string, { block_size: number; events: DumpEvent[] }> {
    const out: Record<string, { block_size: number; events: DumpEvent[] }> = {};
    for (const p of this.#partitions.values()) {
      if (filter.modelName !== undefined && p.modelName !== filter.modelName) continue;
      if (filter.routingGroup !== undefined && p.routingGroup !== filter.routingGroup) continue;
      const events: DumpEvent[] = [];
      for (const [workerId, m] of p.members) {
        if (filter.workerId !== undefined && workerId !== filter.workerId) continue;
        for (const rank of m.ranks) {
          for (const e of p.index.dumpRank(rank)) {
            events.push({ worker_id: workerId, dp_rank: p.ranks.dpRankOf(rank), tier: e.tier, parent_hash: e.parentHash, block_hashes: e.blockHashes, local_hashes: e.localHashes });
          }
        }
      }
      out[p.key] = { block_size: p.blockSize, events };
    }
    return out;
  }

  /** Index and affinity table sizes, for metrics. */
  sizes(): FleetSizes {
    let indexedBlocks = 0;
    let indexNodes = 0;
    let detachedBlocks = 0;
    let predictedBlocks = 0;
    let { attached: detachedAttachedBlocks, shed: detachedShedBlocks } = this.#removedDetached;
    let affinityEntries = 0;
    let activeBlockFallbacks = this.#removedActiveBlockFallbacks;
    // The affinity counters are counters (never go down): removed partitions' counts stay in.
    let {
      fallbacks: affinityFallbacks,
      evictions: affinityEvictions,
      rebinds: affinityRebinds,
      conflicts: affinityConflicts,
      unbindsShed: affinityUnbindsShed,
    } = this.#removedAffinity;
    for (const p of this.#partitions.values()) {
      indexedBlocks += p.index.size;
      indexNodes += p.index.nodeCount;
      predictedBlocks += p.predicted.size;
      const d = p.index.detached;
      detachedBlocks += d.blocks;
      detachedAttachedBlocks += d.attachedBlocks;
      detachedShedBlocks += d.shedBlocks;
      affinityEntries += p.affinity?.size ?? 0;
      affinityFallbacks += p.affinity?.fallbacks ?? 0;
      affinityEvictions += p.affinity?.evictions ?? 0;
      affinityRebinds += p.affinity?.rebinds ?? 0;
      affinityConflicts += p.affinity?.conflicts ?? 0;
      affinityUnbindsShed += p.affinity?.unbindsShed ?? 0;
      activeBlockFallbacks += p.ledger.activeBlockFallbacks;
    }
    return { partitions: this.#partitions.size, indexedBlocks, indexNodes, detachedBlocks, predictedBlocks, detachedAttachedBlocks, detachedShedBlocks, affinityEntries, affinityFallbacks, affinityEvictions, affinityRebinds, affinityConflicts, affinityUnbindsShed, activeBlockFallbacks };
  }
}
