/**
 * GET /ready's answer: the selection core's readiness (schedulable workers, not draining), held
 * at 503 while the mesh pulls its peers' first snapshots after a start (mesh/startup-sync.ts), so
 * a load balancer sends a new or restarted replica nothing before it knows the fleet's sessions.
 */
import type { MeshControl } from "./mesh-control.js";
import type { SelectionService } from "../core/selection-service.js";

export type Readiness = ReturnType<SelectionService["ready"]> & { mesh_syncing?: true; mesh_syncing_peers?: string[] };

/** `allWorkers` (`?workers=all`): list every worker's record even past READY_WORKERS_LISTED_MAX. */
export function readiness(svc: Pick<SelectionService, "ready">, mesh: MeshControl | undefined, allWorkers = false): Readiness {
  const r = svc.ready(allWorkers);
  const pending = mesh?.startupSyncPending?.() ?? null;
  return pending === null ? r : { ...r, ready: false, mesh_syncing: true, mesh_syncing_peers: pending };
}
