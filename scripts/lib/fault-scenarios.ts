/**
 * The mesh fault scenarios, shared by the short tests (test/system/faults/*.test.ts) and the long runs
 * of `npm run faults` (scripts/faults.ts): each one starts real replicas on loopback (or in
 * network namespaces, see netns-partition.ts), drives session load through them, injects one
 * kind of fault, and returns one row of the report with the figures the tests assert on.
 *
 * Every scenario is bounded: each wait has a deadline, every process and proxy is stopped in a
 * finally, and a figure that could not be measured is reported (null / a failed check), never
 * waited for forever.
 */
import { FaultProxy, startMeshPeerProxy, type FaultProxyCounters, type FaultSettings } from "./fault-proxy.js";
import { seededRandom } from "../../src/core/index.js";
import { hashListToBigInts } from "../../src/core/index.js";
import { computeBlockHashes, computeSequenceHashes } from "../../src/core/index.js";
import type { MockKvEvent } from "../../src/mock/kv-event-publisher.js";
import { MeshLoad, type BookingFate, type LoadReport } from "./mesh-load.js";
import { createPartitionTopology, netnsUnavailableReason } from "./netns-partition.js";
import { freePortPair } from "../../src/bench/ports.js";
import { RestartableKvPublisher } from "./restartable-kv-publisher.js";
import {
  bindingDisagreements,
  counterDelta,
  fleetCounters,
  httpCall,
  loadsAgree,
  loadsKey,
  recentLoadsMatcher,
  meshCounters,
  meshLive,
  registerWorkers,
  rssOf,
  sleep,
  startReplica,
  stopReplica,
  timeUntil,
  totalActive,
  type Replica,
  type ReplicaSpec,
} from "./replica-cluster.js";
import { histogramQuantile } from "../../src/bench/stats.js";

/** Block size of the scenario workers: 64 as in bench:mesh (prompts are 1,000-24,000 tokens). */
export const SCENARIO_BLOCK_SIZE = 64;
export const MESH_UP_TIMEOUT_MS = 20_000;
/** How long a scenario waits for convergence before it reports a failure. */
export const CONVERGE_TIMEOUT_MS = 20_000;

export interface Check {
  readonly name: string;
  readonly ok: boolean;
  readonly value: string;
}

export interface ScenarioRow {
  readonly scenario: string;
  /** HTTP requests the load generator sent. */
  readonly requests: number;
  /** Of those, failures at replicas that were up (target 0). */
  readonly failures: number;
  /** The scenario's convergence figure, ms (null: not measured or never converged). */
  readonly convergeMs: number | null;
  /** Mesh events shed by outbound queues, plus bytes/chunks the fault itself destroyed. */
  readonly shed: number;
  /** Repairs: sequence gaps detected and snapshots installed, fleet-wide. */
  readonly gaps: number;
  readonly snapshots: number;
  /** Sessions bound differently across replicas + workers whose load differs, after convergence. */
  readonly divergence: number;
  readonly checks: readonly Check[];
  /** Speed figures against their targets: reported (npm run faults prints them), never pass/fail. */
  readonly figures?: readonly Figure[];
  readonly details: Record<string, unknown>;
  /** Set when the scenario could not run here (e.g. no `ip netns`); checks are then empty. */
  readonly skipped?: string;
}

export const rowPassed = (r: ScenarioRow): boolean => r.skipped === undefined && r.checks.every((c) => c.ok);

export function check(name: string, ok: boolean, value: unknown): Check {
  return { name, ok, value: typeof value === "string" ? value : JSON.stringify(value) };
}

/**
 * A speed figure (a convergence time, a latency) and the target it is measured against. A
 * scenario's checks assert behaviour only (it converged, nothing failed, nothing diverged); how
 * fast depends on the machine and what else runs on it, so the figure is reported beside its
 * target instead: `npm run faults` prints it, and the tests that run the short scenarios do not
 * assert it.
 */
export interface Figure {
  readonly name: string;
  readonly value: string;
  /** The target, e.g. "< 1000 ms"; "" for a figure that has none (printed alone, `met` null). */
  readonly target: string;
  /** Whether the figure met its target; null when it was not measured. */
  readonly met: boolean | null;
}

/** A duration against an upper target, in ms (null: never happened within the scenario's deadline). */
export function figureMs(name: string, ms: number | null, maxMs: number): Figure {
  return { name, value: ms === null ? "never" : `${ms.toFixed(0)} ms`, target: `< ${maxMs} ms`, met: ms === null ? null : ms < maxMs };
}

// ------------------------------------------------------------------ a mesh on loopback

export interface Mesh {
  readonly replicas: Replica[];
  /** One proxy per replica when started with `proxied` (all mesh traffic to that replica). */
  readonly proxies: FaultProxy[];
  stop(): Promise<void>;
}

export interface MeshOptions {
  readonly replicas: number;
  readonly workers: number;
  /**
   * Put a FaultProxy in front of every replica: replica i binds 127.0.0.1:P_i and advertises
   * 127.0.0.2:P_i, where its proxy listens. Every peer's SUB and control requests to it then
   * cross the proxy, so a fault on proxy i hits everything replica i publishes and serves.
   */
  readonly proxied?: boolean;
  readonly seed?: number;
  readonly args?: readonly string[];
}

/** The second loopback address the proxies listen on (all of 127/8 is local on Linux). */
export const PROXY_HOST = "127.0.0.2";

export async function startMesh(o: MeshOptions): Promise<Mesh> {
  const replicas: Replica[] = [];
  const proxies: FaultProxy[] = [];
  const stop = async (): Promise<void> => {
    await Promise.all(replicas.map((r) => stopReplica(r)));
    await Promise.all(proxies.map((p) => p.close()));
  };
  try {
    for (let i = 0; i < o.replicas; i++) {
      const syncPort = await freePortPair();
      if (o.proxied === true) {
        const { proxy } = await startMeshPeerProxy({ target: `tcp://127.0.0.1:${syncPort}`, listenHost: PROXY_HOST, random: seededRandom((o.seed ?? 1) * 100 + i) });
        proxies.push(proxy);
      }
      const spec: ReplicaSpec = {
        name: String.fromCharCode(65 + i),
        syncPort,
        peers: replicas.map((r) => r.syncEndpoint),
        ...(o.proxied === true ? { advertiseHost: PROXY_HOST } : {}),
        ...(o.args === undefined ? {} : { args: o.args }),
      };
      replicas.push(await startReplica(spec));
    }
    await timeUntil(() => meshLive(replicas), MESH_UP_TIMEOUT_MS, "the mesh to come up");
    await Promise.all(replicas.map((r) => registerWorkers(r, o.workers, SCENARIO_BLOCK_SIZE)));
    return { replicas, proxies, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Waits (bounded) for every replica's /loads to match with no load running; ms or null. */
export async function idleConvergence(replicas: readonly Replica[], timeoutMs = CONVERGE_TIMEOUT_MS): Promise<number | null> {
  try {
    return await timeUntil(() => loadsAgree(replicas), timeoutMs, "loads to agree");
  } catch {
    return null;
  }
}

/** Number of workers whose /loads row differs between replicas (0 when they agree). */
export async function loadDivergence(replicas: readonly Replica[]): Promise<number> {
  const keys = await Promise.all(replicas.map(loadsKey));
  const rows = keys.map((k) => k.split(","));
  const base = rows[0] ?? [];
  let n = 0;
  for (let i = 0; i < base.length; i++) if (rows.some((r) => r[i] !== base[i] || r.length !== base.length)) n++;
  return n;
}

/**
 * What is left booked once the load has stopped and every free was sent: waits (bounded) until no
 * replica shows active load; then each replica's residual active requests, and the fates of the
 * client's bookings (a booking still "booked" was never freed by the client).
 */
export async function leftBehind(replicas: readonly Replica[], load: MeshLoad): Promise<{ clearMs: number | null; residual: number[]; fates: Record<BookingFate, number> }> {
  let clearMs: number | null = null;
  try {
    clearMs = await timeUntil(async () => (await Promise.all(replicas.map(totalActive))).every((n) => n === 0), CONVERGE_TIMEOUT_MS, "no active load on any replica");
  } catch {
    // null: never cleared
  }
  const residual = await Promise.all(replicas.map(totalActive));
  const fates: Record<BookingFate, number> = { booked: 0, freed: 0, refused: 0, unknown: 0 };
  for (const b of load.bookings.values()) fates[b.fate]++;
  return { clearMs, residual, fates };
}

export function loadChecks(l: LoadReport): Check[] {
  return [check("no failed request at a live replica", l.failures === 0, l.failures === 0 ? "0" : `${l.failures}: ${l.failureSamples.join(" | ")}`)];
}

/** What every load-driven scenario takes: a mesh of `replicas`, its fleet and its traffic. */
export interface LoadScenarioOptions {
  readonly replicas: number;
  readonly workers: number;
  readonly rateRps: number;
  readonly slots: number;
  readonly seed: number;
}

// ------------------------------------------------------------------ 1. SIGKILL under load

export interface KillOptions extends LoadScenarioOptions {
  readonly warmMs: number;
  /** How long the killed replica stays dead, under load. */
  readonly deadMs: number;
  /** Load after the restarted replica is back in rotation. */
  readonly afterMs: number;
}

export const KILL_SHORT: KillOptions = { replicas: 3, workers: 8, rateRps: 30, slots: 24, warmMs: 1_500, deadMs: 1_000, afterMs: 1_000, seed: 11 };
export const KILL_LONG: KillOptions = { replicas: 3, workers: 32, rateRps: 60, slots: 64, warmMs: 5_000, deadMs: 5_000, afterMs: 5_000, seed: 11 };
/** Target for the restarted replica's own view (issue #7). */
export const RESTART_CONVERGE_TARGET_MS = 1_000;
/**
 * Bound for the survivors to receive the restarted replica again: its next heartbeat (500 ms)
 * and a first-contact snapshot after their SUBs redial. Without the redial on its peering
 * request they waited out libzmq's reconnect backoff (2 s and more, doubling to 5 s).
 */
export const SURVIVORS_SEE_RESTART_MAX_MS = 1_500;
/** Sessions probed while timing the restart (all of them are checked afterwards). */
const RESTART_BINDING_SAMPLE = 8;

/**
 * A replica killed with SIGKILL under load: the others keep routing (failures target 0), the
 * restarted replica (same ports, new process) converges on load and bindings from snapshots
 * (target < 1 s, measured under load from its workers being registered to agreeing /loads and
 * bindings; the registration itself is reported apart), and
 * sessions keep their workers through the kill (stickiness >= 0.99).
 */
export async function scenarioKill(o: KillOptions = KILL_SHORT): Promise<ScenarioRow> {
  const mesh = await startMesh({ replicas: o.replicas, workers: o.workers, seed: o.seed });
  const rs = mesh.replicas;
  const load = new MeshLoad({ rateRps: o.rateRps, slots: o.slots, seed: o.seed, idPrefix: "kill-" }, rs);
  try {
    const victim = rs[1] as Replica;
    // The victim's counters die with it: the fleet delta is over the survivors and the restarted process.
    const before = await fleetCounters(rs.filter((r) => r !== victim));
    load.start();
    await sleep(o.warmMs);
    const sessionsBefore = load.routedSessions();
    load.markDown(victim);
    victim.child.kill("SIGKILL");
    await victim.exited;
    const survivors = rs.filter((r) => r !== victim);
    await sleep(o.deadMs);
    const failuresWhileDead = load.report().failures;

    const restarted = await startReplica({ ...victim.spec, peers: survivors.map((r) => r.syncEndpoint) });
    rs[1] = restarted;
    // The catalogue also arrives in the survivors' snapshots; registering as an operator of the
    // reference would (idempotent: the same content publishes nothing) keeps the clock's start
    // where it was measured before the catalogue was replicated.
    const tReg = performance.now();
    await registerWorkers(restarted, o.workers, SCENARIO_BLOCK_SIZE);
    const t0 = performance.now();
    const registerMs = t0 - tReg;
    let convergeMs: number | null = null;
    let fleetMs: number | null = null;
    // Timed on a sample (each poll must be quick, or the poll itself is what gets measured);
    // every session is checked once the clock has stopped.
    const sample = sessionsBefore.slice(0, RESTART_BINDING_SAMPLE);
    try {
      // The restarted replica's own view: live with every peer, its /loads matching the
      // survivors', and sessions routed to the worker their latest turn got. One snapshot carries
      // both bookings and bindings.
      const loadsMatch = recentLoadsMatcher(rs);
      convergeMs = await timeUntil(
        async () => {
          const [liveOk, loadsOk, elsewhere] = await Promise.all([meshLive([restarted]), loadsMatch(), boundElsewhere(restarted, sample, load)]);
          return liveOk && loadsOk && elsewhere.length === 0;
        },
        CONVERGE_TIMEOUT_MS,
        "the restarted replica's loads and bindings to match",
        t0,
      );
      // And the fleet's: every survivor receives the restarted replica again (its SUB redials).
      fleetMs = await timeUntil(() => meshLive(rs), CONVERGE_TIMEOUT_MS, "the survivors to see the restarted replica live", t0);
    } catch {
      // Reported as null below.
    }
    const movedAtRestart = await boundElsewhere(restarted, sessionsBefore, load);
    load.setTargets(rs);
    await sleep(o.afterMs);
    const l = await load.stop();
    const idleMs = await idleConvergence(rs);
    const disagreeing = await bindingDisagreements(rs, load.routedSessions(), (s) => load.workload.probeTokens(s));
    const loadDiff = await loadDivergence(rs);
    const after = await fleetCounters(rs);
    const d = counterDelta(after, before);
    const both = convergeMs;
    return {
      scenario: "1. SIGKILL a replica under load",
      requests: l.sent,
      failures: l.failures,
      convergeMs: both,
      shed: d.shed,
      gaps: d.gaps,
      snapshots: d.snapshotsInstalled,
      divergence: disagreeing.length + loadDiff,
      checks: [
        ...loadChecks(l),
        check("no failure at the survivors while the victim was dead", failuresWhileDead === 0, failuresWhileDead),
        check("restarted replica converged on loads and bindings (under load)", both !== null, both === null ? "never" : `${both.toFixed(0)} ms`),
        check("the survivors receive the restarted replica again", fleetMs !== null, fleetMs === null ? "never" : `${fleetMs.toFixed(0)} ms`),
        check("every pre-kill session routes to its worker at the restarted replica", movedAtRestart.length === 0, movedAtRestart.slice(0, 5)),
        check("stickiness through the kill >= 0.99", l.stickiness.turnShare >= 0.99, l.stickiness),
        check("no divergence after the load stops", disagreeing.length + loadDiff === 0 && idleMs !== null, { sessions: disagreeing.slice(0, 3), workers: loadDiff }),
      ],
      figures: [
        figureMs("restarted replica converged on loads and bindings (under load)", both, RESTART_CONVERGE_TARGET_MS),
        figureMs("the survivors receive the restarted replica again", fleetMs, SURVIVORS_SEE_RESTART_MAX_MS),
      ],
      details: { load: l, restartedConvergedMs: convergeMs, survivorsSeeRestartedMs: fleetMs, workerRegistrationMs: registerMs, idleConvergeMs: idleMs, sessionsCheckedThroughKill: sessionsBefore.length, mesh: d },
    };
  } finally {
    await load.stop(1_000);
    await mesh.stop();
  }
}

/** Sessions that `r` would route elsewhere than the client saw them routed last. */
async function boundElsewhere(r: Replica, sessions: readonly string[], load: MeshLoad): Promise<string[]> {
  const out: string[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (next < sessions.length) {
        const s = sessions[next++] as string;
        const res = await httpCall(r, "POST", "/select", { token_ids: load.workload.probeTokens(s), session_id: s });
        if (res.status !== 200 || /"worker_id":(\d+)/.exec(res.text)?.[1] !== String(load.lastWorkerOf(s))) out.push(s);
      }
    }),
  );
  return out;
}

// ------------------------------------------------------------------ 3. delay / loss / stall via the proxy

export interface ProxyFaultPhase {
  readonly name: string;
  readonly faults?: Partial<FaultSettings>;
  /** Stall every proxy for this long at the start of the phase. */
  readonly stallMs?: number;
  /** Cut every proxy for this long at the start of the phase (then heal). */
  readonly cutMs?: number;
  readonly ms: number;
}

export interface ProxyFaultOptions extends LoadScenarioOptions {
  readonly phases: readonly ProxyFaultPhase[];
}

export const PROXY_SHORT: ProxyFaultOptions = {
  replicas: 3,
  workers: 8,
  rateRps: 30,
  slots: 24,
  seed: 21,
  phases: [
    { name: "delay 20+-10 ms", faults: { delayMs: 20, jitterMs: 10 }, ms: 1_200 },
    { name: "drop 2% of chunks", faults: { dropRate: 0.02 }, ms: 1_500 },
    // Truncation tends to end in a ZMTP protocol error, after which libzmq never reconnects
    // that SUB: recovery then rests on the mesh redialing silent peers (~3 s).
    { name: "truncate 2% of chunks", faults: { truncateRate: 0.02 }, ms: 1_500 },
    { name: "stall 1.5 s", stallMs: 1_500, ms: 2_000 },
  ],
};

export const PROXY_LONG: ProxyFaultOptions = {
  replicas: 3,
  workers: 32,
  rateRps: 60,
  slots: 64,
  seed: 21,
  phases: [
    { name: "baseline", ms: 5_000 },
    { name: "delay 20+-10 ms", faults: { delayMs: 20, jitterMs: 10 }, ms: 5_000 },
    { name: "delay 100 ms", faults: { delayMs: 100 }, ms: 5_000 },
    { name: "drop 1% of chunks", faults: { dropRate: 0.01 }, ms: 8_000 },
    { name: "truncate 1% of chunks", faults: { truncateRate: 0.01 }, ms: 8_000 },
    { name: "stall 5 s", stallMs: 5_000, ms: 7_000 },
    { name: "cut 3 s", cutMs: 3_000, ms: 5_000 },
  ],
};

interface LagWindow {
  p50Ms: number;
  p99Ms: number;
  samples: number;
}

async function lagHistogram(rs: readonly Replica[]): Promise<{ le: number[]; cum: number[] }> {
  const texts = await Promise.all(rs.map(async (r) => (await httpCall(r, "GET", "/metrics")).text));
  const le: number[] = [];
  const cum: number[] = [];
  texts.forEach((text, j) => {
    let i = 0;
    // Only the aggregate histogram (no origin label).
    for (const m of text.matchAll(/^kvmesh_mesh_replication_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$/gm)) {
      if (j === 0) {
        le.push(m[1] === "+Inf" ? Infinity : Number(m[1]) * 1000);
        cum.push(0);
      }
      cum[i] = (cum[i] ?? 0) + Number(m[2]);
      i++;
    }
  });
  return { le, cum };
}

function lagBetween(a: { le: number[]; cum: number[] }, b: { le: number[]; cum: number[] }): LagWindow {
  const cum = b.cum.map((c, i) => c - (a.cum[i] ?? 0));
  return { p50Ms: histogramQuantile(b.le, cum, 0.5), p99Ms: histogramQuantile(b.le, cum, 0.99), samples: cum[cum.length - 1] ?? 0 };
}

export interface PhaseResult {
  phase: string;
  lag: LagWindow;
  gaps: number;
  snapshots: number;
  snapshotFailures: number;
  malformed: number;
  proxy: Pick<FaultProxyCounters, "chunksDropped" | "chunksTruncated" | "chunksDelayed" | "connectionsCut" | "connectionsAccepted" | "stalls">;
  /** From the end of the fault to loads agreeing and every peer alive + live, ms. */
  recoverMs: number | null;
}

/**
 * Delay, loss (dropped or truncated chunks corrupt ZMTP: the connection resets), stalls and
 * cuts on every mesh link through fault proxies, phase by phase under load: replication lag,
 * gaps and snapshots per phase, and how long the mesh takes to agree again once each fault ends.
 * HTTP never crosses the proxies, so the load must see no failure at all.
 */
export async function scenarioProxyFaults(o: ProxyFaultOptions = PROXY_SHORT): Promise<ScenarioRow> {
  const mesh = await startMesh({ replicas: o.replicas, workers: o.workers, proxied: true, seed: o.seed });
  const rs = mesh.replicas;
  const load = new MeshLoad({ rateRps: o.rateRps, slots: o.slots, seed: o.seed, idPrefix: "proxy-" }, rs);
  const phases: PhaseResult[] = [];
  const sumProxy = (): FaultProxyCounters => {
    const all = mesh.proxies.map((p) => p.counters());
    const out = { ...(all[0] as FaultProxyCounters) };
    for (const k of Object.keys(out) as (keyof FaultProxyCounters)[]) out[k] = all.reduce((s, c) => s + c[k], 0);
    return out;
  };
  try {
    const before = await fleetCounters(rs);
    load.start();
    for (const ph of o.phases) {
      const c0 = await fleetCounters(rs);
      const h0 = await lagHistogram(rs);
      const p0 = sumProxy();
      if (ph.faults !== undefined) for (const p of mesh.proxies) p.setFaults(ph.faults);
      if (ph.stallMs !== undefined) for (const p of mesh.proxies) p.stall(ph.stallMs);
      if (ph.cutMs !== undefined) for (const p of mesh.proxies) p.cut();
      if (ph.cutMs !== undefined) {
        await sleep(ph.cutMs);
        for (const p of mesh.proxies) p.heal();
      }
      await sleep(Math.max(0, ph.ms - (ph.cutMs ?? 0)));
      for (const p of mesh.proxies) {
        p.clearFaults();
        p.resume();
      }
      const healedAt = performance.now();
      let recoverMs: number | null = null;
      try {
        const loadsMatch = recentLoadsMatcher(rs);
        recoverMs = await timeUntil(async () => (await meshLive(rs)) && (await loadsMatch()), CONVERGE_TIMEOUT_MS, `recovery after ${ph.name}`, healedAt);
      } catch {
        // null: never recovered within the deadline.
      }
      const c1 = await fleetCounters(rs);
      const h1 = await lagHistogram(rs);
      const p1 = sumProxy();
      const d = counterDelta(c1, c0);
      phases.push({
        phase: ph.name,
        lag: lagBetween(h0, h1),
        gaps: d.gaps,
        snapshots: d.snapshotsInstalled,
        snapshotFailures: d.snapshotFailures,
        malformed: d.malformed,
        proxy: {
          chunksDropped: p1.chunksDropped - p0.chunksDropped,
          chunksTruncated: p1.chunksTruncated - p0.chunksTruncated,
          chunksDelayed: p1.chunksDelayed - p0.chunksDelayed,
          connectionsCut: p1.connectionsCut - p0.connectionsCut,
          connectionsAccepted: p1.connectionsAccepted - p0.connectionsAccepted,
          stalls: p1.stalls - p0.stalls,
        },
        recoverMs,
      });
    }
    const l = await load.stop();
    const idleMs = await idleConvergence(rs);
    const disagreeing = await bindingDisagreements(rs, load.routedSessions(), (s) => load.workload.probeTokens(s));
    const loadDiff = await loadDivergence(rs);
    const d = counterDelta(await fleetCounters(rs), before);
    const proxyTotal = sumProxy();
    const worst = phases.reduce<number | null>((m, p) => (p.recoverMs === null || m === null ? null : Math.max(m, p.recoverMs)), 0);
    return {
      scenario: "3. delay / loss / stall / cut on mesh links (proxy)",
      requests: l.sent,
      failures: l.failures,
      convergeMs: worst,
      shed: d.shed + proxyTotal.chunksDropped + proxyTotal.chunksTruncated,
      gaps: d.gaps,
      snapshots: d.snapshotsInstalled,
      divergence: disagreeing.length + loadDiff,
      checks: [
        ...loadChecks(l),
        ...phases.map((p) => check(`mesh recovered after "${p.phase}"`, p.recoverMs !== null, p.recoverMs === null ? "never" : `${p.recoverMs.toFixed(0)} ms`)),
        check("every fault phase that destroyed bytes was repaired by a snapshot", phases.every((p) => p.proxy.chunksDropped + p.proxy.chunksTruncated === 0 || p.snapshots > 0), phases.map((p) => [p.phase, p.snapshots])),
        check("no divergence after the load stops", disagreeing.length + loadDiff === 0 && idleMs !== null, { sessions: disagreeing.slice(0, 3), workers: loadDiff }),
      ],
      details: { phases, load: l, idleConvergeMs: idleMs, mesh: d, proxy: proxyTotal },
    };
  } finally {
    await load.stop(1_000);
    await mesh.stop();
  }
}

// ------------------------------------------------------------------ 4. a slow / stalled peer

export interface StalledPeerOptions extends LoadScenarioOptions {
  readonly warmMs: number;
  /** How long the peer is frozen (SIGSTOP), under load at the others. */
  readonly frozenMs: number;
}

export const STALLED_SHORT: StalledPeerOptions = { replicas: 3, workers: 8, rateRps: 30, slots: 24, warmMs: 1_000, frozenMs: 4_000, seed: 31 };
export const STALLED_LONG: StalledPeerOptions = { replicas: 3, workers: 32, rateRps: 60, slots: 64, warmMs: 5_000, frozenMs: 30_000, seed: 31 };

/** select_and_reserve p99 at the others while the peer is frozen, ms (the freeze is 4-30 s). */
export const STALLED_PEER_MAX_P99_MS = 1_000;
/** Allowed RSS growth of a survivor while a peer is frozen, bytes (its HWM-bounded queue). */
export const STALLED_PEER_MAX_RSS_GROWTH_BYTES = 64 * 1024 * 1024;

/**
 * A stalled peer (SIGSTOP: its sockets stay open, nothing is read) under load at the others:
 * they keep answering at normal latency (no failures, p99 compared with before), their memory
 * stays bounded (the XPUB pipe to the frozen peer is capped by the HWM and the ZMTP heartbeat
 * drops it after 3 s), and once it resumes the frozen peer repairs what it missed (gaps ->
 * snapshots) and converges.
 */
export async function scenarioStalledPeer(o: StalledPeerOptions = STALLED_SHORT): Promise<ScenarioRow> {
  const mesh = await startMesh({ replicas: o.replicas, workers: o.workers, seed: o.seed });
  const rs = mesh.replicas;
  const victim = rs[rs.length - 1] as Replica;
  const others = rs.filter((r) => r !== victim);
  const load = new MeshLoad({ rateRps: o.rateRps, slots: o.slots, seed: o.seed, idPrefix: "stall-" }, others);
  try {
    const before = await fleetCounters(rs);
    load.start();
    await sleep(o.warmMs);
    const latBefore = load.report().selectLatencyMs;
    const mark = load.latencyMark();
    const rss0 = others.map((r) => rssOf(r.pid));
    const victimBefore = await meshCounters(victim);
    victim.child.kill("SIGSTOP");
    const rssMax = [...rss0];
    const frozenUntil = performance.now() + o.frozenMs;
    // Answers in the freeze's second half show the others did not block once their queues to it
    // filled (the HWM), not only that requests in flight at the SIGSTOP got through.
    const halfway = frozenUntil - o.frozenMs / 2;
    let lateMark: number | undefined;
    while (performance.now() < frozenUntil) {
      await sleep(250);
      if (lateMark === undefined && performance.now() >= halfway) lateMark = load.latencyMark();
      others.forEach((r, i) => {
        rssMax[i] = Math.max(rssMax[i] ?? 0, rssOf(r.pid));
      });
    }
    const duringFailures = load.report().failures;
    const latDuring = load.latencySince(mark);
    const answeredLate = lateMark === undefined ? 0 : load.latencySince(lateMark).n;
    victim.child.kill("SIGCONT");
    const resumedAt = performance.now();
    let convergeMs: number | null = null;
    try {
      const loadsMatch = recentLoadsMatcher(rs);
      convergeMs = await timeUntil(async () => (await meshLive(rs)) && (await loadsMatch()), CONVERGE_TIMEOUT_MS, "the stalled peer to catch up", resumedAt);
    } catch {
      // null below
    }
    const l = await load.stop();
    const victimAfter = await meshCounters(victim);
    const idleMs = await idleConvergence(rs);
    const disagreeing = await bindingDisagreements(rs, load.routedSessions(), (s) => load.workload.probeTokens(s));
    const loadDiff = await loadDivergence(rs);
    const d = counterDelta(await fleetCounters(rs), before);
    const growth = others.map((_, i) => (rssMax[i] ?? 0) - (rss0[i] ?? 0));
    const victimRepairs = counterDelta(victimAfter, victimBefore);
    return {
      scenario: "4. stalled peer (SIGSTOP) under load",
      requests: l.sent,
      failures: l.failures,
      convergeMs,
      shed: d.shed,
      gaps: d.gaps,
      snapshots: d.snapshotsInstalled,
      divergence: disagreeing.length + loadDiff,
      checks: [
        ...loadChecks(l),
        check("no failure at the others while the peer was frozen", duringFailures === 0, duringFailures),
        // Blocking on the frozen peer would leave nothing answered until it resumed.
        check("the others kept answering while it was frozen (in its second half too)", latDuring.n > 0 && answeredLate > 0, { ...latDuring, answeredInSecondHalf: answeredLate }),
        check(`survivors' RSS grew < ${STALLED_PEER_MAX_RSS_GROWTH_BYTES / 2 ** 20} MiB while it was frozen`, growth.every((g) => g < STALLED_PEER_MAX_RSS_GROWTH_BYTES), growth.map((g) => `${(g / 2 ** 20).toFixed(1)} MiB`)),
        check("the frozen peer repaired what it missed by snapshot", victimRepairs.snapshotsInstalled > 0, { gaps: victimRepairs.gaps, snapshots: victimRepairs.snapshotsInstalled }),
        check("converged after it resumed", convergeMs !== null, convergeMs === null ? "never" : `${convergeMs.toFixed(0)} ms`),
        check("no divergence after the load stops", disagreeing.length + loadDiff === 0 && idleMs !== null, { sessions: disagreeing.slice(0, 3), workers: loadDiff }),
      ],
      figures: [figureMs("select p99 at the others while it was frozen", latDuring.n === 0 ? null : latDuring.p99, STALLED_PEER_MAX_P99_MS)],
      details: {
        load: l,
        selectLatencyBeforeMs: latBefore,
        selectLatencyWhileFrozenMs: latDuring,
        survivorRssGrowthBytes: growth,
        victimRepairs: { gaps: victimRepairs.gaps, snapshots: victimRepairs.snapshotsInstalled },
        idleConvergeMs: idleMs,
        mesh: d,
      },
    };
  } finally {
    victim.child.kill("SIGCONT");
    await load.stop(1_000);
    await mesh.stop();
  }
}

// ------------------------------------------------------------------ 6. shutdown under load

export interface ShutdownOptions extends LoadScenarioOptions {
  readonly warmMs: number;
  readonly afterMs: number;
}

export const SHUTDOWN_SHORT: ShutdownOptions = { replicas: 2, workers: 8, rateRps: 40, slots: 32, warmMs: 1_500, afterMs: 1_000, seed: 61 };
export const SHUTDOWN_LONG: ShutdownOptions = { replicas: 3, workers: 32, rateRps: 80, slots: 96, warmMs: 5_000, afterMs: 3_000, seed: 61 };
/** The HTTP close grace is 2 s (src/http/server.ts); the whole shutdown should fit well within this (a reported target). */
export const SHUTDOWN_MAX_MS = 5_000;
/** Past this the replica is taken as hung (a failed check): a deadline for liveness, not a speed target. */
export const SHUTDOWN_HANG_MS = 30_000;

/**
 * SIGTERM one replica while load runs at it: every in-flight request completes or is refused
 * cleanly (503 KVMESH_SHUTTING_DOWN, a refused connection, or a reset before any response byte on
 * a pooled connection the server closed as idle, all retried elsewhere; no reset mid-answer, no
 * hang, no other 5xx), the process exits 0 (how fast is reported against SHUTDOWN_MAX_MS), and the
 * survivors hold no partial state: once every request the client knows about is freed, they show no active load
 * (a booking published without its answer reaching the client, or a free lost in the shutdown,
 * would remain).
 */
export async function scenarioShutdown(o: ShutdownOptions = SHUTDOWN_SHORT): Promise<ScenarioRow> {
  const mesh = await startMesh({ replicas: o.replicas, workers: o.workers, seed: o.seed });
  const rs = mesh.replicas;
  const victim = rs[rs.length - 1] as Replica;
  const survivors = rs.filter((r) => r !== victim);
  const load = new MeshLoad({ rateRps: o.rateRps, slots: o.slots, seed: o.seed, idPrefix: "shut-" }, rs);
  try {
    const before = await fleetCounters(survivors);
    load.start();
    await sleep(o.warmMs);
    load.markDraining(victim);
    const t0 = performance.now();
    victim.child.kill("SIGTERM");
    let hangTimer: NodeJS.Timeout | undefined;
    const exitCode = await Promise.race([
      victim.exited,
      new Promise<string>((resolve) => {
        hangTimer = setTimeout(() => {
          resolve("hung");
        }, SHUTDOWN_HANG_MS);
      }),
    ]);
    clearTimeout(hangTimer);
    const exitMs = performance.now() - t0;
    load.markDown(victim);
    await sleep(o.afterMs);
    const l = await load.stop();
    const { clearMs: convergeMs, residual, fates } = await leftBehind(survivors, load);
    const disagreeing = await bindingDisagreements(survivors, load.routedSessions(), (s) => load.workload.probeTokens(s));
    const loadDiff = await loadDivergence(survivors);
    const d = counterDelta(await fleetCounters(survivors), before);
    return {
      scenario: "6. shutdown (SIGTERM) under load",
      requests: l.sent,
      failures: l.failures + l.unclean,
      convergeMs,
      shed: d.shed,
      gaps: d.gaps,
      snapshots: d.snapshotsInstalled,
      divergence: disagreeing.length + loadDiff + residual.reduce((s, n) => s + n, 0),
      checks: [
        ...loadChecks(l),
        check(
          "in-flight requests completed or were refused cleanly (no reset mid-answer, hang or other 5xx)",
          l.unclean === 0,
          l.unclean === 0 ? `${l.refusedWhileDraining} refused cleanly (${l.resetBeforeResponseWhileDraining} of them reset unanswered on an idle keep-alive connection)` : l.uncleanSamples,
        ),
        check("exited 0 (no hang)", exitCode === 0, `${String(exitCode)} after ${exitMs.toFixed(0)} ms`),
        check("every booking the client saw was freed", fates.booked === 0, fates),
        check("no partial state at the survivors (no active load once all is freed)", residual.every((n) => n === 0), residual),
      ],
      figures: [figureMs("exit after SIGTERM", exitCode === "hung" ? null : exitMs, SHUTDOWN_MAX_MS)],
      details: { load: l, exitCode, exitMs, fates, residualActive: residual, mesh: d },
    };
  } finally {
    await load.stop(1_000);
    await mesh.stop();
  }
}

// ------------------------------------------------------------------ 5. a worker's KV publisher restarts

export type PublisherRestartCase = "in-place" | "new-process" | "after-one-batch";

export interface PublisherRestartOptions {
  readonly cases: readonly PublisherRestartCase[];
  /** Old batches published before the restart (the "after-one-batch" case always uses 1). */
  readonly oldBatches: number;
  /** New batches after the restart. */
  readonly newBatches: number;
  /** Pause between new batches, ms (the new process publishes while subscribers reconnect). */
  readonly newBatchGapMs: number;
  /** How long the index may take to be rebuilt before the case counts as stale, ms. */
  readonly rebuildTimeoutMs: number;
}

export const PUBLISHER_SHORT: PublisherRestartOptions = { cases: ["in-place", "new-process", "after-one-batch"], oldBatches: 3, newBatches: 3, newBatchGapMs: 150, rebuildTimeoutMs: 4_000 };
export const PUBLISHER_LONG: PublisherRestartOptions = { cases: ["in-place", "new-process", "after-one-batch"], oldBatches: 20, newBatches: 10, newBatchGapMs: 100, rebuildTimeoutMs: 8_000 };

const KV_BLOCK_SIZE = 16;
const KV_PROMPT_BLOCKS = 8;

function kvPrompt(seed: number): { tokens: number[]; event: MockKvEvent } {
  const tokens = Array.from({ length: KV_PROMPT_BLOCKS * KV_BLOCK_SIZE }, (_, i) => seed * 1_000_003 + i);
  const seq = hashListToBigInts(computeSequenceHashes(computeBlockHashes(tokens, KV_BLOCK_SIZE)));
  return { tokens, event: { type: "stored", blockHashes: seq, parentHash: null, tokenIds: tokens, blockSize: KV_BLOCK_SIZE } };
}

/** Device blocks worker 1 holds for `tokens` on replica r (-1 if the probe fails). */
async function deviceBlocks(r: Replica, tokens: readonly number[], workerId = 1): Promise<number> {
  const res = await httpCall(r, "POST", "/overlap_scores", { token_ids: tokens });
  if (res.status !== 200) return -1;
  const body = JSON.parse(res.text) as { workers: { worker_id: number; device_blocks: number }[] };
  return body.workers.find((w) => w.worker_id === workerId)?.device_blocks ?? 0;
}

export interface PublisherCaseResult {
  case: PublisherRestartCase;
  /** ms from the last post-restart publish until every replica dropped the old blocks and holds the new ones; null: left stale. */
  rebuiltMs: number | null;
  /** Per replica after the wait: old prompt's blocks still held, newest prompt's blocks held. */
  oldBlocksLeft: number[];
  newestBlocksHeld: number[];
  resetsSeen: number;
}

/**
 * A worker's KV-event publisher restarts, three ways: numbering back to 0 on the same sockets;
 * a new process on the same ports that publishes at once (the first batches reach no one until
 * the replicas' SUBs reconnect); and a restart after the old publisher sent a single batch (seq 0
 * then seq 0 again). Every replica subscribes to the worker itself; each must drop the old
 * blocks and index the new ones, not keep a stale index.
 */
export async function scenarioPublisherRestart(o: PublisherRestartOptions = PUBLISHER_SHORT): Promise<ScenarioRow> {
  const results: PublisherCaseResult[] = [];
  let published = 0;
  const rs: Replica[] = [];
  const pubs: RestartableKvPublisher[] = [];
  try {
    for (let i = 0; i < 2; i++) {
      rs.push(await startReplica({ name: String.fromCharCode(65 + i), syncPort: await freePortPair(), peers: rs.map((r) => r.syncEndpoint), args: ["--session-affinity-ttl-secs", "600"] }));
    }
    for (const [k, c] of o.cases.entries()) {
      // One worker (and publisher) per case, on the same replicas.
      const workerId = k + 1;
      const ports = await freePortPair();
      const pub = await RestartableKvPublisher.create(ports, ports + 1);
      pubs.push(pub);
      for (const r of rs) {
        const res = await httpCall(r, "POST", "/workers", { worker_id: workerId, endpoint: `http://w${workerId}`, block_size: KV_BLOCK_SIZE, kv_events_endpoint: pub.endpoint, replay_endpoint: pub.replayEndpoint });
        if (res.status !== 201) throw new Error(`POST /workers on ${r.name}: ${res.status} ${res.text}`);
      }
      await timeUntil(() => pub.subscriptions >= rs.length, 10_000, "both replicas to subscribe to the publisher");
      const oldN = c === "after-one-batch" ? 1 : o.oldBatches;
      const old = Array.from({ length: oldN }, (_, i) => kvPrompt(1_000 * workerId + i));
      for (const p of old) await pub.publish([p.event]);
      published += oldN;
      const first = old[0] as { tokens: number[] };
      const held = (tokens: readonly number[]): Promise<number[]> => Promise.all(rs.map((r) => deviceBlocks(r, tokens, workerId)));
      await timeUntil(async () => (await held(first.tokens)).every((n) => n === KV_PROMPT_BLOCKS), 10_000, "the old blocks to be indexed");

      if (c === "new-process") await pub.restartProcess();
      else pub.restartInPlace();
      const fresh = Array.from({ length: o.newBatches }, (_, i) => kvPrompt(1_000 * workerId + 500 + i));
      for (const p of fresh) {
        await pub.publish([p.event]);
        published++;
        await sleep(o.newBatchGapMs);
      }
      const t0 = performance.now();
      const newest = fresh[fresh.length - 1] as { tokens: number[] };
      const rebuilt = async (): Promise<boolean> => (await held(first.tokens)).every((n) => n === 0) && (await held(newest.tokens)).every((n) => n === KV_PROMPT_BLOCKS);
      let rebuiltMs: number | null = null;
      try {
        rebuiltMs = await timeUntil(rebuilt, o.rebuildTimeoutMs, "the index to be rebuilt", t0);
      } catch {
        // stale: null
      }
      const resets = await Promise.all(
        rs.map(async (r) => {
          const text = (await httpCall(r, "GET", "/metrics")).text;
          return Number(new RegExp(`^kvmesh_kv_publisher_resets_total\\{[^}]*worker_id="${workerId}"[^}]*\\} (\\S+)$`, "m").exec(text)?.[1] ?? 0);
        }),
      );
      results.push({ case: c, rebuiltMs, oldBlocksLeft: await held(first.tokens), newestBlocksHeld: await held(newest.tokens), resetsSeen: resets.reduce((x, y) => x + y, 0) });
    }
  } finally {
    await Promise.all(rs.map((r) => stopReplica(r)));
    await Promise.all(pubs.map((p) => p.close()));
  }
  const stale = results.filter((r) => r.rebuiltMs === null);
  const worst = results.reduce<number | null>((m, r) => (r.rebuiltMs === null || m === null ? null : Math.max(m, r.rebuiltMs)), 0);
  return {
    scenario: "5. worker KV publisher restart",
    requests: published,
    failures: stale.length,
    convergeMs: worst,
    shed: 0,
    gaps: 0,
    snapshots: 0,
    divergence: stale.length,
    checks: results.map((r) =>
      check(`index rebuilt after a "${r.case}" restart`, r.rebuiltMs !== null, r.rebuiltMs === null ? { oldBlocksLeft: r.oldBlocksLeft, newestBlocksHeld: r.newestBlocksHeld, resets: r.resetsSeen } : `${r.rebuiltMs.toFixed(0)} ms`),
    ),
    details: { cases: results, note: "requests = KV batches published; failures/divergence = cases left stale" },
  };
}

// ------------------------------------------------------------------ 2. a network partition (namespaces)

export interface PartitionOptions {
  readonly workers: number;
  readonly rateRps: number;
  readonly slots: number;
  readonly warmMs: number;
  /** How long the link stays down; past the 3 s ZMTP heartbeat timeout the connections drop. */
  readonly cutMs: number;
  /** Sessions bound on both sides during the cut, to different workers. */
  readonly conflicts: number;
  readonly afterMs: number;
  readonly seed: number;
}

export const PARTITION_SHORT: PartitionOptions = { workers: 8, rateRps: 24, slots: 24, warmMs: 1_000, cutMs: 4_000, conflicts: 6, afterMs: 500, seed: 41 };
export const PARTITION_LONG: PartitionOptions = { workers: 32, rateRps: 60, slots: 64, warmMs: 5_000, cutMs: 20_000, conflicts: 32, afterMs: 5_000, seed: 41 };

const PARTITION_SYNC_PORTS = { a: 7100, c: 7102, b: 7100 } as const;
const CONFLICT_PROBE_TOKENS = Array.from({ length: SCENARIO_BLOCK_SIZE * 2 }, (_, i) => 900_000 + i);

/**
 * Replicas A and C in one namespace, B in another, joined by a veth pair that is cut under
 * load: both sides keep routing (no failures); during the cut the same sessions are bound to
 * worker 1 on A's side and worker 2 on B's; after the heal, with no manual step, loads and
 * bindings converge (measured from the `ip link set up`) and every conflicting session resolves
 * to the same worker on every replica. Skipped, with the reason, where namespaces are unavailable.
 */
export async function scenarioPartition(o: PartitionOptions = PARTITION_SHORT): Promise<ScenarioRow> {
  const name = "2. network partition (netns + veth)";
  const why = netnsUnavailableReason();
  if (why !== null) return { scenario: name, requests: 0, failures: 0, convergeMs: null, shed: 0, gaps: 0, snapshots: 0, divergence: 0, checks: [], details: {}, skipped: why };
  const topo = createPartitionTopology();
  const rs: Replica[] = [];
  let load: MeshLoad | undefined;
  try {
    const inL = { prefix: topo.exec(topo.left), host: "0.0.0.0", httpHost: topo.leftHttpIp, advertiseHost: topo.leftMeshIp };
    const inR = { prefix: topo.exec(topo.right), host: "0.0.0.0", httpHost: topo.rightHttpIp, advertiseHost: topo.rightMeshIp };
    const a = await startReplica({ name: "A", syncPort: PARTITION_SYNC_PORTS.a, ...inL });
    rs.push(a);
    const c = await startReplica({ name: "C", syncPort: PARTITION_SYNC_PORTS.c, peers: [a.syncEndpoint], ...inL });
    rs.push(c);
    const b = await startReplica({ name: "B", syncPort: PARTITION_SYNC_PORTS.b, peers: [a.syncEndpoint, c.syncEndpoint], ...inR });
    rs.push(b);
    await timeUntil(() => meshLive(rs), MESH_UP_TIMEOUT_MS, "the mesh across namespaces");
    await Promise.all(rs.map((r) => registerWorkers(r, o.workers, SCENARIO_BLOCK_SIZE)));
    await idleConvergence(rs);
    const before = await fleetCounters(rs);
    load = new MeshLoad({ rateRps: o.rateRps, slots: o.slots, seed: o.seed, idPrefix: "part-" }, rs);
    load.start();
    await sleep(o.warmMs);

    topo.cut();
    const cutAt = performance.now();
    // Conflicting bindings: the same sessions bound on each side of the cut, to different workers.
    const conflicts = Array.from({ length: o.conflicts }, (_, i) => `conflict-${i}`);
    let conflictErrors = 0;
    for (const [i, s] of conflicts.entries()) {
      for (const [r, w] of [[a, 1], [b, 2]] as const) {
        const sel = `cf-${r.name}-${i}`;
        const res = await httpCall(r, "POST", "/select_and_reserve", { token_ids: CONFLICT_PROBE_TOKENS, session_id: s, selection_id: sel, allowed_worker_ids: [w] });
        const got = /"worker_id":(\d+)/.exec(res.text)?.[1];
        if (res.status !== 200 || got !== String(w)) conflictErrors++;
        if ((await httpCall(r, "DELETE", `/reservations/${sel}`)).status !== 200) conflictErrors++;
      }
    }
    const probe = (): readonly number[] => CONFLICT_PROBE_TOKENS;
    // Both sides hold their own version while cut off from each other.
    const splitSeen = (await bindingDisagreements([a, b], conflicts, probe)).length;
    await sleep(Math.max(0, o.cutMs - (performance.now() - cutAt)));
    const failuresDuringCut = load.report().failures;

    topo.heal();
    const healedAt = performance.now();
    const loadsMatch = recentLoadsMatcher(rs);
    let convergeMs: number | null = null;
    try {
      convergeMs = await timeUntil(
        async () => (await meshLive(rs)) && (await loadsMatch()) && (await bindingDisagreements(rs, conflicts, probe)).length === 0,
        CONVERGE_TIMEOUT_MS,
        "loads and bindings to converge after the heal",
        healedAt,
      );
    } catch {
      // null below
    }
    await sleep(o.afterMs);
    const l = await load.stop();
    const idleMs = await idleConvergence(rs);
    const conflictAnswers = await Promise.all(conflicts.map(async (s) => (await bindingDisagreements(rs, [s], probe)).length === 0));
    const disagreeing = [...(await bindingDisagreements(rs, load.routedSessions(), (s) => (load as MeshLoad).workload.probeTokens(s))), ...(await bindingDisagreements(rs, conflicts, probe))];
    const loadDiff = await loadDivergence(rs);
    const d = counterDelta(await fleetCounters(rs), before);
    const winners = await Promise.all(
      conflicts.map(async (s) => /"worker_id":(\d+)/.exec((await httpCall(a, "POST", "/select", { token_ids: CONFLICT_PROBE_TOKENS, session_id: s })).text)?.[1] ?? "?"),
    );
    return {
      scenario: name,
      requests: l.sent,
      failures: l.failures,
      convergeMs,
      shed: d.shed,
      gaps: d.gaps,
      snapshots: d.snapshotsInstalled,
      divergence: disagreeing.length + loadDiff,
      checks: [
        ...loadChecks(l),
        check("both sides routed during the cut", failuresDuringCut === 0 && conflictErrors === 0, { failuresDuringCut, conflictErrors }),
        check("the cut really split the bindings", splitSeen === conflicts.length, `${splitSeen} of ${conflicts.length} differed across the cut`),
        check("loads and bindings converged after the heal, no manual step", convergeMs !== null, convergeMs === null ? "never" : `${convergeMs.toFixed(0)} ms`),
        check("every conflicting session resolved the same way everywhere", conflictAnswers.every(Boolean), winners.join(",")),
        check("no divergence after the load stops", disagreeing.length + loadDiff === 0 && idleMs !== null, { sessions: disagreeing.slice(0, 3), workers: loadDiff }),
      ],
      details: { load: l, splitSeen, conflictWinners: winners, idleConvergeMs: idleMs, mesh: d, topology: { left: topo.left, right: topo.right, net: topo.leftMeshIp } },
    };
  } finally {
    await load?.stop(1_000);
    await Promise.all(rs.map((r) => stopReplica(r)));
    topo.destroy();
  }
}
