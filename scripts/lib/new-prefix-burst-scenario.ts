/**
 * Fault scenario 12 (issue 25 item 4): bursts of concurrent requests sharing a new prefix, spread
 * round-robin over meshed replicas, and how many workers each burst lands on. The same bursts run
 * twice, on fresh replicas: with predictions (in-flight prefixes and the approximate cache, the
 * default) and without (`--approx-ttl-secs 0`, kvmesh before issue 25). The replicas run without KV
 * events (the harness's mock workers publish none): the prediction is all any replica knows of a
 * prefix the engines have not reported, with or without events.
 *
 * Check: no request fails, and with predictions every burst lands on at most 2 workers (the target
 * is 1; the fleet is idle between bursts, so load allows it). Figures: the workers per burst, both runs.
 */
import { DEFAULT_AFFINITY_TTL_SECS, httpCall, type Replica } from "./replica-cluster.js";
import { check, figureMs, SCENARIO_BLOCK_SIZE, startMesh, type Figure, type ScenarioRow } from "./fault-scenarios.js";

export interface BurstOptions {
  readonly replicas: number;
  readonly workers: number;
  /** Bursts, each with its own new prefix. */
  readonly bursts: number;
  readonly requestsPerBurst: number;
  readonly prefixTokens: number;
  readonly seed?: number;
}

/** Issue 25's burst: 32 requests sharing a new 8k-token prefix over 4 replicas. */
export const BURST_LONG: BurstOptions = { replicas: 4, workers: 16, bursts: 10, requestsPerBurst: 32, prefixTokens: 8_192 };
export const BURST_SHORT: BurstOptions = { replicas: 4, workers: 8, bursts: 2, requestsPerBurst: 32, prefixTokens: 8_192 };
/** The target: at most this many workers per burst. */
export const BURST_MAX_WORKERS = 2;

interface RunResult {
  readonly workersPerBurst: number[];
  readonly requests: number;
  readonly failures: string[];
}

/** Burst b's prompts: the new prefix, then one block of the request's own. */
function promptsOf(o: BurstOptions, b: number): number[][] {
  const base = ((o.seed ?? 1) * 1_000 + b) * 1_000_000;
  const prefix = Array.from({ length: o.prefixTokens }, (_, i) => base + i);
  return Array.from({ length: o.requestsPerBurst }, (_, r) => [...prefix, ...Array.from({ length: SCENARIO_BLOCK_SIZE }, (_, i) => 900_000_000 + r * SCENARIO_BLOCK_SIZE + i)]);
}

async function run(o: BurstOptions, predictions: boolean): Promise<RunResult> {
  const args = ["--no-kv-events", "--session-affinity-ttl-secs", String(DEFAULT_AFFINITY_TTL_SECS), ...(predictions ? [] : ["--approx-ttl-secs", "0"])];
  const mesh = await startMesh({ replicas: o.replicas, workers: o.workers, seed: o.seed ?? 1, args });
  const failures: string[] = [];
  const workersPerBurst: number[] = [];
  let requests = 0;
  try {
    for (let b = 0; b < o.bursts; b++) {
      const answers = await Promise.all(
        promptsOf(o, b).map(async (token_ids, i) => {
          const r = mesh.replicas[i % mesh.replicas.length] as Replica;
          requests++;
          const res = await httpCall(r, "POST", "/select_and_reserve", { token_ids });
          if (res.status !== 200) {
            failures.push(`${r.name}: ${res.status} ${res.text.slice(0, 200)}`);
            return undefined;
          }
          const json = JSON.parse(res.text) as { worker_id: number; selection_id: string };
          return { r, worker: String(json.worker_id), id: json.selection_id };
        }),
      );
      workersPerBurst.push(new Set(answers.flatMap((a) => (a === undefined ? [] : [a.worker]))).size);
      // The burst ends: every booking is freed where it was made, so the next burst meets an idle fleet.
      for (const a of answers) {
        if (a === undefined) continue;
        requests++;
        const res = await httpCall(a.r, "DELETE", `/reservations/${a.id}`);
        if (res.status !== 200) failures.push(`free ${a.id} at ${a.r.name}: ${res.status}`);
      }
    }
  } finally {
    await mesh.stop();
  }
  return { workersPerBurst, requests, failures };
}

const describeRun = (r: RunResult): string => `${r.workersPerBurst.join(",")} (max ${Math.max(0, ...r.workersPerBurst)})`;

export async function scenarioNewPrefixBurst(o: BurstOptions): Promise<ScenarioRow> {
  const started = performance.now();
  const on = await run(o, true);
  const off = await run(o, false);
  const maxOn = Math.max(0, ...on.workersPerBurst);
  const failures = [...on.failures, ...off.failures];
  const figures: Figure[] = [
    { name: `workers per burst of ${o.requestsPerBurst} sharing a new ${o.prefixTokens}-token prefix over ${o.replicas} replicas, with predictions`, value: describeRun(on), target: `<= ${BURST_MAX_WORKERS} (1 ideal)`, met: maxOn <= BURST_MAX_WORKERS },
    { name: "the same bursts without predictions (--approx-ttl-secs 0)", value: describeRun(off), target: "(baseline)", met: null },
    figureMs("scenario wall time", performance.now() - started, 5 * 60_000),
  ];
  return {
    scenario: "12. new-prefix burst",
    requests: on.requests + off.requests,
    failures: failures.length,
    convergeMs: null,
    shed: 0,
    gaps: 0,
    snapshots: 0,
    divergence: 0,
    checks: [
      check("no failed request", failures.length === 0, failures.length === 0 ? "0" : failures.slice(0, 3).join(" | ")),
      check(`every burst with predictions landed on at most ${BURST_MAX_WORKERS} workers`, maxOn <= BURST_MAX_WORKERS, describeRun(on)),
    ],
    figures,
    details: { withPredictions: on.workersPerBurst, withoutPredictions: off.workersPerBurst },
  };
}
