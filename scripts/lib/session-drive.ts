/**
 * The paced session load bench:mesh and bench:host put on a fleet: every turn of a
 * bench-workload.ts session is a select_and_reserve with the session id (on replica k mod N for
 * the k-th turn), prefill_complete `prefillDelayMs` later, and DELETE `durationMs` after the
 * reserve. Records which worker each turn went to and the client-side reserve latency.
 */
import { setTimeout as sleep } from "node:timers/promises";

import type { RouterClient } from "../../src/bench/router-client.js";
import { SessionWorkload, type TurnPlan } from "./bench-workload.js";
import { paceTurns, type PacerState } from "./turn-pacer.js";

/** An error answer's body is quoted up to this many characters. */
const ERROR_BODY_CHARS = 200;

export interface TurnRecord {
  readonly sessionSerial: number;
  readonly turn: number;
  /** The replica that routed it (index into the clients). */
  readonly replica: number;
  readonly worker: number;
  /** performance.now() when the reserve was answered. */
  readonly answeredAt: number;
}

export interface DriveOptions {
  readonly clients: readonly RouterClient[];
  readonly workload: SessionWorkload;
  /** Names the run in progress lines. */
  readonly label: string;
  readonly seconds: number;
  readonly ratePerS: number;
  readonly maxInFlight: number;
  /** Selection ids are this prefix and the turn's number (warm-up and measured runs use different ones). */
  readonly selectionPrefix: string;
  /** The token ids sent for a turn, as a comma-separated list. Default: the whole history. */
  readonly tokenIdsCsv?: (plan: TurnPlan) => string;
  /**
   * Called when a turn is booked, before its record is kept; may return what to do when the
   * turn ends (freed or failed), e.g. a client-side ledger of active requests.
   */
  readonly onBooked?: (rec: TurnRecord) => (() => void) | undefined;
  /** Every pacer tick (samples of the replicas); `fail` counts an error. */
  readonly onTick?: (nowMs: number, fail: (what: string) => void) => void;
}

export interface DriveResult {
  /** From the first tick to the end of the last turn. */
  readonly wallMs: number;
  readonly ticks: number;
  readonly dropped: number;
  readonly records: TurnRecord[];
  readonly latencyMs: number[];
  readonly errors: number;
  /** The first error, verbatim ("" when none). */
  readonly errorSample: string;
}

export async function driveSessions(o: DriveOptions): Promise<DriveResult> {
  const n = o.clients.length;
  const records: TurnRecord[] = [];
  const latencyMs: number[] = [];
  let errors = 0;
  let errorSample = "";
  const fail = (what: string): void => {
    errors++;
    if (errorSample === "") errorSample = what;
  };
  const tokenIdsCsv = o.tokenIdsCsv ?? ((plan: TurnPlan): string => plan.tokenIdsCsv);

  const runTurn = async (plan: TurnPlan, k: number): Promise<void> => {
    const replica = k % n;
    const client = o.clients[replica] as RouterClient;
    const sel = `${o.selectionPrefix}${String(k)}`;
    const body = `{"token_ids":[${tokenIdsCsv(plan)}],"session_id":"${plan.sessionId}","selection_id":"${sel}"}`;
    const t0 = performance.now();
    const rep = await client.send("POST", "/select_and_reserve", body);
    const t1 = performance.now();
    const m = /"worker_id":(\d+)/.exec(rep.text);
    if (rep.status !== 200 || m?.[1] === undefined) {
      fail(`select_and_reserve ${String(rep.status)}: ${rep.text.slice(0, ERROR_BODY_CHARS)}`);
      return;
    }
    latencyMs.push(t1 - t0);
    const rec: TurnRecord = { sessionSerial: plan.sessionSerial, turn: plan.turn, replica, worker: Number(m[1]), answeredAt: t1 };
    const release = o.onBooked?.(rec);
    records.push(rec);
    try {
      await sleep(plan.prefillDelayMs);
      const p = await client.send("POST", `/reservations/${sel}/prefill_complete`, "{}");
      if (p.status !== 200) fail(`prefill_complete ${String(p.status)}: ${p.text.slice(0, ERROR_BODY_CHARS)}`);
      await sleep(plan.durationMs - plan.prefillDelayMs);
      const d = await client.send("DELETE", `/reservations/${sel}`);
      if (d.status !== 200) fail(`DELETE ${String(d.status)}: ${d.text.slice(0, ERROR_BODY_CHARS)}`);
    } finally {
      release?.();
    }
  };

  const onTick = o.onTick;
  const paced = await paceTurns({
    workload: o.workload,
    ratePerS: o.ratePerS,
    seconds: o.seconds,
    maxInFlight: o.maxInFlight,
    runTurn,
    onError: fail,
    ...(onTick === undefined ? {} : { onTick: (now: number) => { onTick(now, fail); } }),
    onSecond: (elapsedS: number, st: PacerState) => {
      process.stderr.write(`${o.label}: ${String(elapsedS)}/${String(o.seconds)} s, ${String(records.length)} routed, ${String(st.outstanding)} in flight, ${String(errors)} errors, ${String(st.dropped)} ticks dropped\n`);
    },
  });
  return { wallMs: paced.wallMs, ticks: paced.ticks, dropped: paced.dropped, records, latencyMs, errors, errorSample };
}

export interface WarmUpOptions extends Omit<DriveOptions, "workload" | "label" | "selectionPrefix" | "seconds"> {
  readonly label: string;
  readonly seconds: number;
  /** The measured run's seed: the warm-up runs other sessions (seed + 1, ids "warm-..."). */
  readonly seed: number;
  readonly slots: number;
}

/**
 * The same kind of traffic on other sessions, unmeasured: a fresh process runs its first few
 * hundred requests cold (JIT, pools), which would charge whichever run comes first for
 * compilation rather than routing. Throws if any turn failed.
 */
export async function warmUp(o: WarmUpOptions): Promise<void> {
  if (o.seconds <= 0) return;
  process.stderr.write(`${o.label}: warming up for ${String(o.seconds)} s\n`);
  const warm = await driveSessions({
    ...o,
    workload: new SessionWorkload({ seed: o.seed + 1, slots: o.slots, idPrefix: "warm-" }),
    label: `${o.label} warm-up`,
    selectionPrefix: "w",
  });
  if (warm.errors > 0) throw new Error(`warm-up: ${String(warm.errors)} errors, first: ${warm.errorSample}`);
}
