/**
 * The selection service: the worker catalog, the partitions, the reservation index and the
 * pending-selection cache behind one synchronous facade. The daemon's HTTP layer, the KV-event
 * ingest and the replica mesh all drive this class; embedding hosts use it directly.
 *
 * Everything runs on one event loop and a selection never awaits between choosing a worker,
 * booking its load and committing the session binding, so the reference's claim/initialize
 * states (which guard those awaits in Rust) are not needed here.
 */
import { AffinityTable, affinitySweepIntervalMs, type AffinityMode, type Lease } from "./affinity-table.js";
import { mathRandom, systemClock, type Clock, type Random } from "./clock.js";
import { badRequest, KvmeshError } from "./errors.js";
import { hashCount, hashListFromBigInts, hashListToBigInts } from "./hash64.js";
import { computeBlockHashes } from "./hashing.js";
import type { KvEventBatch } from "./kv-events.js";
import { Partition } from "./partition.js";
import { PendingSelections } from "./pending-selections.js";
import { normalizePrompt, type NormalizedPrompt } from "./prompt.js";
import { PromptHashCache } from "./prompt-hash-cache.js";
import { ReorderState, type BindingEvent, type BookingSnapshot, type LoadAddEvent, type LoadEvent, type PartitionRef } from "./replica-events.js";
import { checkSessionBinding, type SessionBindingInput, type SessionBindingOutcome, type SessionBindingOutcomeKind } from "./session-binding-input.js";
import { SessionBindingSubscription, type SessionBindingUpdatesOptions } from "./session-binding-stream.js";
import { applyOverride, DEFAULT_SELECTOR_CONFIG, validateSelectorConfig, type SelectorConfig } from "./selector-config.js";
import { computeCost, selectCandidate } from "./selector.js";
import { TieSpreader, type ReplicaSlot } from "./tie-spread.js";
import {
  DEFAULT_MODEL_NAME,
  DEFAULT_ROUTING_GROUP,
  type ModelLoadResponse,
  type OverlapReport,
  type OverlapScoresResponse,
  type PotentialLoad,
  type ReservationRequest,
  type ReservationResponse,
  type SelectAndReserveRequest,
  type SelectRequest,
  type SelectResponse,
  type WorkerCatalogRecord,
  type WorkerId,
  type WorkerPatchRequest,
  type WorkerRequest,
} from "./types.js";
import { kvEventsEndpointFor, partitionKey, validateWorkerId, WorkerCatalog } from "./worker-catalog.js";

export const DEFAULT_ACTIVE_REQUEST_EXPIRY_MS = 300_000;
/**
 * Bound on this replica's own live bookings. A booking costs ~0.9 KiB (a flood of 20,000 never
 * freed grew the heap 18 MiB), so the cap holds them under ~120 MiB: a client that books and never
 * frees gets 429 instead of growing the heap for the 300 s expiry. 131,072 is 128 requests in
 * flight on each of 1,024 workers. Peers' mirrored bookings are not capped here: refusing them
 * would make this replica's view of the fleet wrong; each peer caps its own.
 */
export const DEFAULT_MAX_LOCAL_RESERVATIONS = 131_072;
/** Longest selection or session id accepted, bytes (the reference's session id limit). */
export const MAX_ID_BYTES = 256;
/** Bounds on session affinity TTL, seconds (reference: 1 s ..= 1 year). */
export const MIN_AFFINITY_TTL_SECS = 1;
export const MAX_AFFINITY_TTL_SECS = 31_536_000;

export interface SessionAffinityOptions {
  readonly ttlSecs: number;
  readonly mode?: AffinityMode;
  readonly maxEntries?: number;
  readonly maxSessionIdBytes?: number;
}

/**
 * The built-in mesh's settings as the daemon passes them. The daemon starts the mesh; the
 * service only checks them, so that a mesh and host replication are never both configured.
 */
export interface ReplicaSyncOptions {
  /** Where the mesh's XPUB binds, e.g. tcp://0.0.0.0:7100 (the control ROUTER takes the next port). */
  readonly publishBind: string;
  readonly advertiseEndpoint?: string | undefined;
  readonly peers?: readonly string[] | undefined;
}

export interface SelectionServiceOptions {
  readonly clock?: Clock;
  readonly random?: Random;
  /**
   * This replica's id: `owner` of its load events and `writer_id` of its bindings. Non-zero.
   * Default: `sessionReplicationWriterId` when given, else random.
   */
  readonly replicaId?: bigint;
  /**
   * Host replication: the host carries session bindings between its replicas itself
   * (`sessionBindingUpdates()` out, `applySessionBinding()` in). The `writer_id` stamped on this
   * service's bindings; non-zero u64, unique per replica, supplied by the host (no random default:
   * two replicas drawing the same id would each ignore the other's bindings as their own).
   * Needs `sessionAffinity`; excludes `replicaSync`.
   */
  readonly sessionReplicationWriterId?: bigint | number;
  /** The built-in mesh (see ReplicaSyncOptions); excludes `sessionReplicationWriterId`. */
  readonly replicaSync?: ReplicaSyncOptions;
  readonly selector?: Partial<SelectorConfig>;
  readonly activeRequestExpiryMs?: number;
  /** Most live bookings this replica makes itself (429 beyond); see DEFAULT_MAX_LOCAL_RESERVATIONS. */
  readonly maxLocalReservations?: number;
  readonly sessionAffinity?: SessionAffinityOptions;
  readonly selectionCache?: { readonly ttlMs?: number; readonly maxEntries?: number; readonly maxBytes?: number };
  /** Daemon mode: a rank without a KV-events endpoint cannot be scheduled. */
  readonly requireKvEventsEndpoint?: boolean;
  /** Wall clock in ns, seeds the affinity Lamport sequence so restarts do not go backwards. */
  readonly wallClockNs?: () => bigint;
}

interface ReservationRow {
  readonly selectionId: string;
  readonly partition: Partition;
  readonly workerId: WorkerId;
  readonly dpRank: number;
  readonly owner: bigint;
  /** The add event that booked it: what a snapshot of the owner carries. */
  readonly add: LoadAddEvent;
  lease: Lease | undefined;
}

/** How long a peer's binding for a worker or partition not known here yet is kept, ms. */
export const DEFAULT_PARKED_BINDING_TTL_MS = 60_000;
/** Bound on parked bindings; past it the oldest is shed (counted). */
export const DEFAULT_PARKED_BINDINGS_MAX = 65_536;

interface PendingEntry {
  readonly workerId: WorkerId;
  readonly dpRank: number;
  readonly prompt: NormalizedPrompt;
  readonly effectivePrefillTokens: number;
  readonly trackPrefill: boolean;
  readonly expectedOutputTokens: number | null;
  readonly prefillDurationMs: number | null;
  readonly sessionId: string | undefined;
}

export interface ServiceStats {
  selections: number;
  reservations: number;
  selectionErrors: number;
  kvEventsApplied: number;
  kvEventsDropped: number;
  replicaEventsApplied: number;
  replicaEventsIgnored: number;
  bindingsApplied: number;
  bindingsIgnored: number;
  expiredRequests: number;
  bindingsParked: number;
  bindingsUnparked: number;
  parkedBindingsExpired: number;
  parkedBindingsShed: number;
  /** Bindings this service committed, rebound or refreshed (what the mesh or a host stream carries). */
  bindingsPublished: number;
  /** Bindings shed by full `sessionBindingUpdates()` queues, all subscriptions together. */
  droppedBindings: number;
  /** Bookings refused (429) because this replica held maxLocalReservations already. */
  reservationsRefused: number;
}

export interface WorkerChange {
  readonly workerId: WorkerId;
  /** The stored record, or null when the worker was deleted. */
  readonly record: WorkerCatalogRecord | null;
}

interface Selection {
  readonly partition: Partition;
  readonly rank: number;
  readonly workerId: WorkerId;
  readonly dpRank: number;
  readonly prompt: NormalizedPrompt;
  readonly config: SelectorConfig;
  readonly overlap: OverlapReport;
  readonly effectivePrefillTokens: number;
  readonly potentialDecodeBlocks: number;
  readonly sessionId: string | undefined;
}

export class SelectionService {
  readonly #clock: Clock;
  readonly #random: Random;
  readonly replicaId: bigint;
  /** `writer_id` of this service's bindings: the host's id in host replication, else replicaId. */
  readonly #writerId: bigint;
  readonly #hostReplication: boolean;
  readonly #bindingSubscriptions = new Set<SessionBindingSubscription>();
  readonly #selector: SelectorConfig;
  readonly #expiryMs: number;
  readonly #maxLocalReservations: number;
  readonly #affinity: Required<SessionAffinityOptions> | undefined;
  readonly #wallClockNs: () => bigint;
  readonly #catalog: WorkerCatalog;
  readonly #partitions = new Map<string, Partition>();
  /** One prompt-hash memo per partition (its block size and Eagle mode fix the memo's layout). */
  readonly #promptHashCaches = new Map<Partition, PromptHashCache>();
  readonly #reservations = new Map<string, ReservationRow>();
  readonly #pending: PendingSelections<PendingEntry>;
  readonly #reorder = new ReorderState();
  readonly #loadListeners = new Set<(e: LoadEvent) => void>();
  readonly #bindingListeners = new Set<(e: BindingEvent) => void>();
  readonly #workerListeners = new Set<(c: WorkerChange) => void>();
  #shuttingDown = false;
  #tieSpreader: TieSpreader | undefined;
  readonly stats: ServiceStats = {
    selections: 0,
    reservations: 0,
    selectionErrors: 0,
    kvEventsApplied: 0,
    kvEventsDropped: 0,
    replicaEventsApplied: 0,
    replicaEventsIgnored: 0,
    bindingsApplied: 0,
    bindingsIgnored: 0,
    expiredRequests: 0,
    bindingsParked: 0,
    bindingsUnparked: 0,
    parkedBindingsExpired: 0,
    parkedBindingsShed: 0,
    bindingsPublished: 0,
    droppedBindings: 0,
    reservationsRefused: 0,
  };
  /** Peer bindings waiting for their worker or partition: key partition/session, insertion = age order. */
  readonly #parked = new Map<string, { event: BindingEvent; expiresAtMs: number }>();
  readonly #ownedCounts = new Map<bigint, number>();

  constructor(options: SelectionServiceOptions = {}) {
    this.#clock = options.clock ?? systemClock;
    this.#random = options.random ?? mathRandom;
    const hostWriterId = checkReplicationOptions(options);
    this.#hostReplication = hostWriterId !== undefined;
    this.replicaId = options.replicaId ?? hostWriterId ?? randomReplicaId(this.#random);
    if (this.replicaId <= 0n || this.replicaId >= 1n << 64n) throw badRequest("replicaId must be a non-zero unsigned 64-bit integer", "replicaId");
    this.#writerId = hostWriterId ?? this.replicaId;
    this.#selector = { ...DEFAULT_SELECTOR_CONFIG, ...options.selector };
    validateSelectorConfig(this.#selector);
    this.#expiryMs = options.activeRequestExpiryMs ?? DEFAULT_ACTIVE_REQUEST_EXPIRY_MS;
    if (!(this.#expiryMs > 0)) throw badRequest("activeRequestExpiryMs must be > 0", "activeRequestExpiryMs");
    this.#maxLocalReservations = options.maxLocalReservations ?? DEFAULT_MAX_LOCAL_RESERVATIONS;
    if (!Number.isSafeInteger(this.#maxLocalReservations) || this.#maxLocalReservations < 1) throw badRequest("maxLocalReservations must be a positive integer", "maxLocalReservations");
    const sa = options.sessionAffinity;
    if (sa !== undefined) {
      if (!Number.isInteger(sa.ttlSecs) || sa.ttlSecs < MIN_AFFINITY_TTL_SECS || sa.ttlSecs > MAX_AFFINITY_TTL_SECS) {
        throw badRequest(
          `session_affinity_ttl_secs must be an integer in [${MIN_AFFINITY_TTL_SECS}, ${MAX_AFFINITY_TTL_SECS}]`,
          "session_affinity_ttl_secs",
        );
      }
      this.#affinity = { mode: "hard", maxEntries: 65_536, maxSessionIdBytes: MAX_ID_BYTES, ...sa };
    } else {
      this.#affinity = undefined;
    }
    this.#wallClockNs = options.wallClockNs ?? (() => process.hrtime.bigint());
    this.#pending = new PendingSelections<PendingEntry>({ clock: this.#clock, ...options.selectionCache });
    this.#catalog = new WorkerCatalog({
      requireKvEventsEndpoint: options.requireKvEventsEndpoint ?? false,
      partitionBlockSize: (key) => this.#partitions.get(key)?.blockSize,
    });
  }

  // ---------------------------------------------------------------- observers (the replica seam)

  onLoadEvent(listener: (e: LoadEvent) => void): () => void {
    this.#loadListeners.add(listener);
    return () => this.#loadListeners.delete(listener);
  }

  onBindingEvent(listener: (e: BindingEvent) => void): () => void {
    this.#bindingListeners.add(listener);
    return () => this.#bindingListeners.delete(listener);
  }

  /**
   * In a mesh, spread ties of the argmin by this replica's slot among the live replicas instead
   * of at random, so replicas racing on new requests pick different idle workers (see
   * tie-spread.ts). `null` restores the random tie-break.
   */
  setReplicaSlot(slot: (() => ReplicaSlot) | null): void {
    this.#tieSpreader = slot === null ? undefined : new TieSpreader(slot, this.#random);
  }

  onWorkerChange(listener: (c: WorkerChange) => void): () => void {
    this.#workerListeners.add(listener);
    return () => this.#workerListeners.delete(listener);
  }

  // ---------------------------------------------------------------- workers

  upsertWorker(req: WorkerRequest): WorkerCatalogRecord {
    this.#assertRunning();
    return this.#storeWorker(this.#catalog.prepareUpsert(req));
  }

  patchWorker(workerId: WorkerId, patch: WorkerPatchRequest): WorkerCatalogRecord {
    this.#assertRunning();
    validateWorkerId(workerId, "worker_id");
    return this.#storeWorker(this.#catalog.preparePatch(workerId, patch));
  }

  /** Deletion stays allowed while shutting down (a drained fleet must be able to leave). */
  deleteWorker(workerId: WorkerId): WorkerCatalogRecord {
    validateWorkerId(workerId, "worker_id");
    const removed = this.#catalog.remove(workerId);
    for (const p of this.#partitions.values()) this.#dropMember(p, workerId);
    this.#notifyWorker({ workerId, record: null });
    return removed;
  }

  listWorkers(modelName?: string, routingGroup?: string): WorkerCatalogRecord[] {
    return this.#catalog.list(modelName, routingGroup);
  }

  getWorker(workerId: WorkerId): WorkerCatalogRecord | undefined {
    return this.#catalog.get(workerId);
  }

  ready(): { ready: boolean; schedulable_workers: number; workers: number } {
    const all = this.#catalog.list();
    const schedulable = all.filter((r) => r.lifecycle === "schedulable").length;
    return { ready: !this.#shuttingDown && schedulable > 0, schedulable_workers: schedulable, workers: all.length };
  }

  #storeWorker(record: WorkerCatalogRecord): WorkerCatalogRecord {
    const key = partitionKey(record.model_name, record.routing_group);
    let partition = this.#partitions.get(key);
    if (partition === undefined && record.lifecycle === "schedulable" && record.block_size !== null) {
      partition = this.#createPartition(record.model_name, record.routing_group, record.block_size, record.is_eagle);
    }
    // A worker that moved partitions leaves its old one entirely.
    for (const p of this.#partitions.values()) {
      if (p !== partition && p.members.has(record.worker_id)) this.#dropMember(p, record.worker_id);
    }
    if (partition !== undefined && record.block_size === partition.blockSize) {
      for (const rank of partition.upsertMember(record)) this.#clearRank(partition, rank, true);
      if (record.lifecycle !== "schedulable") partition.affinity?.dropWorker(record.worker_id);
      else this.#unpark(partition, record.worker_id);
    }
    this.#catalog.store(record);
    this.#notifyWorker({ workerId: record.worker_id, record });
    return record;
  }

  #createPartition(model: string, group: string, blockSize: number, isEagle: boolean): Partition {
    const p = new Partition(model, group, blockSize, isEagle, this.#clock, this.#random, this.#expiryMs);
    if (this.#affinity !== undefined) {
      const table = new AffinityTable({
        ttlMs: this.#affinity.ttlSecs * 1000,
        mode: this.#affinity.mode,
        maxEntries: this.#affinity.maxEntries,
        maxSessionIdBytes: this.#affinity.maxSessionIdBytes,
        writerId: this.#writerId,
        clock: this.#clock,
        initialSequence: this.#wallClockNs(),
      });
      table.onBinding((b, reason) => {
        const ev: BindingEvent = {
          model_name: model,
          routing_group: group,
          session_id: b.sessionId,
          worker_id: b.target.workerId,
          dp_rank: b.target.dpRank,
          sequence: b.version.sequence,
          writer_id: b.version.writerId,
          reason,
        };
        this.stats.bindingsPublished++;
        for (const l of this.#bindingListeners) l(ev);
      });
      p.affinity = table;
    }
    this.#partitions.set(p.key, p);
    this.#promptHashCaches.set(p, new PromptHashCache({ blockSize, isEagle }));
    return p;
  }

  #dropMember(p: Partition, workerId: WorkerId): void {
    for (const rank of p.removeMember(workerId)) this.#clearRank(p, rank, true);
    p.affinity?.dropWorker(workerId);
  }

  /** Removes everything a rank held: indexed blocks, bookings (and their rows), the rank key. */
  #clearRank(p: Partition, rank: number, release: boolean): void {
    p.index.removeRank(rank);
    for (const id of p.ledger.removeRank(rank)) this.#dropRow(id);
    if (release) {
      p.affinity?.dropTarget(p.ranks.workerOf(rank), p.ranks.dpRankOf(rank));
      p.ranks.release(rank);
    }
  }

  #notifyWorker(c: WorkerChange): void {
    for (const l of this.#workerListeners) l(c);
  }

  // ---------------------------------------------------------------- KV events from workers

  /**
   * Applies one KV-event batch of a worker rank to its partition's prefix index. Returns how
   * many events applied and how many were dropped (unknown worker, block-size mismatch,
   * a stored block whose parent this rank does not hold).
   */
  applyKvEvents(workerId: WorkerId, dpRank: number, batch: KvEventBatch): { applied: number; dropped: number } {
    const located = this.#locateRank(workerId, batch.dpRank ?? dpRank);
    if (located === undefined) {
      this.stats.kvEventsDropped += batch.events.length;
      return { applied: 0, dropped: batch.events.length };
    }
    const { partition: p, rank } = located;
    let applied = 0;
    let dropped = 0;
    for (const ev of batch.events) {
      let ok = true;
      switch (ev.type) {
        case "stored": {
          if (ev.blockSize !== null && ev.blockSize !== p.blockSize) {
            ok = false;
            break;
          }
          const local = computeBlockHashes(ev.tokenIds, p.blockSize, { loraName: ev.loraName, isEagle: ev.eagle });
          const engine = hashListFromBigInts(ev.blockHashes);
          if (hashCount(local) !== hashCount(engine)) {
            ok = false;
            break;
          }
          ok = p.index.applyStored(rank, ev.tier, ev.parentHash, engine, local);
          break;
        }
        case "removed":
          p.index.applyRemoved(rank, ev.tier, hashListFromBigInts(ev.blockHashes));
          break;
        case "cleared":
          p.index.applyCleared(rank);
          break;
      }
      if (ok) applied++;
      else dropped++;
    }
    this.stats.kvEventsApplied += applied;
    this.stats.kvEventsDropped += dropped;
    return { applied, dropped };
  }

  /** A rank's KV-event publisher restarted: its old blocks are gone, rebuild from new events. */
  clearWorkerKv(workerId: WorkerId, dpRank: number): void {
    const located = this.#locateRank(workerId, dpRank);
    if (located !== undefined) located.partition.index.applyCleared(located.rank);
  }

  #locateRank(workerId: WorkerId, dpRank: number): { partition: Partition; rank: number } | undefined {
    const r = this.#catalog.get(workerId);
    if (r === undefined) return undefined;
    const p = this.#partitions.get(partitionKey(r.model_name, r.routing_group));
    if (p === undefined || !p.members.has(workerId)) return undefined;
    const rank = p.ranks.get(workerId, dpRank);
    return rank === undefined ? undefined : { partition: p, rank };
  }

  // ---------------------------------------------------------------- selection

  select(req: SelectRequest): SelectResponse {
    const sel = this.#choose(req);
    if (req.selection_id !== undefined) {
      const entry: PendingEntry = {
        workerId: sel.workerId,
        dpRank: sel.dpRank,
        prompt: sel.prompt,
        effectivePrefillTokens: sel.effectivePrefillTokens,
        trackPrefill: sel.config.trackPrefillTokens,
        expectedOutputTokens: req.expected_output_tokens ?? null,
        prefillDurationMs: req.expected_prefill_duration_ms ?? null,
        sessionId: sel.sessionId,
      };
      const bytes = 8 * (sel.prompt.localHashes.length + sel.prompt.seqHashes.length) + 2 * ((sel.sessionId?.length ?? 0) + req.selection_id.length) + 64;
      this.#pending.insert(sel.partition.key, req.selection_id, entry, bytes);
    }
    const resp = this.#response(sel, req.selection_id, false);
    if (req.advisory === true) {
      const rec = this.#catalog.get(sel.workerId);
      resp.worker_load = {
        active_prefill_tokens: sel.partition.ledger.activePrefillTokens(sel.rank),
        prefill_token_capacity: rec?.max_num_batched_tokens ?? null,
        total_kv_blocks: rec?.total_kv_blocks ?? null,
      };
    }
    return resp;
  }

  selectAndReserve(req: SelectAndReserveRequest): SelectResponse {
    const selectionId = req.selection_id ?? randomUuid(this.#random);
    validateId(selectionId, "selection_id");
    this.#assertIdFree(selectionId);
    const sel = this.#choose(req);
    this.#book(sel.partition, selectionId, sel.workerId, sel.dpRank, sel.prompt, {
      prefillTokens: sel.effectivePrefillTokens,
      trackPrefill: sel.config.trackPrefillTokens,
      expectedOutputTokens: req.expected_output_tokens ?? null,
      prefillDurationMs: req.expected_prefill_duration_ms ?? null,
      sessionId: sel.sessionId,
    });
    return this.#response(sel, selectionId, true);
  }

  createReservation(req: ReservationRequest): ReservationResponse {
    this.#assertRunning();
    if (typeof req.selection_id !== "string") throw new KvmeshError("KVMESH_INVALID_FIELD", "selection_id: required string", { details: { field: "selection_id" } });
    validateId(req.selection_id, "selection_id");
    this.#assertIdFree(req.selection_id);
    const p = this.#requirePartition(req.model_name, req.routing_group);
    if (req.worker_id !== undefined) {
      // Explicit form: the caller names the worker; any cached selection for the id is discarded.
      validateWorkerId(req.worker_id, "worker_id");
      this.#pending.remove(p.key, req.selection_id);
      const dpRank = req.dp_rank ?? 0;
      const rank = p.ranks.get(req.worker_id, dpRank);
      if (rank === undefined || !p.isSchedulable(rank)) {
        throw new KvmeshError("KVMESH_WORKER_NOT_SCHEDULABLE", `worker ${req.worker_id} dp_rank ${dpRank} is not schedulable in ${p.key}`);
      }
      const config = req.router_config_override === undefined ? this.#selector : applyOverride(this.#selector, req.router_config_override);
      const prompt = normalizePrompt(req, p.blockSize, p.isEagle, config.assumeKvReuse, this.#random, this.#promptHashCaches.get(p));
      let effective = req.effective_prefill_tokens;
      if (effective !== undefined) {
        if (!Number.isInteger(effective) || effective < 0) throw badRequest("effective_prefill_tokens must be a non-negative integer", "effective_prefill_tokens");
        if (effective > prompt.islTokens) throw badRequest(`effective_prefill_tokens (${effective}) must not exceed isl_tokens (${prompt.islTokens})`, "effective_prefill_tokens");
      } else {
        effective = this.#effectivePrefillFor(p, rank, prompt, config);
      }
      const trackPrefill = req.track_prefill_tokens ?? (req.effective_prefill_tokens !== undefined ? true : config.trackPrefillTokens);
      this.#book(p, req.selection_id, req.worker_id, dpRank, prompt, {
        prefillTokens: effective,
        trackPrefill,
        expectedOutputTokens: req.expected_output_tokens ?? null,
        prefillDurationMs: null,
        sessionId: this.#sessionIdOf(req),
      });
      return this.#reservationResponse(p, req.selection_id, req.worker_id, dpRank);
    }
    // Replay form: book exactly what /select chose and cached under this id.
    const cached = this.#pending.peek(p.key, req.selection_id);
    if (cached === undefined) {
      throw new KvmeshError("KVMESH_PENDING_SELECTION_NOT_FOUND", `no pending selection ${req.selection_id} in ${p.key} (expired, consumed, or made on another replica)`);
    }
    const e = cached.value;
    const rank = p.ranks.get(e.workerId, e.dpRank);
    if (rank === undefined || !p.isSchedulable(rank)) {
      throw new KvmeshError("KVMESH_WORKER_NOT_SCHEDULABLE", `worker ${e.workerId} dp_rank ${e.dpRank} chosen by the selection is no longer schedulable`);
    }
    try {
      this.#book(p, req.selection_id, e.workerId, e.dpRank, e.prompt, {
        prefillTokens: e.effectivePrefillTokens,
        trackPrefill: e.trackPrefill,
        expectedOutputTokens: e.expectedOutputTokens,
        prefillDurationMs: e.prefillDurationMs,
        sessionId: e.sessionId,
      });
    } catch (err) {
      if (err instanceof KvmeshError && err.code === "KVMESH_SESSION_CONFLICT") this.#pending.remove(p.key, req.selection_id, cached.generation);
      throw err;
    }
    this.#pending.remove(p.key, req.selection_id, cached.generation);
    return this.#reservationResponse(p, req.selection_id, e.workerId, e.dpRank);
  }

  prefillComplete(selectionId: string): void {
    const row = this.#requireRow(selectionId);
    if (!row.partition.ledger.markPrefillComplete(selectionId)) {
      this.#dropRow(selectionId);
      throw new KvmeshError("KVMESH_RESERVATION_NOT_FOUND", `reservation ${selectionId} not found`);
    }
    // Re-published even when already marked, so a peer that missed it converges.
    this.#emitLoad({ type: "prefill_complete", origin: this.replicaId, owner: row.owner, request_id: selectionId, partition: ref(row.partition) });
  }

  addOutputBlock(selectionId: string, decayFraction?: number): void {
    const row = this.#requireRow(selectionId);
    if (decayFraction !== undefined && !(typeof decayFraction === "number" && decayFraction >= 0 && decayFraction <= 1)) {
      throw badRequest("decay_fraction must be a number in [0, 1]", "decay_fraction");
    }
    if (!row.partition.ledger.addOutputBlock(selectionId, decayFraction)) {
      this.#dropRow(selectionId);
      throw new KvmeshError("KVMESH_RESERVATION_NOT_FOUND", `reservation ${selectionId} not found`);
    }
  }

  freeReservation(selectionId: string): void {
    const row = this.#requireRow(selectionId);
    row.partition.ledger.free(selectionId);
    this.#dropRow(selectionId);
    this.#reorder.addTombstone(ReorderState.key(row.owner, selectionId), this.#clock.now());
    this.#emitLoad({ type: "free", origin: this.replicaId, owner: row.owner, request_id: selectionId, partition: ref(row.partition) });
  }

  hasReservation(selectionId: string): boolean {
    return this.#reservations.has(selectionId);
  }

  get reservationCount(): number {
    return this.#reservations.size;
  }

  #choose(req: SelectRequest): Selection {
    this.#assertRunning();
    const p = this.#requirePartition(req.model_name, req.routing_group);
    const config = req.router_config_override === undefined ? this.#selector : applyOverride(this.#selector, req.router_config_override);
    const sessionId = this.#sessionIdOf(req);
    const prompt = normalizePrompt(req, p.blockSize, p.isEagle, config.assumeKvReuse, this.#random, this.#promptHashCaches.get(p));
    const s = p.scratch;
    let n = this.#eligible(p, req);
    if (n === 0) throw new KvmeshError("KVMESH_NOT_READY", `all schedulable workers of ${p.key} were filtered out by the request's constraints`);

    // Session steering: a live binding (or an explicit affinity_target) narrows the candidates to
    // its worker/rank while it is eligible; an ineligible target selects normally and the commit
    // decides (Soft rebinds, Hard rejects).
    let target: { workerId: WorkerId; dpRank: number | null } | undefined;
    if (req.affinity_target !== undefined) {
      validateWorkerId(req.affinity_target.worker_id, "affinity_target.worker_id");
      target = { workerId: req.affinity_target.worker_id, dpRank: req.affinity_target.dp_rank ?? null };
    } else if (sessionId !== undefined && req.pinned_worker === undefined && p.affinity !== undefined) {
      target = p.affinity.resolve(sessionId);
    }
    if (target !== undefined) {
      let m = 0;
      for (let i = 0; i < n; i++) {
        const rank = s.candidates[i] as number;
        if (p.ranks.workerOf(rank) === target.workerId && (target.dpRank === null || p.ranks.dpRankOf(rank) === target.dpRank)) {
          s.candidates[m++] = rank;
        }
      }
      if (m > 0) n = m;
    }

    // Overlap per rank from the prefix index, and shared active blocks from the ledger.
    const match = p.index.findMatches(prompt.localHashes);
    for (let i = 0; i < match.count; i++) {
      const rank = match.ranks[i] as number;
      s.device[rank] = match.device[i] as number;
      s.host[rank] = match.host[i] as number;
      s.disk[rank] = match.disk[i] as number;
    }
    s.touched.length = 0;
    p.ledger.newBlocksFor(prompt.seqHashes, s.heldBlocks, s.touched);
    const blocks = hashCount(prompt.seqHashes);
    const t = s.table;
    t.count = n;
    for (let i = 0; i < n; i++) {
      const rank = s.candidates[i] as number;
      t.device[i] = s.device[rank] as number;
      t.host[i] = s.host[rank] as number;
      t.disk[i] = s.disk[rank] as number;
    }
    p.ledger.fillCandidateLoads(s.candidates, n, blocks, s.heldBlocks, t.activePrefillTokens, t.potentialDecodeBlocks, t.activeRequests);
    let idx = selectCandidate(t, { islTokens: prompt.islTokens, blockSize: p.blockSize }, config, this.#random, s.costs);
    if (this.#tieSpreader !== undefined && config.temperature === 0) idx = this.#tieSpreader.pick(s.costs, n, idx, s.candidates, p.ranks.spreadKeys);
    const rank = s.candidates[idx] as number;
    const device = t.device[idx] as number;
    const host = t.host[idx] as number;
    const disk = t.disk[idx] as number;
    const potentialDecodeBlocks = t.potentialDecodeBlocks[idx] as number;
    const workerId = p.ranks.workerOf(rank);

    // Per dp rank of the chosen worker, device-matched tokens (before the scratch is reset).
    const dp: Record<string, number> = {};
    for (const r of p.members.get(workerId)?.ranks ?? [rank]) dp[String(p.ranks.dpRankOf(r))] = (s.device[r] as number) * p.blockSize;
    for (let i = 0; i < match.count; i++) {
      const r = match.ranks[i] as number;
      s.device[r] = 0;
      s.host[r] = 0;
      s.disk[r] = 0;
    }
    for (const r of s.touched) s.heldBlocks[r] = 0;

    const bs = p.blockSize;
    const overlap: OverlapReport = {
      longest_matched: (device + host + disk) * bs,
      gpu: device * bs,
      dp,
      cpu: (device + host) * bs,
      disk: (device + host + disk) * bs,
    };
    this.stats.selections++;
    return {
      partition: p,
      rank,
      workerId,
      dpRank: p.ranks.dpRankOf(rank),
      prompt,
      config,
      overlap,
      effectivePrefillTokens: effectivePrefill(prompt.islTokens, device, host, disk, bs, config),
      potentialDecodeBlocks,
      sessionId,
    };
  }

  /** Fills scratch.candidates with the schedulable ranks that pass the request's filters. */
  #eligible(p: Partition, req: SelectRequest): number {
    const s = p.scratch;
    if (req.pinned_worker !== undefined) {
      validateWorkerId(req.pinned_worker.worker_id, "pinned_worker.worker_id");
      const rank = p.ranks.get(req.pinned_worker.worker_id, req.pinned_worker.dp_rank);
      if (rank === undefined || !p.isSchedulable(rank)) {
        throw new KvmeshError("KVMESH_WORKER_NOT_SCHEDULABLE", `pinned_worker ${req.pinned_worker.worker_id} dp_rank ${req.pinned_worker.dp_rank} is not schedulable in ${p.key}`);
      }
      s.candidates[0] = rank;
      return 1;
    }
    const allowed = req.allowed_worker_ids === undefined ? undefined : new Set(req.allowed_worker_ids);
    const required = req.routing_constraints?.required_taints;
    let n = 0;
    for (const rank of p.schedulable) {
      if (allowed !== undefined && !allowed.has(p.ranks.workerOf(rank))) continue;
      if (required !== undefined && required.length > 0) {
        const taints = p.members.get(p.ranks.workerOf(rank))?.record.taints ?? [];
        if (!required.every((t) => taints.includes(t))) continue;
      }
      s.candidates[n++] = rank;
    }
    return n;
  }

  #effectivePrefillFor(p: Partition, rank: number, prompt: NormalizedPrompt, config: SelectorConfig): number {
    const match = p.index.findMatches(prompt.localHashes);
    for (let i = 0; i < match.count; i++) {
      if (match.ranks[i] === rank) {
        return effectivePrefill(prompt.islTokens, match.device[i] as number, match.host[i] as number, match.disk[i] as number, p.blockSize, config);
      }
    }
    return prompt.islTokens;
  }

  #book(
    p: Partition,
    selectionId: string,
    workerId: WorkerId,
    dpRank: number,
    prompt: NormalizedPrompt,
    o: { prefillTokens: number; trackPrefill: boolean; expectedOutputTokens: number | null; prefillDurationMs: number | null; sessionId: string | undefined },
  ): void {
    const rank = p.ranks.get(workerId, dpRank);
    if (rank === undefined) throw new KvmeshError("KVMESH_WORKER_NOT_SCHEDULABLE", `worker ${workerId} dp_rank ${dpRank} is not in ${p.key}`);
    if (this.countOwnedBy(this.replicaId) >= this.#maxLocalReservations) {
      this.stats.reservationsRefused++;
      throw new KvmeshError("KVMESH_OVERLOADED", `reservations: this replica holds ${this.#maxLocalReservations} live bookings (the limit); free some or raise --max-reservations`, { details: { field: "reservations" } });
    }
    p.ledger.add(selectionId, rank, prompt.seqHashes, {
      prefillTokens: o.trackPrefill ? o.prefillTokens : 0,
      trackPrefill: o.trackPrefill,
      expectedPrefillDurationMs: o.prefillDurationMs,
      expectedOutputTokens: o.expectedOutputTokens,
    });
    let lease: Lease | undefined;
    if (o.sessionId !== undefined && p.affinity !== undefined) {
      try {
        const c = p.affinity.commit(o.sessionId, { workerId, dpRank });
        if (c.kind !== "unpinned") lease = c.lease;
      } catch (err) {
        p.ledger.free(selectionId);
        throw err;
      }
    }
    const add: LoadAddEvent = {
      type: "add",
      origin: this.replicaId,
      owner: this.replicaId,
      request_id: selectionId,
      partition: ref(p),
      block_size: p.blockSize,
      worker_id: workerId,
      dp_rank: dpRank,
      sequence_hashes: prompt.seqHashes,
      prefill_tokens: o.trackPrefill ? o.prefillTokens : 0,
      track_prefill: o.trackPrefill,
      expected_output_tokens: o.expectedOutputTokens,
      prefill_duration_ms: o.prefillDurationMs,
    };
    this.#installRow({ selectionId, partition: p, workerId, dpRank, owner: this.replicaId, add, lease });
    this.stats.reservations++;
    this.#emitLoad(add);
  }

  #response(sel: Selection, selectionId: string | undefined, booked: boolean): SelectResponse {
    const rec = this.#catalog.get(sel.workerId);
    const resp: SelectResponse = {
      model_name: sel.partition.modelName,
      routing_group: sel.partition.routingGroup,
      worker_id: sel.workerId,
      dp_rank: sel.dpRank,
      endpoint: rec?.endpoint ?? null,
      block_size: sel.partition.blockSize,
      overlap: sel.overlap,
      effective_prefill_tokens: sel.effectivePrefillTokens,
      potential_decode_blocks: sel.potentialDecodeBlocks,
    };
    if (selectionId !== undefined) resp.selection_id = selectionId;
    if (booked) {
      resp.sequence_hashes = hashListToBigInts(sel.prompt.seqHashes);
      resp.isl_tokens = sel.prompt.islTokens;
      resp.track_prefill_tokens = sel.config.trackPrefillTokens;
    }
    return resp;
  }

  #reservationResponse(p: Partition, selectionId: string, workerId: WorkerId, dpRank: number): ReservationResponse {
    return {
      selection_id: selectionId,
      model_name: p.modelName,
      routing_group: p.routingGroup,
      worker_id: workerId,
      dp_rank: dpRank,
      endpoint: this.#catalog.get(workerId)?.endpoint ?? null,
    };
  }

  // ---------------------------------------------------------------- loads and diagnostics

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
          potential_prefill_tokens: p.ledger.activePrefillTokens(rank),
          potential_decode_blocks: p.ledger.activeBlocks(rank),
          active_requests: p.ledger.activeRequests(rank),
        })),
        pending_count: 0,
        pending_isl_tokens: 0,
      });
    }
    return out;
  }

  /** Per schedulable rank: its load if this prompt were booked there, and the resulting cost. */
  potentialLoads(req: SelectRequest): PotentialLoad[] {
    const { p, prompt, config, rows } = this.#scoreAll(req);
    return rows.map((r) => ({
      worker_id: p.ranks.workerOf(r.rank),
      dp_rank: p.ranks.dpRankOf(r.rank),
      potential_prefill_tokens: p.ledger.activePrefillTokens(r.rank) + effectivePrefill(prompt.islTokens, r.device, r.host, r.disk, p.blockSize, config),
      potential_decode_blocks: r.potentialDecodeBlocks,
      active_requests: p.ledger.activeRequests(r.rank),
      overlap_blocks: r.device,
      cost: r.cost,
    }));
  }

  overlapScores(req: SelectRequest): OverlapScoresResponse {
    const { p, prompt, config, rows } = this.#scoreAll(req);
    return {
      num_blocks: hashCount(prompt.localHashes),
      workers: rows.map((r) => ({
        worker_id: p.ranks.workerOf(r.rank),
        dp_rank: p.ranks.dpRankOf(r.rank),
        device_blocks: r.device,
        host_pinned_blocks: r.device + r.host,
        disk_blocks: r.device + r.host + r.disk,
        host_pinned_extension_blocks: r.host,
        router_credit_blocks: r.device * config.overlapScoreCredit + r.host * config.hostCacheHitWeight + r.disk * config.diskCacheHitWeight,
      })),
      shared_cache: { enabled: false },
    };
  }

  #scoreAll(req: SelectRequest): {
    p: Partition;
    prompt: NormalizedPrompt;
    config: SelectorConfig;
    rows: { rank: number; device: number; host: number; disk: number; potentialDecodeBlocks: number; cost: number }[];
  } {
    const p = this.#requirePartition(req.model_name, req.routing_group);
    const config = req.router_config_override === undefined ? this.#selector : applyOverride(this.#selector, req.router_config_override);
    const prompt = normalizePrompt(req, p.blockSize, p.isEagle, config.assumeKvReuse, this.#random, this.#promptHashCaches.get(p));
    const match = p.index.findMatches(prompt.localHashes);
    const byRank = new Map<number, [number, number, number]>();
    for (let i = 0; i < match.count; i++) byRank.set(match.ranks[i] as number, [match.device[i] as number, match.host[i] as number, match.disk[i] as number]);
    const held = new Int32Array(p.ranks.capacity);
    const touched: number[] = [];
    p.ledger.newBlocksFor(prompt.seqHashes, held, touched);
    const blocks = hashCount(prompt.seqHashes);
    const n = this.#eligible(p, req);
    const minPrefill = Math.min(...Array.from(p.scratch.candidates.subarray(0, n), (r) => p.ledger.activePrefillTokens(r)));
    const rows = [];
    for (let i = 0; i < n; i++) {
      const rank = p.scratch.candidates[i] as number;
      const [device, host, disk] = byRank.get(rank) ?? [0, 0, 0];
      const potentialDecodeBlocks = p.ledger.activeBlocks(rank) + blocks - (held[rank] as number);
      const cost = computeCost(
        { device, host, disk, activePrefillTokens: p.ledger.activePrefillTokens(rank), potentialDecodeBlocks, activeRequests: p.ledger.activeRequests(rank) },
        { islTokens: prompt.islTokens, blockSize: p.blockSize },
        config,
        minPrefill,
      );
      rows.push({ rank, device, host, disk, potentialDecodeBlocks, cost });
    }
    return { p, prompt, config, rows };
  }

  /**
   * The prefix index as KV events per partition (GET /dump): replaying them into an empty
   * service rebuilds the same index.
   */
  dump(): Record<string, { block_size: number; events: DumpEvent[] }> {
    const out: Record<string, { block_size: number; events: DumpEvent[] }> = {};
    for (const p of this.#partitions.values()) {
      const events: DumpEvent[] = [];
      for (const [workerId, m] of p.members) {
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

  /** Index and table sizes, for metrics. */
  sizes(): {
    partitions: number;
    indexedBlocks: number;
    indexNodes: number;
    affinityEntries: number;
    affinityFallbacks: number;
    pendingSelections: number;
    pendingEvictions: number;
    reorderEntries: number;
    reorderShed: number;
  } {
    let indexedBlocks = 0;
    let indexNodes = 0;
    let affinityEntries = 0;
    let affinityFallbacks = 0;
    for (const p of this.#partitions.values()) {
      indexedBlocks += p.index.size;
      indexNodes += p.index.nodeCount;
      affinityEntries += p.affinity?.size ?? 0;
      affinityFallbacks += p.affinity?.fallbacks ?? 0;
    }
    return {
      partitions: this.#partitions.size,
      indexedBlocks,
      indexNodes,
      affinityEntries,
      affinityFallbacks,
      pendingSelections: this.#pending.size,
      pendingEvictions: this.#pending.evictions,
      reorderEntries: this.#reorder.size,
      reorderShed: this.#reorder.shed,
    };
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

  // ---------------------------------------------------------------- replica apply

  /**
   * Applies a peer's load event, idempotently by `(owner, request_id)`. A Free that overtook its
   * Add leaves a tombstone so the late Add is ignored; an early prefill-complete is remembered
   * and applied with the Add. Returns whether the event changed state.
   */
  applyLoadEvent(e: LoadEvent): boolean {
    if (e.origin === this.replicaId) return this.#ignored();
    const now = this.#clock.now();
    const key = ReorderState.key(e.owner, e.request_id);
    const p = this.#partitions.get(partitionKey(e.partition.model_name, e.partition.routing_group));
    switch (e.type) {
      case "add": {
        if (p === undefined || e.block_size !== p.blockSize) return this.#ignored();
        if (this.#reorder.hasTombstone(key, now)) return this.#ignored();
        if (this.#reservations.has(e.request_id) || p.ledger.has(e.request_id)) return this.#ignored();
        const rank = p.ranks.get(e.worker_id, e.dp_rank);
        if (rank === undefined) return this.#ignored();
        p.ledger.add(e.request_id, rank, e.sequence_hashes, {
          prefillTokens: e.prefill_tokens,
          trackPrefill: e.track_prefill,
          expectedPrefillDurationMs: e.prefill_duration_ms,
          expectedOutputTokens: e.expected_output_tokens,
        });
        if (this.#reorder.takeEarlyMark(key, now)) p.ledger.markPrefillComplete(e.request_id);
        this.#installRow({ selectionId: e.request_id, partition: p, workerId: e.worker_id, dpRank: e.dp_rank, owner: e.owner, add: e, lease: undefined });
        break;
      }
      case "prefill_complete": {
        const row = this.#reservations.get(e.request_id);
        if (row === undefined || row.owner !== e.owner) {
          this.#reorder.addEarlyMark(key, now);
          return this.#ignored();
        }
        row.partition.ledger.markPrefillComplete(e.request_id);
        break;
      }
      case "free": {
        this.#reorder.addTombstone(key, now);
        const row = this.#reservations.get(e.request_id);
        if (row === undefined || row.owner !== e.owner) return this.#ignored();
        row.partition.ledger.free(e.request_id);
        this.#dropRow(e.request_id);
        break;
      }
    }
    this.stats.replicaEventsApplied++;
    return true;
  }

  /** Merges a peer's session binding by `(sequence, writer_id)` (the mesh's entry point). */
  applyBindingEvent(e: BindingEvent): string {
    if (this.#affinity === undefined) {
      this.stats.bindingsIgnored++;
      return "ignored-affinity-disabled";
    }
    return this.#mergeBinding(e);
  }

  #mergeBinding(e: BindingEvent): SessionBindingOutcomeKind {
    const p = this.#partitions.get(partitionKey(e.model_name, e.routing_group));
    if (e.writer_id === this.#writerId) {
      // Our own binding coming back. A peer's *refresh* of it means the session is in use there:
      // extend our idle TTL. Anything else (an echo, a snapshot copy) changes nothing.
      if (e.reason === "refresh" && p?.affinity?.refreshOwn({ sessionId: e.session_id, target: { workerId: e.worker_id, dpRank: e.dp_rank }, version: { sequence: e.sequence, writerId: e.writer_id } }) === true) {
        this.stats.bindingsApplied++;
        return "refreshed";
      }
      this.stats.bindingsIgnored++;
      return "ignored-own";
    }
    if (p?.affinity === undefined || !p.members.has(e.worker_id)) {
      // The binding is real; this replica just has not learned the worker (or partition) yet.
      // Park it and apply it when the worker registers, instead of dropping it.
      p?.affinity?.observeSequence(e.sequence);
      this.#park(e);
      return "parked-unknown-worker";
    }
    const outcome = p.affinity.applyReplica({
      sessionId: e.session_id,
      target: { workerId: e.worker_id, dpRank: e.dp_rank },
      version: { sequence: e.sequence, writerId: e.writer_id },
    });
    if (outcome.startsWith("ignored") || outcome.startsWith("rejected")) this.stats.bindingsIgnored++;
    else this.stats.bindingsApplied++;
    return outcome;
  }

  // ---------------------------------------------------------------- host replication

  /** The host-supplied writer id in host-replication mode, else undefined. */
  get sessionReplicationWriterId(): bigint | undefined {
    return this.#hostReplication ? this.#writerId : undefined;
  }

  /**
   * The bindings this service commits (bind, rebind) and refreshes (a request of the session
   * finished, or a long request's keepalive), as batches: everything queued is handed over on
   * each wake-up. Every call is an independent subscription from now on, with its own bound
   * (see session-binding-stream.ts); it ends when the service shuts down (after what is queued)
   * or on `break` / `opts.signal`. A batch with `dropped > 0` means the bound shed bindings:
   * publish `bindingsSnapshot()` once to repair. Host-replication mode only (409 otherwise).
   */
  sessionBindingUpdates(opts: SessionBindingUpdatesOptions = {}): SessionBindingSubscription {
    this.#assertHostReplication();
    // Filled after construction: an already-aborted signal closes the subscription inside it.
    const ref: { sub?: SessionBindingSubscription; off?: () => void } = {};
    const sub = new SessionBindingSubscription(opts, {
      onClose: () => {
        ref.off?.();
        if (ref.sub !== undefined) this.#bindingSubscriptions.delete(ref.sub);
      },
      onShed: () => {
        this.stats.droppedBindings++;
      },
    });
    ref.sub = sub;
    if (sub.closed) return sub;
    if (this.#shuttingDown) sub.end();
    else {
      ref.off = this.onBindingEvent((e) => {
        sub.push(e);
      });
      this.#bindingSubscriptions.add(sub);
    }
    return sub;
  }

  /** Live `sessionBindingUpdates()` subscriptions. */
  get sessionBindingSubscribers(): number {
    return this.#bindingSubscriptions.size;
  }

  /**
   * Merges peers' bindings (from their `sessionBindingUpdates()`, carried by the host) by
   * `(sequence, writer_id)`, synchronously, and says what happened to each. Every field is
   * validated first (rejected-invalid names the field); a binding for a worker or partition not
   * registered here yet is parked (for DEFAULT_PARKED_BINDING_TTL_MS) and applied when the worker
   * registers. Applied bindings are never re-published, so two replicas cannot echo one back and
   * forth. Host-replication mode only (409 otherwise).
   */
  applySessionBinding(binding: SessionBindingInput): SessionBindingOutcome;
  applySessionBinding(bindings: readonly SessionBindingInput[]): SessionBindingOutcome[];
  applySessionBinding(input: SessionBindingInput | readonly SessionBindingInput[]): SessionBindingOutcome | SessionBindingOutcome[] {
    this.#assertHostReplication();
    if (Array.isArray(input)) return (input as readonly unknown[]).map((b) => this.#applyOne(b));
    return this.#applyOne(input);
  }

  /** Validates one peer binding without applying it (what applySessionBinding checks first). */
  checkSessionBinding(binding: unknown): ReturnType<typeof checkSessionBinding> {
    return checkSessionBinding(binding, this.#affinity?.maxSessionIdBytes ?? MAX_ID_BYTES);
  }

  #applyOne(input: unknown): SessionBindingOutcome {
    const checked = this.checkSessionBinding(input);
    if (!checked.ok) {
      this.stats.bindingsIgnored++;
      return { outcome: "rejected-invalid", reason: checked.reason };
    }
    return { outcome: this.#mergeBinding(checked.binding) };
  }

  #assertHostReplication(): void {
    if (!this.#hostReplication) {
      throw new KvmeshError("KVMESH_HOST_REPLICATION_DISABLED", "host replication is disabled: construct the service with sessionReplicationWriterId (kvmesh serve --session-replication-writer-id N)");
    }
  }

  #park(e: BindingEvent): void {
    const key = `${e.model_name}:${e.routing_group}/${e.session_id}`;
    const prev = this.#parked.get(key)?.event;
    if (prev !== undefined && (prev.sequence > e.sequence || (prev.sequence === e.sequence && prev.writer_id >= e.writer_id))) return;
    this.#parked.delete(key);
    this.#parked.set(key, { event: e, expiresAtMs: this.#clock.now() + DEFAULT_PARKED_BINDING_TTL_MS });
    this.stats.bindingsParked++;
    if (this.#parked.size > DEFAULT_PARKED_BINDINGS_MAX) {
      const oldest = this.#parked.keys().next();
      if (oldest.done !== true) {
        this.#parked.delete(oldest.value);
        this.stats.parkedBindingsShed++;
      }
    }
  }

  /** Applies parked bindings whose worker just became a member of its partition. */
  #unpark(p: Partition, workerId: WorkerId): void {
    if (this.#parked.size === 0) return;
    for (const [k, v] of this.#parked) {
      const e = v.event;
      if (e.worker_id !== workerId || e.model_name !== p.modelName || e.routing_group !== p.routingGroup) continue;
      this.#parked.delete(k);
      this.stats.bindingsUnparked++;
      this.#mergeBinding(e);
    }
  }

  get parkedBindings(): number {
    return this.#parked.size;
  }

  // ---------------------------------------------------------------- replica snapshots

  /**
   * Every live booking held here, own and mirrored, each with its owner: what a snapshot of this
   * replica carries. A receiver replaces what it mirrors of this replica's own bookings and adds
   * the others it lacks (a restarted replica thereby learns the bookings of a peer that died).
   */
  bookingsSnapshot(): BookingSnapshot[] {
    const out: BookingSnapshot[] = [];
    for (const row of this.#reservations.values()) {
      out.push({ add: row.add, prefillDone: row.partition.ledger.get(row.selectionId)?.prefillDone ?? false });
    }
    return out;
  }

  /** Every live session binding held here (LWW merge makes re-applying them harmless). */
  bindingsSnapshot(): BindingEvent[] {
    const out: BindingEvent[] = [];
    for (const p of this.#partitions.values()) {
      for (const b of p.affinity?.snapshot() ?? []) {
        out.push({
          model_name: p.modelName,
          routing_group: p.routingGroup,
          session_id: b.sessionId,
          worker_id: b.target.workerId,
          dp_rank: b.target.dpRank,
          sequence: b.version.sequence,
          writer_id: b.version.writerId,
          reason: "refresh",
        });
      }
    }
    return out;
  }

  /** Live bookings this replica holds that `owner` made (own or mirrored). */
  countOwnedBy(owner: bigint): number {
    return this.#ownedCounts.get(owner) ?? 0;
  }

  /**
   * Installs a snapshot from `owner`: rows `owner` booked that the snapshot lacks are freed;
   * bookings missing here (its own, or others' it mirrors) are added; prefill completion is
   * brought up to date. Tombstones keep a freed booking from coming back.
   */
  replaceOrigin(owner: bigint, bookings: readonly BookingSnapshot[]): { added: number; removed: number } {
    if (owner === this.replicaId) return { added: 0, removed: 0 };
    const live = new Map(bookings.map((b) => [b.add.request_id, b]));
    let removed = 0;
    for (const row of [...this.#reservations.values()]) {
      if (row.owner !== owner || live.has(row.selectionId)) continue;
      row.partition.ledger.free(row.selectionId);
      this.#dropRow(row.selectionId);
      removed++;
    }
    let added = 0;
    for (const b of bookings) {
      if (b.add.owner === this.replicaId) continue;
      const row = this.#reservations.get(b.add.request_id);
      if (row === undefined) {
        if (this.applyLoadEvent({ ...b.add, origin: owner })) added++;
      }
      // Prefill completion only moves forward, whoever reports it.
      if (b.prefillDone) this.#reservations.get(b.add.request_id)?.partition.ledger.markPrefillComplete(b.add.request_id);
    }
    return { added, removed };
  }

  /** Frees every booking mirrored from `owner` (a deregistered peer). Returns how many. */
  dropOrigin(owner: bigint): number {
    if (owner === this.replicaId) return 0;
    return this.replaceOrigin(owner, []).removed;
  }

  #ignored(): false {
    this.stats.replicaEventsIgnored++;
    return false;
  }

  // ---------------------------------------------------------------- maintenance

  /**
   * Periodic upkeep (the daemon calls it every second): force-frees bookings past the expiry,
   * drops reservation rows whose booking is gone, reaps idle session bindings and expired
   * cached selections and reorder state.
   */
  tick(): void {
    const now = this.#clock.now();
    for (const p of this.#partitions.values()) {
      const expired = p.ledger.expire();
      this.stats.expiredRequests += expired.length;
      for (const id of expired) {
        const row = this.#reservations.get(id);
        this.#dropRow(id);
        // Peers free their mirror of our expired booking now rather than at their own expiry.
        if (row?.owner === this.replicaId) this.#emitLoad({ type: "free", origin: this.replicaId, owner: row.owner, request_id: id, partition: ref(p) });
      }
      if (p.affinity !== undefined && now >= p.nextAffinitySweepMs) {
        p.affinity.sweep();
        p.nextAffinitySweepMs = now + affinitySweepIntervalMs(p.affinity.ttlMs);
      }
    }
    for (const [id, row] of this.#reservations) {
      if (!row.partition.ledger.has(id)) this.#dropRow(id);
    }
    this.#pending.sweep();
    this.#reorder.sweep(now);
    for (const [k, v] of this.#parked) {
      if (v.expiresAtMs > now) break;
      this.#parked.delete(k);
      this.stats.parkedBindingsExpired++;
    }
  }

  shutdown(): void {
    this.#shuttingDown = true;
    // Binding streams deliver what is queued, then end (a host's relay loop finishes cleanly).
    for (const sub of this.#bindingSubscriptions) sub.end();
  }

  get shuttingDown(): boolean {
    return this.#shuttingDown;
  }

  // ---------------------------------------------------------------- helpers

  #assertRunning(): void {
    if (this.#shuttingDown) throw new KvmeshError("KVMESH_SHUTTING_DOWN", "selection service is shutting down");
  }

  #assertIdFree(id: string): void {
    if (this.#reservations.has(id)) throw new KvmeshError("KVMESH_DUPLICATE_ID", `selection_id ${id} is already live`);
    for (const p of this.#partitions.values()) {
      if (p.ledger.has(id)) throw new KvmeshError("KVMESH_DUPLICATE_ID", `selection_id ${id} is already live`);
    }
  }

  #requirePartition(model: string | undefined, group: string | undefined): Partition {
    if (this.#shuttingDown) throw new KvmeshError("KVMESH_SHUTTING_DOWN", "selection service is shutting down");
    const key = partitionKey(model ?? DEFAULT_MODEL_NAME, group ?? DEFAULT_ROUTING_GROUP);
    const p = this.#partitions.get(key);
    if (p === undefined || p.schedulable.length === 0) {
      const any = this.#catalog.list().some((r) => r.lifecycle === "schedulable");
      throw new KvmeshError("KVMESH_NOT_READY", any ? `no schedulable workers for ${key}` : "no schedulable workers are available");
    }
    return p;
  }

  #requireRow(selectionId: string): ReservationRow {
    if (typeof selectionId !== "string" || selectionId.length === 0) throw badRequest("selection_id must be a non-empty string", "selection_id");
    const row = this.#reservations.get(selectionId);
    if (row === undefined) throw new KvmeshError("KVMESH_RESERVATION_NOT_FOUND", `reservation ${selectionId} not found`);
    return row;
  }

  #installRow(row: ReservationRow): void {
    this.#reservations.set(row.selectionId, row);
    this.#ownedCounts.set(row.owner, (this.#ownedCounts.get(row.owner) ?? 0) + 1);
  }

  #dropRow(selectionId: string): void {
    const row = this.#reservations.get(selectionId);
    if (row === undefined) return;
    this.#reservations.delete(selectionId);
    const n = (this.#ownedCounts.get(row.owner) ?? 1) - 1;
    if (n === 0) this.#ownedCounts.delete(row.owner);
    else this.#ownedCounts.set(row.owner, n);
    if (row.lease !== undefined) row.partition.affinity?.release(row.lease);
  }

  #sessionIdOf(req: { session_id?: string | undefined; session_context?: { session_id: string } | undefined }): string | undefined {
    const id = req.session_context?.session_id ?? req.session_id;
    if (id === undefined) return undefined;
    validateId(id, req.session_context !== undefined ? "session_context.session_id" : "session_id");
    return id;
  }

  #emitLoad(e: LoadEvent): void {
    for (const l of this.#loadListeners) l(e);
  }
}

export interface DumpEvent {
  worker_id: WorkerId;
  dp_rank: number;
  tier: string;
  parent_hash: bigint | null;
  block_hashes: bigint[];
  local_hashes: bigint[];
}

function ref(p: Partition): PartitionRef {
  return { model_name: p.modelName, routing_group: p.routingGroup };
}

/** isl − credit-weighted cached tokens, clamped at 0 (reference 4.4). */
function effectivePrefill(isl: number, device: number, host: number, disk: number, blockSize: number, c: SelectorConfig): number {
  const credit = device * c.overlapScoreCredit + host * c.hostCacheHitWeight + disk * c.diskCacheHitWeight;
  return Math.max(0, isl - Math.round(credit * blockSize));
}

function validateId(id: unknown, field: string): asserts id is string {
  if (typeof id !== "string" || id.length === 0) throw badRequest(`${field} must be a non-empty string`, field);
  if (Buffer.byteLength(id, "utf8") > MAX_ID_BYTES) throw badRequest(`${field} is longer than ${MAX_ID_BYTES} bytes`, field);
}

/**
 * Cross-option checks of replication: host replication needs session affinity and excludes the
 * built-in mesh. Returns the host's writer id as a bigint, or undefined without host replication.
 */
function checkReplicationOptions(options: SelectionServiceOptions): bigint | undefined {
  const sync = options.replicaSync;
  if (sync !== undefined) {
    if (typeof sync.publishBind !== "string" || sync.publishBind.length === 0) {
      throw badRequest("replicaSync.publishBind must be a non-empty endpoint string, e.g. tcp://0.0.0.0:7100", "replicaSync.publishBind");
    }
    if (sync.advertiseEndpoint !== undefined && (typeof sync.advertiseEndpoint !== "string" || sync.advertiseEndpoint.length === 0)) {
      throw badRequest("replicaSync.advertiseEndpoint must be a non-empty endpoint string", "replicaSync.advertiseEndpoint");
    }
    (sync.peers ?? []).forEach((peer, i) => {
      if (typeof peer !== "string" || peer.length === 0) throw badRequest(`replicaSync.peers[${i}] must be a non-empty endpoint string`, `replicaSync.peers[${i}]`);
    });
  }
  const raw = options.sessionReplicationWriterId;
  if (raw === undefined) return undefined;
  const field = "sessionReplicationWriterId";
  const id = typeof raw === "bigint" ? raw : typeof raw === "number" && Number.isSafeInteger(raw) ? BigInt(raw) : undefined;
  if (id === undefined || id <= 0n || id >= 1n << 64n) {
    throw badRequest(`${field} must be a non-zero unsigned 64-bit integer (a bigint, or a number up to 2^53 - 1)`, field);
  }
  if (options.sessionAffinity === undefined) {
    throw badRequest(`${field} (host replication) needs sessionAffinity: there are no session bindings to replicate without it`, field);
  }
  if (sync !== undefined) {
    throw badRequest(`${field} (host replication) and replicaSync (the built-in mesh) exclude each other: bindings would travel twice, with two writer ids`, field);
  }
  return id;
}

function randomReplicaId(random: Random): bigint {
  for (;;) {
    const hi = BigInt(Math.floor(random.next() * 0x1_0000_0000));
    const lo = BigInt(Math.floor(random.next() * 0x1_0000_0000));
    const id = (hi << 32n) | lo;
    if (id !== 0n) return id;
  }
}

/** RFC 4122 v4 layout from the injected random source (deterministic under a seeded Random). */
function randomUuid(random: Random): string {
  const b = new Uint8Array(16);
  for (let i = 0; i < 16; i++) b[i] = Math.floor(random.next() * 256);
  b[6] = ((b[6] as number) & 0x0f) | 0x40;
  b[8] = ((b[8] as number) & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

