/**
 * The selection service's options and the one place they are checked. `resolveServiceOptions`
 * applies the defaults and every rule, single-field and cross-field, and returns the settings the
 * service runs with; the daemon's config module calls the same function, so a rule is written
 * once. Errors are KVMESH_BAD_REQUEST naming the field.
 */
import { validateBusyThresholds, type BusyThresholds } from "./busy-signals.js";
import { LOAD_REPLICATION_MODES, type LoadReplication } from "./replica-events.js";
import { DEFAULT_AFFINITY_MAX_ENTRIES, type AffinityMode } from "./affinity-table.js";
import { systemClock, systemWallClockNs, type Clock, type WallClockNs } from "./time.js";
import { mathRandom, type Random } from "./random.js";
import { badRequest } from "./errors.js";
import { DEFAULT_ACTIVE_REQUEST_EXPIRY_MS } from "./load-ledger.js";
import { DEFAULT_MAX_PREDICTED_BLOCKS_PER_RANK, type PredictedCacheOptions } from "./predicted-cache.js";
import { MAX_RANK_KEYS } from "./rank-registry.js";
import { MAX_ID_BYTES } from "./request-ids.js";
import { DEFAULT_SELECTOR_CONFIG, validateSelectorConfig, type SelectorConfig } from "./selector-config.js";
import type { WorkerType } from "./selector.js";

/**
 * Bound on this replica's own live bookings. A booking costs ~0.9 KiB (a flood of 20,000 never
 * freed grew the heap 18 MiB), so the cap holds them under ~120 MiB: a client that books and never
 * frees gets 429 instead of growing the heap for the 300 s expiry. 131,072 is 128 requests in
 * flight on each of 1,024 workers. Peers' mirrored bookings are not capped here: refusing them
 * would make this replica's view of the fleet wrong; each peer caps its own.
 */
export const DEFAULT_MAX_LOCAL_RESERVATIONS = 131_072;
/**
 * Byte budget of a replica's live bookings, 1 GiB: ~5.6 M booked blocks at BOOKED_BLOCK_BYTES
 * (reservations.ts), e.g. 170 bookings of 2M-token prompts or 131,072 of 2,500 tokens. Before it,
 * 250 bookings of 2M-token prompts took RSS from 69 MB to 2.35 GB under the count cap alone.
 */
export const DEFAULT_MAX_RESERVATION_BYTES = 1_073_741_824;
/**
 * Most partitions at once. A partition costs hundreds of KB before any worker load (its prefix
 * index, affinity table and prompt-hash memo), and real fleets
 * have one per (model, routing group): tens.
 */
export const DEFAULT_MAX_PARTITIONS = 1_024;
/**
 * Most worker ranks registered at once, across partitions. A /select scores every rank of its
 * partition and /loads lists every rank: at 1.78 M ranks one /select blocked the event loop for
 * 2.1 s and /loads took 6.6 s, linear in ranks, so 16,384 ranks keep both near 20 ms and 60 ms.
 * With KV events each rank also holds a ZeroMQ socket, which caps a daemon near 3,400 of them
 * first (src/ingest/zmq-socket-limit.ts).
 */
export const DEFAULT_MAX_RANKS = 16_384;
/** Bounds on session affinity TTL, seconds (reference: 1 s ..= 1 year). */
export const MIN_AFFINITY_TTL_SECS = 1;
export const MAX_AFFINITY_TTL_SECS = 31_536_000;
/** The reference's default worker type: one worker does prefill and decode. */
export const DEFAULT_WORKER_TYPE: WorkerType = "aggregated";
const WORKER_TYPES: readonly WorkerType[] = ["aggregated", "prefill", "decode"];
const U64_LIMIT = 1n << 64n;

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
  /** Where the mesh's PUB binds, e.g. tcp://0.0.0.0:7100 (the control ROUTER takes the next port). */
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
  /**
   * What the fleet's workers do (the reference's service-level `worker_type`). "decode" workers
   * with prefill tracking off are scored on the blocks their cache saves (selector.ts).
   * Default DEFAULT_WORKER_TYPE.
   */
  readonly workerType?: WorkerType;
  readonly activeRequestExpiryMs?: number;
  /**
   * How this replica shares its bookings with peers (replica-events.ts LoadReplication). Default
   * "exact", which emits every booking change through onLoadEvent as embedding hosts expect; the
   * daemon's default is its own (src/app/config.ts).
   */
  readonly loadReplication?: LoadReplication;
  /** Most live bookings this replica makes itself (429 beyond); see DEFAULT_MAX_LOCAL_RESERVATIONS. */
  readonly maxLocalReservations?: number;
  readonly sessionAffinity?: SessionAffinityOptions;
  /**
   * Coalescing window of session-binding refreshes, ms: a refresh (a continuing session's request
   * committed or released) of a binding published less than this long ago is not published to
   * the mesh or host streams, only counted (`bindingRefreshesCoalesced`). Capped at the affinity
   * TTL / 8 (affinity-table.ts `refreshCoalesceWindowMs` says why). Binds, rebinds and keepalives
   * are always published. Default 0: every refresh is published; the daemon's default is its own
   * (src/app/config.ts).
   */
  readonly bindingRefreshCoalesceMs?: number;
  readonly selectionCache?: { readonly ttlMs?: number; readonly maxEntries?: number; readonly maxBytes?: number };
  /** Thresholds of the reported busy signals (busy-signals.ts); unset: neither is reported. */
  readonly busyThresholds?: BusyThresholds;
  /** Daemon mode: a rank without a KV-events endpoint cannot be scheduled. */
  readonly requireKvEventsEndpoint?: boolean;
  /**
   * In-flight prefixes (predicted-cache.ts): how long a routed prompt's blocks count as cached on
   * its rank before the engine reports them, ms (0, the default: off; the daemon's default is its
   * own, src/app/config.ts), and the most predicted blocks per rank.
   */
  readonly predictedCache?: { readonly ttlMs?: number; readonly maxBlocksPerRank?: number };
  /** Most partitions (model_name, routing_group) at once. Default DEFAULT_MAX_PARTITIONS. */
  readonly maxPartitions?: number;
  /** Byte budget of this replica's live bookings (reservations.ts bookingBytes); 429 past it. Default DEFAULT_MAX_RESERVATION_BYTES. */
  readonly maxReservationBytes?: number;
  /** Most worker ranks (the sum of data_parallel_size) registered at once. Default DEFAULT_MAX_RANKS. */
  readonly maxRanks?: number;
  /**
   * Wall clock in ns since the epoch; seeds the Lamport sequence of session bindings so a restart
   * (or a move to another host) does not go backwards. Default Date.now() in ns.
   */
  readonly wallClockNs?: WallClockNs;
}

/** Session affinity with every default filled in. */
export type ResolvedAffinityOptions = Required<SessionAffinityOptions>;

/** What the service runs with: every option defaulted and checked. */
export interface ServiceSettings {
  readonly clock: Clock;
  readonly random: Random;
  readonly replicaId: bigint;
  /** `writer_id` of this service's bindings: the host's id in host replication, else replicaId. */
  readonly writerId: bigint;
  readonly hostReplication: boolean;
  readonly selector: SelectorConfig;
  readonly workerType: WorkerType;
  readonly expiryMs: number;
  readonly loadReplication: LoadReplication;
  readonly maxLocalReservations: number;
  readonly affinity: ResolvedAffinityOptions | undefined;
  readonly bindingRefreshCoalesceMs: number;
  readonly wallClockNs: WallClockNs;
  readonly selectionCache: NonNullable<SelectionServiceOptions["selectionCache"]>;
  readonly busyThresholds: BusyThresholds;
  readonly requireKvEventsEndpoint: boolean;
  readonly predictedCache: PredictedCacheOptions;
  readonly maxPartitions: number;
  readonly maxRanks: number;
  readonly maxReservationBytes: number;
}

/** Defaults and checks every option; throws KVMESH_BAD_REQUEST naming the first bad field. */
export function resolveServiceOptions(options: SelectionServiceOptions = {}): ServiceSettings {
  const random = options.random ?? mathRandom;
  const hostWriterId = checkReplicationOptions(options);
  const replicaId = options.replicaId ?? hostWriterId ?? randomReplicaId(random);
  if (replicaId <= 0n || replicaId >= U64_LIMIT) throw badRequest("replicaId must be a non-zero unsigned 64-bit integer", "replicaId");
  const selector = validateSelectorConfig({ ...DEFAULT_SELECTOR_CONFIG, ...options.selector });
  const workerType = options.workerType ?? DEFAULT_WORKER_TYPE;
  if (!WORKER_TYPES.includes(workerType)) throw badRequest(`workerType must be one of ${WORKER_TYPES.join(", ")}`, "workerType");
  const expiryMs = options.activeRequestExpiryMs ?? DEFAULT_ACTIVE_REQUEST_EXPIRY_MS;
  if (!(expiryMs > 0)) throw badRequest("activeRequestExpiryMs must be > 0", "activeRequestExpiryMs");
  const loadReplication = options.loadReplication ?? "exact";
  if (!LOAD_REPLICATION_MODES.includes(loadReplication)) throw badRequest(`loadReplication must be one of ${LOAD_REPLICATION_MODES.join(", ")}`, "loadReplication");
  const maxLocalReservations = options.maxLocalReservations ?? DEFAULT_MAX_LOCAL_RESERVATIONS;
  if (!Number.isSafeInteger(maxLocalReservations) || maxLocalReservations < 1) throw badRequest("maxLocalReservations must be a positive integer", "maxLocalReservations");
  const maxReservationBytes = options.maxReservationBytes ?? DEFAULT_MAX_RESERVATION_BYTES;
  if (!Number.isSafeInteger(maxReservationBytes) || maxReservationBytes < 1) throw badRequest("maxReservationBytes must be a positive integer", "maxReservationBytes");
  const maxPartitions = options.maxPartitions ?? DEFAULT_MAX_PARTITIONS;
  if (!Number.isSafeInteger(maxPartitions) || maxPartitions < 1) throw badRequest("maxPartitions must be a positive integer", "maxPartitions");
  const maxRanks = options.maxRanks ?? DEFAULT_MAX_RANKS;
  if (!Number.isSafeInteger(maxRanks) || maxRanks < 1 || maxRanks > MAX_RANK_KEYS) throw badRequest(`maxRanks must be an integer in [1, ${MAX_RANK_KEYS}]`, "maxRanks");
  const bindingRefreshCoalesceMs = options.bindingRefreshCoalesceMs ?? 0;
  if (!Number.isSafeInteger(bindingRefreshCoalesceMs) || bindingRefreshCoalesceMs < 0) {
    throw badRequest("bindingRefreshCoalesceMs must be a non-negative integer (ms)", "bindingRefreshCoalesceMs");
  }
  return {
    clock: options.clock ?? systemClock,
    random,
    replicaId,
    writerId: hostWriterId ?? replicaId,
    hostReplication: hostWriterId !== undefined,
    selector,
    workerType,
    expiryMs,
    loadReplication,
    maxLocalReservations,
    affinity: resolveAffinity(options.sessionAffinity),
    bindingRefreshCoalesceMs,
    wallClockNs: options.wallClockNs ?? systemWallClockNs,
    selectionCache: options.selectionCache ?? {},
    busyThresholds: validateBusyThresholds(options.busyThresholds),
    requireKvEventsEndpoint: options.requireKvEventsEndpoint ?? false,
    predictedCache: resolvePredicted(options.predictedCache),
    maxPartitions,
    maxRanks,
    maxReservationBytes,
  };
}

function resolvePredicted(o: SelectionServiceOptions["predictedCache"]): PredictedCacheOptions {
  const ttlMs = o?.ttlMs ?? 0;
  if (!Number.isFinite(ttlMs) || ttlMs < 0) throw badRequest("predictedCache.ttlMs must be a finite number of ms >= 0 (0: off)", "predictedCache.ttlMs");
  const maxBlocksPerRank = o?.maxBlocksPerRank ?? DEFAULT_MAX_PREDICTED_BLOCKS_PER_RANK;
  if (!Number.isSafeInteger(maxBlocksPerRank) || maxBlocksPerRank < 1) throw badRequest("predictedCache.maxBlocksPerRank must be a positive integer", "predictedCache.maxBlocksPerRank");
  return { ttlMs, maxBlocksPerRank };
}

function resolveAffinity(sa: SessionAffinityOptions | undefined): ResolvedAffinityOptions | undefined {
  if (sa === undefined) return undefined;
  if (!Number.isInteger(sa.ttlSecs) || sa.ttlSecs < MIN_AFFINITY_TTL_SECS || sa.ttlSecs > MAX_AFFINITY_TTL_SECS) {
    throw badRequest(`session_affinity_ttl_secs must be an integer in [${MIN_AFFINITY_TTL_SECS}, ${MAX_AFFINITY_TTL_SECS}]`, "session_affinity_ttl_secs");
  }
  return { mode: "hard", maxEntries: DEFAULT_AFFINITY_MAX_ENTRIES, maxSessionIdBytes: MAX_ID_BYTES, ...sa };
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
  if (id === undefined || id <= 0n || id >= U64_LIMIT) {
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
