/**
 * Issue 29's native abort at shutdown: a replica printed `terminate called after throwing an
 * instance of 'Napi::Error'` as it exited after a clean SIGTERM. zeromq.js (6.8) closes, at the
 * end of a worker thread's environment, every socket and observer still open there; one with a
 * receive pending then rejects it through N-API in an environment that is going away, the throw
 * has no JavaScript frame to land in, and the whole process aborts (exit 134). Reproduced in
 * isolation: a worker with a SUB and its observer each awaiting a receive aborts 3 times out of 3
 * on `worker.terminate()` or `process.exit()`; the same on the main thread does not.
 *
 * One round: a replica pair on loopback (mesh on), workers whose KV-event publishers live in this
 * process and publish without pause, selects at both replicas, then SIGTERM to one replica while
 * all of it runs. The round passes if that replica exits 0 and its stderr holds no native abort.
 * The other replica stays up across rounds, so each round also exercises the mesh's receive
 * thread of the stopping one with a live peer.
 *
 * Used by test/system/integration/shutdown-abort.test.ts (a few rounds) and
 * `npx tsx scripts/shutdown-loop.ts --rounds N` (many, under the shared lock).
 */
import { MockKvPublisher } from "../../src/mock/kv-event-publisher.js";
import { freePortPair } from "../../src/bench/ports.js";
import { httpCall, sleep, startReplica, stopReplica, type Replica } from "./replica-cluster.js";

export interface ShutdownAbortOptions {
  readonly rounds: number;
  /** Workers registered, each with `ranks` KV publishers (one SUB and observer per rank in each replica). */
  readonly workers: number;
  readonly ranks: number;
  /** How long events and selects flow before the SIGTERM, ms (a liveness window, not a speed target). */
  readonly busyMs: number;
}

export const SHUTDOWN_ABORT_SHORT: ShutdownAbortOptions = { rounds: 5, workers: 4, ranks: 2, busyMs: 1_500 };
export const SHUTDOWN_ABORT_LONG: ShutdownAbortOptions = { rounds: 30, workers: 4, ranks: 2, busyMs: 1_500 };

/** What a native abort leaves on stderr (libstdc++'s terminate handler, node-addon-api's error). */
export const NATIVE_ABORT_PATTERN = /terminate called|Napi::Error|Napi|FATAL ERROR|Aborted|core dumped/;
/** What a daemon logs when a thread had to be terminated (the last resort that risks the abort). */
export const THREAD_TERMINATED_PATTERN = /did not end by itself/;

export interface ShutdownRound {
  readonly round: number;
  readonly exitCode: number | string;
  /** Native-abort lines found in the stopped replica's stderr. */
  readonly abortLines: string[];
  /** Log lines saying a socket-owning thread had to be terminated (it did not end by itself). */
  readonly terminatedLines: string[];
  /** KV batches published during the round (across publishers). */
  readonly published: number;
}

export interface ShutdownAbortReport {
  readonly rounds: ShutdownRound[];
  readonly failures: number;
}

const BLOCK_SIZE = 16;

/** Every stderr line of a replica, kept whole (the abort is printed last, after the log tail). */
function stderrLines(r: Replica): string[] {
  const lines: string[] = [];
  r.child.stderr?.on("data", (chunk: Buffer) => {
    for (const l of chunk.toString("utf8").split("\n")) if (l.trim() !== "") lines.push(l);
  });
  return lines;
}

async function registerKvWorkers(r: Replica, pubs: readonly MockKvPublisher[][]): Promise<void> {
  for (const [i, ranks] of pubs.entries()) {
    const kv: Record<string, string> = {};
    const replay: Record<string, string> = {};
    for (const [rank, p] of ranks.entries()) {
      kv[String(rank)] = p.endpoint;
      if (p.replayEndpoint !== null) replay[String(rank)] = p.replayEndpoint;
    }
    const res = await httpCall(r, "POST", "/workers", {
      worker_id: i + 1,
      endpoint: `http://w${i + 1}`,
      block_size: BLOCK_SIZE,
      data_parallel_size: ranks.length,
      kv_events_endpoints: kv,
      replay_endpoints: replay,
    });
    if (res.status !== 201 && res.status !== 200) throw new Error(`POST /workers ${i + 1}: ${res.status} ${res.text}`);
  }
}

/** Publishes stored/removed batches on every publisher until `stop()` is called; returns how many. */
function publishUntilStopped(pubs: readonly MockKvPublisher[]): { stop: () => Promise<number> } {
  let running = true;
  let published = 0;
  const loops = pubs.map(async (p, i) => {
    let h = BigInt(i) << 40n;
    while (running) {
      const hashes = [h + 1n, h + 2n, h + 3n, h + 4n];
      h += 4n;
      try {
        // Every 50th batch is kept for replay only: gaps keep replays (a DEALER each) in flight.
        await p.publish([{ type: "stored", blockHashes: hashes, parentHash: null, tokenIds: Array.from({ length: 4 * BLOCK_SIZE }, (_, t) => t + i), blockSize: BLOCK_SIZE }], { deliver: published % 50 !== 49 });
        await p.publish([{ type: "removed", blockHashes: hashes.slice(2) }]);
        published += 2;
      } catch {
        return;
      }
      // A short pause: steady traffic without starving this process's HTTP probes.
      await sleep(2);
    }
  });
  return {
    stop: async () => {
      running = false;
      await Promise.all(loops);
      return published;
    },
  };
}

/** Selects against `r` until stopped (failures are expected while it shuts down). */
function selectUntilStopped(r: Replica): { stop: () => Promise<void> } {
  let running = true;
  const loop = (async () => {
    while (running) {
      await httpCall(r, "POST", "/select", { token_ids: Array.from({ length: 64 }, (_, t) => t) }, 2_000).catch(() => undefined);
      await sleep(5);
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
    },
  };
}

export async function runShutdownAbort(o: ShutdownAbortOptions, onRound: (r: ShutdownRound) => void = () => undefined): Promise<ShutdownAbortReport> {
  const pubs: MockKvPublisher[][] = [];
  let peer: Replica | undefined;
  let stopping: Replica | undefined;
  const rounds: ShutdownRound[] = [];
  try {
    for (let w = 0; w < o.workers; w++) {
      const ranks: MockKvPublisher[] = [];
      for (let r = 0; r < o.ranks; r++) ranks.push(await MockKvPublisher.create({ historySize: 1_000 }));
      pubs.push(ranks);
    }
    const portA = await freePortPair();
    const portB = await freePortPair();
    const args = ["--session-affinity-ttl-secs", "600"];
    peer = await startReplica({ name: "A", syncPort: portA, args });
    await registerKvWorkers(peer, pubs);
    for (let i = 1; i <= o.rounds; i++) {
      stopping = await startReplica({ name: "B", syncPort: portB, peers: [peer.syncEndpoint], args });
      const lines = stderrLines(stopping);
      // Registered at B too (idempotent when the mesh already brought them): B's ingest subscribes either way.
      await registerKvWorkers(stopping, pubs);
      const publishing = publishUntilStopped(pubs.flat());
      const selecting = [selectUntilStopped(peer), selectUntilStopped(stopping)];
      await sleep(o.busyMs);
      const exitCode = await stopReplica(stopping, "SIGTERM", 15_000);
      const published = await publishing.stop();
      await Promise.all(selecting.map((s) => s.stop()));
      // The last chunk of stderr can trail the exit event.
      await sleep(50);
      const abortLines = lines.filter((l) => NATIVE_ABORT_PATTERN.test(l));
      const terminatedLines = lines.filter((l) => THREAD_TERMINATED_PATTERN.test(l));
      const round: ShutdownRound = { round: i, exitCode: exitCode ?? "unknown", abortLines, terminatedLines, published };
      rounds.push(round);
      onRound(round);
      stopping = undefined;
    }
  } finally {
    await stopReplica(stopping);
    await stopReplica(peer);
    await Promise.all(pubs.flat().map((p) => p.close()));
  }
  return { rounds, failures: rounds.filter((r) => r.exitCode !== 0 || r.abortLines.length > 0 || r.terminatedLines.length > 0).length };
}
