import { describe, expect, it } from "vitest";
import type { EngineRequest, EngineResult } from "../../../src/mock/mock-engine.js";
import type { TraceRecord } from "../../../src/mock/trace.js";
import { replay, StickinessCounter } from "../../../src/bench/replay-run.js";
import type { RouteDecision, RouteRequest, RoutingPolicy } from "../../../src/bench/routing-policy.js";

const rec = (timestamp: number, session?: string, hashIds: number[] = [1]): TraceRecord => ({
  timestamp,
  input_length: hashIds.length * 8,
  output_length: 1,
  hash_ids: hashIds,
  ...(session === undefined ? {} : { session_id: session }),
});

/** A policy that records every call and picks worker = number of the request modulo `workers`. */
class RecordingPolicy implements RoutingPolicy {
  readonly routed: string[] = [];
  readonly prefilled: string[] = [];
  readonly finishedIds: string[] = [];
  failOn?: string;
  constructor(readonly workers: number) {}
  route(req: RouteRequest): Promise<RouteDecision> {
    this.routed.push(req.requestId);
    if (req.requestId === this.failOn) return Promise.reject(new Error(`no worker for ${req.requestId}`));
    const n = Number(req.requestId.split("-").pop());
    return Promise.resolve({ worker: n % this.workers, replica: 0, selectionId: req.requestId, selectMs: 1 });
  }
  prefillDone(d: RouteDecision): Promise<void> {
    this.prefilled.push(d.selectionId ?? "");
    return Promise.resolve();
  }
  finished(d: RouteDecision): Promise<void> {
    this.finishedIds.push(d.selectionId ?? "");
    return Promise.resolve();
  }
}

/** An engine that answers after `delayMs`, half the prompt cached; it can fail chosen requests. */
function fakeEngines(delayMs: number, failIds: ReadonlySet<string> = new Set()) {
  const log: { id: string; start: number; end: number }[] = [];
  return {
    log,
    submit: async (_worker: number, req: EngineRequest): Promise<EngineResult> => {
      const start = performance.now();
      req.onFirstToken?.();
      await new Promise((r) => setTimeout(r, delayMs));
      log.push({ id: req.requestId, start, end: performance.now() });
      if (failIds.has(req.requestId)) throw new Error(`engine failed ${req.requestId}`);
      const p = req.tokens.length;
      return { requestId: req.requestId, promptTokens: p, cachedTokens: p / 2, outputTokens: 1, queueMs: 2, prefillMs: 3, ttftMs: 5, totalMs: 6 };
    },
  };
}

const tokensOf = (r: TraceRecord): Uint32Array => new Uint32Array(r.input_length);

describe("replay", () => {
  it("runs every record, books and releases each, and measures the engines' hit ratio", async () => {
    const policy = new RecordingPolicy(2);
    const engines = fakeEngines(1);
    const res = await replay({ records: [rec(0), rec(1), rec(2)], policy, engines, speedup: 1, durationMs: 5_000, idPrefix: "t-", tokensOf });
    expect(res.dispatched).toBe(3);
    expect(res.failed).toBe(0);
    expect(res.samples).toHaveLength(3);
    expect(policy.prefilled.sort()).toEqual(["t-0", "t-1", "t-2"]);
    expect(policy.finishedIds.sort()).toEqual(["t-0", "t-1", "t-2"]);
    expect(res.samples.every((s) => s.ttftMs === 5 && s.cachedTokens * 2 === s.promptTokens)).toBe(true);
  });

  it("starts a session's turn only after its previous turn finished", async () => {
    const policy = new RecordingPolicy(4);
    const engines = fakeEngines(30);
    // Both turns are due at once; the second must still wait for the first's answer.
    await replay({ records: [rec(0, "s"), rec(0, "s"), rec(0, "other")], policy, engines, speedup: 1, durationMs: 5_000, idPrefix: "t-", tokensOf });
    const at = (id: string): { start: number; end: number } => {
      const l = engines.log.find((e) => e.id === id);
      if (l === undefined) throw new Error(`${id} never reached the engine`);
      return l;
    };
    expect(at("t-1").start).toBeGreaterThanOrEqual(at("t-0").end);
    // Another session is not held back.
    expect(at("t-2").start).toBeLessThan(at("t-0").end);
  });

  it("hides session ids from the policy when asked, still chaining turns and measuring stickiness", async () => {
    const seen: (string | undefined)[] = [];
    const policy = new RecordingPolicy(1);
    const spy: RoutingPolicy = {
      route: (req) => {
        seen.push(req.sessionId);
        return policy.route(req);
      },
      prefillDone: (d) => policy.prefillDone(d),
      finished: (d) => policy.finished(d),
    };
    const engines = fakeEngines(20);
    const records = [rec(0, "s"), rec(0, "s")];
    const hidden = await replay({ records, policy: spy, engines, speedup: 1, durationMs: 5_000, idPrefix: "h-", tokensOf, routeSessionIds: false });
    expect(seen).toEqual([undefined, undefined]);
    expect(hidden.samples.map((x) => x.sessionId)).toEqual(["s", "s"]);
    const turn = (id: string): { start: number; end: number } => engines.log.find((e) => e.id === id) ?? { start: Number.NaN, end: Number.NaN };
    expect(turn("h-1").start).toBeGreaterThanOrEqual(turn("h-0").end);
    seen.length = 0;
    await replay({ records, policy: spy, engines, speedup: 1, durationMs: 5_000, idPrefix: "v-", tokensOf });
    expect(seen).toEqual(["s", "s"]);
  });

  it("stops dispatching at the duration, and speedup compresses trace time", async () => {
    const policy = new RecordingPolicy(1);
    const records = [rec(0), rec(2_000), rec(1_000_000)];
    const engines = fakeEngines(1);
    // 2,000 ms of trace time is 200 ms at speedup 10, inside the 1.5 s duration (at speedup 1 it
    // would be past it); the third record is due at 100 s, far past it: the replay returns at the
    // duration instead of waiting for it (waiting would run into the test's timeout).
    const res = await replay({ records, policy, engines, speedup: 10, durationMs: 1_500, idPrefix: "t-", tokensOf });
    expect(res.dispatched).toBe(2);
    expect(engines.log.map((l) => l.id).sort()).toEqual(["t-0", "t-1"]);
    expect(res.failed).toBe(0);
  });

  it("counts failures with a sample, and releases the booking of a request its engine failed", async () => {
    const policy = new RecordingPolicy(2);
    policy.failOn = "t-0";
    const res = await replay({ records: [rec(0), rec(0)], policy, engines: fakeEngines(1, new Set(["t-1"])), speedup: 1, durationMs: 2_000, idPrefix: "t-", tokensOf });
    expect(res.failed).toBe(2);
    expect(res.samples).toHaveLength(0);
    expect(res.failureSample).toMatch(/no worker for t-0|engine failed t-1/);
    // t-0 was never booked; t-1 was booked and must be released.
    expect(policy.finishedIds).toEqual(["t-1"]);
  });

  it("an aborted signal stops dispatching", async () => {
    const ctrl = new AbortController();
    ctrl.abort();
    const res = await replay({ records: [rec(0), rec(1)], policy: new RecordingPolicy(1), engines: fakeEngines(1), speedup: 1, durationMs: 5_000, idPrefix: "t-", tokensOf, signal: ctrl.signal });
    expect(res.dispatched).toBe(0);
  });
});

describe("StickinessCounter", () => {
  it("is the share of later turns served where the session's first turn was", () => {
    const s = new StickinessCounter();
    expect(Number.isNaN(s.value)).toBe(true);
    s.observe("a", 1);
    s.observe("a", 1);
    s.observe("a", 2);
    s.observe("b", 3);
    s.observe("b", 3);
    s.observe(undefined, 9);
    expect(s.value).toBeCloseTo(2 / 3, 10);
  });
});
