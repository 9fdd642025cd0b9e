/**
 * N `kvmesh serve` processes on loopback, meshed or each alone: what `kvmesh bench` and
 * `kvmesh demo` route through. Real processes (not in-process daemons) so replicas contend for the
 * cores and talk over real sockets exactly as a deployment does.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { createServer } from "node:net";
import { fileURLToPath } from "node:url";
import { waitForListening } from "./listening.js";
import { RouterClient } from "./router-client.js";

/** A replica that has not logged "listening" in this long failed to start (tsx compile ~2 s here). */
export const DEFAULT_REPLICA_STARTUP_TIMEOUT_MS = 30_000;
/** Peers alive and live within this long of start, or the mesh failed to form. */
export const DEFAULT_MESH_READY_TIMEOUT_MS = 20_000;
/** SIGTERM, then SIGKILL this long later. */
export const REPLICA_STOP_GRACE_MS = 3_000;
const MESH_POLL_MS = 100;

export interface ReplicaFleetOptions {
  readonly replicas: number;
  /** Join the replicas into one mesh (each gets --replica-sync-port and the others as --peers). */
  readonly mesh: boolean;
  /** Extra `serve` flags for every replica. */
  readonly serveArgs?: readonly string[];
  /** Warnings and errors the replicas log (pino level >= 40), one line each. */
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

/** The CLI entry point beside this file: cli/main.ts through tsx from source, dist/cli/main.js when built. */
function cliCommand(): string[] {
  const fromSource = import.meta.url.endsWith(".ts");
  const main = fileURLToPath(new URL(`../../cli/main.${fromSource ? "ts" : "js"}`, import.meta.url));
  return fromSource ? ["--import", "tsx", main] : [main];
}

function listenOnce(port: number): Promise<number | null> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once("error", () => {
      resolve(null);
    });
    s.listen(port, "127.0.0.1", () => {
      const addr = s.address();
      const got = typeof addr === "object" && addr !== null ? addr.port : null;
      s.close(() => {
        resolve(got);
      });
    });
  });
}

/** A port p with p and p + 1 free right now (the mesh's control port is its sync port + 1). */
export async function freePortPair(): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const p = await listenOnce(0);
    if (p !== null && p < 65_535 && (await listenOnce(p + 1)) !== null) return p;
  }
  throw new Error("no free loopback port pair found");
}

export class ReplicaFleet {
  readonly replicas: readonly Replica[];
  readonly #children: readonly ChildProcess[];

  private constructor(replicas: Replica[], children: ChildProcess[]) {
    this.replicas = replicas;
    this.#children = children;
  }

  static async start(opts: ReplicaFleetOptions): Promise<ReplicaFleet> {
    const syncPorts: (number | null)[] = [];
    for (let i = 0; i < opts.replicas; i++) syncPorts.push(opts.mesh ? await freePortPair() : null);
    const children: ChildProcess[] = [];
    try {
      const replicas = await Promise.all(
        syncPorts.map((syncPort, i) => {
          const args = ["serve", "--port", "0", "--log-level", "info", ...(opts.serveArgs ?? [])];
          if (syncPort !== null) {
            args.push("--replica-sync-port", String(syncPort));
            const peers = syncPorts.filter((p, k) => k !== i && p !== null).map((p) => `tcp://127.0.0.1:${String(p)}`);
            if (peers.length > 0) args.push("--peers", peers.join(","));
          }
          const child = spawn(process.execPath, [...cliCommand(), ...args], { stdio: ["ignore", "pipe", "pipe"] });
          children.push(child);
          return waitListening(child, i, syncPort, opts.onLog);
        }),
      );
      const fleet = new ReplicaFleet(replicas, children);
      if (opts.mesh && opts.replicas > 1) await fleet.#waitForMesh();
      return fleet;
    } catch (err) {
      await stopAll(children);
      throw err;
    }
  }

  async #waitForMesh(): Promise<void> {
    const deadline = performance.now() + DEFAULT_MESH_READY_TIMEOUT_MS;
    const n = this.replicas.length;
    for (;;) {
      const views = await Promise.all(this.replicas.map(async (r) => JSON.parse(await r.client.ok("GET", "/replica_sync/peers")) as PeerRow[]));
      if (views.every((v) => v.length === n - 1 && v.every((p) => p.state === "alive" && p.sync === "live"))) return;
      if (performance.now() > deadline) throw new Error(`mesh not formed after ${DEFAULT_MESH_READY_TIMEOUT_MS} ms: ${JSON.stringify(views)}`);
      await new Promise((r) => setTimeout(r, MESH_POLL_MS));
    }
  }

  /** The replicas' process ids (for CPU and memory sampling from /proc). */
  pids(): number[] {
    return this.replicas.map((r) => r.pid);
  }

  async stop(): Promise<void> {
    for (const r of this.replicas) r.client.close();
    await stopAll(this.#children);
  }
}

async function waitListening(child: ChildProcess, index: number, syncPort: number | null, onLog?: (replica: number, line: string) => void): Promise<Replica> {
  child.stderr?.on("data", (d: Buffer) => {
    onLog?.(index, d.toString().trimEnd());
  });
  const port = await waitForListening(child, {
    label: `replica ${String(index)}`,
    timeoutMs: DEFAULT_REPLICA_STARTUP_TIMEOUT_MS,
    ...(onLog === undefined ? {} : { onLine: (line: string) => { onLog(index, line); } }),
  });
  if (child.pid === undefined) throw new Error(`replica ${String(index)} has no pid`);
  return { index, pid: child.pid, port, syncPort, client: new RouterClient(port) };
}

/** SIGTERM, then SIGKILL for any child still running `graceMs` later; resolves when all exited. */
export async function stopAll(children: readonly ChildProcess[], graceMs = REPLICA_STOP_GRACE_MS): Promise<void> {
  await Promise.all(
    children.map(
      (child) =>
        new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) {
            resolve();
            return;
          }
          const kill = setTimeout(() => child.kill("SIGKILL"), graceMs);
          child.once("exit", () => {
            clearTimeout(kill);
            resolve();
          });
          child.kill("SIGTERM");
        }),
    ),
  );
}
