/**
 * Messages between the main thread's KvIngestWorker (kv-ingest-worker.ts) and the ingest thread
 * (kv-ingest-thread.ts), one MessagePort, in order both ways: a batch posted before a reply is
 * handled before it, so the main thread sees a worker's batches, stats and removal in the order
 * the thread produced them.
 */
import type { KvEventBatch } from "../core/index.js";

import type { KvRankEndpoints, KvRankRef, KvRankStats } from "./kv-ingest.js";
import type { IngestWindowLimits } from "./kv-ingest-window.js";

export interface KvIngestThreadData {
  readonly replayTimeoutMs?: number;
  readonly maxRanks?: number | null;
  /** The main thread's ingest logger's level: the thread forwards only what it would print. */
  readonly logLevel: string;
  /** The hand-over window's shared counters (kv-ingest-window.ts), new for each thread, and its limits. */
  readonly window: SharedArrayBuffer;
  readonly windowLimits: IngestWindowLimits;
}

/** main -> thread */
export type KvIngestCommand =
  | { readonly t: "upsert"; readonly id: number; readonly workerId: string; readonly ranks: readonly KvRankEndpoints[] }
  | { readonly t: "remove"; readonly id: number; readonly workerId: string }
  | { readonly t: "close"; readonly id: number }
  /** Test hook: the thread throws an uncaught error, as a bug would (kv-ingest-worker.ts, crashThreadForTest). */
  | { readonly t: "crash" };

/** Why a command failed, rebuilt as the error KvIngest itself would have thrown. */
export type KvIngestFailure =
  | { readonly kind: "endpoint"; readonly rank: number; readonly endpoint: string; readonly message: string; readonly code?: string }
  | { readonly kind: "range"; readonly message: string }
  | { readonly kind: "other"; readonly message: string };

/** A worker's rank after a command: its stats and replay endpoint (KvIngest.replayEndpointOf). */
export interface KvOpenRank {
  readonly stats: KvRankStats;
  readonly replayEndpoint: string | null;
}

/** thread -> main */
export type KvIngestReport =
  | { readonly t: "ready" }
  /**
   * The thread hit an uncaught error: it has closed its sockets and observers and ends by itself
   * (a zeromq object still open when a thread's environment goes away aborts the whole process).
   */
  | { readonly t: "fatal"; readonly message: string }
  | { readonly t: "done"; readonly id: number; readonly workerId?: string; readonly open?: readonly KvOpenRank[]; readonly result?: boolean; readonly failure?: KvIngestFailure }
  | {
      readonly t: "batch";
      readonly ref: KvRankRef;
      readonly seq: bigint;
      readonly replayed: boolean;
      readonly digest: bigint | null;
      /** What the batch counts in the hand-over window, bytes (kv-ingest-window.ts): the main thread gives it back once applied. */
      readonly bytes: number;
      /** The batch as prepared-batch-codec.ts encodes it (its buffer transferred), or, when it cannot, as it is (cloned). */
      readonly encoded: { readonly ts: number; readonly dpRank: number | null; readonly words: Uint32Array; readonly strings: string[] } | null;
      readonly batch: KvEventBatch | null;
    }
  | { readonly t: "reset"; readonly ref: KvRankRef }
  | { readonly t: "stats"; readonly ranks: readonly KvRankStats[]; readonly budgetRefusals: number }
  | { readonly t: "log"; readonly level: "debug" | "info" | "warn" | "error"; readonly bindings: Readonly<Record<string, unknown>>; readonly obj: unknown; readonly msg: string };
