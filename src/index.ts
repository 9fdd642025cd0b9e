/**
 * kvmesh's public surface: the selection core as a library. Everything else (HTTP, ingest
 * sockets, the mesh) builds on what is exported here.
 */
export { SelectionService, DEFAULT_ACTIVE_REQUEST_EXPIRY_MS, MAX_ID_BYTES } from "./selection-service.js";
export type { SelectionServiceOptions, SessionAffinityOptions, ServiceStats, WorkerChange, DumpEvent, ReplicaSyncOptions } from "./selection-service.js";
export { DEFAULT_MAX_PENDING_BINDINGS, type SessionBindingSubscription, type SessionBindingBatch, type SessionBindingUpdatesOptions } from "./session-binding-stream.js";
export type { SessionBindingInput, SessionBindingOutcome, SessionBindingOutcomeKind } from "./session-binding-input.js";
export type { BindingEvent, LoadEvent, LoadAddEvent, LoadMarkEvent, PartitionRef } from "./replica-events.js";
export type { AffinityMode, SessionBinding, AffinityTarget, BindingVersion, ApplyOutcome } from "./affinity-table.js";
export { DEFAULT_SELECTOR_CONFIG, type SelectorConfig } from "./selector-config.js";
export { KvmeshError, ERROR_CODES, type ErrorCode, type ErrorKind } from "./errors.js";
export { ManualClock, seededRandom, systemClock, type Clock, type Random } from "./clock.js";
export { computeBlockHashes, computeSequenceHashes, saltSeed, XXH3_SEED } from "./hashing.js";
export { hashListFromBigInts, hashListToBigInts, type HashList } from "./hash64.js";
export type { KvEvent, KvEventBatch, StorageTier } from "./ingest/kv-event-decoder.js";
export type * from "./types.js";
