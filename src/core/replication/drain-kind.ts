/**
 * The drain flag: a replica that is draining (leaving: `POST /drain`, a shutdown's drain window)
 * tells its peers, and each records it per origin (GET /replica_sync/status shows it as
 * `held.draining`). A peer can then tell a cleanly leaving replica from a dead one, and keep its
 * bookings instead of dropping them when it goes down (issue 29's G8).
 */
import type { ReplicaKindFactory } from "./kind.js";

export interface DrainEvent {
  readonly draining: boolean;
}

export type DrainKindEvent = { readonly kind: "drain"; readonly event: DrainEvent };

export interface DrainSnapshotPart {
  /** The origin is draining (absent otherwise, and from older replicas). */
  readonly draining?: boolean;
  /**
   * Other origins the sender holds as leaving (absent when none, and from older replicas): a
   * joiner that adopts their totals from this snapshot then keeps them as the sender does, instead
   * of dropping them once they go silent (G8).
   */
  readonly drainingOrigins?: readonly bigint[];
}

export interface DrainFacts {
  /** The origin said it is leaving. */
  readonly draining?: true;
}

/** Origins remembered as draining at most; past it the oldest flag goes (a flood of forged origins stays bounded). */
export const MAX_DRAINING_ORIGINS = 4_096;

export const drainKind: ReplicaKindFactory<DrainKindEvent, DrainSnapshotPart, DrainFacts> = ({ local, replicaId }, emit) => {
  const draining = new Set<bigint>();
  const record = (origin: bigint, flag: boolean): boolean => {
    if (!flag) return draining.delete(origin);
    if (draining.has(origin)) return false;
    draining.add(origin);
    if (draining.size > MAX_DRAINING_ORIGINS) draining.delete(draining.values().next().value as bigint);
    return true;
  };
  local.onDraining(() => {
    emit({ kind: "drain", event: { draining: true } });
  });
  return {
    kinds: ["drain"],
    apply: (origin, e) => record(origin, e.event.draining),
    snapshot: () => ({ ...(local.draining ? { draining: true } : {}), ...(draining.size > 0 ? { drainingOrigins: [...draining] } : {}) }),
    install(origin, s) {
      record(origin, s.draining === true);
      // Only ever set from here: a flag goes with its own origin's word or its drop.
      for (const o of s.drainingOrigins ?? []) if (o !== replicaId && o !== origin) record(o, true);
    },
    dropOrigin(origin) {
      draining.delete(origin);
      return 0;
    },
    describe: (origin) => (draining.has(origin) ? { draining: true } : {}),
  };
};
