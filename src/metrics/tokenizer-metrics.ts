/**
 * The tokenizer's series, read at scrape time from its plain counters (tokenizer-counters.ts):
 * the tokenize path never calls prom-client.
 */
import type { Registry } from "prom-client";

import type { TokenizerCounters } from "../tokenize/tokenizer-counters.js";
import { collectedCounter, collectedGauge, collectedLabelledCounter, type LabelledSample } from "./collected.js";

export interface TokenizerMetricsSource {
  readonly counters: TokenizerCounters;
  /** The multi-turn cache's size, when there is one (file mode). */
  readonly cache?: { readonly size: number; readonly tokens: number } | null;
}

function* entries<L extends string>(label: L, record: Readonly<Record<string, number>>): Iterable<LabelledSample<L>> {
  for (const [k, v] of Object.entries(record)) yield [{ [label]: k } as Record<L, string>, v];
}

export function registerTokenizerMetrics(registry: Registry, source: TokenizerMetricsSource): void {
  const c = source.counters;
  collectedLabelledCounter(registry, { name: "kvmesh_tokenize_requests_total", help: "Prompts tokenized, by the path that gave the ids: engine (a worker), local (tokenizer file), cache (local, reusing a cached conversation prefix), body (ids in the request)." }, ["source"], () => entries("source", c.bySource));
  collectedLabelledCounter(registry, { name: "kvmesh_tokenize_failures_total", help: "Prompts not tokenized: no_workers (no ready worker of the model), exhausted (every worker tried failed), shed (the tokenizer queue was full), aborted (the stream ended first), bad_request (the chat template refused it)." }, ["reason"], () => entries("reason", c.failures));
  collectedLabelledCounter(registry, { name: "kvmesh_tokenizer_engine_calls_total", help: "Tokenization calls to workers, by endpoint: render (/v1/chat/completions/render, /v1/completions/render) or tokenize (/tokenize, the fallback)." }, ["endpoint"], () => entries("endpoint", c.engineCalls));
  collectedLabelledCounter(registry, { name: "kvmesh_tokenizer_engine_attempt_failures_total", help: "Worker tokenization calls that failed (the next worker is tried): timeout, http (an error status), network, malformed (an answer without valid token ids)." }, ["reason"], () => entries("reason", c.engineAttemptFailures));
  collectedLabelledCounter(registry, { name: "kvmesh_tokenizer_prefix_cache_lookups_total", help: "Multi-turn prefix cache lookups (file mode), by result." }, ["result"], () => entries("result", { hit: c.prefixCache.hits, miss: c.prefixCache.misses }));
  collectedCounter(registry, { name: "kvmesh_tokenizer_prefix_cache_evictions_total", help: "Multi-turn prefix cache entries evicted at its bound (--tokenizer-cache-entries, --tokenizer-cache-tokens)." }, () => c.prefixCache.evictions);
  collectedCounter(registry, { name: "kvmesh_tokenizer_prefix_cache_reused_tokens_total", help: "Token ids taken from the prefix cache instead of tokenized." }, () => c.prefixCache.reusedTokens);
  collectedCounter(registry, { name: "kvmesh_tokenizer_tokenized_tokens_total", help: "Token ids the local tokenizer produced by tokenizing (chat prompts through the prefix cache)." }, () => c.prefixCache.tokenizedTokens);
  collectedGauge(registry, { name: "kvmesh_tokenizer_prefix_cache_entries", help: "Multi-turn prefix cache entries." }, () => source.cache?.size ?? 0);
  collectedGauge(registry, { name: "kvmesh_tokenizer_prefix_cache_tokens", help: "Token ids the multi-turn prefix cache keeps alive." }, () => source.cache?.tokens ?? 0);
}
