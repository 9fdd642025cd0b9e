import { CommanderError, type Command } from "commander";
import { describe, expect, it } from "vitest";
import { buildCli } from "../../../cli/program.js";
import type { BenchCliConfig, DemoCliConfig } from "../../../src/bench/bench-config.js";

async function run(args: string[]): Promise<{ code: number; err: string; bench?: BenchCliConfig; demo?: DemoCliConfig }> {
  const err: string[] = [];
  const seen: { bench?: BenchCliConfig; demo?: DemoCliConfig } = {};
  const exits: number[] = [];
  const program = buildCli({
    writeOut: () => undefined,
    writeErr: (s) => err.push(s),
    exit: (c) => exits.push(c),
    runBench: (c) => {
      seen.bench = c;
      return Promise.resolve(0);
    },
    runDemo: (c) => {
      seen.demo = c;
      return Promise.resolve(3);
    },
  });
  const all = (c: Command): Command[] => [c, ...c.commands.flatMap(all)];
  for (const c of all(program)) c.exitOverride();
  let code = 0;
  try {
    await program.parseAsync(args, { from: "user" });
    code = exits[0] ?? 0;
  } catch (e) {
    if (!(e instanceof CommanderError)) throw e;
    code = e.exitCode;
  }
  return { code, err: err.join(""), ...seen };
}

describe("kvmesh bench / demo flags", () => {
  it("bench takes a trace or generated sessions, replica counts, policies and outputs", async () => {
    const r = await run(["bench", "--trace", "t.jsonl", "--replicas", "4,1,2,2", "--policies", "kvmesh,random", "--workers", "8", "--speedup", "2.5", "--duration", "5", "--json", "o.json", "--limit", "100"]);
    expect(r.code).toBe(0);
    expect(r.bench).toMatchObject({ workload: { kind: "trace", path: "t.jsonl", limit: 100 }, replicas: [1, 2, 4], policies: ["kvmesh", "random"], workers: 8, speedup: 2.5, durationSecs: 5, jsonPath: "o.json", engineHosts: 1 });
    const s = await run(["bench", "--sessions", "50"]);
    expect(s.bench).toMatchObject({ workload: { kind: "sessions", sessions: 50 }, replicas: [1, 2, 4], policies: ["kvmesh", "unmeshed", "round-robin", "random"], workers: 16, sessionIds: true });
    const hidden = await run(["bench", "--sessions", "50", "--no-session-ids"]);
    expect(hidden.bench).toMatchObject({ sessionIds: false });
    expect(s.bench).toMatchObject({ rate: 1, clientDelayMs: 0, costModel: undefined });
    const setting = await run(["bench", "--sessions", "50", "--rate", "4", "--client-delay-ms", "90", "--cost-model", "ttft"]);
    expect(setting.bench).toMatchObject({ rate: 4, clientDelayMs: 90, costModel: "ttft" });
  });

  it("bench without a workload, or with both, is a usage error naming the flags", async () => {
    const none = await run(["bench"]);
    expect(none.code).not.toBe(0);
    expect(none.err).toMatch(/--trace <file> or --sessions <n>/);
    expect(none.bench).toBeUndefined();
    const both = await run(["bench", "--trace", "t", "--sessions", "3"]);
    expect(both.code).not.toBe(0);
    expect(both.err).toMatch(/--trace.*cannot be used with.*--sessions/);
  });

  it.each([
    [["--replicas", "0"], /--replicas/],
    [["--replicas", "1,x"], /--replicas/],
    [["--policies", "kvmesh,best"], /unknown policy "best"/],
    [["--speedup", "0"], /--speedup.*> 0/],
    [["--duration", "0"], /--duration/],
    [["--workers", "-1"], /--workers/],
    [["--rate", "0"], /--rate.*> 0/],
    [["--client-delay-ms", "-5"], /--client-delay-ms/],
    [["--cost-model", "fast"], /--cost-model.*reference, ttft/],
  ])("bench %j is rejected", async (flags, message) => {
    const r = await run(["bench", "--sessions", "5", ...flags]);
    expect(r.code).not.toBe(0);
    expect(r.err).toMatch(message);
    expect(r.bench).toBeUndefined();
  });

  it("demo has the README's defaults, accepts --duration 0 (until Ctrl-C) and exits with the run's code", async () => {
    const r = await run(["demo"]);
    expect(r.demo).toMatchObject({ replicas: 3, workers: 16, sessions: 300, durationSecs: 60 });
    expect(r.code).toBe(3);
    expect((await run(["demo", "--duration", "0", "--replicas", "2"])).demo).toMatchObject({ durationSecs: 0, replicas: 2 });
  });
});
