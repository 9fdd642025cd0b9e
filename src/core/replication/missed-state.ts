/**
 * Peers' load this replica could not place: a booking (exact) or a non-zero total (aggregate)
 * for a worker whose partition or rank is not known here yet. It is ignored when it arrives (a
 * ledger row needs a rank), and in aggregate mode the origin does not send that total again until
 * it changes, so the only repair is a fresh snapshot of the origin that sent it.
 *
 * This remembers who sent what could not be placed, by worker, so that when a worker registers
 * or changes here the replicator re-pulls exactly those origins (ReplicaLink.workersChanged), and
 * nobody on an idempotent re-registration or a PATCH. Before it (issue 29's G6) every catalogue
 * change made every replica re-pull every peer's full snapshot: one PATCH on 4 replicas made 12
 * pulls, and ~5 PATCHes/s took 18.3 of 20.6 CPU-seconds.
 *
 * Why this race exists at all: a catalogue event and the bookings that follow it on its own
 * origin's stream arrive in order, but a third replica may book on a worker it just learned of
 * and its booking can reach us before the registering replica's catalogue event does.
 */
import type { WorkerId } from "../types.js";

/**
 * (worker, origin) pairs remembered at most. Past it an origin is remembered for every worker
 * (re-pulled on any change), so nothing is forgotten; origins reaching the core are bounded by
 * the replicator (the mesh tracks 1,024 at most), so that set stays bounded too.
 */
export const MAX_MISSED_PAIRS = 65_536;

export class MissedPeerState {
  readonly #byWorker = new Map<WorkerId, Set<bigint>>();
  /** Origins that missed something past MAX_MISSED_PAIRS: re-pulled on any worker change. */
  readonly #anyWorker = new Set<bigint>();
  #pairs = 0;

  /** `origin` sent load for `workerId` that could not be placed here. */
  note(origin: bigint, workerId: WorkerId): void {
    let origins = this.#byWorker.get(workerId);
    if (origins?.has(origin) === true || this.#anyWorker.has(origin)) return;
    if (this.#pairs >= MAX_MISSED_PAIRS) {
      this.#anyWorker.add(origin);
      return;
    }
    if (origins === undefined) {
      origins = new Set();
      this.#byWorker.set(workerId, origins);
    }
    origins.add(origin);
    this.#pairs++;
  }

  /** `workerId` registered or changed here: the origins to re-pull (each returned once). */
  take(workerId: WorkerId): bigint[] {
    const origins = this.#byWorker.get(workerId);
    const out = new Set<bigint>(this.#anyWorker);
    this.#anyWorker.clear();
    if (origins !== undefined) {
      this.#byWorker.delete(workerId);
      this.#pairs -= origins.size;
      for (const o of origins) out.add(o);
    }
    return [...out];
  }

  /** Pairs remembered (diagnostics and tests). */
  get size(): number {
    return this.#pairs + this.#anyWorker.size;
  }
}
