/**
 * Fault scenario 9 (#29): the hostile inputs of issue 29 against a real mesh (three replica
 * processes), while a prober calls every replica's /health:
 * - G1: a worker with 4,097 taints (one past the bound the mesh decoder shares) is refused 400;
 * - G2: a booking with 140,000 precomputed hashes (past 131,072) is refused 400;
 * - G3: a session binding at sequence 2^64-1, sent by a rogue peer (a fake origin speaking the
 *   mesh protocol; a meshed daemon takes no POST /session_bindings), is refused where it enters;
 * - G6: a new worker, 10 identical re-registrations and 20 PATCHes of it pull no snapshot anywhere;
 * - G9: 2,000 pipelined `GET /loads` on one socket that is never read: the connection is cut, counted;
 * - G10: 200 idle sockets from one client: those past --max-connections-per-client are refused, counted.
 * Then the replicas must agree (catalogue, loads, every session's binding), each refusal must be
 * counted in /metrics, /health must have answered throughout, and each replica's RSS stays bounded.
 */
import { connect, type Socket } from "node:net";
import { freePortPair } from "../../src/bench/ports.js";
import { systemWallClock } from "../../src/core/index.js";
import { FakeOrigin } from "./fake-origin.js";
import { check, figureMs, idleConvergence, loadDivergence, MESH_UP_TIMEOUT_MS, SCENARIO_BLOCK_SIZE, type ScenarioRow } from "./fault-scenarios.js";
import {
  bindingDisagreements,
  DEFAULT_REPLICA_ARGS,
  httpCall,
  meshLive,
  metricSum,
  registerWorkers,
  rssOf,
  sleep,
  startReplica,
  stopReplica,
  timeUntil,
  type Replica,
} from "./replica-cluster.js";

export interface HostileMeshOptions {
  readonly replicas: number;
  /** Sessions bound before and after the hostile calls (their bindings must agree everywhere). */
  readonly sessions: number;
  /** Identical re-registrations and PATCHes of one worker (G6). */
  readonly reRegistrations: number;
  readonly patches: number;
  /** Pipelined requests written on the unread socket (G9). */
  readonly pipelined: number;
  /** Idle sockets opened from one client address (G10). */
  readonly idleSockets: number;
}

export const HOSTILE_MESH_SHORT: HostileMeshOptions = { replicas: 3, sessions: 12, reRegistrations: 10, patches: 20, pipelined: 2_000, idleSockets: 200 };
export const HOSTILE_MESH_LONG: HostileMeshOptions = { replicas: 3, sessions: 48, reRegistrations: 50, patches: 100, pipelined: 20_000, idleSockets: 600 };

/** --max-connections and --max-connections-per-client of every replica here (G10 is measured against them). */
const MAX_CONNECTIONS = 256;
const MAX_CONNECTIONS_PER_CLIENT = 64;
/** The address the G10 sockets come from, so the prober (127.0.0.1) is another client. */
const FLOOD_CLIENT_ADDRESS = "127.0.0.3";
const WORKERS = 4;
/** The worker G6 registers, re-registers and patches. */
const G6_WORKER = 100;
/** One past the shared bounds (src/core/limits.ts): 4,096 entries per list, 131,072 hashes per booking. */
const TAINTS = 4_097;
const HASHES = 140_000;
const U64_MAX = (1n << 64n) - 1n;
const HEALTH_PROBE_INTERVAL_MS = 100;
/** Target for the slowest /health while the hostile calls run (a reported figure, not a check). */
const MAX_HEALTH_MS = 1_000;
/** RSS the scenario may add to any replica. */
const MAX_RSS_GROWTH_BYTES = 128 * 1024 * 1024;
/** How long the G9/G10 sockets are held before they are counted. */
const HOLD_MS = 1_500;
/** The rogue peer's origin and epoch (G3). */
const ROGUE_ORIGIN = 0x0bad_0bad_0bad_0badn;
const ROGUE_EPOCH = 0x1234n;

const tokensOf = (s: string): number[] => Array.from({ length: 4 * SCENARIO_BLOCK_SIZE }, (_, i) => (s.length * 7_919 + s.charCodeAt(s.length - 1) * 131 + i) % 50_000);

export async function scenarioHostileMesh(o: HostileMeshOptions = HOSTILE_MESH_SHORT): Promise<ScenarioRow> {
  const replicas: Replica[] = [];
  const sockets: Socket[] = [];
  let rogue: FakeOrigin | undefined;
  let probing = true;
  const health = { calls: 0, failures: 0, slowestMs: 0 };
  const rssMax = new Map<string, number>();
  try {
    const args = [...DEFAULT_REPLICA_ARGS, "--max-connections", String(MAX_CONNECTIONS), "--max-connections-per-client", String(MAX_CONNECTIONS_PER_CLIENT), "--load-replication", "aggregate"];
    for (let i = 0; i < o.replicas; i++) {
      replicas.push(await startReplica({ name: String.fromCharCode(65 + i), syncPort: await freePortPair(), peers: replicas.map((r) => r.syncEndpoint), args }));
    }
    await timeUntil(() => meshLive(replicas), MESH_UP_TIMEOUT_MS, "the mesh to come up");
    await registerWorkers(replicas[0] as Replica, WORKERS, SCENARIO_BLOCK_SIZE);
    await timeUntil(async () => (await Promise.all(replicas.map(schedulable))).every((n) => n === WORKERS), MESH_UP_TIMEOUT_MS, "every replica to hold the workers");
    const [a, b] = replicas as [Replica, Replica, ...Replica[]];
    const rssBefore = new Map(replicas.map((r) => [r.name, rssOf(r.pid)]));
    const prober = (async () => {
      while (probing) {
        await Promise.all(
          replicas.map(async (r) => {
            const t0 = performance.now();
            const ok = await httpCall(r, "GET", "/health", undefined, 5_000).then((x) => x.status === 200, () => false);
            health.calls++;
            if (!ok) health.failures++;
            health.slowestMs = Math.max(health.slowestMs, performance.now() - t0);
            rssMax.set(r.name, Math.max(rssMax.get(r.name) ?? 0, rssOf(r.pid)));
          }),
        );
        await sleep(HEALTH_PROBE_INTERVAL_MS);
      }
    })();
    const sessions = Array.from({ length: o.sessions }, (_, i) => `hostile-mesh-${i}`);
    for (const [i, s] of sessions.entries()) await httpCall(replicas[i % replicas.length] as Replica, "POST", "/select_and_reserve", { token_ids: tokensOf(s), session_id: s, selection_id: `bind-${s}` });
    const metricsBefore = await Promise.all(replicas.map((r) => httpCall(r, "GET", "/metrics").then((x) => x.text)));

    // G1
    const g1 = await httpCall(a, "POST", "/workers", { worker_id: 50, endpoint: "http://w50", block_size: SCENARIO_BLOCK_SIZE, taints: Array.from({ length: TAINTS }, (_, i) => `t${i}`) });
    // G2
    const hashes = Array.from({ length: HASHES }, (_, i) => i + 1);
    const g2 = await httpCall(b, "POST", "/select_and_reserve", { block_hashes: hashes, sequence_hashes: hashes, isl_tokens: HASHES * SCENARIO_BLOCK_SIZE, selection_id: "g2-huge" });
    // G3: a rogue peer binds a session at the top of the u64 range.
    rogue = await FakeOrigin.bind({ port: await freePortPair(), wallClock: systemWallClock, origin: ROGUE_ORIGIN, epoch: ROGUE_EPOCH, bookings: { snapshotBookings: () => [], live: 0 } });
    const rogueEndpoint = rogue.publishEndpoint;
    await httpCall(a, "POST", "/replica_sync/register_peer", { endpoint: rogueEndpoint });
    await timeUntil(async () => (await httpCall(a, "GET", "/replica_sync/status")).text.includes(`"sync":"live"`) && (await peerLive(a, rogueEndpoint)), MESH_UP_TIMEOUT_MS, "the rogue peer to be live at A");
    rogue.publish([{ kind: "binding", event: { model_name: "default", routing_group: "default", session_id: sessions[0] ?? "s", worker_id: 1n, dp_rank: 0, sequence: U64_MAX, writer_id: ROGUE_ORIGIN, reason: "bind" } }]);
    await sleep(500);
    // G6
    const snapshotsServed = async (): Promise<number> => (await Promise.all(replicas.map((r) => httpCall(r, "GET", "/metrics")))).reduce((n, x) => n + metricSum(x.text, "kvmesh_mesh_snapshots_served_total"), 0);
    const served0 = await snapshotsServed();
    const g6Worker = { worker_id: G6_WORKER, endpoint: `http://w${G6_WORKER}`, block_size: SCENARIO_BLOCK_SIZE };
    const g6Statuses: number[] = [];
    g6Statuses.push((await httpCall(a, "POST", "/workers", g6Worker)).status);
    for (let i = 0; i < o.reRegistrations; i++) g6Statuses.push((await httpCall(replicas[i % replicas.length] as Replica, "POST", "/workers", g6Worker)).status);
    for (let i = 0; i < o.patches; i++) g6Statuses.push((await httpCall(replicas[i % replicas.length] as Replica, "PATCH", `/workers/${G6_WORKER}`, { endpoint: `http://w${G6_WORKER}-${i}` })).status);
    await sleep(500);
    const g6Pulls = (await snapshotsServed()) - served0;
    // G9: pipelined reads nobody reads.
    const g9 = connect({ host: "127.0.0.1", port: a.port });
    sockets.push(g9);
    g9.on("error", () => undefined);
    g9.pause();
    await new Promise<void>((resolve) => g9.once("connect", () => { resolve(); }));
    g9.write("GET /loads HTTP/1.1\r\nHost: x\r\n\r\n".repeat(o.pipelined));
    // G10: idle sockets from one client.
    for (let i = 0; i < o.idleSockets; i++) {
      const s = connect({ host: "127.0.0.1", port: b.port, localAddress: FLOOD_CLIENT_ADDRESS });
      s.on("error", () => undefined);
      sockets.push(s);
    }
    await sleep(HOLD_MS);
    const metricsAfter = await Promise.all(replicas.map((r) => httpCall(r, "GET", "/metrics").then((x) => x.text)));
    for (const s of sockets) s.destroy();

    // Agreement, after the hostile calls: catalogue, loads, bindings.
    for (const [i, s] of sessions.entries()) await httpCall(replicas[(i + 1) % replicas.length] as Replica, "DELETE", `/reservations/bind-${s}`).catch(() => undefined);
    const convergeMs = await idleConvergence(replicas);
    const loadsDiverged = await loadDivergence(replicas);
    const catalogues = await Promise.all(replicas.map(catalogueKey));
    const cataloguesDiverged = new Set(catalogues).size - 1;
    const bindings = await bindingDisagreements(replicas, sessions, tokensOf);
    probing = false;
    await prober;

    const delta = (name: string, i = -1): number =>
      i >= 0 ? metricSum(metricsAfter[i] ?? "", name) - metricSum(metricsBefore[i] ?? "", name) : metricsAfter.reduce((n, t, j) => n + metricSum(t, name) - metricSum(metricsBefore[j] ?? "", name), 0);
    const badRequests = metricsAfter.reduce((n, t, j) => n + statusCount(t, "400") - statusCount(metricsBefore[j] ?? "", "400"), 0);
    const versionsRefused = delta("kvmesh_versions_refused_total");
    const pipelineCut = delta("kvmesh_http_pipeline_overflow_total");
    const connectionsRefused = delta("kvmesh_http_connections_refused_total");
    const rssGrowth = Math.max(...replicas.map((r) => (rssMax.get(r.name) ?? 0) - (rssBefore.get(r.name) ?? 0)));
    const divergence = loadsDiverged + cataloguesDiverged + bindings.length;
    const rss = replicas.map((r) => `${r.name} ${((rssBefore.get(r.name) ?? 0) / 2 ** 20).toFixed(0)} -> max ${((rssMax.get(r.name) ?? 0) / 2 ** 20).toFixed(0)} MiB`).join(", ");
    const summary =
      `G1 ${g1.status}, G2 ${g2.status}, G3 refused ${versionsRefused}, G6 ${g6Pulls} snapshot pulls for ${g6Statuses.length} catalogue calls, G9 cut ${pipelineCut}, G10 refused ${connectionsRefused} of ${o.idleSockets}; ` +
      `400s counted ${badRequests}, versions refused ${versionsRefused}; /health ${health.calls} calls, ${health.failures} failed, slowest ${health.slowestMs.toFixed(0)} ms; RSS ${rss}; ` +
      `divergence: loads ${loadsDiverged}, catalogues ${cataloguesDiverged}, bindings ${bindings.length}`;
    return {
      scenario: "9. hostile inputs, meshed",
      requests: health.calls + o.sessions * 2 + g6Statuses.length + 3,
      failures: health.failures,
      convergeMs,
      shed: 0,
      gaps: 0,
      snapshots: g6Pulls,
      divergence,
      checks: [
        check("G1: a worker past the list bound is refused 400", g1.status === 400, g1.status),
        check("G2: a booking past the hash bound is refused 400", g2.status === 400, g2.status),
        check("G1, G2: both refusals counted (kvmesh_http_requests_total, status 400)", badRequests >= 2, badRequests),
        check("G3: a peer's binding at sequence 2^64-1 is refused where it enters, and counted", versionsRefused >= 1, versionsRefused),
        check("G6: no catalogue call failed", g6Statuses.every((s) => s === 200 || s === 201), g6Statuses.filter((s) => s !== 200 && s !== 201)),
        check("G6: no snapshot pulled for a new worker, identical re-registrations and PATCHes", g6Pulls === 0, g6Pulls),
        check("G9: the unread pipelining connection is cut, and counted", pipelineCut >= 1, pipelineCut),
        check(`G10: sockets past --max-connections-per-client (${MAX_CONNECTIONS_PER_CLIENT}) are refused, and counted`, connectionsRefused >= o.idleSockets - MAX_CONNECTIONS_PER_CLIENT, connectionsRefused),
        check("/health answered throughout", health.failures === 0 && health.calls > 0, { calls: health.calls, failures: health.failures }),
        check(`RSS grew less than ${MAX_RSS_GROWTH_BYTES / 2 ** 20} MiB on every replica`, rssGrowth < MAX_RSS_GROWTH_BYTES, `${(rssGrowth / 2 ** 20).toFixed(1)} MiB`),
        check("the replicas agree (catalogue, loads, bindings)", divergence === 0 && convergeMs !== null, { loadsDiverged, cataloguesDiverged, bindings: bindings.slice(0, 3) }),
      ],
      figures: [figureMs("slowest /health while the hostile calls ran", health.calls === 0 ? null : health.slowestMs, MAX_HEALTH_MS)],
      details: { summary, g6Pulls, rssBefore: Object.fromEntries(rssBefore), rssMax: Object.fromEntries(rssMax), health },
    };
  } finally {
    probing = false;
    for (const s of sockets) s.destroy();
    await rogue?.close();
    await Promise.all(replicas.map((r) => stopReplica(r)));
  }
}

async function peerLive(r: Replica, endpoint: string): Promise<boolean> {
  const rows = JSON.parse((await httpCall(r, "GET", "/replica_sync/status")).text) as { endpoint: string; sync: string | null }[];
  return rows.some((p) => p.endpoint === endpoint && p.sync === "live");
}

/** Workers in the replica's catalogue. */
async function schedulable(r: Replica): Promise<number> {
  const res = await httpCall(r, "GET", "/workers");
  return new Set([...res.text.matchAll(/"worker_id":(\d+)/g)].map((m) => m[1])).size;
}

/** The catalogue as a comparable string (ids, endpoints, lifecycles). */
async function catalogueKey(r: Replica): Promise<string> {
  const res = await httpCall(r, "GET", "/workers");
  const ids = [...res.text.matchAll(/"worker_id":(\d+)[^}]*?"endpoint":"([^"]*)"/g)].map((m) => `${m[1]}=${m[2]}`);
  return ids.sort().join(",");
}

/** kvmesh_http_requests_total summed over routes for one status. */
function statusCount(text: string, status: string): number {
  let n = 0;
  const re = new RegExp(`^kvmesh_http_requests_total\\{[^}]*status="${status}"[^}]*\\} (\\S+)$`, "gm");
  for (const m of text.matchAll(re)) n += Number(m[1]);
  return n;
}
