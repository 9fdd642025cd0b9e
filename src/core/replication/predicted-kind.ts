/**
 * The predicted cache (predicted-cache.ts) in snapshots: no events of its own (a booking's
 * prediction travels with its load event), only a snapshot part, merged into what is held
 * (predicted-snapshot.ts). It installs after the catalogue, so a joiner knows the rows' workers.
 */
import type { PredictionSnapshotRow } from "../predicted-snapshot.js";
import type { ReplicaKindFactory } from "./kind.js";

export interface PredictedSnapshotPart {
  /** Predictions with the time each has left (absent when none, and from older replicas). */
  readonly predictions?: readonly PredictionSnapshotRow[];
}

export const predictedKind: ReplicaKindFactory<never, PredictedSnapshotPart> = ({ predictions }) => ({
  kinds: [],
  apply: () => undefined,
  snapshot: () => {
    const rows = predictions.snapshot();
    return rows.length > 0 ? { predictions: rows } : {};
  },
  install(_origin, s) {
    if (s.predictions !== undefined && s.predictions.length > 0) predictions.install(s.predictions);
  },
});
