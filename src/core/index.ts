/**
 * The core's one public entry: everything outside src/core (HTTP, ingest, mesh, ext_proc, the
 * composition root, scripts and tests) imports the core from here, never a file inside it
 * (test/unit/arch/imports.test.ts checks it). The core's own unit tests (test/unit/core/, and
 * test/helpers/replica-view.ts, which maps their old names onto the replication port) may reach
 * its internals.
 */
export type { AffinityMode, AffinityTarget, ApplyOutcome, BindingVersion, SessionBinding } from "./affinity-table.js";
export { catalogWorkerOf, MAX_WORKER_STATUS_REASONS, type CatalogVersion } from "./catalog-replication.js";
export { badRequest, ERROR_CODES, invalidField, isKvmeshError, KvmeshError } from "./errors.js";
export type { ErrorCode, ErrorKind } from "./errors.js";
export { hashCount, hashListFromBigInts, hashListToBigInts, hashListToSignedBigInts, pairToBigInt, toU64, u64ToI64 } from "./hash64.js";
export type { HashList } from "./hash64.js";
export { computeBlockHashes, computePromptHashes, computeSequenceHashes, saltSeed, XXH3_SEED } from "./hashing.js";
export { IndexJoinJournal } from "./index-join-journal.js";
export type { JoinPlan } from "./index-join-journal.js";
export { decodeIndexChunk, DEFAULT_INDEX_CHUNK_BYTES, indexChunkSteps } from "./index-snapshot.js";
export type { IndexChunk, IndexRankKey, IndexRankSnapshot, IndexSnapshotSource, KvStreamPosition, RankViewsOf } from "./index-snapshot.js";
export { copyIndexChunk, encodeIndexChunkCopy, indexChunkCopyBuffers } from "./index-export-copy.js";
export type { IndexChunkCopy, NodeArraysCopy, RankCopy } from "./index-export-copy.js";
export { storedContentHashes } from "./kv-events.js";
export type { KvApplyResult, KvEvent, KvEventBatch, StorageTier } from "./kv-events.js";
export { MAX_HASHES_PER_BOOKING, MAX_WORKER_FIELD_ENTRIES } from "./limits.js";
export { LoadLedger } from "./load-ledger.js";
export { DEFAULT_PENDING_MAX_BYTES, DEFAULT_PENDING_MAX_ENTRIES, DEFAULT_PENDING_TTL_MS } from "./pending-selections.js";
export { rankEntriesFromViews, withRankLookup } from "./prefix-index.js";
export type { RankEntries, RankExportViews } from "./prefix-index.js";
export { PrefixTreeBuilder } from "./prefix-tree-builder.js";
export { prefixTreeBuffers } from "./prefix-tree-image.js";
export type { PrefixTreeImage } from "./prefix-tree-image.js";
export { IndexTreeMerger } from "./index-tree-merge.js";
export type { IndexPartitionTree, IndexRankTarget, MergedRank } from "./index-tree-merge.js";
export type { MatchResult, PrefixIndex } from "./prefix-index.js";
export { mathRandom, seededRandom } from "./random.js";
export type { Random } from "./random.js";
export { rankIndexBound } from "./rank-index-bound.js";
export { DEFAULT_REORDER_STATE_MAX_ENTRIES, LOAD_REPLICATION_MODES } from "./replica-events.js";
export type { AddedBooking, BindingEvent, BookingSnapshot, CatalogEvent, LoadAddEvent, LoadAggregateRow, LoadAggregates, LoadEvent, LoadMarkEvent, LoadReplication, OriginAggregates, PartitionRef, WorkerStatusEvent } from "./replica-events.js";
export { MAX_DRAINING_ORIGINS } from "./replication/drain-kind.js";
export type { ReplicaAttachment, ReplicaLink, ReplicationPort } from "./replication/port.js";
export type { OriginFacts, ReplicaEvent, ReplicaSnapshot } from "./replication/registry.js";
export { DEFAULT_ACTIVE_REQUEST_EXPIRY_MS, DEFAULT_MAX_LOCAL_RESERVATIONS, DEFAULT_MAX_PARTITIONS, DEFAULT_MAX_RANKS, DEFAULT_MAX_RESERVATION_BYTES, DEFAULT_PARKED_BINDINGS_MAX, MAX_AFFINITY_TTL_SECS, MAX_ID_BYTES, MAX_RANK_KEYS, MIN_AFFINITY_TTL_SECS, READY_WORKERS_LISTED_MAX, SelectionService } from "./selection-service.js";
export type { DumpEvent, ReplicaSyncOptions, SelectionServiceOptions, ServiceStats, SessionAffinityOptions, WorkerChange } from "./selection-service.js";
export { DEFAULT_SELECTOR_CONFIG } from "./selector-config.js";
export type { SelectorConfig } from "./selector-config.js";
export { COST_MODELS, DEFAULT_TTFT_COST, ttftCost } from "./ttft-cost.js";
export type { CostModel, TtftCostParams } from "./ttft-cost.js";
export { resolveServiceOptions } from "./service-options.js";
export type { SessionBindingInput, SessionBindingOutcome, SessionBindingOutcomeKind } from "./session-binding-input.js";
export { DEFAULT_MAX_PENDING_BINDINGS } from "./session-binding-stream.js";
export type { SessionBindingBatch, SessionBindingSubscription, SessionBindingUpdatesOptions } from "./session-binding-stream.js";
export type { ReplicaSlot } from "./tie-spread.js";
export { keepAliveTimers, ManualClock, ManualTimers, systemClock, systemTimers, systemWallClock } from "./time.js";
export type { Clock, TimerHandle, Timers } from "./time.js";
export { DEFAULT_MODEL_NAME, DEFAULT_ROUTING_GROUP } from "./types.js";
export type { BlockExtraInfo, BlockMmObjectInfo, Lifecycle, MmRoutingInfo, ModelLoadResponse, PromptFields, RankLoad, ReservationRequest, RouterConfigOverrideWire, SelectAndReserveRequest, SelectionNote, SelectReplyShape, SelectRequest, SessionContext, WorkerCatalogRecord, WorkerId, WorkerPatchRequest, WorkerRankRef, WorkerRequest } from "./types.js";
export { U64Table } from "./u64-table.js";
export { DEFAULT_APPROX_TTL_SECS, DEFAULT_MAX_PREDICTED_BLOCKS_PER_RANK, DEFAULT_PREDICTED_TTL_SECS, PREDICTED_STRIDE_BLOCKS, predictedTtlMs, predictionOf } from "./predicted-cache.js";
export { MAX_SNAPSHOT_PREDICTED_PAIRS, type PredictionSnapshotRow } from "./predicted-snapshot.js";
export { hasUnusableKvEndpoint, kvEventsEndpointRefused, recordToRequest, replayEndpointFor, workerDraft } from "./worker-catalog.js";
export type * from "./types.js";
