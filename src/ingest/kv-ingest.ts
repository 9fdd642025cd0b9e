/**
 * Owns one KvEventListener per (worker, rank) and keeps them in step with worker registration.
 * Re-registering a worker with unchanged endpoints keeps its listeners (and so their seq cursors);
 * a rank whose endpoint changed gets a fresh listener and an onReset, because a new address means
 * a new engine instance whose blocks we have never seen.
 */
import type { Logger } from "pino";

import { FDS_PER_KV_RANK, kvRankBudget, processFdLimit } from "../util/fd-budget.js";
import type { KvEventBatch } from "./kv-event-decoder.js";
import { KvEventListener, type KvEventListenerStats, type KvFastPath } from "./kv-event-listener.js";
import type { PreparedKvBatch } from "./prepared-batch-codec.js";

export interface KvRankRef {
  readonly workerId: string;
  readonly rank: number;
}

export interface KvRankEndpoints {
  readonly rank: number;
  readonly endpoint: string;
  readonly replayEndpoint?: string | null;
  /** Resume a stream a previous listener of this rank left here (kv-event-listener.ts, resumeAt); used when a new listener starts. */
  readonly resumeAt?: { readonly seq: bigint; readonly digest: bigint | null } | null;
}

export interface KvIngestOptions {
  /** `batch.dpRank`, when not null, is the engine's own rank and overrides `ref.rank`. */
  readonly onBatch: (ref: KvRankRef, batch: KvEventBatch, seq: bigint, replayed: boolean, digest: bigint | null) => void;
  /** Drop every block of this rank: its publisher restarted or was replaced. */
  readonly onReset: (ref: KvRankRef) => void;
  readonly logger?: Logger;
  readonly replayTimeoutMs?: number;
  /** Ranks open at once, at most (fd-budget.ts). Default: derived from the process's fd limit; null: none. */
  readonly maxRanks?: number | null;
  /** Whether a message's batch of `ref` may be handed on now (the ingest thread's hand-over window; kv-event-listener.ts). */
  readonly admit?: (ref: KvRankRef) => boolean;
  /** With admit: resolves once a replay that filled the window may go on (kv-event-listener.ts). */
  readonly room?: () => Promise<boolean>;
  /** Batches read straight into the prepared form where they can be (the ingest thread's; kv-event-listener.ts). */
  readonly fastPath?: KvFastPath<(ref: KvRankRef, batch: PreparedKvBatch, seq: bigint, replayed: boolean, digest: bigint | null) => void>;
}

export interface KvRankStats extends KvRankRef {
  readonly endpoint: string;
  readonly stats: KvEventListenerStats;
}

/**
 * A rank's listener could not start: ZeroMQ refused its endpoint (a form libzmq rejects, such as
 * `tcp://*:5557` or a path after the port). The ranks started before it keep running; the caller
 * decides (the daemon marks the worker incomplete, which removes them).
 */
export class KvEndpointError extends Error {
  readonly rank: number;
  readonly endpoint: string;
  /** What ZeroMQ said, e.g. "Invalid argument (EINVAL)". */
  readonly detail: string;

  constructor(rank: number, endpoint: string, cause: unknown) {
    const message = cause instanceof Error ? cause.message : String(cause);
    const code = (cause as { code?: unknown } | null)?.code;
    const detail = typeof code === "string" && code !== "" ? `${message} (${code})` : message;
    super(`dp rank ${rank}: ZeroMQ refused ${JSON.stringify(endpoint)}: ${detail}`, { cause });
    this.name = "KvEndpointError";
    this.rank = rank;
    this.endpoint = endpoint;
    this.detail = detail;
  }
}

/** A rank refused because the KV fd budget is spent: its socket was never opened. */
export class KvRankBudgetError extends Error {
  readonly code = "KVMESH_KV_FD_BUDGET";
  constructor(maxRanks: number) {
    super(`the process's KV rank budget is spent: ${maxRanks} ranks open, what its fd limit allows with a reserve for HTTP and the mesh (raise ulimit -n; ranks cost ${String(FDS_PER_KV_RANK)} fds each)`);
    this.name = "KvRankBudgetError";
  }
}

/** What the daemon uses of an ingest: KvIngest on this thread, or KvIngestWorker (kv-ingest-worker.ts) on its own. */
export type KvIngestPort = Pick<KvIngest, "upsert" | "remove" | "position" | "replayEndpointOf" | "stats" | "close" | "budgetRefusals">;

export class KvIngest {
  readonly #options: KvIngestOptions;
  readonly #maxRanks: number | null;
  /** Listeners open across every worker. */
  #open = 0;
  /** Ranks refused for the budget so far. */
  #budgetRefusals = 0;
  /** workerId -> rank -> listener */
  readonly #workers = new Map<string, Map<number, KvEventListener>>();
  /** Per listener, its statsVersion when changedStats last returned it. */
  readonly #reportedVersion = new WeakMap<KvEventListener, number>();
  /** Registration changes run one at a time so two upserts of one worker cannot interleave. */
  #tail: Promise<void> = Promise.resolve();
  #closed = false;

  constructor(options: KvIngestOptions) {
    this.#options = options;
    this.#maxRanks = options.maxRanks === undefined ? kvRankBudget(processFdLimit()) : options.maxRanks;
  }

  /** Ranks refused because the fd budget was spent (their workers are incomplete). */
  get budgetRefusals(): number {
    return this.#budgetRefusals;
  }

  /**
   * Starts, keeps or replaces listeners so that `workerId` has exactly `ranks`. Rejects with a
   * KvEndpointError when a rank's endpoint is refused (the ranks before it are left running).
   */
  upsert(workerId: string, ranks: readonly KvRankEndpoints[]): Promise<void> {
    const seen = new Set<number>();
    for (const r of ranks) {
      if (!Number.isInteger(r.rank) || r.rank < 0) return Promise.reject(new RangeError(`ranks: invalid rank ${r.rank}`));
      if (seen.has(r.rank)) return Promise.reject(new RangeError(`ranks: duplicate rank ${r.rank}`));
      seen.add(r.rank);
    }
    return this.#serial(async () => {
      const current = this.#workers.get(workerId) ?? new Map<number, KvEventListener>();
      this.#workers.set(workerId, current);
      const wanted = new Map(ranks.map((r) => [r.rank, r]));
      for (const [rank, listener] of [...current]) {
        const want = wanted.get(rank);
        if (want !== undefined && want.endpoint === listener.endpoint && (want.replayEndpoint ?? null) === listener.replayEndpoint) continue;
        current.delete(rank);
        this.#open--;
        await listener.close();
        this.#reset({ workerId, rank });
      }
      for (const r of ranks) {
        if (current.has(r.rank)) continue;
        if (this.#maxRanks !== null && this.#open >= this.#maxRanks) {
          this.#budgetRefusals++;
          throw new KvEndpointError(r.rank, r.endpoint, new KvRankBudgetError(this.#maxRanks));
        }
        const listener = this.#create({ workerId, rank: r.rank }, r);
        try {
          await listener.start();
        } catch (err) {
          throw new KvEndpointError(r.rank, r.endpoint, err);
        }
        current.set(r.rank, listener);
        this.#open++;
      }
    });
  }

  /** Stops every listener of `workerId`; the caller removes the worker's blocks itself. Returns false if unknown. */
  remove(workerId: string): Promise<boolean> {
    return this.#serial(async () => {
      const current = this.#workers.get(workerId);
      if (current === undefined) return false;
      this.#workers.delete(workerId);
      this.#open -= current.size;
      await Promise.all([...current.values()].map((l) => l.close()));
      return true;
    });
  }

  /** A rank's stream position (its listener's last seq and digest), or null. */
  position(workerId: string, rank: number): { seq: bigint; digest: bigint | null } | null {
    return this.#workers.get(workerId)?.get(rank)?.position ?? null;
  }

  /** A rank's replay endpoint, or null (none, or no listener). */
  replayEndpointOf(workerId: string, rank: number): string | null {
    return this.#workers.get(workerId)?.get(rank)?.replayEndpoint ?? null;
  }

  /** One rank's stats, or null (no listener). */
  rankStats(workerId: string, rank: number): KvRankStats | null {
    const listener = this.#workers.get(workerId)?.get(rank);
    return listener === undefined ? null : { workerId, rank, endpoint: listener.endpoint, stats: listener.stats };
  }

  /**
   * The stats of ranks whose counters changed since the last call that returned them (every rank
   * on the first call), optionally only among `refs`.
   */
  changedStats(refs?: Iterable<KvRankRef>): KvRankStats[] {
    const out: KvRankStats[] = [];
    const visit = (workerId: string, rank: number, listener: KvEventListener): void => {
      const v = listener.statsVersion;
      if (this.#reportedVersion.get(listener) === v) return;
      this.#reportedVersion.set(listener, v);
      out.push({ workerId, rank, endpoint: listener.endpoint, stats: listener.stats });
    };
    if (refs === undefined) {
      for (const [workerId, ranks] of this.#workers) for (const [rank, listener] of ranks) visit(workerId, rank, listener);
    } else {
      for (const ref of refs) {
        const listener = this.#workers.get(ref.workerId)?.get(ref.rank);
        if (listener !== undefined) visit(ref.workerId, ref.rank, listener);
      }
    }
    return out;
  }

  stats(): KvRankStats[] {
    const out: KvRankStats[] = [];
    for (const workerId of this.#workers.keys()) out.push(...this.statsOf(workerId));
    return out;
  }

  /**
   * One worker's ranks. The ingest thread answers each worker command with them: taking them
   * from stats() built every rank's stats per command, 1,024 x 1,024 for a fleet registered one
   * worker at a time (1.8 s of the thread's self time in a warm join's profile).
   */
  statsOf(workerId: string): KvRankStats[] {
    const out: KvRankStats[] = [];
    for (const [rank, listener] of this.#workers.get(workerId) ?? []) out.push({ workerId, rank, endpoint: listener.endpoint, stats: listener.stats });
    return out;
  }

  async close(): Promise<void> {
    this.#closed = true;
    await this.#tail;
    const all = [...this.#workers.values()].flatMap((ranks) => [...ranks.values()]);
    this.#workers.clear();
    this.#open = 0;
    await Promise.all(all.map((l) => l.close()));
  }

  #create(ref: KvRankRef, r: KvRankEndpoints): KvEventListener {
    const { onBatch, logger, replayTimeoutMs, fastPath, admit, room } = this.#options;
    return new KvEventListener({
      endpoint: r.endpoint,
      replayEndpoint: r.replayEndpoint ?? null,
      resumeAt: r.resumeAt ?? null,
      onBatch: (batch, seq, replayed, digest) => {
        onBatch(ref, batch, seq, replayed, digest);
      },
      onReset: () => {
        this.#reset(ref);
      },
      ...(logger === undefined ? {} : { logger: logger.child({ workerId: ref.workerId, rank: ref.rank }) }),
      ...(replayTimeoutMs === undefined ? {} : { replayTimeoutMs }),
      ...(admit === undefined ? {} : { admit: () => admit(ref) }),
      ...(room === undefined ? {} : { room }),
      ...(fastPath === undefined
        ? {}
        : {
            fastPath: {
              read: fastPath.read,
              onPrepared: (batch: PreparedKvBatch, seq: bigint, replayed: boolean, digest: bigint | null) => {
                fastPath.onPrepared(ref, batch, seq, replayed, digest);
              },
            },
          }),
    });
  }

  #reset(ref: KvRankRef): void {
    try {
      this.#options.onReset(ref);
    } catch (err) {
      this.#options.logger?.error({ err, ...ref }, "onReset handler threw");
    }
  }

  #serial<T>(task: () => Promise<T>): Promise<T> {
    if (this.#closed) return Promise.reject(new Error("KvIngest is closed"));
    const p = this.#tail.then(task);
    this.#tail = p.then(
      () => undefined,
      () => undefined,
    );
    return p;
  }
}
