/**
 * N `kvmesh serve` processes on loopback, meshed or each alone: the fleet harness `kvmesh bench`,
 * `kvmesh demo`, bench:mesh and bench:host route through. Each replica is a real process
 * (serve-process.ts); the fleet allocates the mesh ports, waits until every replica sees every
 * other alive and live, registers mock workers, and stops them all.
 */
import { mapLimited } from "./bounded.js";
import { freePortPair } from "./ports.js";
import { RouterClient } from "./router-client.js";
import { DEFAULT_SERVE_START_TIMEOUT_MS, DEFAULT_SERVE_STOP_GRACE_MS, spawnServe, stopAll, type ServeProcess } from "./serve-process.js";

/** A replica that has not logged "listening" in this long failed to start (tsx compile ~2 s here). */
export const DEFAULT_REPLICA_STARTUP_TIMEOUT_MS = DEFAULT_SERVE_START_TIMEOUT_MS;
/** Peers alive and live within this long of start, or the mesh failed to form. */
export const DEFAULT_MESH_READY_TIMEOUT_MS = 20_000;
/** SIGTERM, then SIGKILL this long later. */
export const REPLICA_STOP_GRACE_MS = DEFAULT_SERVE_STOP_GRACE_MS;
/** Worker registrations in flight per replica: POST /workers is cheap, 16 keeps a replica busy without queueing. */
export const DEFAULT_REGISTER_CONCURRENCY = 16;
const MESH_POLL_MS = 100;

export interface ReplicaFleetOptions {
  readonly replicas: number;
  /** Join the replicas into one mesh (each gets --replica-sync-port and the others as --peers). */
  readonly mesh: boolean;
  /**
   * With `mesh`, false gives each replica its mesh ports but no peers: the same processes, each
   * publishing to nobody (a baseline that isolates what mirroring costs). Default true.
   */
  readonly peer?: boolean;
  /** Extra `serve` flags for every replica. */
  readonly serveArgs?: readonly string[];
  /** Extra `serve` flags for replica `index` only (after serveArgs). */
  readonly serveArgsOf?: (index: number) => readonly string[];
  /** Node flags for every replica, e.g. ["--cpu-prof", "--cpu-prof-dir=DIR"]. */
  readonly nodeArgs?: readonly string[];
  /** The keep-alive client each replica gets (sockets, request timeout). */
  readonly client?: { readonly sockets?: number; readonly timeoutMs?: number };
  readonly startTimeoutMs?: number;
  readonly stopGraceMs?: number;
  /** Stderr, and warnings and errors the replicas log (pino level >= 40), one line each. */
  readonly onLog?: (replica: number, line: string) => void;
}

export interface Replica {
  readonly index: number;
  readonly pid: number;
  readonly port: number;
  readonly syncPort: number | null;
  readonly client: RouterClient;
}

interface PeerRow {
  state: string;
  sync: string | null;
}

/**
 * Resolves once every replica lists every other one as a peer that is alive and live; rejects,
 * with what each saw, after `timeoutMs`.
 */
export async function waitForMesh(clients: readonly RouterClient[], timeoutMs = DEFAULT_MESH_READY_TIMEOUT_MS): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  const n = clients.length;
  for (;;) {
    const views = await Promise.all(clients.map(async (c) => JSON.parse(await c.ok("GET", "/replica_sync/status")) as PeerRow[]));
    if (views.every((v) => v.length === n - 1 && v.every((p) => p.state === "alive" && p.sync === "live"))) return;
    if (performance.now() > deadline) throw new Error(`mesh not formed after ${timeoutMs} ms: ${JSON.stringify(views)}`);
    await new Promise((r) => setTimeout(r, MESH_POLL_MS));
  }
}

/** Registers workers 1..count (mock endpoints, no KV events) on one replica, `concurrency` at a time. */
export async function registerWorkers(client: RouterClient, count: number, blockSize: number, concurrency = DEFAULT_REGISTER_CONCURRENCY): Promise<void> {
  const ids = Array.from({ length: count }, (_, i) => i + 1);
  await mapLimited(ids, concurrency, async (w) => {
    await client.ok("POST", "/workers", JSON.stringify({ worker_id: w, endpoint: `http://w${String(w)}`, block_size: blockSize }));
  });
}

export class ReplicaFleet {
  readonly replicas: readonly Replica[];
  readonly #processes: readonly ServeProcess[];
  readonly #stopGraceMs: number;

  private constructor(replicas: Replica[], processes: ServeProcess[], stopGraceMs: number) {
    this.replicas = replicas;
    this.#processes = processes;
    this.#stopGraceMs = stopGraceMs;
  }

  static async start(opts: ReplicaFleetOptions): Promise<ReplicaFleet> {
    const syncPorts: (number | null)[] = [];
    for (let i = 0; i < opts.replicas; i++) syncPorts.push(opts.mesh ? await freePortPair() : null);
    const stopGraceMs = opts.stopGraceMs ?? REPLICA_STOP_GRACE_MS;
    const started = await Promise.allSettled(
      syncPorts.map((syncPort, i) => {
        const args = [...(opts.serveArgs ?? []), ...(opts.serveArgsOf?.(i) ?? [])];
        if (syncPort !== null) {
          args.push("--replica-sync-port", String(syncPort));
          const peers = syncPorts.filter((p, k) => k !== i && p !== null).map((p) => `tcp://127.0.0.1:${String(p)}`);
          if (peers.length > 0 && opts.peer !== false) args.push("--peers", peers.join(","));
        }
        const onLog = opts.onLog;
        return spawnServe({
          label: `replica ${String(i)}`,
          args,
          startTimeoutMs: opts.startTimeoutMs ?? DEFAULT_REPLICA_STARTUP_TIMEOUT_MS,
          ...(opts.nodeArgs === undefined ? {} : { nodeArgs: opts.nodeArgs }),
          ...(onLog === undefined ? {} : { onLine: (line: string) => { onLog(i, line); } }),
        });
      }),
    );
    const processes = started.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
    const failed = started.find((s): s is PromiseRejectedResult => s.status === "rejected");
    if (failed !== undefined) {
      await stopAll(processes.map((p) => p.child), stopGraceMs);
      throw failed.reason;
    }
    const replicas = processes.map((p, index) => ({ index, pid: p.pid, port: p.port, syncPort: syncPorts[index] ?? null, client: new RouterClient(p.port, opts.client) }));
    const fleet = new ReplicaFleet(replicas, processes, stopGraceMs);
    try {
      if (opts.mesh && opts.peer !== false && opts.replicas > 1) await waitForMesh(fleet.clients());
    } catch (err) {
      await fleet.stop();
      throw err;
    }
    return fleet;
  }

  clients(): RouterClient[] {
    return this.replicas.map((r) => r.client);
  }

  /** The replicas' process ids (for CPU and memory sampling from /proc). */
  pids(): number[] {
    return this.replicas.map((r) => r.pid);
  }

  /** Workers 1..count registered on every replica, each on its own. */
  async registerWorkers(count: number, blockSize: number, concurrency = DEFAULT_REGISTER_CONCURRENCY): Promise<void> {
    await Promise.all(this.replicas.map((r) => registerWorkers(r.client, count, blockSize, concurrency)));
  }

  async stop(): Promise<void> {
    for (const r of this.replicas) r.client.close();
    await stopAll(
      this.#processes.map((p) => p.child),
      this.#stopGraceMs,
    );
  }
}
