/**
 * The reservation book: one row per live booking this replica holds, its own and those mirrored
 * from peers, keyed by selection id. It books (both `createReservation` forms: an explicit
 * worker, or the replay of a selection cached by /select), runs the lifecycle calls (prefill
 * complete, output block, free), caps this replica's own bookings, and force-frees bookings past
 * the expiry. Every change to an own booking is published as a LoadEvent for the peers.
 *
 * The ledger holds the load; a row holds what the ledger does not: the owner, the add event a
 * snapshot carries, and the session binding's lease.
 */
import type { Lease } from "./affinity-table.js";
import type { Clock } from "./time.js";
import type { Random } from "./random.js";
import { badRequest, KvmeshError } from "./errors.js";
import { effectivePrefillFor, type Chooser, type Selection } from "./choose.js";
import { hashCount } from "./hash64.js";
import type { Fleet } from "./fleet.js";
import { partitionRef, type Partition } from "./partition.js";
import { PendingSelections } from "./pending-selections.js";
import { normalizeReservationPrompt, type NormalizedPrompt } from "./prompt.js";
import type { LoadAddEvent, LoadEvent } from "./replica-events.js";
import { sessionIdOf, validateId } from "./request-ids.js";
import type { ServiceCounters } from "./service-stats.js";
import { DEFAULT_MODEL_NAME, DEFAULT_ROUTING_GROUP, type ReservationRequest, type ReservationResponse, type SelectRequest, type WorkerId } from "./types.js";
import { partitionKey, validateWorkerId } from "./worker-catalog.js";

export interface ReservationRow {
  readonly selectionId: string;
  readonly partition: Partition;
  readonly workerId: WorkerId;
  readonly dpRank: number;
  readonly owner: bigint;
  /** The add event that booked it: what a snapshot of the owner carries. */
  readonly add: LoadAddEvent;
  lease: Lease | undefined;
}

/** What /select cached under a selection id for a later POST /reservations to book. */
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

/** What a booking carries besides its worker and prompt. */
export interface BookingTerms {
  readonly prefillTokens: number;
  readonly trackPrefill: boolean;
  readonly expectedOutputTokens: number | null;
  readonly prefillDurationMs: number | null;
  readonly sessionId: string | undefined;
}

/**
 * What one booked block costs the process, bytes: the booking's sequence hash, its entries in the
 * ledger's active-block index and the row. Measured with 60 bookings of 500,000-token prompts
 * (block size 64, every block distinct, the worst case): 186 bytes of RSS per block, 115 of them
 * typed arrays outside the JS heap. Where F3 found 9.4 MB per 2M-token booking: 31,250 blocks.
 */
export const BOOKED_BLOCK_BYTES = 192;
/** A booking's fixed cost (row, ledger entry, ids), bytes. */
export const BOOKING_OVERHEAD_BYTES = 1_024;

/** The bytes a booking of `blocks` blocks is charged against maxReservationBytes. */
export function bookingBytes(blocks: number): number {
  return BOOKING_OVERHEAD_BYTES + blocks * BOOKED_BLOCK_BYTES;
}

export interface ReservationBookOptions {
  readonly replicaId: bigint;
  readonly maxLocalReservations: number;
  /** Byte budget of this replica's live bookings (bookingBytes each); 429 past it. */
  readonly maxReservationBytes: number;
  readonly clock: Clock;
  readonly selectionCache: { readonly ttlMs?: number; readonly maxEntries?: number; readonly maxBytes?: number };
  readonly counters: ServiceCounters;
  readonly fleet: Pick<Fleet, "requirePartition" | "partitions" | "endpointOf">;
  readonly chooser: Pick<Chooser, "configFor" | "promptOf">;
  readonly random: Random;
  /** Publishes a change to a booking (to the mesh; peers mirror it). */
  readonly emit: (e: LoadEvent) => void;
  /** A booking was freed here: a late Add of it from a peer must not bring it back. */
  readonly freed: (owner: bigint, selectionId: string) => void;
}

export class ReservationBook {
  readonly #o: ReservationBookOptions;
  readonly #rows = new Map<string, ReservationRow>();
  /** Live rows per owner (this replica and each peer it mirrors). */
  readonly #ownedCounts = new Map<bigint, number>();
  /** bookingBytes of this replica's own live rows, and of the rows mirrored from peers. */
  #ownBytes = 0;
  #mirroredBytes = 0;
  readonly #pending: PendingSelections<PendingEntry>;

  constructor(options: ReservationBookOptions) {
    this.#o = options;
    this.#pending = new PendingSelections<PendingEntry>({ clock: options.clock, ...options.selectionCache });
  }

  // ---------------------------------------------------------------- rows

  get size(): number {
    return this.#rows.size;
  }

  has(selectionId: string): boolean {
    return this.#rows.has(selectionId);
  }

  get(selectionId: string): ReservationRow | undefined {
    return this.#rows.get(selectionId);
  }

  rows(): IterableIterator<ReservationRow> {
    return this.#rows.values();
  }

  /** Live bookings this replica holds that `owner` made (own or mirrored). */
  countOwnedBy(owner: bigint): number {
    return this.#ownedCounts.get(owner) ?? 0;
  }

  /** bookingBytes of this replica's live bookings, and of those it mirrors (exact mode). */
  get bytes(): { own: number; mirrored: number } {
    return { own: this.#ownBytes, mirrored: this.#mirroredBytes };
  }

  install(row: ReservationRow): void {
    this.#rows.set(row.selectionId, row);
    this.#ownedCounts.set(row.owner, (this.#ownedCounts.get(row.owner) ?? 0) + 1);
    this.#charge(row, 1);
  }

  #charge(row: ReservationRow, sign: 1 | -1): void {
    const bytes = sign * bookingBytes(hashCount(row.add.sequence_hashes));
    if (row.owner === this.#o.replicaId) this.#ownBytes += bytes;
    else this.#mirroredBytes += bytes;
  }

  /** Drops a row (its ledger entry is the caller's) and releases its binding lease. */
  drop(selectionId: string): void {
    const row = this.#rows.get(selectionId);
    if (row === undefined) return;
    this.#rows.delete(selectionId);
    this.#charge(row, -1);
    const n = (this.#ownedCounts.get(row.owner) ?? 1) - 1;
    if (n === 0) this.#ownedCounts.delete(row.owner);
    else this.#ownedCounts.set(row.owner, n);
    if (row.lease !== undefined) row.partition.affinity?.release(row.lease);
  }

  /** 409 when the id is live anywhere here (a row, or a ledger entry not yet rowed). */
  assertIdFree(id: string): void {
    if (this.#rows.has(id)) throw new KvmeshError("KVMESH_DUPLICATE_ID", `selection_id ${id} is already live`);
    for (const p of this.#o.fleet.partitions()) {
      if (p.ledger.has(id)) throw new KvmeshError("KVMESH_DUPLICATE_ID", `selection_id ${id} is already live`);
    }
  }

  // ---------------------------------------------------------------- booking

  /** Books what `select_and_reserve` chose. */
  bookSelection(sel: Selection, selectionId: string, req: SelectRequest): void {
    this.#book(sel.partition, selectionId, sel.workerId, sel.dpRank, sel.prompt, {
      prefillTokens: sel.effectivePrefillTokens,
      trackPrefill: sel.config.trackPrefillTokens,
      expectedOutputTokens: req.expected_output_tokens ?? null,
      prefillDurationMs: req.expected_prefill_duration_ms ?? null,
      sessionId: sel.sessionId,
    });
  }

  /** Caches what /select chose under its selection id, for a later POST /reservations. */
  rememberSelection(sel: Selection, selectionId: string, req: SelectRequest): void {
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
    // The entry's size for the cache's byte bound: the hashes (8 B each), ids as UTF-16, overhead.
    const bytes = 8 * (sel.prompt.localHashes.length + sel.prompt.seqHashes.length) + 2 * ((sel.sessionId?.length ?? 0) + selectionId.length) + 64;
    this.#pending.insert(sel.partition.key, selectionId, entry, bytes);
  }

  /**
   * POST /reservations (the caller has checked the service is running). Checks run in the
   * reference's order (`create_reservation`, core/reservations.rs), so each failure answers what
   * the reference answers: the replay form looks the cached selection up before anything else
   * (404 "no pending selection"), then the partition (503) and the cached rank (404), and only
   * then claims the id (409); the explicit form discards any cached selection first, then checks
   * the partition (503), the prompt and effective prefill (400) and the worker (404) before the
   * id (409). A second replay of a booked selection is therefore a 404 (the entry was consumed),
   * not a 409, even while the booking is live.
   */
  createReservation(req: ReservationRequest): ReservationResponse {
    if (typeof req.selection_id !== "string") throw new KvmeshError("KVMESH_INVALID_FIELD", "selection_id: required string", { details: { field: "selection_id" } });
    validateId(req.selection_id, "selection_id");
    return req.worker_id !== undefined ? this.#createExplicit(req, req.worker_id) : this.#createFromPending(req, req.selection_id);
  }

  /** Explicit form: the caller names the worker; any cached selection for the id is discarded. */
  #createExplicit(req: ReservationRequest, workerId: WorkerId): ReservationResponse {
    validateWorkerId(workerId, "worker_id");
    // First, whatever fails below: the caller has chosen for itself, so a later replay of the
    // id must not book the stale choice (tests.rs explicit_reservation_discards_cached_selection).
    this.#pending.remove(partitionKey(req.model_name ?? DEFAULT_MODEL_NAME, req.routing_group ?? DEFAULT_ROUTING_GROUP), req.selection_id);
    const p = this.#o.fleet.requirePartition(req.model_name, req.routing_group);
    const config = this.#o.chooser.configFor(req.router_config_override);
    const prompt = normalizeReservationPrompt(req, (q) => this.#o.chooser.promptOf(p, q, config));
    let effective = req.effective_prefill_tokens;
    if (effective !== undefined) {
      if (!Number.isInteger(effective) || effective < 0) throw badRequest("effective_prefill_tokens must be a non-negative integer", "effective_prefill_tokens");
      if (effective > prompt.islTokens) throw badRequest(`effective_prefill_tokens (${effective}) must not exceed isl_tokens (${prompt.islTokens})`, "effective_prefill_tokens");
    }
    const dpRank = req.dp_rank ?? 0;
    const rank = p.ranks.get(workerId, dpRank);
    if (rank === undefined || !p.isSchedulable(rank)) {
      throw new KvmeshError("KVMESH_WORKER_NOT_SCHEDULABLE", `worker ${workerId} dp_rank ${dpRank} is not schedulable in ${p.key}`);
    }
    this.assertIdFree(req.selection_id);
    effective ??= effectivePrefillFor(p, rank, prompt, config);
    const trackPrefill = req.track_prefill_tokens ?? (req.effective_prefill_tokens !== undefined ? true : config.trackPrefillTokens);
    this.#book(p, req.selection_id, workerId, dpRank, prompt, {
      prefillTokens: effective,
      trackPrefill,
      expectedOutputTokens: req.expected_output_tokens ?? null,
      prefillDurationMs: null,
      sessionId: sessionIdOf(req),
    });
    return this.#response(p, req.selection_id, workerId, dpRank);
  }

  /**
   * Replay form: book exactly what /select chose and cached under this id. Only a booking that
   * lands consumes the entry (generation-checked, so a newer /select of the id survives); a
   * failure leaves it for a retry, except a session conflict, which no retry can book.
   */
  #createFromPending(req: ReservationRequest, selectionId: string): ReservationResponse {
    // A selection cached under another partition (or none) is a plain miss, 404, before the
    // partition's readiness is asked (tests.rs cached_reservation_needs_matching_model).
    const key = partitionKey(req.model_name ?? DEFAULT_MODEL_NAME, req.routing_group ?? DEFAULT_ROUTING_GROUP);
    const cached = this.#pending.peek(key, selectionId);
    if (cached === undefined) {
      throw new KvmeshError("KVMESH_PENDING_SELECTION_NOT_FOUND", `no pending selection ${selectionId} in ${key} (expired, already used, made on another replica, or never selected)`);
    }
    // A cached selection whose partition lost its workers is 503 and stays for a retry
    // (tests.rs failed_cached_booking_is_retryable).
    const p = this.#o.fleet.requirePartition(req.model_name, req.routing_group);
    const e = cached.value;
    const rank = p.ranks.get(e.workerId, e.dpRank);
    if (rank === undefined || !p.isSchedulable(rank)) {
      throw new KvmeshError("KVMESH_WORKER_NOT_SCHEDULABLE", `worker ${e.workerId} dp_rank ${e.dpRank} chosen by the selection is no longer schedulable`);
    }
    // Last: a live id with a cached selection is 409 and the entry stays
    // (tests.rs cached_booking_retryable_after_scheduler_conflict).
    this.assertIdFree(selectionId);
    try {
      this.#book(p, selectionId, e.workerId, e.dpRank, e.prompt, {
        prefillTokens: e.effectivePrefillTokens,
        trackPrefill: e.trackPrefill,
        expectedOutputTokens: e.expectedOutputTokens,
        prefillDurationMs: e.prefillDurationMs,
        sessionId: e.sessionId,
      });
    } catch (err) {
      if (err instanceof KvmeshError && err.code === "KVMESH_SESSION_CONFLICT") this.#pending.remove(p.key, selectionId, cached.generation);
      throw err;
    }
    this.#pending.remove(p.key, selectionId, cached.generation);
    return this.#response(p, selectionId, e.workerId, e.dpRank);
  }

  #response(p: Partition, selectionId: string, workerId: WorkerId, dpRank: number): ReservationResponse {
    return {
      selection_id: selectionId,
      model_name: p.modelName,
      routing_group: p.routingGroup,
      worker_id: workerId,
      dp_rank: dpRank,
      endpoint: this.#o.fleet.endpointOf(workerId),
    };
  }

  /** Books load on the rank, commits the session binding, installs the row, publishes the add. */
  #book(p: Partition, selectionId: string, workerId: WorkerId, dpRank: number, prompt: NormalizedPrompt, o: BookingTerms): void {
    const rank = p.ranks.get(workerId, dpRank);
    if (rank === undefined) throw new KvmeshError("KVMESH_WORKER_NOT_SCHEDULABLE", `worker ${workerId} dp_rank ${dpRank} is not in ${p.key}`);
    const { replicaId, maxLocalReservations, maxReservationBytes, counters } = this.#o;
    if (this.countOwnedBy(replicaId) >= maxLocalReservations) {
      counters.reservationsRefused++;
      throw new KvmeshError("KVMESH_OVERLOADED", `reservations: this replica holds ${maxLocalReservations} live bookings (the limit); free some or raise --max-reservations`, { details: { field: "reservations" } });
    }
    const blocks = hashCount(prompt.seqHashes);
    const bytes = bookingBytes(blocks);
    if (this.#ownBytes + bytes > maxReservationBytes) {
      counters.reservationsRefused++;
      throw new KvmeshError(
        "KVMESH_OVERLOADED",
        `reservations: this booking (${blocks} blocks, ~${bytes} bytes) would pass the live bookings' byte budget of ${maxReservationBytes} (${this.#ownBytes} held); free some or raise --max-reservation-bytes`,
        { details: { field: "reservations" } },
      );
    }
    p.predicted.recordBooking(rank, prompt.seqHashes);
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
      origin: replicaId,
      owner: replicaId,
      request_id: selectionId,
      partition: partitionRef(p),
      block_size: p.blockSize,
      worker_id: workerId,
      dp_rank: dpRank,
      sequence_hashes: prompt.seqHashes,
      prefill_tokens: o.trackPrefill ? o.prefillTokens : 0,
      track_prefill: o.trackPrefill,
      expected_output_tokens: o.expectedOutputTokens,
      prefill_duration_ms: o.prefillDurationMs,
    };
    this.install({ selectionId, partition: p, workerId, dpRank, owner: replicaId, add, lease });
    counters.reservations++;
    this.#o.emit(add);
  }

  // ---------------------------------------------------------------- lifecycle

  prefillComplete(selectionId: string): void {
    const row = this.#require(selectionId);
    if (!row.partition.ledger.markPrefillComplete(selectionId)) {
      this.drop(selectionId);
      throw new KvmeshError("KVMESH_RESERVATION_NOT_FOUND", `reservation ${selectionId} not found`);
    }
    // Re-published even when already marked, so a peer that missed it converges.
    this.#o.emit({ type: "prefill_complete", origin: this.#o.replicaId, owner: row.owner, request_id: selectionId, partition: partitionRef(row.partition) });
  }

  addOutputBlock(selectionId: string, decayFraction?: number): void {
    const row = this.#require(selectionId);
    if (decayFraction !== undefined && !(typeof decayFraction === "number" && decayFraction >= 0 && decayFraction <= 1)) {
      throw badRequest("decay_fraction must be a number in [0, 1]", "decay_fraction");
    }
    if (!row.partition.ledger.addOutputBlock(selectionId, decayFraction)) {
      this.drop(selectionId);
      throw new KvmeshError("KVMESH_RESERVATION_NOT_FOUND", `reservation ${selectionId} not found`);
    }
  }

  free(selectionId: string): void {
    const row = this.#require(selectionId);
    row.partition.ledger.free(selectionId);
    this.drop(selectionId);
    this.#o.freed(row.owner, selectionId);
    this.#o.emit({ type: "free", origin: this.#o.replicaId, owner: row.owner, request_id: selectionId, partition: partitionRef(row.partition) });
  }

  /**
   * Moves an own booking to another rank of its partition (the gateway's retries landed the
   * request there): frees it and books the same prompt and terms on `workerId`/`dpRank` under
   * `newId`, synchronously, so the free and the add leave in one mesh batch. A new id, because
   * peers tombstone a freed id and would ignore a late add under it. The session (the old row's
   * lease) commits on the new rank; in hard affinity mode a conflicting commit unbinds the
   * session as any hard-mode conflict does (published), and the booking is made without it.
   */
  move(selectionId: string, newId: string, workerId: WorkerId, dpRank: number): void {
    const row = this.#require(selectionId);
    if (row.owner !== this.#o.replicaId) throw new KvmeshError("KVMESH_RESERVATION_NOT_FOUND", `reservation ${selectionId} is a peer's: only its owner moves it`);
    validateId(newId, "selection_id");
    this.assertIdFree(newId);
    const p = row.partition;
    const rank = p.ranks.get(workerId, dpRank);
    if (rank === undefined || !p.isSchedulable(rank)) {
      throw new KvmeshError("KVMESH_WORKER_NOT_SCHEDULABLE", `worker ${workerId} dp_rank ${dpRank} is not schedulable in ${p.key}`);
    }
    const a = row.add;
    // #book reads only the sequence hashes of the prompt.
    const prompt: NormalizedPrompt = { localHashes: a.sequence_hashes, seqHashes: a.sequence_hashes, islTokens: 0 };
    const terms: BookingTerms = {
      prefillTokens: a.prefill_tokens,
      trackPrefill: a.track_prefill,
      expectedOutputTokens: a.expected_output_tokens,
      prefillDurationMs: a.prefill_duration_ms,
      sessionId: row.lease?.sessionId,
    };
    this.free(selectionId);
    try {
      this.#book(p, newId, workerId, dpRank, prompt, terms);
    } catch (err) {
      if (!(err instanceof KvmeshError && err.code === "KVMESH_SESSION_CONFLICT")) throw err;
      this.#book(p, newId, workerId, dpRank, prompt, { ...terms, sessionId: undefined });
    }
  }

  #require(selectionId: string): ReservationRow {
    if (typeof selectionId !== "string" || selectionId.length === 0) throw badRequest("selection_id must be a non-empty string", "selection_id");
    const row = this.#rows.get(selectionId);
    if (row === undefined) throw new KvmeshError("KVMESH_RESERVATION_NOT_FOUND", `reservation ${selectionId} not found`);
    return row;
  }

  // ---------------------------------------------------------------- upkeep

  /**
   * Force-frees `p`'s bookings past the expiry. Own ones are published as frees, so peers drop
   * their mirror now rather than at their own expiry.
   */
  expire(p: Partition): void {
    const { replicaId, counters } = this.#o;
    const expired = p.ledger.expire();
    counters.expiredRequests += expired.length;
    for (const id of expired) {
      const row = this.#rows.get(id);
      this.drop(id);
      if (row?.owner === replicaId) this.#o.emit({ type: "free", origin: replicaId, owner: row.owner, request_id: id, partition: partitionRef(p) });
    }
  }

  /** Drops rows whose booking left the ledger some other way, and expires cached selections. */
  sweep(): void {
    for (const [id, row] of this.#rows) {
      if (!row.partition.ledger.has(id)) this.drop(id);
    }
    this.#pending.sweep();
  }

  get pendingSelections(): number {
    return this.#pending.size;
  }

  get pendingEvictions(): number {
    return this.#pending.evictions;
  }

  get pendingLargeEvictions(): number {
    return this.#pending.largeEvictions;
  }
}
