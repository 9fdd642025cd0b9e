import { CommanderError } from "commander";
import { describe, expect, it } from "vitest";
import { benchScaleCommand, DEFAULT_JSON, DEFAULT_STRESS_JSON, DEFAULT_STRESS_RATES, parseBenchScaleArgs } from "../../scripts/lib/bench-scale-args.js";
import { lagQuantiles, meshWindow, parseMeshMetrics } from "../../scripts/lib/mesh-scrape.js";
import { capacityCurve, mirrorRatio, modelledCapacity } from "../../scripts/lib/scale-model.js";
import { SyntheticBookings } from "../../scripts/lib/synthetic-bookings.js";
import { bytesDelta, parseSs } from "../../scripts/lib/tcp-bytes.js";
import { parseStat } from "../../scripts/lib/thread-cpu.js";

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

describe("bench:scale arguments", () => {
  it("defaults to rates 100,200, peers 0,1,3, 1,024 workers and the HTTP report files", () => {
    const c = parse([]);
    expect(c.rates).toEqual([100, 200]);
    expect(c.peerCounts).toEqual([0, 1, 3]);
    expect(c.workers).toBe(1024);
    expect(c.seconds).toBe(10);
    expect(c.warmupSeconds).toBe(2);
    expect(c.json).toBe(DEFAULT_JSON);
    expect(c.svg).toBe("reports/bench-scale.svg");
    expect(c.label).toBe("test-build");
    expect(c.compare).toBeUndefined();
    expect(c.stress).toBe(false);
    expect(c.stressRates).toEqual(DEFAULT_STRESS_RATES);
    expect(c.stressRetries).toBe(1);
    expect(c.lagTargetMs).toBe(20);
  });

  it("reads lists sorted and deduplicated, and every flag", () => {
    const c = parse(["--rate", "200,100,200", "--peers", "3,0", "--seconds", "2.5", "--warmup", "0", "--workers", "64", "--json", "/tmp/x.json", "--svg", "/tmp/x.svg", "--label", "before", "--compare", "old.json"]);
    expect(c.rates).toEqual([100, 200]);
    expect(c.peerCounts).toEqual([0, 3]);
    expect(c.seconds).toBe(2.5);
    expect(c.warmupSeconds).toBe(0);
    expect(c.workers).toBe(64);
    expect(c.json).toBe("/tmp/x.json");
    expect(c.svg).toBe("/tmp/x.svg");
    expect(c.label).toBe("before");
    expect(c.compare).toBe("old.json");
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

  it.each([
    [["--rate", "0"]],
    [["--rate", "100,"]],
    [["--rate", "fast"]],
    [["--peers", "-1"]],
    [["--peers", "16"]],
    [["--seconds", "0"]],
    [["--warmup", "-1"]],
    [["--workers", "0"]],
    [["--label", " "]],
    [["--lag-target-ms", "0"]],
    [["--no-such-flag"]],
  ])("rejects %j", (argv) => {
    expect(() => parse(argv)).toThrow(CommanderError);
  });

  it("answers --help with every flag", () => {
    const help = quiet().helpInformation();
    for (const flag of ["--rate", "--peers", "--seconds", "--warmup", "--workers", "--json", "--svg", "--label", "--compare", "--stress", "--stress-rates", "--stress-seconds", "--lag-target-ms"]) expect(help).toContain(flag);
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
});
