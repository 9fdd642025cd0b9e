import { CommanderError } from "commander";
import { describe, expect, it } from "vitest";
import { AggregateBookings } from "../../../scripts/lib/aggregate-bookings.js";
import {
  benchScaleCommand,
  DEFAULT_AGGREGATE_STRESS_RATES,
  DEFAULT_JSON,
  DEFAULT_STRESS_JSON,
  DEFAULT_STRESS_RATES,
  MIN_STRESS_STEP_SECONDS,
  parseBenchScaleArgs,
  scaleServeArgs,
  STRESS_BUDGET_SECONDS,
  STRESS_STEP_OVERHEAD_SECONDS,
  stressStepSeconds,
} from "../../../scripts/lib/bench-scale-args.js";
import { lagQuantiles, meshWindow, parseMeshMetrics } from "../../../scripts/lib/mesh-scrape.js";
import { capacityCurve, idleCpu, marginalCpu, marginalUs, meanMirrorRatio, mirrorRatio, MODEL_REPLICA_COUNTS, modelledCapacity, replicaCpu } from "../../../scripts/lib/scale-model.js";
import { capacitySvg, CLAMPED_NOTE, pointsTable, stressTable, type ReplicaCpu, type ScalePoint, type ScaleReport, type StressStep } from "../../../scripts/lib/scale-report.js";
import { SyntheticBookings } from "../../../scripts/lib/synthetic-bookings.js";
import { bytesDelta, parseSs } from "../../../scripts/lib/tcp-bytes.js";
import { parseStat } from "../../../scripts/lib/thread-cpu.js";

/** A command that throws instead of exiting and prints nothing. */
function quiet(): ReturnType<typeof benchScaleCommand> {
  return benchScaleCommand()
    .exitOverride()
    .configureOutput({ writeErr: () => undefined, writeOut: () => undefined });
}

const parse = (argv: string[]): ReturnType<typeof parseBenchScaleArgs> => parseBenchScaleArgs(argv, "test-build", quiet());

describe("bench:scale capacity model", () => {
  it("is N at ratio 0, 1 at ratio 1, and N / (1 + (N-1) r) between", () => {
    expect(modelledCapacity(16, 0)).toBe(16);
    expect(modelledCapacity(16, 1)).toBe(1);
    expect(modelledCapacity(1, 0.5)).toBe(1);
    // The range: ratios 0.23-0.28 give 2.2-2.4x at 4.
    expect(modelledCapacity(4, 0.23)).toBeCloseTo(4 / 1.69, 10);
    expect(modelledCapacity(4, 0.28)).toBeCloseTo(4 / 1.84, 10);
    // The target: 3% gives at least 3.6x at 4 and 11x at 16.
    expect(modelledCapacity(4, 0.03)).toBeGreaterThanOrEqual(3.6);
    expect(modelledCapacity(16, 0.03)).toBeGreaterThanOrEqual(11);
  });

  it("rejects replica counts below 1 and negative or non-finite ratios", () => {
    expect(() => modelledCapacity(0, 0.1)).toThrow(RangeError);
    expect(() => modelledCapacity(2.5, 0.1)).toThrow(RangeError);
    expect(() => modelledCapacity(4, -0.1)).toThrow(RangeError);
    expect(() => modelledCapacity(4, Number.NaN)).toThrow(RangeError);
  });

  it("draws the curve from N = 1 through 2, 4, 8, 16, and nothing without a ratio", () => {
    const c = capacityCurve(0.25);
    expect(c.map(([n]) => n)).toEqual([1, 2, 4, 8, 16]);
    expect(c[0]).toEqual([1, 1]);
    expect(c[2]?.[1]).toBeCloseTo(4 / 1.75, 10);
    expect(capacityCurve(Number.NaN)).toEqual([]);
    expect(mirrorRatio(100, 400)).toBe(0.25);
    expect(mirrorRatio(100, 0)).toBeNaN();
  });
});

describe("bench:scale fixed and marginal costs", () => {
  it("takes an idle window's CPU as ms per second, per thread set", () => {
    expect(idleCpu({ mainMs: 50, allMs: 80 }, 5_000)).toEqual({ windowMs: 5_000, mainMsPerS: 10, allMsPerS: 16 });
    expect(() => idleCpu({ mainMs: 1, allMs: 1 }, 0)).toThrow(RangeError);
  });

  it("subtracts the idle rate x window from the window's CPU before dividing by the requests", () => {
    // 10 s window, 300 ms of CPU, idle 10 ms/s: 100 ms are the fixed part, 200 ms over 1,000 requests.
    expect(marginalUs(300, 10_000, 10, 1_000)).toEqual({ us: 200, clamped: false });
    // No idle rate: the plain per-request figure.
    expect(marginalUs(300, 10_000, 0, 1_000)).toEqual({ us: 300, clamped: false });
    // Exactly the idle rate: 0, not clamped.
    expect(marginalUs(100, 10_000, 10, 1_000)).toEqual({ us: 0, clamped: false });
    // Below the idle rate: clamped at 0, and said so.
    expect(marginalUs(60, 10_000, 10, 1_000)).toEqual({ us: 0, clamped: true });
    // No requests divides by 1, as the per-request figures do.
    expect(marginalUs(150, 10_000, 10, 0)).toEqual({ us: 50_000, clamped: false });
  });

  it("gives marginal main and all-thread figures beside the per-request ones, only with an idle window", () => {
    const idle = idleCpu({ mainMs: 40, allMs: 60 }, 5_000); // 8 and 12 ms/s
    const delta = { mainMs: 500, allMs: 100, byName: { node: 500 } };
    expect(marginalCpu(delta, 2_000, 10_000, idle)).toEqual({ mainUs: 210, allUs: 0, mainClamped: false, allClamped: true });
    const withIdle = replicaCpu(delta, 2_000, 10_000, idle);
    expect(withIdle.mainUs).toBe(250);
    expect(withIdle.allUs).toBe(50);
    expect(withIdle.mainCores).toBe(0.05);
    expect(withIdle.idle).toBe(idle);
    expect(withIdle.marginal).toEqual({ mainUs: 210, allUs: 0, mainClamped: false, allClamped: true });
    const without = replicaCpu(delta, 2_000, 10_000, null);
    expect(without).toEqual({ mainUs: 250, allUs: 50, mainCores: 0.05, byThreadMs: { node: 500 } });
    expect("marginal" in without).toBe(false);
  });

  it("averages peer/origin ratios over peers, null without peers or an origin cost", () => {
    expect(meanMirrorRatio([100, 300], 400)).toBe(0.5);
    expect(meanMirrorRatio([], 400)).toBeNull();
    expect(meanMirrorRatio([100], 0)).toBeNull();
  });

  it("models saturated replicas from marginal costs: the fixed rate cancels, unlike in the per-request ratio", () => {
    // Every replica's main thread: a fixed 10 ms/s, 1,000 us per routed request, 50 us per mirrored one.
    const fixed = 10;
    const origin = 1_000;
    const peer = 50;
    const window = (rate: number, costUs: number): number => fixed * 10 + (rate * 10 * costUs) / 1000; // ms of CPU in a 10 s window
    const idle = idleCpu({ mainMs: fixed * 5, allMs: fixed * 5 }, 5_000);
    const ratios = [100, 200].map((rate) => {
      const o = marginalUs(window(rate, origin), 10_000, idle.mainMsPerS, rate * 10);
      const p = marginalUs(window(rate, peer), 10_000, idle.mainMsPerS, rate * 10);
      const perRequest = mirrorRatio(window(rate, peer) / (rate * 10), window(rate, origin) / (rate * 10));
      return { perRequest, marginal: meanMirrorRatio([p.us], o.us) };
    });
    // The per-request ratio carries the fixed part, more at the lower rate; the marginal one is peer / origin at both.
    expect(ratios[0]?.perRequest).toBeCloseTo((10 + 5) / (10 + 100), 10);
    expect(ratios[1]?.perRequest).toBeCloseTo((10 + 10) / (10 + 200), 10);
    for (const r of ratios) expect(r.marginal).toBeCloseTo(peer / origin, 10);
    // At saturation (1,000 ms/s busy): one replica routes r1 = (1000 - f) / origin; N replicas each
    // route r with f + r origin + (N-1) r peer = 1000. N r / r1 is the marginal model.
    const r1 = ((1000 - fixed) * 1000) / origin;
    for (const n of MODEL_REPLICA_COUNTS) {
      const r = ((1000 - fixed) * 1000) / (origin + (n - 1) * peer);
      expect(modelledCapacity(n, ratios[0]?.marginal ?? Number.NaN)).toBeCloseTo((n * r) / r1, 10);
      // The per-request ratio at 100/s understates it.
      expect(modelledCapacity(n, ratios[0]?.perRequest ?? Number.NaN)).toBeLessThan((n * r) / r1);
    }
  });
});

const cpuFixture = (mainUs: number, allUs: number, marginal?: ReplicaCpu["marginal"]): ReplicaCpu => ({
  mainUs,
  allUs,
  mainCores: 0.1,
  byThreadMs: {},
  ...(marginal === undefined ? {} : { idle: { windowMs: 5_000, mainMsPerS: 9.5, allMsPerS: 14.25 }, marginal }),
});

function pointFixture(over: Partial<ScalePoint>): ScalePoint {
  return {
    rate: 100,
    peers: 1,
    routed: 1_000,
    achievedRatePerS: 100,
    windowMs: 10_500,
    errors: 0,
    errorSample: "",
    droppedTicks: 0,
    origin: cpuFixture(2_000, 2_500),
    peerCpu: [cpuFixture(200, 300)],
    ratio: 0.1,
    capacity: [],
    meshBytes: { originSentPerRequest: 100, perPeerPerRequest: 100, allPerRequest: 200, connectionsOpened: 0, connectionsClosed: 0 },
    lag: { samples: 10, p50Ms: 1, p99Ms: 2 },
    shed: 0,
    shedTotal: 0,
    gaps: 0,
    snapshotsInstalled: 0,
    divergenceResyncs: 0,
    batchesSent: 10,
    eventsSent: 10,
    loadGeneratorCpuMs: 100,
    machineLoad1m: 1,
    ...over,
  };
}

const reportFixture = (points: ScalePoint[], label = "now"): ScaleReport => ({ tool: "bench:scale", label, measuredAt: "", config: {}, method: [], points, stress: null });

describe("bench:scale report with marginal costs", () => {
  const marginal = pointFixture({
    origin: cpuFixture(2_000, 2_500, { mainUs: 1_900, allUs: 2_350, mainClamped: false, allClamped: false }),
    peerCpu: [cpuFixture(200, 300, { mainUs: 95, allUs: 0, mainClamped: false, allClamped: true })],
    marginalRatio: 0.05,
  });
  const old = pointFixture({});

  it("keeps the per-request rows and adds idle, marginal and second-model rows, marking clamped figures", () => {
    const t = pointsTable([reportFixture([marginal])]);
    const row = (name: string): string => (t.split("\n").find((l) => l.startsWith(`${name}  `)) ?? "").slice(name.length).trim();
    expect(row("peer main us/req (each)")).toBe("200");
    expect(row("ratio peer/origin main")).toBe("0.100");
    expect(row("modelled capacity N=4")).toBe(`${(4 / 1.3).toFixed(2)}x`);
    expect(row("origin idle main ms/s")).toBe("9.5");
    expect(row("peer idle all ms/s")).toBe("14.3");
    expect(row("origin marginal main us/req")).toBe("1900");
    expect(row("peer marginal main us/req (each)")).toBe("95");
    expect(row("peer marginal all us/req")).toBe("0*");
    expect(row("marginal ratio peer/origin main")).toBe("0.050");
    expect(row("marginal capacity N=16 (saturated)")).toBe(`${(16 / 1.75).toFixed(2)}x`);
    expect(t).toContain(CLAMPED_NOTE);
  });

  it("prints - for points without an idle window (older reports, --idle-seconds 0) and no clamp note", () => {
    const t = pointsTable([reportFixture([old])]);
    expect(t).toMatch(/peer marginal main us\/req \(each\)\s+-\n/);
    expect(t).toMatch(/marginal capacity N=2 \(saturated\)\s+-\n/);
    expect(t).not.toContain(CLAMPED_NOTE);
  });

  it("plots both models per point in one colour, the marginal one dashed, and names both in the legend", () => {
    const svg = capacitySvg([reportFixture([old], "before"), reportFixture([marginal])]);
    expect(svg).toContain("before 100/s K=1 per req");
    expect(svg).not.toContain("before 100/s K=1 marginal");
    expect(svg).toContain("now 100/s K=1 per req");
    expect(svg).toContain("now 100/s K=1 marginal");
    expect(svg.match(/<path [^>]*stroke-dasharray/g)).toHaveLength(1);
    expect(svg.match(/<path /g)).toHaveLength(4);
  });

  it("reports the stress peer's idle rates and marginal figures per step", () => {
    const step: StressStep = {
      rate: 1_000,
      attempt: 1,
      requests: 5_000,
      windowMs: 5_000,
      lag: { samples: 10, p50Ms: 1, p99Ms: 2 },
      peerReservoirP99Ms: 2,
      gaps: 0,
      snapshotsInstalled: 0,
      divergenceResyncs: 0,
      shed: 0,
      caughtUp: true,
      catchUpMs: 1,
      peer: cpuFixture(60, 80, { mainUs: 50, allUs: 0, mainClamped: false, allClamped: true }),
      generator: { cores: 0.1, maxTickGapMs: 3, maxPendingPublishes: 0 },
      batches: 500,
      events: 500,
      machineLoad1m: 1,
      keptUp: true,
      why: "",
    };
    const t = stressTable([{ ...reportFixture([]), stress: { lagTargetMs: 20, idle: { windowMs: 5_000, mainMsPerS: 9.5, allMsPerS: 14.25 }, steps: [step], maxRate: 1_000, atMax: step } }]);
    expect(t).toContain("peer idle before the steps (5.0 s, no traffic): main thread 9.5 ms/s, all threads 14.3 ms/s");
    expect(t).toMatch(/marg main us\s+marg all us/);
    expect(t).toMatch(/ 60 +80 +50 +0\* /);
    expect(t).toContain(CLAMPED_NOTE);
  });
});

describe("bench:scale arguments", () => {
  it("defaults to rates 100,200, peers 0,1,3, 1,024 workers and the HTTP report files", () => {
    const c = parse([]);
    expect(c.rates).toEqual([100, 200]);
    expect(c.peerCounts).toEqual([0, 1, 3]);
    expect(c.workers).toBe(1024);
    expect(c.seconds).toBe(10);
    expect(c.warmupSeconds).toBe(2);
    expect(c.idleSeconds).toBe(5);
    expect(c.json).toBe(DEFAULT_JSON);
    expect(c.svg).toBe("reports/bench-scale.svg");
    expect(c.label).toBe("test-build aggregate");
    expect(c.compare).toEqual([]);
    expect(c.stress).toBe(false);
    expect(c.loadReplication).toBe("aggregate");
    expect(c.meshAggregateIntervalMs).toBeUndefined();
    expect(c.stressRates).toEqual(DEFAULT_AGGREGATE_STRESS_RATES);
    expect(c.stressRates[c.stressRates.length - 1]).toBe(100_000);
    expect(c.stressRetries).toBe(1);
    expect(c.lagTargetMs).toBe(20);
    expect(c.curve).toBe(false);
  });

  it("reads --curve and names the default label after it", () => {
    const c = parse(["--curve"]);
    expect(c.curve).toBe(true);
    expect(c.label).toBe("test-build aggregate curve");
    expect(parse(["--curve", "--label", "k8s"]).label).toBe("k8s");
  });

  it("reads lists sorted and deduplicated, and every flag", () => {
    const c = parse(["--rate", "200,100,200", "--peers", "3,0", "--seconds", "2.5", "--warmup", "0", "--workers", "64", "--json", "/tmp/x.json", "--svg", "/tmp/x.svg", "--label", "before", "--compare", "old.json,older.json"]);
    expect(c.rates).toEqual([100, 200]);
    expect(c.peerCounts).toEqual([0, 3]);
    expect(c.seconds).toBe(2.5);
    expect(c.warmupSeconds).toBe(0);
    expect(c.workers).toBe(64);
    expect(parse(["--idle-seconds", "0"]).idleSeconds).toBe(0);
    expect(parse(["--idle-seconds", "2.5"]).idleSeconds).toBe(2.5);
    expect(c.json).toBe("/tmp/x.json");
    expect(c.svg).toBe("/tmp/x.svg");
    expect(c.label).toBe("before");
    expect(c.compare).toEqual(["old.json", "older.json"]);
  });

  it("writes stress results to their own file unless --json is given", () => {
    const c = parse(["--stress", "--stress-rates", "1000,5000", "--stress-seconds", "3", "--stress-retries", "0", "--lag-target-ms", "10"]);
    expect(c.stress).toBe(true);
    expect(c.json).toBe(DEFAULT_STRESS_JSON);
    expect(c.stressRates).toEqual([1000, 5000]);
    expect(c.stressSeconds).toBe(3);
    expect(c.stressRetries).toBe(0);
    expect(c.lagTargetMs).toBe(10);
    expect(parse(["--stress", "--json", "s.json"]).json).toBe("s.json");
  });

  it("reads the load replication mode and aggregation interval, names the default label after the mode, and passes both to every serve", () => {
    const e = parse(["--load-replication", "exact"]);
    expect(e.loadReplication).toBe("exact");
    expect(e.label).toBe("test-build exact");
    expect(e.stressRates).toEqual(DEFAULT_STRESS_RATES);
    expect(scaleServeArgs(e, ["--no-kv-events"])).toEqual(["--no-kv-events", "--load-replication", "exact"]);
    const a = parse(["--load-replication", "aggregate", "--mesh-aggregate-interval-ms", "25", "--label", "mine"]);
    expect(a.loadReplication).toBe("aggregate");
    expect(a.meshAggregateIntervalMs).toBe(25);
    expect(a.label).toBe("mine");
    expect(scaleServeArgs(a)).toEqual(["--load-replication", "aggregate", "--mesh-aggregate-interval-ms", "25"]);
    expect(parse(["--mesh-aggregate-interval-ms", "0"]).meshAggregateIntervalMs).toBe(0);
    // An explicit --stress-rates wins over either mode's default.
    expect(parse(["--load-replication", "exact", "--stress-rates", "900"]).stressRates).toEqual([900]);
  });

  it("cuts each stress step so all of them fit the budget, never below the minimum", () => {
    expect(stressStepSeconds(3, 5)).toBe(5);
    expect(stressStepSeconds(DEFAULT_STRESS_RATES.length, 5)).toBe(5);
    const cut = stressStepSeconds(DEFAULT_AGGREGATE_STRESS_RATES.length, 5);
    expect(cut).toBeLessThan(5);
    expect(DEFAULT_AGGREGATE_STRESS_RATES.length * (cut + STRESS_STEP_OVERHEAD_SECONDS)).toBeLessThanOrEqual(STRESS_BUDGET_SECONDS);
    expect(stressStepSeconds(1_000, 5)).toBe(MIN_STRESS_STEP_SECONDS);
    expect(parse(["--stress", "--stress-seconds", "3"]).stressStepSeconds).toBe(3);
    expect(parse(["--stress"]).stressStepSeconds).toBe(cut);
  });

  it.each([
    [["--load-replication", "both"]],
    [["--mesh-aggregate-interval-ms", "-1"]],
    [["--mesh-aggregate-interval-ms", "1001"]],
    [["--mesh-aggregate-interval-ms", "2.5"]],
    [["--rate", "0"]],
    [["--rate", "100,"]],
    [["--rate", "fast"]],
    [["--peers", "-1"]],
    [["--peers", "16"]],
    [["--seconds", "0"]],
    [["--warmup", "-1"]],
    [["--idle-seconds", "-1"]],
    [["--idle-seconds", "soon"]],
    [["--workers", "0"]],
    [["--label", " "]],
    [["--lag-target-ms", "0"]],
    [["--no-such-flag"]],
  ])("rejects %j", (argv) => {
    expect(() => parse(argv)).toThrow(CommanderError);
  });

  it("answers --help with every flag", () => {
    const help = quiet().helpInformation();
    for (const flag of ["--rate", "--peers", "--seconds", "--warmup", "--idle-seconds", "--workers", "--json", "--svg", "--label", "--compare", "--stress", "--stress-rates", "--stress-seconds", "--lag-target-ms", "--load-replication", "--mesh-aggregate-interval-ms"]) {
      expect(help).toContain(flag);
    }
  });
});

describe("bench:scale measurement helpers", () => {
  it("reads per-connection payload bytes from ss -tinH and takes deltas per local port", () => {
    const ss = (sent: number, recv: number, peerPort: number): string =>
      `0      0      127.0.0.1:7100 127.0.0.1:${peerPort}\n\t cubic wscale:7,7 rto:204 bytes_sent:${sent} bytes_acked:${sent} bytes_received:${recv} segs_out:3\n`;
    const before = parseSs(ss(1000, 10, 50001) + ss(500, 5, 50002));
    expect(before).toEqual([
      { key: "127.0.0.1:7100 -> 127.0.0.1:50001", localPort: 7100, sent: 1000, received: 10 },
      { key: "127.0.0.1:7100 -> 127.0.0.1:50002", localPort: 7100, sent: 500, received: 5 },
    ]);
    const after = parseSs(ss(3000, 20, 50001) + ss(700, 7, 50003));
    const d = bytesDelta(before, after);
    expect(d.byPort.get(7100)).toEqual({ sent: 2000 + 700, received: 10 + 7 });
    expect(d.opened).toBe(1);
    expect(d.closed).toBe(1);
  });

  it("reads a thread's name and CPU ms from a stat line whose name holds spaces and parentheses", () => {
    const t = parseStat("4242 (ZMQbg/IO (0)) S 1 4242 4242 0 -1 4194368 10 0 0 0 150 50 0 0 20 0 9 0");
    expect(t.name).toBe("ZMQbg/IO (0)");
    expect(t.ms).toBeGreaterThan(0);
  });

  it("takes lag quantiles from the window's histogram delta", () => {
    const metrics = (le1: number, le5: number, inf: number, shed: number): string =>
      [
        `kvmesh_mesh_events_shed_total ${shed}`,
        `kvmesh_mesh_gaps_total{origin="1"} 0`,
        `kvmesh_mesh_replication_lag_seconds_bucket{le="0.001"} ${le1}`,
        `kvmesh_mesh_replication_lag_seconds_bucket{le="0.005"} ${le5}`,
        `kvmesh_mesh_replication_lag_seconds_bucket{le="+Inf"} ${inf}`,
      ].join("\n");
    const w = meshWindow(parseMeshMetrics(metrics(100, 100, 100, 2)), parseMeshMetrics(metrics(200, 300, 300, 5)));
    expect(w.counters.shed).toBe(3);
    const q = lagQuantiles([w]);
    expect(q.samples).toBe(200);
    expect(q.p50Ms).toBe(1);
    expect(q.p99Ms).toBeCloseTo(1 + (4 * 98) / 100, 10);
  });

  it("books, marks and frees synthetic requests in time order, and snapshots what is live", () => {
    const b = new SyntheticBookings({ origin: 7n, workers: 3, blockSize: 64, promptTokens: 14_000, prompts: [new Uint32Array([1, 2])], prefillDelayMs: 50, holdMs: 500 });
    const adds = b.step(0, 4);
    expect(adds.map((e) => (e.kind === "load" && e.event.type === "add" ? e.event.worker_id : null))).toEqual([1n, 2n, 3n, 1n]);
    expect(b.live).toBe(4);
    expect(b.step(49, 0)).toEqual([]);
    const marks = b.step(50, 1);
    expect(marks.map((e) => (e.kind === "load" ? e.event.type : e.kind))).toEqual(["prefill_complete", "prefill_complete", "prefill_complete", "prefill_complete", "add"]);
    expect(b.snapshotBookings().map((s) => s.prefillDone)).toEqual([true, true, true, true, false]);
    const frees = b.step(500, 0);
    expect(frees.map((e) => (e.kind === "load" ? `${e.event.type}:${e.event.request_id}` : ""))).toEqual(["prefill_complete:r4", "free:r0", "free:r1", "free:r2", "free:r3"]);
    expect(b.live).toBe(1);
    expect(b.issued).toBe(5);
  });

  it("keeps aggregate totals of synthetic bookings as a replica would: changed ranks, ids booked and ended, published requests", () => {
    // Two prompts that share their first hash, used as p0, p1, p1; request k goes to worker (k mod 2) + 1.
    const p0 = new Uint32Array([0, 1, 0, 2, 0, 3]);
    const p1 = new Uint32Array([0, 1, 0, 9]);
    const b = new AggregateBookings({ origin: 7n, workers: 2, blockSize: 64, promptTokens: 1_000, prompts: [p0, p1, p1], prefillDelayMs: 50, holdMs: 500 });
    expect(b.take()).toEqual([]);
    expect(b.snapshot()).toEqual([]);

    // t=0: r0 -> w1 p0, r1 -> w2 p1, r2 -> w1 p1 (shares hash (0,1) with p0 on w1).
    expect(b.step(0, 3)).toBe(true);
    expect(b.live).toBe(3);
    expect(b.publishedRequests).toBe(0);
    const t0 = b.take();
    expect(t0).toHaveLength(1);
    const e0 = t0[0];
    expect(e0?.partition).toEqual({ model_name: "default", routing_group: "default" });
    expect(e0?.block_size).toBe(64);
    expect(e0?.rows).toEqual([
      { worker_id: 1n, dp_rank: 0, prefill_tokens: 2_000, blocks: 4, requests: 2 },
      { worker_id: 2n, dp_rank: 0, prefill_tokens: 1_000, blocks: 2, requests: 1 },
    ]);
    expect(e0?.added).toEqual([
      { id: "r0", worker_id: 1n, dp_rank: 0 },
      { id: "r1", worker_id: 2n, dp_rank: 0 },
      { id: "r2", worker_id: 1n, dp_rank: 0 },
    ]);
    expect(e0?.removed).toEqual([]);
    expect(b.publishedRequests).toBe(3);
    // Nothing changed since: nothing to publish.
    expect(b.step(10, 0)).toBe(false);
    expect(b.take()).toEqual([]);

    // t=50: prefills of r0..r2 complete; r3 -> w2 p0 booked.
    expect(b.step(50, 1)).toBe(true);
    const t50 = b.take()[0];
    expect(t50?.rows).toEqual([
      { worker_id: 1n, dp_rank: 0, prefill_tokens: 0, blocks: 4, requests: 2 },
      { worker_id: 2n, dp_rank: 0, prefill_tokens: 1_000, blocks: 4, requests: 2 },
    ]);
    expect(t50?.added.map((a) => a.id)).toEqual(["r3"]);
    expect(b.publishedRequests).toBe(4);

    // t=500: r3's prefill completes, r0..r2 are freed; r4 -> w1 p1 is booked and, before any take, ...
    b.step(500, 1);
    // ... freed at t=1000 together with r3: r4 is in neither added nor removed.
    expect(b.publishedRequests).toBe(4);
    b.step(1_000, 0);
    expect(b.live).toBe(0);
    const t1000 = b.take()[0];
    // Rows in the order the ranks first changed since the last take: r3's prefill (w2) came due first.
    expect(t1000?.rows).toEqual([
      { worker_id: 2n, dp_rank: 0, prefill_tokens: 0, blocks: 0, requests: 0 },
      { worker_id: 1n, dp_rank: 0, prefill_tokens: 0, blocks: 0, requests: 0 },
    ]);
    expect(t1000?.added).toEqual([]);
    expect([...(t1000?.removed ?? [])].sort()).toEqual(["r0", "r1", "r2", "r3"]);
    expect(b.publishedRequests).toBe(0);
    expect(b.issued).toBe(5);
  });

  it("snapshots every rank with load and every live id, whatever was taken", () => {
    const p0 = new Uint32Array([0, 1, 0, 2]);
    const b = new AggregateBookings({ origin: 7n, workers: 3, blockSize: 16, promptTokens: 500, prompts: [p0], prefillDelayMs: 50, holdMs: 500 });
    b.step(0, 2);
    b.take();
    b.step(50, 1);
    expect(b.publishedRequests).toBe(2);
    const [snap] = b.snapshot();
    expect(snap?.rows).toEqual([
      { worker_id: 1n, dp_rank: 0, prefill_tokens: 0, blocks: 2, requests: 1 },
      { worker_id: 2n, dp_rank: 0, prefill_tokens: 0, blocks: 2, requests: 1 },
      { worker_id: 3n, dp_rank: 0, prefill_tokens: 500, blocks: 2, requests: 1 },
    ]);
    expect(snap?.added.map((a) => a.id)).toEqual(["r0", "r1", "r2"]);
    expect(snap?.removed).toEqual([]);
    // A snapshot publishes nothing: the next take still carries r2 and w3.
    const [next] = b.take();
    expect(next?.added.map((a) => a.id)).toEqual(["r2"]);
    expect(next?.rows.map((r) => r.worker_id)).toEqual([1n, 2n, 3n]);
    expect(b.publishedRequests).toBe(3);
  });
});
