/**
 * The worker catalogue: entries merged last-writer-wins (catalog-replication.ts). A snapshot's
 * entries install first, so a joiner with an empty catalogue gets the fleet's workers before the
 * bookings and bindings that name them.
 */
import type { CatalogEvent } from "../replica-events.js";
import type { ReplicaKindFactory } from "./kind.js";

export type CatalogKindEvent = { readonly kind: "catalog"; readonly event: CatalogEvent };

export interface CatalogSnapshotPart {
  /** Every entry the origin holds, live and deleted (absent from older replicas). */
  readonly catalog?: readonly CatalogEvent[];
}

export const catalogKind: ReplicaKindFactory<CatalogKindEvent, CatalogSnapshotPart> = ({ catalog }, emit) => {
  catalog.onCatalogEvent((event) => {
    emit({ kind: "catalog", event });
  });
  return {
    kinds: ["catalog"],
    apply: (origin, e) => catalog.apply(e.event, origin),
    snapshot: () => ({ catalog: catalog.snapshot() }),
    install(_origin, s) {
      for (const c of s.catalog ?? []) catalog.apply(c);
    },
  };
};
