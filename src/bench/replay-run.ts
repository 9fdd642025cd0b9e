/**
 * One benchmark run: a workload replayed through one routing policy against a fresh fleet of mock
 * engines, in trace time divided by `speedup`. Requests start at their trace timestamps (open
 * loop, as the trace was recorded), except that a session's turn waits for its previous turn to
 * finish, as a user waits for an answer before typing the next message.
 */
import type { EngineFleetHandle } from "../mock/engine-fleet.js";
import type { TraceRecord } from "../mock/trace.js";
import type { RouteDecision, RoutingPolicy } from "./routing-policy.js";

/** The dispatcher wakes this often; at 100 req/s one request is due every 10 ms. */
export const DISPATCH_TICK_MS = 5;
/** Progress lines at most this often. */
export const PROGRESS_INTERVAL_MS = 1_000;
/** Requests still running this long after dispatch stops are abandoned (and counted as failed). */
export const DRAIN_TIMEOUT_MS = 60_000;

export interface RequestSample {
  readonly sessionId: string | undefined;
  readonly worker: number;
  readonly replica: number;
  readonly selectMs: number;
  readonly ttftMs: number;
  readonly promptTokens: number;
  readonly cachedTokens: number;
}

export interface ReplayProgress {
  readonly elapsedMs: number;
  readonly dispatched: number;
  readonly completed: number;
  readonly failed: number;
  readonly inFlight: number;
  readonly hitRatio: number;
  readonly stickiness: number;
}

export interface ReplayOptions {
  readonly records: readonly TraceRecord[];
  readonly policy: RoutingPolicy;
  readonly engines: Pick<EngineFleetHandle, "submit">;
  /** Trace time runs this many times faster than the wall clock. */
  readonly speedup: number;
  /** Wall-clock limit on dispatching (ms); the trace's end stops it earlier. */
  readonly durationMs: number;
  /** Prefix of request ids, so ids are unique across runs against the same replicas. */
  readonly idPrefix: string;
  /** The prompt's token ids (the router hashes them; the engine caches their blocks). */
  readonly tokensOf: (rec: TraceRecord) => Uint32Array;
  /** false: the policy is not told the records' session ids (default true). */
  readonly routeSessionIds?: boolean;
  readonly onProgress?: (p: ReplayProgress) => void;
  /** Abort dispatching early (Ctrl-C in the demo). */
  readonly signal?: AbortSignal;
}

export interface ReplayResult {
  readonly samples: RequestSample[];
  readonly dispatched: number;
  readonly failed: number;
  readonly failureSample: string;
  readonly wallMs: number;
}

/** Share of a session's later turns served where its first turn was, over all sessions. */
export class StickinessCounter {
  readonly #first = new Map<string, number>();
  #later = 0;
  #stayed = 0;

  observe(sessionId: string | undefined, worker: number): void {
    if (sessionId === undefined) return;
    const first = this.#first.get(sessionId);
    if (first === undefined) {
      this.#first.set(sessionId, worker);
      return;
    }
    this.#later++;
    if (first === worker) this.#stayed++;
  }

  /** NaN when no session had a second turn (a trace without session ids). */
  get value(): number {
    return this.#later === 0 ? Number.NaN : this.#stayed / this.#later;
  }
}

export async function replay(opts: ReplayOptions): Promise<ReplayResult> {
  const { records, policy, engines, speedup } = opts;
  const samples: RequestSample[] = [];
  const sticky = new StickinessCounter();
  const sessionTail = new Map<string, Promise<void>>();
  const running = new Set<Promise<void>>();
  let failed = 0;
  let failureSample = "";
  let dispatched = 0;
  let promptTokens = 0;
  let cachedTokens = 0;
  const t0 = performance.now();
  const base = records[0]?.timestamp ?? 0;

  const serve = async (rec: TraceRecord, requestId: string): Promise<void> => {
    let decision: RouteDecision | undefined;
    try {
      const tokens = opts.tokensOf(rec);
      decision = await policy.route({ requestId, tokens, sessionId: opts.routeSessionIds === false ? undefined : rec.session_id });
      const d = decision;
      let prefill: Promise<void> | undefined;
      const outcome = await engines.submit(d.worker, {
        requestId,
        tokens,
        outputTokens: rec.output_length,
        onFirstToken: () => {
          prefill = policy.prefillDone(d);
        },
      });
      await prefill;
      await policy.finished(d);
      samples.push({ sessionId: rec.session_id, worker: d.worker, replica: d.replica, selectMs: d.selectMs, ttftMs: outcome.queueMs + outcome.prefillMs, promptTokens: outcome.promptTokens, cachedTokens: outcome.cachedTokens });
      sticky.observe(rec.session_id, d.worker);
      promptTokens += outcome.promptTokens;
      cachedTokens += outcome.cachedTokens;
    } catch (err) {
      failed++;
      if (failureSample === "") failureSample = err instanceof Error ? err.message : String(err);
      // Release a booking whose request failed at the engine, so the ledger does not drift.
      if (decision !== undefined) await policy.finished(decision).catch(() => undefined);
    }
  };

  const launch = (rec: TraceRecord, index: number): void => {
    const requestId = `${opts.idPrefix}${String(index)}`;
    const prev = rec.session_id === undefined ? undefined : sessionTail.get(rec.session_id);
    const p = (prev === undefined ? serve(rec, requestId) : prev.then(() => serve(rec, requestId))).finally(() => {
      running.delete(p);
      if (rec.session_id !== undefined && sessionTail.get(rec.session_id) === p) sessionTail.delete(rec.session_id);
    });
    running.add(p);
    if (rec.session_id !== undefined) sessionTail.set(rec.session_id, p);
    dispatched++;
  };

  let lastProgress = t0;
  const report = (): void => {
    opts.onProgress?.({
      elapsedMs: performance.now() - t0,
      dispatched,
      completed: samples.length,
      failed,
      inFlight: running.size,
      hitRatio: promptTokens === 0 ? Number.NaN : cachedTokens / promptTokens,
      stickiness: sticky.value,
    });
  };

  let next = 0;
  while (next < records.length && opts.signal?.aborted !== true) {
    const elapsed = performance.now() - t0;
    if (elapsed > opts.durationMs) break;
    while (next < records.length && ((records[next] as TraceRecord).timestamp - base) / speedup <= elapsed) {
      launch(records[next] as TraceRecord, next);
      next++;
    }
    if (performance.now() - lastProgress >= PROGRESS_INTERVAL_MS) {
      lastProgress = performance.now();
      report();
    }
    await sleep(DISPATCH_TICK_MS);
  }
  const drainDeadline = performance.now() + DRAIN_TIMEOUT_MS;
  while (running.size > 0 && performance.now() < drainDeadline) {
    await Promise.race([Promise.all(running), sleep(PROGRESS_INTERVAL_MS)]);
    report();
  }
  failed += running.size;
  if (running.size > 0 && failureSample === "") failureSample = `${String(running.size)} requests still running ${String(DRAIN_TIMEOUT_MS)} ms after dispatch stopped`;
  report();
  return { samples, dispatched, failed, failureSample, wallMs: performance.now() - t0 };
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
