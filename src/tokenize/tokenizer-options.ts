/**
 * The tokenizer's configuration: typed options with named defaults, the flag and environment
 * variable each maps to (for `kvmesh serve`, which the endpoint picker's wiring adds), and one
 * resolve function that checks them and names the offending field (KVMESH_INVALID_OPTION).
 */
import { KvmeshError } from "../core/index.js";
import {
  DEFAULT_ENGINE_TOKENIZE_ATTEMPTS,
  DEFAULT_ENGINE_TOKENIZE_CONCURRENCY,
  DEFAULT_ENGINE_TOKENIZE_MAX_QUEUED,
  DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MS,
  DEFAULT_LOCAL_TOKENIZE_CONCURRENCY,
  DEFAULT_LOCAL_TOKENIZE_MAX_QUEUED,
  DEFAULT_PREFIX_CACHE_MAX_ENTRIES,
  DEFAULT_PREFIX_CACHE_MAX_TOKENS,
} from "./defaults.js";

export const TOKENIZER_MODES = ["engine", "file"] as const;
export type TokenizerMode = (typeof TOKENIZER_MODES)[number];

export interface TokenizerOptions {
  /** engine: a worker renders and tokenizes (default); file: tokenizer.json in process. */
  readonly tokenizer: TokenizerMode;
  /** tokenizer.json path (file mode; its folder's tokenizer_config.json gives the chat template). */
  readonly tokenizerFile: string | undefined;
  /** One worker call's timeout, ms (engine mode). */
  readonly tokenizerTimeoutMs: number;
  /** Tokenizations in flight (engine: worker calls; file: encodes on the thread pool); undefined = the mode's default. */
  readonly tokenizerConcurrency: number | undefined;
  /** Requests waiting for a slot before new ones are shed (503 / routed without ids). */
  readonly tokenizerMaxQueued: number | undefined;
  /** Workers tried per request (engine mode). */
  readonly tokenizerAttempts: number;
  /** Multi-turn prefix cache bounds (file mode). */
  readonly tokenizerCacheEntries: number;
  readonly tokenizerCacheTokens: number;
}

export const DEFAULT_TOKENIZER_OPTIONS: TokenizerOptions = Object.freeze({
  tokenizer: "engine",
  tokenizerFile: undefined,
  tokenizerTimeoutMs: DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MS,
  tokenizerConcurrency: undefined,
  tokenizerMaxQueued: undefined,
  tokenizerAttempts: DEFAULT_ENGINE_TOKENIZE_ATTEMPTS,
  tokenizerCacheEntries: DEFAULT_PREFIX_CACHE_MAX_ENTRIES,
  tokenizerCacheTokens: DEFAULT_PREFIX_CACHE_MAX_TOKENS,
});

export interface TokenizerOptionDefinition {
  readonly field: keyof TokenizerOptions;
  readonly flag: string;
  readonly env: string;
  readonly description: string;
}

/** What `kvmesh serve` exposes (docs/tokenization.md lists the same). */
export const TOKENIZER_OPTION_DEFINITIONS: readonly TokenizerOptionDefinition[] = [
  { field: "tokenizer", flag: "--tokenizer <mode>", env: "KVMESH_TOKENIZER", description: "engine (a ready worker renders and tokenizes: /v1/chat/completions/render, else /tokenize) or file (--tokenizer-file in process)" },
  { field: "tokenizerFile", flag: "--tokenizer-file <path>", env: "KVMESH_TOKENIZER_FILE", description: "a Hugging Face tokenizer.json; the chat template comes from tokenizer_config.json (or chat_template.jinja) beside it; implies --tokenizer file" },
  { field: "tokenizerTimeoutMs", flag: "--tokenizer-timeout-ms <ms>", env: "KVMESH_TOKENIZER_TIMEOUT_MS", description: `one worker call's timeout (engine), default ${DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MS}` },
  { field: "tokenizerConcurrency", flag: "--tokenizer-concurrency <n>", env: "KVMESH_TOKENIZER_CONCURRENCY", description: `tokenizations in flight, default ${DEFAULT_ENGINE_TOKENIZE_CONCURRENCY} (engine) / ${DEFAULT_LOCAL_TOKENIZE_CONCURRENCY} (file)` },
  { field: "tokenizerMaxQueued", flag: "--tokenizer-max-queued <n>", env: "KVMESH_TOKENIZER_MAX_QUEUED", description: `requests waiting for a slot before new ones are shed, default ${DEFAULT_ENGINE_TOKENIZE_MAX_QUEUED} / ${DEFAULT_LOCAL_TOKENIZE_MAX_QUEUED}` },
  { field: "tokenizerAttempts", flag: "--tokenizer-attempts <n>", env: "KVMESH_TOKENIZER_ATTEMPTS", description: `workers tried per request (engine), default ${DEFAULT_ENGINE_TOKENIZE_ATTEMPTS}` },
  { field: "tokenizerCacheEntries", flag: "--tokenizer-cache-entries <n>", env: "KVMESH_TOKENIZER_CACHE_ENTRIES", description: `multi-turn prefix cache entries (file), default ${DEFAULT_PREFIX_CACHE_MAX_ENTRIES}` },
  { field: "tokenizerCacheTokens", flag: "--tokenizer-cache-tokens <n>", env: "KVMESH_TOKENIZER_CACHE_TOKENS", description: `token ids the prefix cache keeps (file), default ${DEFAULT_PREFIX_CACHE_MAX_TOKENS}` },
];

const invalid = (field: keyof TokenizerOptions, message: string): KvmeshError => new KvmeshError("KVMESH_INVALID_OPTION", `${field}: ${message}`, { details: { field } });

function positiveInt(field: keyof TokenizerOptions, v: unknown): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 1) throw invalid(field, `must be a positive integer, got ${String(v)}`);
  return v;
}

/** Defaults filled, every field checked; --tokenizer-file alone means file mode. */
export function resolveTokenizerOptions(input: Partial<TokenizerOptions> = {}): TokenizerOptions {
  const file = input.tokenizerFile;
  if (file !== undefined && (typeof file !== "string" || file.length === 0)) throw invalid("tokenizerFile", "must be a non-empty path");
  const mode = input.tokenizer ?? (file === undefined ? "engine" : "file");
  if (!TOKENIZER_MODES.includes(mode)) throw invalid("tokenizer", `must be one of ${TOKENIZER_MODES.join(", ")}, got ${JSON.stringify(mode)}`);
  if (mode === "file" && file === undefined) throw invalid("tokenizerFile", "is required with --tokenizer file");
  if (mode === "engine" && file !== undefined) throw invalid("tokenizerFile", "is only read with --tokenizer file (drop one of the two)");
  const d = DEFAULT_TOKENIZER_OPTIONS;
  return Object.freeze({
    tokenizer: mode,
    tokenizerFile: file,
    tokenizerTimeoutMs: positiveInt("tokenizerTimeoutMs", input.tokenizerTimeoutMs ?? d.tokenizerTimeoutMs),
    tokenizerConcurrency: input.tokenizerConcurrency === undefined ? undefined : positiveInt("tokenizerConcurrency", input.tokenizerConcurrency),
    tokenizerMaxQueued: input.tokenizerMaxQueued === undefined ? undefined : positiveInt("tokenizerMaxQueued", input.tokenizerMaxQueued),
    tokenizerAttempts: positiveInt("tokenizerAttempts", input.tokenizerAttempts ?? d.tokenizerAttempts),
    tokenizerCacheEntries: positiveInt("tokenizerCacheEntries", input.tokenizerCacheEntries ?? d.tokenizerCacheEntries),
    tokenizerCacheTokens: positiveInt("tokenizerCacheTokens", input.tokenizerCacheTokens ?? d.tokenizerCacheTokens),
  });
}
