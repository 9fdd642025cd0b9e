/**
 * Fault scenario 8 (#15): a rolling restart under load, as Kubernetes does one: each replica of
 * three in turn gets SIGTERM with a drain window (`--drain-secs`), exits, and starts again at the
 * same ports, while a client sends multi-turn sessions only to the replicas whose `GET /ready`
 * answers 200 (polled like a load balancer's probe). Expected: no failed request, sessions keep
 * their workers (stickiness >= 0.99: a restarted replica is ready only once its peers' snapshots,
 * bindings included, are in), and once the load stops and every free is sent, no replica holds
 * any active load (no booking left behind by a replica that went away).
 */
import { MeshLoad } from "./mesh-load.js";
import { check, idleConvergence, leftBehind, loadChecks, loadDivergence, SCENARIO_BLOCK_SIZE, startMesh, type ScenarioRow } from "./fault-scenarios.js";
import { bindingDisagreements, DEFAULT_REPLICA_ARGS, httpCall, registerWorkers, sleep, startReplica, timeUntil, type Replica } from "./replica-cluster.js";

export interface RollingRestartOptions {
  readonly replicas: number;
  readonly workers: number;
  readonly rateRps: number;
  readonly slots: number;
  readonly seed: number;
  /** --drain-secs of every replica: longer than a request (200-800 ms) plus a readiness poll. */
  readonly drainSecs: number;
  readonly warmMs: number;
  /** Load between one replica being ready again and the next one's SIGTERM. */
  readonly betweenMs: number;
  readonly afterMs: number;
}

export const ROLLING_SHORT: RollingRestartOptions = { replicas: 3, workers: 8, rateRps: 30, slots: 24, seed: 81, drainSecs: 1, warmMs: 1_500, betweenMs: 500, afterMs: 1_000 };
export const ROLLING_LONG: RollingRestartOptions = { replicas: 3, workers: 32, rateRps: 60, slots: 64, seed: 81, drainSecs: 5, warmMs: 5_000, betweenMs: 5_000, afterMs: 5_000 };
/** How often the client reads every replica's /ready (a Kubernetes readiness probe: 1-2 s; a load balancer's: often less). */
export const READY_POLL_MS = 100;
/** A restarted replica must be ready again within this (process start, workers, snapshots). */
const READY_AGAIN_TIMEOUT_MS = 20_000;
/** A draining replica must have exited within this after its drain window. */
const EXIT_GRACE_MS = 5_000;

export const STICKINESS_MIN = 0.99;

export async function scenarioRollingRestart(o: RollingRestartOptions = ROLLING_SHORT): Promise<ScenarioRow> {
  const args = [...DEFAULT_REPLICA_ARGS, "--drain-secs", String(o.drainSecs)];
  const mesh = await startMesh({ replicas: o.replicas, workers: o.workers, seed: o.seed, args });
  const rs = mesh.replicas;
  const load = new MeshLoad({ rateRps: o.rateRps, slots: o.slots, seed: o.seed, idPrefix: "roll-" }, rs);
  const ready = new Set<Replica>(rs);
  const exits: string[] = [];
  /** How long each restarted replica took from its start to answering /ready 200, ms. */
  const readyAfterMs: number[] = [];
  let polling = true;
  // The client's view of the fleet: the replicas whose /ready is 200 get new sessions' turns.
  const poller = (async () => {
    while (polling) {
      await Promise.all(
        rs.map(async (r) => {
          const ok = await httpCall(r, "GET", "/ready", undefined, 1_000).then(
            (res) => res.status === 200,
            () => false,
          );
          if (ok) ready.add(r);
          else ready.delete(r);
        }),
      );
      load.setTargets(rs.filter((r) => ready.has(r)));
      await sleep(READY_POLL_MS);
    }
  })();
  try {
    load.start();
    await sleep(o.warmMs);
    for (let i = 0; i < rs.length; i++) {
      const victim = rs[i] as Replica;
      // Errors there count as clean refusals (retried elsewhere), not failures, from now on.
      load.markDraining(victim);
      const t0 = performance.now();
      victim.child.kill("SIGTERM");
      const code = await Promise.race([victim.exited, sleep(o.drainSecs * 1_000 + EXIT_GRACE_MS).then(() => "hung")]);
      exits.push(`${victim.name}: ${String(code)} after ${(performance.now() - t0).toFixed(0)} ms`);
      load.markDown(victim);
      const others = rs.filter((r) => r !== victim);
      const restarted = await startReplica({ ...victim.spec, peers: others.map((r) => r.syncEndpoint) });
      const started = performance.now();
      rs[i] = restarted;
      // The catalogue is per replica here: the operator (or --workers-file) registers the workers.
      await registerWorkers(restarted, o.workers, SCENARIO_BLOCK_SIZE);
      readyAfterMs.push(await timeUntil(() => ready.has(restarted), READY_AGAIN_TIMEOUT_MS, `${restarted.name} ready again`, started));
      await sleep(o.betweenMs);
    }
    await sleep(o.afterMs);
    const l = await load.stop();
    polling = false;
    await poller;
    const { clearMs: drainedMs, residual, fates } = await leftBehind(rs, load);
    const idleMs = await idleConvergence(rs);
    const disagreeing = await bindingDisagreements(rs, load.routedSessions(), (s) => load.workload.probeTokens(s));
    const loadDiff = await loadDivergence(rs);
    return {
      scenario: "8. rolling restart under load",
      requests: l.sent,
      failures: l.failures + l.unclean,
      convergeMs: drainedMs,
      shed: 0,
      gaps: 0,
      snapshots: 0,
      divergence: disagreeing.length + loadDiff + residual.reduce((s, n) => s + n, 0),
      checks: [
        ...loadChecks(l),
        check("no unclean answer at a draining replica", l.unclean === 0, l.unclean === 0 ? `${l.refusedWhileDraining} refused cleanly and retried` : l.uncleanSamples),
        check("every replica exited 0 after its drain", exits.every((e) => / 0 after /.test(e)), exits),
        check(`stickiness through the restarts >= ${STICKINESS_MIN}`, l.stickiness.turnShare >= STICKINESS_MIN, l.stickiness),
        check("every booking the client saw was freed", fates.booked === 0 && fates.unknown === 0, fates),
        check("no booking left behind (no active load anywhere once all is freed)", residual.every((n) => n === 0), residual),
        check("the replicas agree on bindings and loads afterwards", disagreeing.length + loadDiff === 0 && idleMs !== null, { sessions: disagreeing.slice(0, 3), workers: loadDiff }),
      ],
      details: { load: l, exits, readyAfterMs, drainedMs, fates, residualActive: residual },
    };
  } finally {
    polling = false;
    await poller.catch(() => undefined);
    await load.stop(1_000);
    await mesh.stop();
  }
}
