/**
 * Paces a multi-turn session workload (scripts/lib/bench-workload.ts) at a fixed rate, as
 * bench:mesh and bench:host drive their replicas: every scheduler tick, as many turns as are
 * due start, each on a session slot that is free (its previous turn answered and its think time
 * over), with at most `maxInFlight` turns running. Ticks owed for longer than a second are
 * dropped and counted, so a stall of the driver cannot turn into a burst. Returns once every
 * started turn has finished.
 */
import { setTimeout as sleep } from "node:timers/promises";

import type { SessionWorkload, TurnPlan } from "./bench-workload.js";

/** Scheduler tick: at 200 req/s one request is due every 5 ms, so 2 ms keeps the pacing even. */
export const SCHED_TICK_MS = 2;
/** Ticks owed for longer than this are dropped (counted), so a stall cannot turn into a burst. */
export const MAX_BACKLOG_S = 1;

export interface PacerState {
  readonly startMs: number;
  /** Turns started, plus ticks dropped. */
  readonly ticks: number;
  readonly dropped: number;
  readonly outstanding: number;
}

export interface PacerOptions {
  readonly workload: SessionWorkload;
  readonly ratePerS: number;
  readonly seconds: number;
  readonly maxInFlight: number;
  /** Runs the k-th turn (k = 0, 1, 2, ... in start order); a rejection goes to onError. */
  readonly runTurn: (plan: TurnPlan, k: number) => Promise<void>;
  readonly onError: (message: string) => void;
  /** Every tick, after the due turns started (samples of the replicas, and the like). */
  readonly onTick?: (nowMs: number, state: PacerState) => void;
  /** Once a second of issuing: progress lines. */
  readonly onSecond?: (elapsedS: number, state: PacerState) => void;
}

export interface PacerResult {
  /** From the first tick to the end of the last turn. */
  readonly wallMs: number;
  readonly ticks: number;
  readonly dropped: number;
}

export async function paceTurns(o: PacerOptions): Promise<PacerResult> {
  const ready: number[] = Array.from({ length: o.workload.slots }, (_, s) => s);
  let outstanding = 0;
  let ticks = 0;
  let dropped = 0;
  let k = 0;
  const start = performance.now();
  const state = (): PacerState => ({ startMs: start, ticks, dropped, outstanding });
  const endAt = start + o.seconds * 1000;
  let nextSecondAt = start + 1000;
  for (let now = start; now < endAt; now = performance.now()) {
    const due = Math.floor(((now - start) * o.ratePerS) / 1000) + 1;
    while (ticks < due && ready.length > 0 && outstanding < o.maxInFlight) {
      const slot = ready.shift() as number;
      const plan = o.workload.nextTurn(slot);
      ticks++;
      outstanding++;
      void o
        .runTurn(plan, k++)
        .catch((err: unknown) => {
          o.onError(err instanceof Error ? err.message : String(err));
        })
        .finally(() => {
          outstanding--;
          setTimeout(() => ready.push(slot), plan.thinkMs);
        });
    }
    const backlog = due - ticks - o.ratePerS * MAX_BACKLOG_S;
    if (backlog > 0) {
      dropped += backlog;
      ticks += backlog;
    }
    o.onTick?.(now, state());
    if (now >= nextSecondAt) {
      nextSecondAt += 1000;
      o.onSecond?.(Math.round((now - start) / 1000), state());
    }
    await sleep(SCHED_TICK_MS);
  }
  // Let every started turn run to its end: the window ends when the replicas are idle.
  while (outstanding > 0) await sleep(10);
  return { wallMs: performance.now() - start, ticks, dropped };
}
