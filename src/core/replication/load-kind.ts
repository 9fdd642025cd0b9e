/**
 * Load: a booking's events (exact), an origin's per-rank totals (aggregate), and lifecycle calls
 * forwarded to a booking's owner (both). What it does is the load strategy's (load-strategy.ts).
 */
import type { LoadAggregates, LoadEvent } from "../replica-events.js";
import type { ReplicaKindFactory } from "./kind.js";
import type { LoadSnapshotPart } from "./load-strategy.js";

export type LoadKindEvent = { readonly kind: "load"; readonly event: LoadEvent } | { readonly kind: "loads"; readonly event: LoadAggregates };

export interface LoadFacts {
  /** Bookings `origin` owns as held here (own, mirrored or totals): the heartbeat's count and its divergence check. */
  readonly bookings: number;
}

export const loadKind: ReplicaKindFactory<LoadKindEvent, LoadSnapshotPart, LoadFacts> = ({ load }) => ({
  kinds: ["load", "loads"],
  apply: (origin, e) => (e.kind === "load" ? load.applyEvent(e.event) : load.applyTotals(origin, e.event)),
  snapshot: () => load.snapshot(),
  install(origin, s) {
    load.install(origin, s);
  },
  dropOrigin: (origin) => load.dropOrigin(origin),
  describe: (origin) => ({ bookings: load.countOwnedBy(origin) }),
});
