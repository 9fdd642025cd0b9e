/**
 * kvmesh's public surface: the selection core as a library. Everything else (HTTP, ingest
 * sockets, the mesh) builds on what is exported here.
 */
export { SelectionService, DEFAULT_ACTIVE_REQUEST_EXPIRY_MS, MAX_ID_BYTES } from "./core/index.js";
export type { SelectionServiceOptions, SessionAffinityOptions, ServiceStats, WorkerChange, DumpEvent, ReplicaSyncOptions } from "./core/index.js";
export { DEFAULT_MAX_PENDING_BINDINGS, type SessionBindingSubscription, type SessionBindingBatch, type SessionBindingUpdatesOptions } from "./core/index.js";
export type { SessionBindingInput, SessionBindingOutcome, SessionBindingOutcomeKind } from "./core/index.js";
export type { BindingEvent, LoadEvent, LoadAddEvent, LoadMarkEvent, PartitionRef } from "./core/index.js";
export type { ReplicationPort, ReplicaLink, ReplicaAttachment } from "./core/index.js";
export type { ReplicaEvent, ReplicaSnapshot, OriginFacts } from "./core/index.js";
export type { AffinityMode, SessionBinding, AffinityTarget, BindingVersion, ApplyOutcome } from "./core/index.js";
export { DEFAULT_SELECTOR_CONFIG, type SelectorConfig } from "./core/index.js";
export { KvmeshError, ERROR_CODES, type ErrorCode, type ErrorKind } from "./core/index.js";
export { ManualClock, systemClock, type Clock } from "./core/index.js";
export { seededRandom, type Random } from "./core/index.js";
export { computeBlockHashes, computeSequenceHashes, saltSeed, XXH3_SEED } from "./core/index.js";
export { hashListFromBigInts, hashListToBigInts, type HashList } from "./core/index.js";
export type { KvEvent, KvEventBatch, StorageTier } from "./ingest/kv-event-decoder.js";
export type * from "./core/index.js";
