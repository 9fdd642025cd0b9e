/**
 * Plain counters the tokenizers bump (no prom-client on the tokenize path); the metrics module
 * (src/metrics/tokenizer-metrics.ts) reads them at scrape time. One instance per daemon, shared
 * by whichever tokenizer runs.
 */
import type { TokenizeResult } from "./contract.js";

/** Why one call to a worker failed (the next worker is tried). */
export type EngineAttemptFailure = "timeout" | "http" | "network" | "malformed";
/** Why a request got no ids at all. */
export type TokenizeFailure = "no_workers" | "exhausted" | "shed" | "aborted" | "bad_request";

export class TokenizerCounters {
  /** Requests answered, by the path that produced the ids. */
  readonly bySource: Record<TokenizeResult["source"], number> = { engine: 0, local: 0, body: 0, cache: 0 };
  /** Requests refused, by reason. */
  readonly failures: Record<TokenizeFailure, number> = { no_workers: 0, exhausted: 0, shed: 0, aborted: 0, bad_request: 0 };
  /** HTTP calls to workers, by endpoint. */
  readonly engineCalls = { render: 0, tokenize: 0 };
  /** Worker calls that failed, by reason. */
  readonly engineAttemptFailures: Record<EngineAttemptFailure, number> = { timeout: 0, http: 0, network: 0, malformed: 0 };
  /** Local multi-turn prefix cache. */
  readonly prefixCache = { hits: 0, misses: 0, evictions: 0, reusedTokens: 0, tokenizedTokens: 0 };
}
