/**
 * How the bench driver picks a worker for each request. kvmesh policies ask a replica, as a
 * frontend would (select_and_reserve, then prefill_complete and free); the baselines pick without
 * a router. All answer a worker *index* into the engine fleet's descriptors.
 */
import type { Random } from "../core/index.js";
import type { RouterClient } from "./router-client.js";

export type PolicyName = "kvmesh" | "unmeshed" | "round-robin" | "random";
export const POLICY_NAMES: readonly PolicyName[] = ["kvmesh", "unmeshed", "round-robin", "random"];

export interface RouteRequest {
  readonly requestId: string;
  readonly tokens: Uint32Array;
  readonly sessionId?: string | undefined;
}

export interface RouteDecision {
  readonly worker: number;
  /** The replica asked (-1 for the baselines). */
  readonly replica: number;
  /** The booking to release (undefined for the baselines). */
  readonly selectionId?: string;
  /** Round trip of the routing call, ms (0 for the baselines). */
  readonly selectMs: number;
}

export interface RoutingPolicy {
  route(req: RouteRequest): Promise<RouteDecision>;
  prefillDone(d: RouteDecision): Promise<void>;
  finished(d: RouteDecision): Promise<void>;
}

/** Engines are registered as (worker_id, dp_rank); the driver addresses them by index. */
export type WorkerIndex = ReadonlyMap<string, number>;
export const workerKey = (workerId: bigint | string, dpRank: number): string => `${String(workerId)}:${String(dpRank)}`;

// The daemon prints worker_id as a bare JSON integer; ids here are small, but a regex keeps
// full u64 precision anyway and costs ~1 us against ~60 us for parsing the whole answer.
const WORKER_ID_RE = /"worker_id":(\d+)/;
const DP_RANK_RE = /"dp_rank":(\d+)/;

export class KvmeshPolicy implements RoutingPolicy {
  readonly #replicas: readonly RouterClient[];
  readonly #workers: WorkerIndex;
  readonly #pick: (n: number) => number;
  readonly #delayMs: number;

  /**
   * `pick` chooses the replica for each request (round-robin by default), as a load balancer would.
   * `delayMs` (default 0) is added to every lifecycle call, as a network round trip would: the
   * select answer reaches the frontend that much later (and selectMs includes it), and
   * prefill_complete and free reach the router that much later, so bookings live longer.
   */
  constructor(replicas: readonly RouterClient[], workers: WorkerIndex, pick?: (n: number) => number, delayMs = 0) {
    if (replicas.length === 0) throw new Error("KvmeshPolicy needs at least one replica");
    this.#replicas = replicas;
    this.#workers = workers;
    this.#delayMs = delayMs;
    let next = 0;
    this.#pick = pick ?? ((n) => next++ % n);
  }

  async route(req: RouteRequest): Promise<RouteDecision> {
    const replica = this.#pick(this.#replicas.length);
    const client = this.#replicas[replica] as RouterClient;
    const session = req.sessionId === undefined ? "" : `,"session_id":${JSON.stringify(req.sessionId)}`;
    const body = `{"token_ids":[${req.tokens.join(",")}],"selection_id":${JSON.stringify(req.requestId)}${session}}`;
    const t0 = performance.now();
    const res = await client.send("POST", "/select_and_reserve", body);
    if (this.#delayMs > 0) await sleep(this.#delayMs);
    const selectMs = performance.now() - t0;
    if (res.status !== 200) throw new Error(`select_and_reserve on replica ${String(replica)}: ${String(res.status)} ${res.text.slice(0, 200)}`);
    const id = WORKER_ID_RE.exec(res.text)?.[1];
    const rank = DP_RANK_RE.exec(res.text)?.[1];
    const worker = id === undefined ? undefined : this.#workers.get(workerKey(id, Number(rank ?? 0)));
    if (worker === undefined) throw new Error(`select_and_reserve on replica ${String(replica)} chose an unknown worker: ${res.text.slice(0, 200)}`);
    return { worker, replica, selectionId: req.requestId, selectMs };
  }

  async prefillDone(d: RouteDecision): Promise<void> {
    if (d.selectionId === undefined) return;
    if (this.#delayMs > 0) await sleep(this.#delayMs);
    await (this.#replicas[d.replica] as RouterClient).ok("POST", `/reservations/${encodeURIComponent(d.selectionId)}/prefill_complete`);
  }

  async finished(d: RouteDecision): Promise<void> {
    if (d.selectionId === undefined) return;
    if (this.#delayMs > 0) await sleep(this.#delayMs);
    await (this.#replicas[d.replica] as RouterClient).ok("DELETE", `/reservations/${encodeURIComponent(d.selectionId)}`);
  }
}

export class RoundRobinPolicy implements RoutingPolicy {
  readonly #workers: number;
  #next = 0;
  constructor(workers: number) {
    this.#workers = workers;
  }
  route(): Promise<RouteDecision> {
    return Promise.resolve({ worker: this.#next++ % this.#workers, replica: -1, selectMs: 0 });
  }
  prefillDone(): Promise<void> {
    return Promise.resolve();
  }
  finished(): Promise<void> {
    return Promise.resolve();
  }
}

export class RandomPolicy implements RoutingPolicy {
  readonly #workers: number;
  readonly #random: Random;
  constructor(workers: number, random: Random) {
    this.#workers = workers;
    this.#random = random;
  }
  route(): Promise<RouteDecision> {
    return Promise.resolve({ worker: Math.floor(this.#random.next() * this.#workers), replica: -1, selectMs: 0 });
  }
  prefillDone(): Promise<void> {
    return Promise.resolve();
  }
  finished(): Promise<void> {
    return Promise.resolve();
  }
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
