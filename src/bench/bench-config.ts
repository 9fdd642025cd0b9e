/** What `kvmesh bench` and `kvmesh demo` run with, and their defaults. */
import type { CostModel } from "../core/index.js";
import type { PolicyName } from "./routing-policy.js";

export interface EngineFleetConfig {
  readonly workers: number;
  /** Trace time runs this many times faster; engine timings are divided by it too. */
  readonly speedup: number;
  readonly durationSecs: number;
  readonly blockSize: number;
  readonly kvBlocks: number;
  readonly seed: number;
  readonly engineHosts: number;
}

export type WorkloadSpec = { readonly kind: "trace"; readonly path: string; readonly limit?: number | undefined } | { readonly kind: "sessions"; readonly sessions: number };

export interface BenchCliConfig extends EngineFleetConfig {
  readonly workload: WorkloadSpec;
  readonly replicas: readonly number[];
  readonly policies: readonly PolicyName[];
  /**
   * Send session ids to the router (default). false: the router sees none, as behind a frontend
   * that has no conversation ids; a session's turns still wait for the previous answer, and
   * stickiness is still measured.
   */
  readonly sessionIds?: boolean;
  /**
   * Routers subscribe to the engines' KV events (default). false: they run `--no-kv-events` and
   * the engines are registered without KV endpoints, as engines that publish none (the router's
   * approximate cache from its own decisions, src/core/predicted-cache.ts).
   */
  readonly kvEvents?: boolean;
  readonly jsonPath?: string | undefined;
  readonly svgPath: string;
  /** Arrivals come this many times faster in trace time (timestamps / rate), engines unchanged: load x rate. Default 1. */
  readonly rate?: number;
  /** Wall ms the client adds to each router call (select, prefill_complete, free). Default 0. */
  readonly clientDelayMs?: number;
  /** The replicas' --cost-model; undefined: the daemon's default. */
  readonly costModel?: CostModel | undefined;
}

export interface DemoCliConfig extends EngineFleetConfig {
  readonly replicas: number;
  readonly sessions: number;
}

/**
 * 16,384 blocks x 64 tokens = 1M cached tokens per engine (an 80 GB GPU serving a 70B model
 * holds about that); 16 engines hold 16.8M of the Mooncake trace's 22M distinct prompt tokens,
 * so eviction and placement both matter, as in a real fleet. The trace's longest prompt (135k
 * tokens, 2,112 blocks) must fit one engine. Speedup 10 turns its ~4 req/s into ~40 req/s.
 */
export const DEFAULT_BENCH_CONFIG = {
  workers: 16,
  speedup: 10,
  durationSecs: 30,
  blockSize: 64,
  kvBlocks: 16_384,
  seed: 1,
  replicas: [1, 2, 4] as readonly number[],
  policies: ["kvmesh", "unmeshed", "round-robin", "random"] as readonly PolicyName[],
  svgPath: "reports/kvmesh-bench.svg",
} as const;

/**
 * The README's first command: 3 meshed replicas, 16 engines, generated sessions, one minute.
 * 300 sessions of ~7 turns over 5 minutes of trace time at speedup 5: ~35 requests/s of wall
 * time, which the replicas, engines and driver handle on 2 cores with room to spare.
 */
export const DEFAULT_DEMO_CONFIG = {
  workers: 16,
  speedup: 5,
  durationSecs: 60,
  blockSize: 64,
  kvBlocks: 16_384,
  seed: 1,
  replicas: 3,
  sessions: 300,
} as const;
