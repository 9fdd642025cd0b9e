/**
 * kvmesh's public surface: the selection core as a library. Everything else (HTTP, ingest
 * sockets, the mesh) builds on what is exported here.
 */
export { SelectionService, DEFAULT_ACTIVE_REQUEST_EXPIRY_MS, MAX_ID_BYTES } from "./core/selection-service.js";
export type { SelectionServiceOptions, SessionAffinityOptions, ServiceStats, WorkerChange, DumpEvent, ReplicaSyncOptions } from "./core/selection-service.js";
export { DEFAULT_MAX_PENDING_BINDINGS, type SessionBindingSubscription, type SessionBindingBatch, type SessionBindingUpdatesOptions } from "./core/session-binding-stream.js";
export type { SessionBindingInput, SessionBindingOutcome, SessionBindingOutcomeKind } from "./core/session-binding-input.js";
export type { BindingEvent, LoadEvent, LoadAddEvent, LoadMarkEvent, PartitionRef } from "./core/replica-events.js";
export type { ReplicationPort, ReplicaLink, ReplicaAttachment } from "./core/replication/port.js";
export type { ReplicaEvent, ReplicaSnapshot, OriginFacts } from "./core/replication/registry.js";
export type { AffinityMode, SessionBinding, AffinityTarget, BindingVersion, ApplyOutcome } from "./core/affinity-table.js";
export { DEFAULT_SELECTOR_CONFIG, type SelectorConfig } from "./core/selector-config.js";
export { KvmeshError, ERROR_CODES, type ErrorCode, type ErrorKind } from "./core/errors.js";
export { ManualClock, systemClock, type Clock } from "./core/time.js";
export { seededRandom, type Random } from "./core/random.js";
export { computeBlockHashes, computeSequenceHashes, saltSeed, XXH3_SEED } from "./core/hashing.js";
export { hashListFromBigInts, hashListToBigInts, type HashList } from "./core/hash64.js";
export type { KvEvent, KvEventBatch, StorageTier } from "./ingest/kv-event-decoder.js";
export type * from "./core/types.js";
