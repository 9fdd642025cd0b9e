/**
 * `--tokenizer-file PATH`: a Hugging Face tokenizer.json tokenized in process, with the chat
 * template from tokenizer_config.json (or chat_template.jinja) in the same folder.
 *
 * Library: `tokenizers` (Hugging Face's Rust tokenizers through napi-rs, binaries shipped inside
 * the npm package): the same code as the Python `tokenizers` vLLM's fast tokenizers run, so the
 * ids match by construction, and encode() runs on libuv's thread pool, off the event loop. The
 * template renders with @huggingface/jinja (chat-template.ts). The measurements behind the
 * choice are in docs/tokenization.md (scripts/bench-tokenizers.ts).
 *
 * Chat requests go through the multi-turn prefix cache (prefix-token-cache.ts); completions
 * prompts are tokenized whole (with add_special_tokens, vLLM's default for completions).
 */
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";

import PQueue from "p-queue";
import { Tokenizer } from "tokenizers";

import { KvmeshError } from "../core/index.js";
import type { OpenAIRequest, PromptTokenizer, TokenizeOptions, TokenizeResult } from "./contract.js";
import { tokenIdsFromBody } from "./body-token-ids.js";
import { ChatTemplate } from "./chat-template.js";
import { DEFAULT_LOCAL_TOKENIZE_CONCURRENCY, DEFAULT_LOCAL_TOKENIZE_MAX_QUEUED, DEFAULT_PREFIX_CACHE_MAX_ENTRIES, DEFAULT_PREFIX_CACHE_MAX_TOKENS } from "./defaults.js";
import { PrefixTokenCache } from "./prefix-token-cache.js";
import { TokenizerCounters } from "./tokenizer-counters.js";
import { tokenizerUnavailable } from "./tokenizer-errors.js";

export { DEFAULT_LOCAL_TOKENIZE_CONCURRENCY, DEFAULT_LOCAL_TOKENIZE_MAX_QUEUED };

export interface LocalTokenizerOptions {
  readonly concurrency?: number;
  readonly maxQueued?: number;
  readonly prefixCacheMaxEntries?: number;
  readonly prefixCacheMaxTokens?: number;
  /** false: no multi-turn cache (the equality tests compare with it). */
  readonly prefixCache?: boolean;
  readonly counters?: TokenizerCounters;
}

interface AddedToken {
  readonly content: string;
  readonly special?: boolean;
  readonly lstrip?: boolean;
}

const optionError = (path: string, problem: string, cause?: unknown): KvmeshError =>
  new KvmeshError("KVMESH_INVALID_OPTION", `tokenizerFile ${path}: ${problem}`, { cause, details: { field: "tokenizerFile" } });

function tokenText(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (typeof v === "object" && v !== null && typeof (v as { content?: unknown }).content === "string") return (v as { content: string }).content;
  return undefined;
}

/** The chat template named "default" (or the only one), from a config's string or list form. */
function templateOf(config: Record<string, unknown>, dir: string): string | undefined {
  const t = config.chat_template;
  if (typeof t === "string") return t;
  if (Array.isArray(t)) {
    const named = t as { name?: unknown; template?: unknown }[];
    const pick = named.find((x) => x.name === "default") ?? (named.length === 1 ? named[0] : undefined);
    if (typeof pick?.template === "string") return pick.template;
  }
  const file = join(dir, "chat_template.jinja");
  return existsSync(file) ? readFileSync(file, "utf8") : undefined;
}

const escapeRegExp = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

export class LocalTokenizer implements PromptTokenizer {
  readonly counters: TokenizerCounters;
  readonly cache: PrefixTokenCache | null;
  readonly #tokenizer: Tokenizer;
  readonly #template: ChatTemplate | null;
  /** Matches the special tokens a prompt can be cut before (see prefix-token-cache.ts). */
  readonly #boundary: RegExp | null;
  readonly #queue: PQueue;
  readonly #maxQueued: number;

  private constructor(tokenizer: Tokenizer, template: ChatTemplate | null, boundaryTokens: readonly string[], options: LocalTokenizerOptions) {
    this.#tokenizer = tokenizer;
    this.#template = template;
    this.counters = options.counters ?? new TokenizerCounters();
    const counters = this.counters;
    this.cache =
      options.prefixCache === false
        ? null
        : new PrefixTokenCache({
            maxEntries: options.prefixCacheMaxEntries ?? DEFAULT_PREFIX_CACHE_MAX_ENTRIES,
            maxTokens: options.prefixCacheMaxTokens ?? DEFAULT_PREFIX_CACHE_MAX_TOKENS,
            onEvict: () => {
              counters.prefixCache.evictions++;
            },
          });
    // Longest first, so a token that is a prefix of another never wins.
    const sorted = [...boundaryTokens].sort((a, b) => b.length - a.length);
    this.#boundary = sorted.length === 0 ? null : new RegExp(sorted.map(escapeRegExp).join("|"), "g");
    this.#queue = new PQueue({ concurrency: options.concurrency ?? DEFAULT_LOCAL_TOKENIZE_CONCURRENCY });
    this.#maxQueued = options.maxQueued ?? DEFAULT_LOCAL_TOKENIZE_MAX_QUEUED;
  }

  /** Loads tokenizer.json at `path` and the chat template beside it. Throws KVMESH_INVALID_OPTION naming the file. */
  static load(path: string, options: LocalTokenizerOptions = {}): LocalTokenizer {
    let json: string;
    try {
      json = readFileSync(path, "utf8");
    } catch (err) {
      throw optionError(path, `cannot be read (${err instanceof Error ? err.message : String(err)})`, err);
    }
    let added: AddedToken[];
    let segmentable: boolean;
    let tokenizer: Tokenizer;
    try {
      const parsed = JSON.parse(json) as { added_tokens?: AddedToken[]; pre_tokenizer?: unknown; normalizer?: unknown };
      added = (parsed.added_tokens ?? []).filter((t) => typeof t.content === "string");
      // Metaspace (prepend_scheme "first") and a Prepend normalizer add a piece at the start of
      // each split's first word only when it starts the input: a segment tokenized alone would
      // get one too, so such tokenizers (Llama 2, Mistral v1) do not use the prefix cache.
      segmentable = !/"(Metaspace|Prepend)"/.test(JSON.stringify([parsed.pre_tokenizer ?? null, parsed.normalizer ?? null]));
      tokenizer = Tokenizer.fromString(json);
    } catch (err) {
      throw optionError(path, `is not a Hugging Face tokenizer.json (${err instanceof Error ? err.message : String(err)})`, err);
    }
    const dir = dirname(path);
    const configPath = join(dir, "tokenizer_config.json");
    let template: ChatTemplate | null = null;
    if (existsSync(configPath)) {
      let config: Record<string, unknown>;
      try {
        config = JSON.parse(readFileSync(configPath, "utf8")) as Record<string, unknown>;
      } catch (err) {
        throw optionError(configPath, "is not valid JSON", err);
      }
      const source = templateOf(config, dir);
      if (source !== undefined) {
        const specialTokens: Record<string, string> = {};
        for (const k of ["bos_token", "eos_token", "pad_token", "unk_token"]) {
          const v = tokenText(config[k]);
          if (v !== undefined) specialTokens[k] = v;
        }
        try {
          template = new ChatTemplate(source, { specialTokens });
        } catch (err) {
          throw optionError(configPath, `chat_template does not parse (${err instanceof Error ? err.message : String(err)})`, err);
        }
      }
    }
    const boundaries = added.filter((t) => t.special === true && t.lstrip !== true && t.content.length > 0).map((t) => t.content);
    return new LocalTokenizer(tokenizer, template, boundaries, segmentable ? options : { ...options, prefixCache: false });
  }

  /** The chat template from the tokenizer's folder, or null when it has none. */
  get chatTemplate(): ChatTemplate | null {
    return this.#template;
  }

  /** A chat body's prompt text (the template applied), e.g. to compare with whole-text encode(). */
  renderChat(body: Readonly<Record<string, unknown>>): string {
    if (this.#template === null) throw tokenizerUnavailable(typeof body.model === "string" ? body.model : "", "the tokenizer file has no chat template");
    return this.#template.render(body);
  }

  async tokenize(req: OpenAIRequest, options: TokenizeOptions = {}): Promise<TokenizeResult> {
    const given = tokenIdsFromBody(req);
    if (given !== undefined) {
      this.counters.bySource.body++;
      return given;
    }
    if (this.#queue.size >= this.#maxQueued) {
      this.counters.failures.shed++;
      throw tokenizerUnavailable(req.model, `${this.#queue.size} requests already wait for the local tokenizer (the limit)`);
    }
    const signal = options.signal;
    try {
      const result = await this.#queue.add(() => this.#run(req), signal === undefined ? {} : { signal });
      this.counters.bySource[result.source]++;
      return result;
    } catch (err) {
      if (signal?.aborted === true) this.counters.failures.aborted++;
      else if (err instanceof KvmeshError && err.status === 400) this.counters.failures.bad_request++;
      throw err;
    }
  }

  async #run(req: OpenAIRequest): Promise<TokenizeResult> {
    if (req.kind === "completions") {
      const p = req.body.prompt;
      const text = typeof p === "string" ? p : String((p as unknown[])[0]);
      const addSpecial = req.body.add_special_tokens !== false;
      return { tokenIds: await this.encode(text, addSpecial), source: "local" };
    }
    if (this.#template === null) throw tokenizerUnavailable(req.model, "the tokenizer file has no chat template (tokenizer_config.json chat_template or chat_template.jinja)");
    const text = this.#template.render(req.body);
    const addSpecial = req.body.add_special_tokens === true;
    if (this.cache === null || addSpecial || this.#boundary === null) return { tokenIds: await this.encode(text, addSpecial), source: "local" };
    return this.#withCache(text);
  }

  async #withCache(text: string): Promise<TokenizeResult> {
    const cache = this.cache as PrefixTokenCache;
    const boundaries: number[] = [];
    for (const m of text.matchAll(this.#boundary as RegExp)) if (m.index > 0) boundaries.push(m.index);
    const keys = PrefixTokenCache.keys(text, boundaries);
    const hit = cache.lookup(keys, boundaries);
    const stats = this.counters.prefixCache;
    if (hit === undefined) stats.misses++;
    else {
      stats.hits++;
      stats.reusedTokens += hit.ids.length;
    }
    const offset = hit?.offset ?? 0;
    // Tokenized segment by segment from the hit on (one encodeBatch call), so every boundary's
    // id count is known: the tokenizer splits at these special tokens anyway, so no id changes.
    const segments: string[] = [];
    const lengths: number[] = [];
    let at = offset;
    for (const b of boundaries) {
      if (b <= offset) continue;
      segments.push(text.slice(at, b));
      at = b;
    }
    segments.push(text.slice(at));
    const encoded = await this.#tokenizer.encodeBatch(segments, { addSpecialTokens: false });
    const parts: Uint32Array[] = hit === undefined ? [] : [hit.ids];
    let total = hit?.ids.length ?? 0;
    for (const enc of encoded) {
      const ids = Uint32Array.from(enc.getIds());
      parts.push(ids);
      total += ids.length;
      lengths.push(total);
    }
    stats.tokenizedTokens += total - (hit?.ids.length ?? 0);
    const all = new Uint32Array(total);
    let o = 0;
    for (const p of parts) {
      all.set(p, o);
      o += p.length;
    }
    // lengths[j] covers text up to the end of segment j; segment j < last ends at a boundary.
    const firstNew = boundaries.length - (segments.length - 1);
    const newKeys = keys.slice(firstNew);
    const newLengths = lengths.slice(0, segments.length - 1);
    cache.store(newKeys, newLengths, all);
    return { tokenIds: all, source: hit === undefined ? "local" : "cache" };
  }

  /** The ids of `text` (whole-text tokenization; the equality tests use it as the reference). */
  async encode(text: string, addSpecialTokens: boolean): Promise<Uint32Array> {
    if (text.length === 0) return new Uint32Array(0);
    const enc = await this.#tokenizer.encode(text, null, { addSpecialTokens });
    return Uint32Array.from(enc.getIds());
  }

  async close(): Promise<void> {
    this.#queue.clear();
    await this.#queue.onIdle();
  }
}
