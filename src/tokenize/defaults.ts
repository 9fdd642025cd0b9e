/**
 * Tokenization's named defaults, apart from the tokenizers' code so that src/app/config.ts (and
 * the CLI) read them without loading the native `tokenizers` module or p-queue: the daemon builds
 * a tokenizer only when --ext-proc-port is set. The tokenizer modules re-export them.
 */

/** One worker call's timeout, ms: a 220 KB chat body is ~75 k tokens, ~0.2 s of a fast tokenizer's CPU. */
export const DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MS = 2_000;
/** Worker calls in flight at once. */
export const DEFAULT_ENGINE_TOKENIZE_CONCURRENCY = 64;
/** Requests waiting for a slot before new ones are shed. */
export const DEFAULT_ENGINE_TOKENIZE_MAX_QUEUED = 1_024;
/** Workers tried per request (the first and one other). */
export const DEFAULT_ENGINE_TOKENIZE_ATTEMPTS = 2;

/** Encodes in flight on the thread pool (libuv's default pool has 4 threads, shared with fs and dns). */
export const DEFAULT_LOCAL_TOKENIZE_CONCURRENCY = 2;
/** Requests waiting for an encode slot before new ones are shed. */
export const DEFAULT_LOCAL_TOKENIZE_MAX_QUEUED = 1_024;

/** Cached boundaries at most (a 100-turn conversation stores ~200). */
export const DEFAULT_PREFIX_CACHE_MAX_ENTRIES = 65_536;
/** Token ids the cache keeps alive at most: 64 Mi ids = 256 MiB. */
export const DEFAULT_PREFIX_CACHE_MAX_TOKENS = 64 * 1024 * 1024;
