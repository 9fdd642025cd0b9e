/** Each replica's own outcome for a worker (its lifecycle and reasons there), held per origin (GET /workers lists them). */
import type { WorkerStatusEvent } from "../replica-events.js";
import type { ReplicaKindFactory } from "./kind.js";

export type WorkerStatusKindEvent = { readonly kind: "worker_status"; readonly event: WorkerStatusEvent };

export interface WorkerStatusSnapshotPart {
  /** The origin's own status for each worker it holds (absent from older replicas). */
  readonly statuses?: readonly WorkerStatusEvent[];
}

export const workerStatusKind: ReplicaKindFactory<WorkerStatusKindEvent, WorkerStatusSnapshotPart> = ({ catalog }, emit) => {
  catalog.onWorkerStatusEvent((event) => {
    emit({ kind: "worker_status", event });
  });
  return {
    kinds: ["worker_status"],
    apply(origin, e) {
      catalog.applyStatus(origin, e.event);
    },
    snapshot: () => ({ statuses: catalog.statusSnapshot() }),
    install(origin, s) {
      catalog.replaceStatuses(origin, s.statuses ?? []);
    },
    dropOrigin(origin) {
      catalog.dropOrigin(origin);
      return 0;
    },
  };
};
