/**
 * The factory the daemon calls: the configured tokenizer, its counters registered on the
 * daemon's metrics registry. The endpoint picker (src/extproc/) holds the PromptTokenizer it
 * returns and knows nothing of the mode.
 */
import type { Clock } from "../core/index.js";
import type { MetricsRegistry } from "../metrics/registry.js";
import { registerTokenizerMetrics } from "../metrics/tokenizer-metrics.js";
import type { PromptTokenizer } from "./contract.js";
import { EngineTokenizer } from "./engine-tokenizer.js";
import { LocalTokenizer } from "./local-tokenizer.js";
import { TokenizerCounters } from "./tokenizer-counters.js";
import { resolveTokenizerOptions, type TokenizerOptions } from "./tokenizer-options.js";

export interface TokenizerDeps {
  /**
   * Base URLs (`http://host:port`) of the ready workers serving `model` (engine mode): the
   * catalogue's `endpoint` of each schedulable worker of the model's partitions.
   */
  readonly workerUrls: (model: string) => readonly string[];
  /** Where the tokenizer's series go (omitted: none registered, e.g. in tests). */
  readonly metrics?: MetricsRegistry | undefined;
  readonly fetch?: typeof globalThis.fetch | undefined;
  readonly clock?: Clock | undefined;
}

export interface CreatedTokenizer extends PromptTokenizer {
  readonly counters: TokenizerCounters;
  close(): Promise<void>;
}

/**
 * Builds the tokenizer `options` ask for (resolved again here, so a partial input is checked
 * the same way). Throws KVMESH_INVALID_OPTION naming the field, including for a tokenizer file
 * that cannot be read or parsed.
 */
export function createTokenizer(options: Partial<TokenizerOptions>, deps: TokenizerDeps): CreatedTokenizer {
  const o = resolveTokenizerOptions(options);
  const counters = new TokenizerCounters();
  let tokenizer: EngineTokenizer | LocalTokenizer;
  if (o.tokenizer === "file") {
    tokenizer = LocalTokenizer.load(o.tokenizerFile as string, {
      counters,
      prefixCacheMaxEntries: o.tokenizerCacheEntries,
      prefixCacheMaxTokens: o.tokenizerCacheTokens,
      ...(o.tokenizerConcurrency === undefined ? {} : { concurrency: o.tokenizerConcurrency }),
      ...(o.tokenizerMaxQueued === undefined ? {} : { maxQueued: o.tokenizerMaxQueued }),
    });
  } else {
    tokenizer = new EngineTokenizer(
      { workerUrls: deps.workerUrls, counters, ...(deps.fetch === undefined ? {} : { fetch: deps.fetch }), ...(deps.clock === undefined ? {} : { clock: deps.clock }) },
      {
        timeoutMs: o.tokenizerTimeoutMs,
        maxAttempts: o.tokenizerAttempts,
        ...(o.tokenizerConcurrency === undefined ? {} : { concurrency: o.tokenizerConcurrency }),
        ...(o.tokenizerMaxQueued === undefined ? {} : { maxQueued: o.tokenizerMaxQueued }),
      },
    );
  }
  if (deps.metrics !== undefined) registerTokenizerMetrics(deps.metrics, { counters, cache: tokenizer instanceof LocalTokenizer ? tokenizer.cache : null });
  return tokenizer;
}
