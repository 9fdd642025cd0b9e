/**
 * The selection service: the public facade of the selection core. It composes the parts, each in
 * its own file, and keeps the public API the daemon's HTTP layer, the KV-event ingest, the
 * replica mesh and embedding hosts call:
 * - fleet.ts: the worker catalogue, partitions, KV-event apply, /loads, /dump, sizes;
 * - choose.ts: eligibility, session steering, overlap and cost (select and the score views);
 * - reservations.ts: bookings, their lifecycle, the booking cap, the expiry sweep;
 * - replica-state.ts: peers' load as mirrored here, their snapshots;
 * - bindings.ts: session bindings across replicas (mesh and host replication);
 * - service-options.ts: options, defaults and their checks; service-stats.ts: the counters.
 *
 * Everything runs on one event loop and a selection never awaits between choosing a worker,
 * booking its load and committing the session binding, so the claim/initialize states Dynamo's
 * selection core needs to guard those awaits are not needed here.
 */
import { addBusySignals, type BusyThresholds } from "./busy-signals.js";
import { SessionBindings } from "./bindings.js";
import type { VersionRefusal } from "./lamport.js";
import { CatalogReplication, type CatalogVersion, type WorkerReplicaStatus } from "./catalog-replication.js";
import { Chooser, effectivePrefill, selectResponse } from "./choose.js";
import type { Clock } from "./time.js";
import type { Random } from "./random.js";
import { KvmeshError } from "./errors.js";
import { Fleet, type DumpEvent, type DumpFilter, type FleetSizes, type WorkerChange } from "./fleet.js";
import { hashCount } from "./hash64.js";
import { exportPredictions, installPredictions } from "./predicted-snapshot.js";
import type { IndexRankSnapshot, IndexSnapshotSource } from "./index-snapshot.js";
import type { IndexPartitionTree, IndexRankTarget, MergedRank } from "./index-tree-merge.js";
import type { KvApplyResult, KvEventBatch } from "./kv-events.js";
import { LOAD_STRATEGIES } from "./replication/load-strategies.js";
import type { LoadStrategy } from "./replication/load-strategy.js";
import { Replication, type ReplicationPort } from "./replication/port.js";
import { MissedPeerState } from "./replication/missed-state.js";
import type { BindingEvent, LoadReplication } from "./replica-events.js";
import { randomUuid, validateId } from "./request-ids.js";
import { ReservationBook } from "./reservations.js";
import { resolveServiceOptions, type SelectionServiceOptions } from "./service-options.js";
import { ServiceCounters, type ServiceStats } from "./service-stats.js";
import type { checkSessionBinding, SessionBindingInput, SessionBindingOutcome } from "./session-binding-input.js";
import type { SessionBindingSubscription, SessionBindingUpdatesOptions } from "./session-binding-stream.js";
import { TieSpreader } from "./tie-spread.js";
import type {
  ModelLoadResponse,
  OverlapScoresResponse,
  PotentialLoad,
  ReservationRequest,
  ReservationResponse,
  SelectAndReserveRequest,
  SelectionNote,
  SelectReplyShape,
  SelectRequest,
  SelectResponse,
  WorkerCatalogRecord,
  WorkerId,
  WorkerPatchRequest,
  WorkerRequest,
} from "./types.js";

export { DEFAULT_ACTIVE_REQUEST_EXPIRY_MS } from "./load-ledger.js";
export { MAX_ID_BYTES } from "./request-ids.js";
export { DEFAULT_PARKED_BINDING_TTL_MS, DEFAULT_PARKED_BINDINGS_MAX } from "./bindings.js";
export { DEFAULT_CATALOG_TOMBSTONE_TTL_MS, DEFAULT_CATALOG_TOMBSTONES_MAX, type WorkerReplicaStatus } from "./catalog-replication.js";
export { MAX_RANK_KEYS } from "./rank-registry.js";
export {
  DEFAULT_MAX_LOCAL_RESERVATIONS,
  DEFAULT_MAX_PARTITIONS,
  DEFAULT_MAX_RESERVATION_BYTES,
  DEFAULT_MAX_RANKS,
  MAX_AFFINITY_TTL_SECS,
  MIN_AFFINITY_TTL_SECS,
  resolveServiceOptions,
  type ReplicaSyncOptions,
  type SelectionServiceOptions,
  type SessionAffinityOptions,
} from "./service-options.js";
export type { ServiceStats } from "./service-stats.js";
export type { DumpEvent, DumpFilter, WorkerChange } from "./fleet.js";

/**
 * `worker_load.prefill_token_capacity` of a worker registered without max_num_batched_tokens:
 * the reference's DEFAULT_MAX_BATCHED_TOKENS (lib/kv-router/src/scheduling/queue.rs).
 */
export const DEFAULT_MAX_BATCHED_TOKENS = 10_000_000;

/** GET /ready lists the workers' records up to this many workers (the reference's shape); past it, a count (#29 G13). */
export const READY_WORKERS_LISTED_MAX = 256;

export class SelectionService {
  readonly replicaId: bigint;
  readonly #clock: Clock;
  readonly #random: Random;
  readonly #counters = new ServiceCounters();
  readonly #fleet: Fleet;
  readonly #chooser: Chooser;
  readonly #book: ReservationBook;
  readonly #load: LoadStrategy;
  readonly #replication: Replication;
  readonly #bindings: SessionBindings;
  readonly #catalog: CatalogReplication;
  readonly #drainingListeners: (() => void)[] = [];
  readonly #refusalListeners = new Set<(r: VersionRefusal) => void>();
  readonly #busy: BusyThresholds;
  #shuttingDown = false;
  #draining = false;

  constructor(options: SelectionServiceOptions = {}) {
    const o = resolveServiceOptions(options);
    this.#busy = o.busyThresholds;
    this.replicaId = o.replicaId;
    this.#clock = o.clock;
    this.#random = o.random;
    const counters = this.#counters;
    // The fleet's hooks reach parts built after it; they only run once workers register.
    this.#fleet = new Fleet({
      clock: o.clock,
      random: o.random,
      expiryMs: o.expiryMs,
      prefillTiming: o.selector.costModel === "ttft" ? o.selector : undefined,
      requireKvEventsEndpoint: o.requireKvEventsEndpoint,
      predicted: o.predictedCache,
      maxPartitions: o.maxPartitions,
      maxRanks: o.maxRanks,
      counters,
      hooks: {
        createAffinity: (p) => this.#bindings.createTable(p),
        workerJoined: (p, workerId) => {
          this.#bindings.unpark(p, workerId);
        },
        bookingsGone: (p, ids) => {
          this.#load.ownBookingsGone(p, ids);
          for (const id of ids) this.#book.drop(id);
        },
        partitionCreated: (p) => {
          this.#load.partitionCreated(p);
        },
        partitionRemoved: (p) => {
          this.#load.partitionRemoved(p);
        },
        rankLeaving: (p, rank) => {
          this.#load.rankLeaving(p, rank);
        },
      },
    });
    this.#bindings = new SessionBindings({
      clock: o.clock,
      wallClockNs: o.wallClockNs,
      affinity: o.affinity,
      refreshCoalesceMs: o.bindingRefreshCoalesceMs,
      writerId: o.writerId,
      hostReplication: o.hostReplication,
      counters,
      fleet: this.#fleet,
      onVersionRefused: (r) => {
        this.#versionRefused(r);
      },
    });
    this.#catalog = new CatalogReplication({
      clock: o.clock,
      wallClockNs: o.wallClockNs,
      replicaId: o.replicaId,
      counters,
      fleet: this.#fleet,
      onVersionRefused: (r) => {
        this.#versionRefused(r);
      },
    });
    this.#chooser = new Chooser({ selector: o.selector, workerType: o.workerType, random: o.random, clock: o.clock, counters, fleet: this.#fleet });
    this.#book = new ReservationBook({
      replicaId: o.replicaId,
      maxLocalReservations: o.maxLocalReservations,
      maxReservationBytes: o.maxReservationBytes,
      clock: o.clock,
      selectionCache: o.selectionCache,
      counters,
      fleet: this.#fleet,
      chooser: this.#chooser,
      random: o.random,
      emit: (e) => {
        this.#load.ownEvent(e);
      },
      freed: (owner, id) => {
        this.#load.noteFreed(owner, id);
      },
    });
    const missed = new MissedPeerState();
    this.#load = LOAD_STRATEGIES[o.loadReplication]({
      missed,
      replicaId: o.replicaId,
      clock: o.clock,
      counters,
      fleet: this.#fleet,
      book: this.#book,
      expiryMs: o.expiryMs,
      emit: (event) => {
        this.#replication.emitLoad({ kind: "load", event });
      },
      pending: () => {
        this.#replication.pending();
      },
    });
    const drainingListeners = this.#drainingListeners;
    const isDraining = (): boolean => this.#draining;
    this.#replication = new Replication({
      replicaId: o.replicaId,
      load: this.#load,
      parts: {
        bindings: this.#bindings,
        catalog: this.#catalog,
        predictions: {
          snapshot: () => exportPredictions(this.#fleet, counters),
          install: (rows) => {
            installPredictions(this.#fleet, counters, rows);
          },
        },
      },
      local: {
        get draining() {
          return isDraining();
        },
        onDraining: (listener) => {
          drainingListeners.push(listener);
        },
      },
      setSlot: (slot) => {
        this.#chooser.setTieSpreader(slot === null ? undefined : new TieSpreader(slot, this.#random));
      },
      missed,
    });
    this.#fleet.onWorkerChange((c) => {
      this.#replication.workersChanged(c.workerId, c.record === null);
    });
  }

  /**
   * The replication port (src/core/replication/port.ts): what a replicator (the mesh, a host's
   * transport) attaches to, applies peers' events and snapshots through, and reads counts from.
   */
  get replication(): ReplicationPort {
    return this.#replication;
  }

  /** What the service has counted (live, read-only; cheap to read at every scrape). */
  get stats(): ServiceStats {
    return this.#counters.view;
  }

  /** How this replica shares its bookings with peers (service option loadReplication). */
  get loadReplication(): LoadReplication {
    return this.#load.mode;
  }

  // ---------------------------------------------------------------- observers

  /** A worker registered, changed or left here (the KV-event ingest follows its endpoints). */
  onWorkerChange(listener: (c: WorkerChange) => void): () => void {
    return this.#fleet.onWorkerChange(listener);
  }

  // ---------------------------------------------------------------- workers

  /** Registers (or replaces) a worker here, and on every peer (catalog-replication.ts). */
  upsertWorker(req: WorkerRequest): WorkerCatalogRecord {
    this.#replication.drainInbound();
    this.#assertRunning();
    return this.#catalog.upsert(req);
  }

  /**
   * The ingest could not use a KV-event endpoint of `record` (ZeroMQ refused it): the worker turns
   * incomplete with `reason` unless a newer registration replaced `record` (Fleet.markKvEndpointUnusable).
   */
  markKvEndpointUnusable(record: WorkerCatalogRecord, reason: string): WorkerCatalogRecord | undefined {
    return this.#fleet.markKvEndpointUnusable(record, reason);
  }

  patchWorker(workerId: WorkerId, patch: WorkerPatchRequest): WorkerCatalogRecord {
    this.#replication.drainInbound();
    this.#assertRunning();
    return this.#catalog.patch(workerId, patch);
  }

  /** Deletion stays allowed while shutting down (a drained fleet must be able to leave). */
  deleteWorker(workerId: WorkerId): WorkerCatalogRecord {
    this.#replication.drainInbound();
    return this.#catalog.delete(workerId);
  }

  /** The catalogue's version of a worker, a deletion included while its tombstone lasts (catalog-replication.ts). */
  catalogVersionOf(workerId: WorkerId): CatalogVersion | undefined {
    this.#replication.drainInbound();
    return this.#catalog.versionOf(workerId);
  }

  /** Each replica's outcome for the worker (its lifecycle and reasons there), sorted by replica id. */
  workerReplicas(workerId: WorkerId): WorkerReplicaStatus[] {
    this.#replication.drainInbound();
    return this.#catalog.replicasOf(workerId);
  }

  listWorkers(modelName?: string, routingGroup?: string): WorkerCatalogRecord[] {
    this.#replication.drainInbound();
    return this.#fleet.listWorkers(modelName, routingGroup);
  }

  getWorker(workerId: WorkerId): WorkerCatalogRecord | undefined {
    this.#replication.drainInbound();
    return this.#fleet.getWorker(workerId);
  }

  /**
   * GET /ready: as the reference's `ReadyResponse` (services/selection/types.rs), `workers` is
   * every catalog record (`catalog.list(None, None)`), not a count, up to READY_WORKERS_LISTED_MAX
   * workers (or with `allWorkers`). Past it a probe listed 8.4 MB at 16,000 workers (#29 G13):
   * `workers` is then empty, with `workers_total` and `workers_omitted: true` (GET /workers lists them).
   */
  ready(allWorkers = false): { ready: boolean; schedulable_workers: number; workers: WorkerCatalogRecord[]; workers_total?: number; workers_omitted?: true; draining?: true } {
    this.#replication.drainInbound();
    const r = this.#fleet.readiness();
    const ready = !this.#shuttingDown && !this.#draining && r.schedulable > 0;
    const base =
      allWorkers || r.workers <= READY_WORKERS_LISTED_MAX
        ? { ready, schedulable_workers: r.schedulable, workers: this.#fleet.listWorkers() }
        : { ready, schedulable_workers: r.schedulable, workers: [], workers_total: r.workers, workers_omitted: true as const };
    return this.#draining ? { ...base, draining: true } : base;
  }

  /**
   * Starts draining: `ready()` turns false at once (load balancers move away) while every call
   * keeps being served. The daemon then waits its drain window and shuts down.
   */
  drain(): void {
    if (this.#draining) return;
    this.#draining = true;
    for (const l of this.#drainingListeners) l();
  }

  get draining(): boolean {
    return this.#draining;
  }

  // ---------------------------------------------------------------- KV events from workers

  /**
   * Applies one KV-event batch of a worker rank to its partition's prefix index. Returns how
   * many events applied and how many were dropped (unknown worker, block-size mismatch,
   * a stored block whose parent this rank does not hold).
   */
  applyKvEvents(workerId: WorkerId, dpRank: number, batch: KvEventBatch): KvApplyResult {
    return this.#fleet.applyKvEvents(workerId, dpRank, batch);
  }

  /** The prefix index rank by rank, for a joining peer (the warm join, index-snapshot.ts). */
  get indexSnapshotSource(): IndexSnapshotSource {
    return this.#fleet.indexSnapshotSource;
  }

  /** Installs a peer's snapshot of one rank (the warm join): see Fleet.importIndexRank. */
  importIndexRank(s: IndexRankSnapshot): { installed: number } | { refused: "unknown_rank" | "block_size" } {
    return this.#fleet.importIndexRank(s);
  }

  /** This replica's ranks for the warm join's decoding thread to merge into trees: see Fleet.indexRankTargets. */
  indexRankTargets(): IndexRankTarget[] {
    return this.#fleet.indexRankTargets();
  }

  /** Whether a rank merged on the thread is still that rank key here: see Fleet.mergedRankHolds. */
  mergedRankHolds(m: MergedRank): boolean {
    return this.#fleet.mergedRankHolds(m);
  }

  /** Adopts a partition's tree merged on the warm join's thread: see Fleet.adoptIndexTree. */
  adoptIndexTree(t: IndexPartitionTree, keepOwn: (rank: number) => boolean): boolean {
    return this.#fleet.adoptIndexTree(t, keepOwn);
  }

  /** A rank's KV-event publisher restarted: its old blocks are gone, rebuild from new events. */
  clearWorkerKv(workerId: WorkerId, dpRank: number): void {
    this.#fleet.clearWorkerKv(workerId, dpRank);
  }

  // ---------------------------------------------------------------- selection and bookings

  /** `note`, when given, is filled with what the choice decided beyond its answer (a trace's attributes). */
  select(req: SelectRequest, note?: SelectionNote): SelectResponse {
    this.#replication.drainInbound();
    try {
      this.#assertRunning();
      const sel = this.#chooser.choose(req, note);
      if (req.selection_id !== undefined) this.#book.rememberSelection(sel, req.selection_id, req);
      const resp = selectResponse(sel, this.#fleet.endpointOf(sel.workerId), req.selection_id, false);
      if (req.advisory === true) {
        const rec = this.#fleet.getWorker(sel.workerId);
        // As the reference: capacity falls back to DEFAULT_MAX_BATCHED_TOKENS, and total_kv_blocks
        // is omitted (not null) when the worker registered none (scheduling/queue.rs, types.rs).
        resp.worker_load = {
          active_prefill_tokens: sel.partition.activePrefillTokens(sel.rank),
          prefill_token_capacity: rec?.max_num_batched_tokens ?? DEFAULT_MAX_BATCHED_TOKENS,
        };
        const totalKvBlocks = rec?.total_kv_blocks;
        if (totalKvBlocks !== undefined && totalKvBlocks !== null) resp.worker_load.total_kv_blocks = totalKvBlocks;
      }
      addBusySignals(resp, this.#busy, this.#fleet.getWorker(sel.workerId)?.total_kv_blocks);
      return resp;
    } catch (err) {
      this.#counters.selectionErrors++;
      throw err;
    }
  }

  /** Select and book; `reply` trims the answer for in-process callers (SelectReplyShape). */
  selectAndReserve(req: SelectAndReserveRequest, note?: SelectionNote, reply?: SelectReplyShape): SelectResponse {
    this.#replication.drainInbound();
    try {
      const selectionId = req.selection_id ?? randomUuid(this.#random);
      validateId(selectionId, "selection_id");
      // The reference's order (run_selection, core/run.rs): running, partition ready, then the id.
      this.#assertRunning();
      this.#fleet.requirePartition(req.model_name, req.routing_group);
      this.#book.assertIdFree(selectionId);
      const sel = this.#chooser.choose(req, note);
      this.#book.bookSelection(sel, selectionId, req);
      const resp = selectResponse(sel, this.#fleet.endpointOf(sel.workerId), selectionId, true, reply?.sequenceHashes ?? true);
      addBusySignals(resp, this.#busy, this.#fleet.getWorker(sel.workerId)?.total_kv_blocks);
      return resp;
    } catch (err) {
      this.#counters.selectionErrors++;
      throw err;
    }
  }

  createReservation(req: ReservationRequest): ReservationResponse {
    this.#replication.drainInbound();
    try {
      this.#assertRunning();
      return this.#book.createReservation(req);
    } catch (err) {
      this.#counters.selectionErrors++;
      throw err;
    }
  }

  prefillComplete(selectionId: string): void {
    this.#replication.drainInbound();
    if (!this.#forwardedToOwner("prefill_complete", selectionId)) this.#book.prefillComplete(selectionId);
  }

  addOutputBlock(selectionId: string, decayFraction?: number): void {
    this.#replication.drainInbound();
    this.#book.addOutputBlock(selectionId, decayFraction);
    // Exact replication does not carry output blocks (peers count the prompt's); totals do.
    this.#load.ownChanged();
  }

  /**
   * Moves this replica's booking `selectionId` to `target` (a gateway served the request on
   * another worker than the one picked): one synchronous free and re-book, so peers receive both
   * in the same batch, and the session binding follows in soft mode (ReservationBook.move says
   * what hard mode does). Returns the booking under its new selection id, which the caller's
   * later prefill_complete and free use.
   */
  moveReservation(selectionId: string, target: { readonly worker_id: WorkerId; readonly dp_rank: number }): ReservationResponse {
    this.#replication.drainInbound();
    this.#assertRunning();
    const newId = randomUuid(this.#random);
    this.#book.move(selectionId, newId, target.worker_id, target.dp_rank);
    const row = this.#book.get(newId);
    if (row === undefined) throw new KvmeshError("KVMESH_INTERNAL", `reservation ${newId} missing after its move`);
    return { selection_id: newId, model_name: row.partition.modelName, routing_group: row.partition.routingGroup, worker_id: row.workerId, dp_rank: row.dpRank, endpoint: this.#fleet.endpointOf(row.workerId) };
  }

  freeReservation(selectionId: string): void {
    this.#replication.drainInbound();
    if (!this.#forwardedToOwner("free", selectionId)) this.#book.free(selectionId);
  }

  /**
   * Whether a lifecycle call for this id resolves here: a booking of this replica's, or a peer's
   * it mirrors (exact mode: the booking; aggregate mode: its id and owner).
   */
  hasReservation(selectionId: string): boolean {
    this.#replication.drainInbound();
    return this.#book.has(selectionId) || this.#load.mirrorsBooking(selectionId);
  }

  /**
   * Aggregate replication keeps no copy of a peer's booking, only its id and owner: a lifecycle
   * call for it is sent to the owner as a load event (the mesh carries it), as a call on the
   * owner itself would be. Exact replication resolves it here (the mirrored row).
   */
  #forwardedToOwner(type: "prefill_complete" | "free", selectionId: string): boolean {
    if (this.#book.has(selectionId)) return false;
    const event = this.#load.peerLifecycle(type, selectionId);
    if (event === undefined) return false;
    this.#replication.emitLoad({ kind: "load", event });
    return true;
  }

  /** Live bookings known here: this replica's and its peers' (mirrored, or indexed by id in aggregate mode). */
  get reservationCount(): number {
    return this.#book.size + this.#load.mirroredBookingCount;
  }

  // ---------------------------------------------------------------- loads and diagnostics

  loads(modelName?: string, routingGroup?: string): ModelLoadResponse[] {
    this.#replication.drainInbound();
    return this.#fleet.loads(modelName, routingGroup);
  }

  /** Per schedulable rank: its load if this prompt were booked there, and the resulting cost. */
  potentialLoads(req: SelectRequest): PotentialLoad[] {
    this.#replication.drainInbound();
    this.#assertRunning();
    const { partition: p, prompt, config, rows } = this.#chooser.score(req);
    return rows.map((r) => ({
      worker_id: p.ranks.workerOf(r.rank),
      dp_rank: p.ranks.dpRankOf(r.rank),
      potential_prefill_tokens: r.activePrefillTokens + effectivePrefill(prompt.islTokens, r.device, r.host, r.disk, p.blockSize, config),
      potential_decode_blocks: r.potentialDecodeBlocks,
      active_requests: r.activeRequests,
      overlap_blocks: r.device,
      cost: r.cost,
    }));
  }

  overlapScores(req: SelectRequest): OverlapScoresResponse {
    this.#replication.drainInbound();
    this.#assertRunning();
    const { partition: p, prompt, config, rows } = this.#chooser.score(req);
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
      // kvmesh has no shared KV cache tier (the reference's optional one): never enabled.
      shared_cache: { enabled: false },
    };
  }

  /**
   * The prefix index as KV events per partition (GET /dump): replaying them into an empty
   * service rebuilds the same index.
   */
  dump(filter?: DumpFilter): Record<string, { block_size: number; events: DumpEvent[] }> {
    this.#replication.drainInbound();
    return this.#fleet.dump(filter);
  }

  /** Index and table sizes, for metrics. */
  sizes(): FleetSizes & {
    pendingSelections: number;
    pendingEvictions: number;
    pendingLargeEvictions: number;
    reservationBytes: number;
    mirroredReservationBytes: number;
    reorderEntries: number;
    reorderShed: number;
  } {
    return {
      ...this.#fleet.sizes(),
      pendingSelections: this.#book.pendingSelections,
      pendingEvictions: this.#book.pendingEvictions,
      pendingLargeEvictions: this.#book.pendingLargeEvictions,
      reservationBytes: this.#book.bytes.own,
      mirroredReservationBytes: this.#book.bytes.mirrored,
      reorderEntries: this.#load.reorderEntries,
      reorderShed: this.#load.reorderShed,
    };
  }

  kvEventsEndpointsOf(workerId: WorkerId): { dpRank: number; endpoint: string }[] {
    return this.#fleet.kvEventsEndpointsOf(workerId);
  }

  /** A binding or catalogue event refused for its version (lamport.ts; the daemon logs it, throttled). */
  onVersionRefused(listener: (r: VersionRefusal) => void): () => void {
    this.#refusalListeners.add(listener);
    return () => this.#refusalListeners.delete(listener);
  }

  #versionRefused(r: VersionRefusal): void {
    for (const l of this.#refusalListeners) l(r);
  }

  /** Catalogue deletions remembered now (tombstones). */
  get catalogTombstones(): number {
    return this.#catalog.tombstoneCount;
  }

  /** Every live session binding held here, then recent unbinds (LWW merge makes re-applying them harmless). */
  bindingsSnapshot(): BindingEvent[] {
    return this.#bindings.snapshot();
  }

  // ---------------------------------------------------------------- host replication

  /** The host-supplied writer id in host-replication mode, else undefined. */
  get sessionReplicationWriterId(): bigint | undefined {
    return this.#bindings.hostWriterId;
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
    return this.#bindings.subscribe(opts, this.#shuttingDown);
  }

  /** Live `sessionBindingUpdates()` subscriptions. */
  get sessionBindingSubscribers(): number {
    return this.#bindings.subscriberCount;
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
    return this.#bindings.applySessionBinding(input);
  }

  /** Validates one peer binding without applying it (what applySessionBinding checks first). */
  checkSessionBinding(binding: unknown): ReturnType<typeof checkSessionBinding> {
    return this.#bindings.check(binding);
  }

  get parkedBindings(): number {
    return this.#bindings.parkedCount;
  }

  // ---------------------------------------------------------------- maintenance

  /**
   * Periodic upkeep (the daemon calls it every second): force-frees bookings past the expiry,
   * drops reservation rows whose booking is gone, reaps idle session bindings and expired
   * cached selections and reorder state.
   */
  tick(): void {
    const now = this.#clock.now();
    for (const p of this.#fleet.partitions()) {
      this.#book.expire(p);
      this.#bindings.sweepTable(p, now);
    }
    this.#book.sweep();
    this.#load.sweep(now);
    this.#bindings.sweepParked(now);
    this.#catalog.sweep(now);
  }

  shutdown(): void {
    this.#shuttingDown = true;
    this.#bindings.endSubscriptions();
  }

  get shuttingDown(): boolean {
    return this.#shuttingDown;
  }

  #assertRunning(): void {
    if (this.#shuttingDown) throw new KvmeshError("KVMESH_SHUTTING_DOWN", "selection service is shutting down");
  }
}
