/**
 * GET /ready's answer: the selection core's readiness (schedulable workers, not draining), held
 * at 503 while the mesh pulls its peers' first snapshots after a start (mesh/startup-sync.ts), so
 * a load balancer sends a new or restarted replica nothing before it knows the fleet's sessions.
 */
import type { MeshControl } from "./mesh-control.js";
import type { SelectionService } from "../core/index.js";

export type Readiness = ReturnType<SelectionService["ready"]> & { mesh_syncing?: true; mesh_syncing_peers?: string[]; index_syncing?: true; index_sync?: string };

/**
 * `allWorkers` (`?workers=all`): list every worker's record even past READY_WORKERS_LISTED_MAX.
 * Held at 503 as well while the warm join installs a peer's prefix index (src/app/warm-join.ts):
 * `index_syncing: true`, bounded by --index-sync-secs; `index_sync` says "no_peer" or "timeout"
 * when the join ended without a peer's index.
 */
export function readiness(svc: Pick<SelectionService, "ready">, mesh: MeshControl | undefined, allWorkers = false): Readiness {
  let r: Readiness = svc.ready(allWorkers);
  const pending = mesh?.startupSyncPending?.() ?? null;
  if (pending !== null) r = { ...r, ready: false, mesh_syncing: true, mesh_syncing_peers: pending };
  const index = mesh?.indexSyncPending?.() ?? null;
  if (index !== null) r = { ...r, ...(index.index_syncing === true ? { ready: false } : {}), ...index };
  return r;
}
