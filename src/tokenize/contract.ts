/**
 * The contract between the endpoint picker (src/extproc/, Envoy ext_proc) and tokenization
 * (src/tokenize/, src/openai/): the picker hands over a parsed OpenAI request body and gets back
 * exactly the token ids the engine will cache for it. Two teams build the two sides; this file is
 * the only thing both import, so it changes only by agreement.
 */

/** Which OpenAI endpoint the body was sent to. */
export type OpenAIKind = "completions" | "chat";

/** An OpenAI body, parsed and checked (src/openai/ owns the parser and its field-naming errors). */
export interface OpenAIRequest {
  readonly kind: OpenAIKind;
  /** The body's `model` (after `x-gateway-model-name-rewrite`, when the gateway sent one). */
  readonly model: string;
  /** The whole decoded body, for tokenizers that render it (chat template, tools, ...). */
  readonly body: Readonly<Record<string, unknown>>;
  /**
   * Token ids the body already carries (`prompt` as a token array on /v1/completions): such a
   * request skips tokenization. A Uint32Array when the parser read a flat id array straight from
   * the bytes (src/openai/parse-request.ts); `body.prompt` is then that same Uint32Array.
   */
  readonly tokenIds?: readonly number[] | Uint32Array | undefined;
  /**
   * The body's bytes as the client sent them, when the parser had them (src/openai/'s
   * parseOpenAIRequest on a text prompt): the engine tokenizer sends these to the render endpoint
   * (the model rewritten if needed) instead of re-serialising `body`, which cost the picker
   * ~1 ms of CPU per 220 KB chat body and re-wrote numbers (`1.0` -> `1`, digits past 2^53).
   * Must hold the same JSON as `body`.
   */
  readonly bytes?: Uint8Array | undefined;
}

export interface TokenizeOptions {
  /** Aborted when the stream ends (client left, Envoy reset) or the picker's timeout fires. */
  readonly signal?: AbortSignal | undefined;
}

/** What a tokenizer answers: the prompt's token ids, and which path produced them (metrics). */
export interface TokenizeResult {
  readonly tokenIds: Uint32Array;
  /** "engine" (a worker rendered it), "local" (tokenizer.json in process), "body" (ids given), "cache" (multi-turn prefix cache hit, then the rest tokenized). */
  readonly source: "engine" | "local" | "body" | "cache";
}

/**
 * Turns a request into token ids. Rejects with a registry error (KvmeshError) when it cannot:
 * the picker maps "no worker could tokenize" to 503 (or, by default, to routing by session and
 * load alone) and a bad body to 400 naming the field.
 */
export interface PromptTokenizer {
  tokenize(req: OpenAIRequest, options?: TokenizeOptions): Promise<TokenizeResult>;
  close?(): Promise<void>;
}
