/**
 * The selection core's series, all read at scrape time from its plain counters and sizes: the
 * select path never calls prom-client.
 */
import type { Registry } from "prom-client";

import type { SelectionService, ServiceStats } from "../core/index.js";
import type { RankLoad } from "../core/index.js";
import { collectedCounter, collectedGauge, collectedLabelledGauge, type LabelledSample } from "./collected.js";

/** What the metrics read from the service: read-only views only. */
export type ServiceMetricsSource = Pick<SelectionService, "sizes" | "parkedBindings" | "sessionBindingSubscribers" | "reservationCount" | "loads" | "catalogTombstones"> & {
  readonly stats: Readonly<ServiceStats>;
};

type Sizes = ReturnType<SelectionService["sizes"]>;

const STAT_COUNTERS: readonly (readonly [name: string, help: string, key: keyof ServiceStats])[] = [
  ["kvmesh_selections_total", "Workers selected (select and select_and_reserve).", "selections"],
  ["kvmesh_selection_prompt_blocks_total", "Prompt blocks of the selections made (full blocks, hashed).", "selectionPromptBlocks"],
  ["kvmesh_selection_overlap_blocks_total", "Of those, blocks the chosen rank held on device: rate over the prompt blocks' rate is the router's hit ratio.", "selectionOverlapBlocks"],
  ["kvmesh_reservations_total", "Bookings made by this replica.", "reservations"],
  ["kvmesh_kv_events_applied_total", "Worker KV events applied to the prefix index.", "kvEventsApplied"],
  ["kvmesh_kv_events_dropped_total", "Worker KV events dropped (unknown rank, block size or parent mismatch, parent-hash cycle).", "kvEventsDropped"],
  ["kvmesh_kv_events_parked_total", "Stored KV events parked because their rank did not hold their parent yet (attached once it is known).", "kvEventsParked"],
  ["kvmesh_kv_index_blocks_shed_total", "New KV blocks refused because their rank's prefix index held its bound (8 x total_kv_blocks, or 1,048,576).", "kvIndexBlocksShed"],
  ["kvmesh_kv_parent_cycles_total", "Stored KV events refused because a block would have been chained below itself (parent-hash cycle).", "kvParentCycles"],
  ["kvmesh_replica_events_applied_total", "Peer load events applied.", "replicaEventsApplied"],
  ["kvmesh_replica_events_ignored_total", "Peer load events ignored (duplicate, unknown partition or rank, tombstoned).", "replicaEventsIgnored"],
  ["kvmesh_bindings_applied_total", "Peer session bindings applied.", "bindingsApplied"],
  ["kvmesh_bindings_ignored_total", "Peer session bindings ignored or rejected.", "bindingsIgnored"],
  [
    "kvmesh_versions_refused_total",
    "Session bindings and catalogue events refused: a version more than 5 minutes ahead of this replica's wall clock, or a catalogue event its sender did not write.",
    "versionsRefusedAhead",
  ],
  ["kvmesh_expired_requests_total", "Bookings force-freed after the active-request expiry.", "expiredRequests"],
  ["kvmesh_reservations_refused_total", "Bookings refused (429) at the live-booking limit (--max-reservations).", "reservationsRefused"],
  ["kvmesh_bindings_parked_total", "Peer bindings parked because their worker or partition was not known yet.", "bindingsParked"],
  ["kvmesh_bindings_unparked_total", "Parked bindings applied once their worker registered.", "bindingsUnparked"],
  ["kvmesh_parked_bindings_expired_total", "Parked bindings dropped after their TTL without the worker appearing.", "parkedBindingsExpired"],
  ["kvmesh_parked_bindings_shed_total", "Parked bindings shed because the parking table was full.", "parkedBindingsShed"],
  ["kvmesh_session_bindings_published_total", "Session bindings this replica committed, rebound or refreshed.", "bindingsPublished"],
  [
    "kvmesh_session_bindings_refreshes_coalesced_total",
    "Session binding refreshes not published because the binding was published within the coalescing window (--binding-refresh-coalesce-ms).",
    "bindingRefreshesCoalesced",
  ],
  ["kvmesh_session_bindings_dropped_total", "Bindings shed by full sessionBindingUpdates() queues (host replication; repaired by a snapshot).", "droppedBindings"],
  ["kvmesh_catalog_events_published_total", "Worker catalogue changes taken here (register, patch, delete) published to peers with a new version.", "catalogEventsPublished"],
  ["kvmesh_catalog_events_applied_total", "Peers' worker catalogue entries merged (newer than the entry held).", "catalogEventsApplied"],
  ["kvmesh_catalog_events_stale_total", "Peers' worker catalogue entries ignored: not newer than the entry held (stale, or a repeat).", "catalogEventsStale"],
  ["kvmesh_catalog_events_rejected_total", "Peers' worker registrations this replica could not hold (a fleet limit); reported in its worker status.", "catalogEventsRejected"],
  ["kvmesh_catalog_tombstones_expired_total", "Worker catalogue deletions forgotten after their TTL.", "catalogTombstonesExpired"],
  ["kvmesh_catalog_tombstones_shed_total", "Worker catalogue deletions forgotten early because the tombstone table was full.", "catalogTombstonesShed"],
  ["kvmesh_worker_statuses_published_total", "This replica's per-worker status (lifecycle and reasons) published because it changed.", "workerStatusesPublished"],
  ["kvmesh_worker_statuses_applied_total", "Peers' per-worker statuses applied.", "workerStatusesApplied"],
  ["kvmesh_predicted_blocks_added_total", "Predicted (rank, block) pairs recorded from routing decisions (this replica's and its peers').", "predictedBlocksAdded"],
  ["kvmesh_predicted_blocks_confirmed_total", "Predicted pairs dropped because the prefix index held them when looked up (the engine's BlockStored arrived).", "predictedBlocksConfirmed"],
  ["kvmesh_predicted_blocks_expired_total", "Predicted pairs dropped at their TTL (--predicted-ttl-secs, or --approx-ttl-secs without KV events).", "predictedBlocksExpired"],
  ["kvmesh_predicted_blocks_shed_total", "Predicted pairs shed at the per-rank bound (--predicted-max-blocks-per-rank), oldest bookings first.", "predictedBlocksShed"],
  ["kvmesh_predicted_blocks_snapshot_left_total", "Predicted pairs left out of a snapshot sent to a peer, past its bound (262,144 pairs, newest kept).", "predictedSnapshotLeft"],
  ["kvmesh_predicted_snapshot_rows_unplaced_total", "Predicted rows in a peer's snapshot skipped because their worker is not registered here.", "predictedSnapshotUnplaced"],
  ["kvmesh_worker_statuses_ignored_total", "Peers' per-worker statuses ignored (taken before the worker's deletion, or over the bound).", "workerStatusesIgnored"],
];

const SIZE_GAUGES: readonly (readonly [name: string, help: string, key: keyof Sizes])[] = [
  ["kvmesh_partitions", "Partitions (model_name, routing_group).", "partitions"],
  ["kvmesh_index_blocks", "(rank, block) entries in the prefix indexes.", "indexedBlocks"],
  ["kvmesh_index_nodes", "Nodes in the prefix indexes.", "indexNodes"],
  ["kvmesh_index_detached_blocks", "Stored KV blocks parked until their parent is known (a replay that ran short, a snapshot not installed yet).", "detachedBlocks"],
  ["kvmesh_predicted_blocks", "Predicted (rank, block) pairs held: checkpoints of in-flight prompts not yet reported by their engine, or the approximate cache of engines without KV events.", "predictedBlocks"],
  ["kvmesh_affinity_entries", "Session bindings held.", "affinityEntries"],
  ["kvmesh_pending_selections", "Cached selections awaiting POST /reservations.", "pendingSelections"],
  ["kvmesh_reservation_bytes", "Estimated bytes of this replica's live bookings (192 per booked block + 1 KiB each), against --max-reservation-bytes.", "reservationBytes"],
  ["kvmesh_mirrored_reservation_bytes", "Estimated bytes of the bookings mirrored from peers (exact load replication; 0 in aggregate mode).", "mirroredReservationBytes"],
];

const SIZE_COUNTERS: readonly (readonly [name: string, help: string, key: keyof Sizes])[] = [
  ["kvmesh_affinity_fallbacks_total", "Sessions routed unpinned because the affinity table was full of leased bindings.", "affinityFallbacks"],
  ["kvmesh_affinity_evictions_total", "Bindings without a lease evicted, least recently used first, to make room for a new session.", "affinityEvictions"],
  ["kvmesh_affinity_rebinds_total", "Soft affinity: session bindings that followed a dispatch to another worker (rank).", "affinityRebinds"],
  ["kvmesh_affinity_conflicts_total", "Hard affinity: dispatches away from a live binding, refused 400 (KVMESH_SESSION_CONFLICT).", "affinityConflicts"],
  ["kvmesh_affinity_unbinds_shed_total", "Hard affinity: remembered unbinds forgotten before their TTL because the table's max entries were remembered (an older copy of such a session could then be applied again).", "affinityUnbindsShed"],
  ["kvmesh_pending_selection_evictions_total", "Cached selections evicted (entry or byte bound) before use.", "pendingEvictions"],
  ["kvmesh_pending_selection_large_evictions_total", "Of those, large cached selections (over 1/256 of the byte budget) evicted by newer large ones (their budget is 1/4 of it).", "pendingLargeEvictions"],
  ["kvmesh_index_detached_attached_blocks_total", "Parked KV blocks attached to the prefix index once their parent was known.", "detachedAttachedBlocks"],
  ["kvmesh_index_detached_shed_blocks_total", "Parked KV blocks shed, oldest chains first, at the bound (65,536 per partition).", "detachedShedBlocks"],
  [
    "kvmesh_active_blocks_fallbacks_total",
    "Booking hash lists that broke the active blocks' prefix tree (a repeated hash, or one held under another prefix: only client-supplied sequence_hashes do), each moving its partition to the slower per-hash index until nothing is in flight there.",
    "activeBlockFallbacks",
  ],
  ["kvmesh_reorder_state_shed_total", "Tombstones or early prefill marks shed at their bound.", "reorderShed"],
];

export function registerServiceMetrics(registry: Registry, svc: ServiceMetricsSource): void {
  // svc.stats is read at each scrape, never captured: the facade may hand out a fresh view each time.
  for (const [name, help, key] of STAT_COUNTERS) collectedCounter(registry, { name, help }, () => svc.stats[key]);
  collectedCounter(registry, { name: "kvmesh_selection_errors_total", help: "Selections that failed." }, () => svc.stats.selectionErrors);
  collectedGauge(registry, { name: "kvmesh_parked_bindings", help: "Peer bindings parked now." }, () => svc.parkedBindings);
  collectedGauge(registry, { name: "kvmesh_session_bindings_subscribers", help: "Live sessionBindingUpdates() subscriptions." }, () => svc.sessionBindingSubscribers);
  collectedGauge(registry, { name: "kvmesh_catalog_tombstones", help: "Worker catalogue deletions remembered now (tombstones)." }, () => svc.catalogTombstones);
  collectedGauge(registry, { name: "kvmesh_reservations_active", help: "Live bookings (local and mirrored from peers)." }, () => svc.reservationCount);

  // sizes() walks the partitions (a handful: one per model and routing group), once per family.
  for (const [name, help, key] of SIZE_GAUGES) collectedGauge(registry, { name, help }, () => svc.sizes()[key]);
  for (const [name, help, key] of SIZE_COUNTERS) collectedCounter(registry, { name, help }, () => svc.sizes()[key]);

  // Per rank, as GET /loads gives it (this replica's bookings plus its peers'): one series per
  // (model, group, worker, dp rank), 1,024 ranks are 3,072 series. A removed rank's series ends.
  const rankLabels = ["model_name", "routing_group", "worker_id", "dp_rank"] as const;
  type RankLabel = (typeof rankLabels)[number];
  const perRank = (pick: (l: RankLoad) => number) => (): LabelledSample<RankLabel>[] =>
    svc.loads().flatMap((m) => m.loads.map((l): LabelledSample<RankLabel> => [{ model_name: m.model_name, routing_group: m.routing_group, worker_id: l.worker_id.toString(), dp_rank: String(l.dp_rank) }, pick(l)]));
  collectedLabelledGauge(registry, { name: "kvmesh_rank_active_requests", help: "Requests in flight per worker rank (booked here and by peers)." }, rankLabels, perRank((l) => l.active_requests));
  collectedLabelledGauge(registry, { name: "kvmesh_rank_decode_blocks", help: "Active KV blocks per worker rank (potential_decode_blocks of GET /loads)." }, rankLabels, perRank((l) => l.potential_decode_blocks));
  collectedLabelledGauge(registry, { name: "kvmesh_rank_prefill_tokens", help: "Prefill tokens still owed per worker rank (potential_prefill_tokens of GET /loads)." }, rankLabels, perRank((l) => l.potential_prefill_tokens));
}
