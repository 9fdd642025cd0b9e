/**
 * GET /ready's answer: the selection core's readiness (schedulable workers, not draining), held
 * at 503 while the mesh pulls its peers' first snapshots after a start (mesh/startup-sync.ts), so
 * a load balancer sends a new or restarted replica nothing before it knows the fleet's sessions.
 */
import type { MeshControl } from "./mesh-control.js";
import type { SelectionService } from "../core/index.js";

export type Readiness = ReturnType<SelectionService["ready"]> & {
  mesh_syncing?: true;
  mesh_syncing_peers?: string[];
  index_syncing?: true;
  index_sync?: string;
  kv_ingest?: "restarting";
  kv_ingest_restarts?: number;
};

/** The KV ingest thread's life (src/ingest/kv-ingest-worker.ts); absent with --no-kv-ingest-thread or --no-kv-events. */
export interface KvIngestHealth {
  /** Whether a live thread reads the KV streams (false while a dead one waits for its restart). */
  readonly up: boolean;
  /** Threads started again after one died. */
  readonly restarts: number;
}

/**
 * `allWorkers` (`?workers=all`): list every worker's record even past READY_WORKERS_LISTED_MAX.
 * Held at 503 as well while the warm join installs a peer's prefix index (src/app/warm-join.ts):
 * `index_syncing: true`, bounded by --index-sync-secs; `index_sync` says "no_peer" or "timeout"
 * when the join ended without a peer's index. While the KV ingest thread is dead and waits for its
 * restart (100 ms to 5 s of backoff), the answer says so (`kv_ingest: "restarting"`,
 * `kv_ingest_restarts`) and stays as it was: routing on an index a few seconds stale beats
 * refusing every request (docs/ingest-thread.md).
 */
export function readiness(svc: Pick<SelectionService, "ready">, mesh: MeshControl | undefined, allWorkers = false, kvIngest?: KvIngestHealth): Readiness {
  let r: Readiness = svc.ready(allWorkers);
  const pending = mesh?.startupSyncPending?.() ?? null;
  if (pending !== null) r = { ...r, ready: false, mesh_syncing: true, mesh_syncing_peers: pending };
  const index = mesh?.indexSyncPending?.() ?? null;
  if (index !== null) r = { ...r, ...(index.index_syncing === true ? { ready: false } : {}), ...index };
  // Said, not held at 503: the index only goes stale (the new thread replays what the dead one
  // missed), while 503 on every replica that hit the same bug would stop all routing at once.
  if (kvIngest !== undefined && !kvIngest.up) r = { ...r, kv_ingest: "restarting", kv_ingest_restarts: kvIngest.restarts };
  return r;
}
