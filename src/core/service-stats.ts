/**
 * The selection service's counters. The core bumps plain number fields (one add on the hot path,
 * nothing else); readers (metrics scrapes, tests, logs) get a read-only view whose getters read
 * the live values, so a scrape needs no copy and no reader can move a counter.
 */

/** What the service has counted since it started; every field only grows. */
export interface ServiceStats {
  /** Workers selected (select and select_and_reserve). */
  readonly selections: number;
  /** Prompt blocks of those selections, and the blocks the chosen rank held on device: their
   * ratio of rates is the hit ratio the router achieves (the dashboard's "overlap"). */
  readonly selectionPromptBlocks: number;
  readonly selectionOverlapBlocks: number;
  /** Bookings this replica made. */
  readonly reservations: number;
  /** select / selectAndReserve / createReservation calls that threw (refused or invalid). */
  readonly selectionErrors: number;
  readonly kvEventsApplied: number;
  /** KV events dropped: unknown rank, block-size mismatch, or a parent this rank does not hold. */
  readonly kvEventsDropped: number;
  /** Stored KV events parked because their parent was unknown (attached later: src/core/detached-chains.ts). */
  readonly kvEventsParked: number;
  /** New blocks refused because their rank's index was at its bound (src/core/rank-index-bound.ts, #17 F8). */
  readonly kvIndexBlocksShed: number;
  /** Stored events refused because a block would have been chained below itself (#17 F11). */
  readonly kvParentCycles: number;
  readonly replicaEventsApplied: number;
  /** Peer load events ignored: duplicate, unknown partition or rank, tombstoned, own echo. */
  readonly replicaEventsIgnored: number;
  readonly bindingsApplied: number;
  readonly bindingsIgnored: number;
  /** Bindings and catalogue events refused: a version past the Lamport horizon (wall clock + skew), or a catalogue event not written by the origin that sent it (#29 G3/G4). */
  readonly versionsRefusedAhead: number;
  /** Bookings force-freed after the active-request expiry. */
  readonly expiredRequests: number;
  readonly bindingsParked: number;
  readonly bindingsUnparked: number;
  readonly parkedBindingsExpired: number;
  readonly parkedBindingsShed: number;
  /** Bindings this service committed, rebound or refreshed (what the mesh or a host stream carries). */
  readonly bindingsPublished: number;
  /** Binding refreshes not published because the binding was published within the coalescing window. */
  readonly bindingRefreshesCoalesced: number;
  /** Bindings shed by full `sessionBindingUpdates()` queues, all subscriptions together. */
  readonly droppedBindings: number;
  /** Bookings refused (429) because this replica held maxLocalReservations already. */
  readonly reservationsRefused: number;
  /** Catalogue changes taken here and published with a new version (catalog-replication.ts). */
  readonly catalogEventsPublished: number;
  /** Peers' catalogue events merged (newer than the entry held). */
  readonly catalogEventsApplied: number;
  /** Peers' catalogue events ignored: a version not newer than the entry held (stale or a repeat). */
  readonly catalogEventsStale: number;
  /** Peers' registrations this replica could not hold (a fleet limit); reported in its status. */
  readonly catalogEventsRejected: number;
  /** Catalogue tombstones dropped after their TTL, and shed at their bound. */
  readonly catalogTombstonesExpired: number;
  readonly catalogTombstonesShed: number;
  /** This replica's per-worker statuses published (they changed), and peers' applied / ignored. */
  readonly workerStatusesPublished: number;
  readonly workerStatusesApplied: number;
  readonly workerStatusesIgnored: number;
  /** Predicted (rank, block) pairs (checkpoints) recorded from routing decisions (predicted-cache.ts). */
  readonly predictedBlocksAdded: number;
  /** Of those, found in the prefix index by a later lookup (the engine's BlockStored arrived). */
  readonly predictedBlocksConfirmed: number;
  /** Of those, gone at their TTL. */
  readonly predictedBlocksExpired: number;
  /** Of those, shed at the per-rank bound (oldest bookings first). */
  readonly predictedBlocksShed: number;
  /** Predicted pairs left out of a snapshot this replica sent, at MAX_SNAPSHOT_PREDICTED_PAIRS (predicted-snapshot.ts). */
  readonly predictedSnapshotLeft: number;
  /** Predicted rows in a peer's snapshot whose worker is not known here (skipped). */
  readonly predictedSnapshotUnplaced: number;
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] };

/** The writable counters the core's parts share; never handed out (see `view`). */
export class ServiceCounters implements Mutable<ServiceStats> {
  selections = 0;
  selectionPromptBlocks = 0;
  selectionOverlapBlocks = 0;
  reservations = 0;
  selectionErrors = 0;
  kvEventsApplied = 0;
  kvEventsDropped = 0;
  kvEventsParked = 0;
  kvIndexBlocksShed = 0;
  kvParentCycles = 0;
  replicaEventsApplied = 0;
  replicaEventsIgnored = 0;
  bindingsApplied = 0;
  bindingsIgnored = 0;
  versionsRefusedAhead = 0;
  expiredRequests = 0;
  bindingsParked = 0;
  bindingsUnparked = 0;
  parkedBindingsExpired = 0;
  parkedBindingsShed = 0;
  bindingsPublished = 0;
  bindingRefreshesCoalesced = 0;
  droppedBindings = 0;
  reservationsRefused = 0;
  catalogEventsPublished = 0;
  catalogEventsApplied = 0;
  catalogEventsStale = 0;
  catalogEventsRejected = 0;
  catalogTombstonesExpired = 0;
  catalogTombstonesShed = 0;
  workerStatusesPublished = 0;
  workerStatusesApplied = 0;
  workerStatusesIgnored = 0;
  predictedBlocksAdded = 0;
  predictedBlocksConfirmed = 0;
  predictedBlocksExpired = 0;
  predictedBlocksShed = 0;
  predictedSnapshotLeft = 0;
  predictedSnapshotUnplaced = 0;

  /** Live, read-only: each property is a getter over the counter (enumerable, so JSON shows it). */
  readonly view: ServiceStats;

  constructor() {
    const view: Partial<Record<keyof ServiceStats, number>> = {};
    // Every own field but `view` itself (declared, so already an own property here).
    for (const key of Object.keys(this).filter((k) => k !== "view") as (keyof ServiceStats)[]) {
      Object.defineProperty(view, key, { enumerable: true, get: (): number => this[key] });
    }
    this.view = Object.freeze(view) as ServiceStats;
  }
}
