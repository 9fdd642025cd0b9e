/**
 * The registry error a tokenizer rejects with when it cannot produce ids (no worker of the model
 * answered, every attempt failed or timed out, the queue was full). It is KVMESH_NOT_READY (503,
 * kind not_ready) with details.reason = "tokenizer_unavailable", so the picker can tell it from
 * a bad body (400 naming the field) and, by default, route by session and load alone instead.
 */
import { isKvmeshError, KvmeshError } from "../core/index.js";

export const TOKENIZER_UNAVAILABLE = "tokenizer_unavailable";

export function tokenizerUnavailable(model: string, detail: string, cause?: unknown): KvmeshError {
  return new KvmeshError("KVMESH_NOT_READY", `no worker of model '${model}' could tokenize the prompt: ${detail}`, {
    cause,
    details: { field: "tokenizer", reason: TOKENIZER_UNAVAILABLE, model },
  });
}

/** True for the error above (the picker's "tokenization failed" branch). */
export const isTokenizerUnavailable = (e: unknown): e is KvmeshError => isKvmeshError(e) && e.details?.reason === TOKENIZER_UNAVAILABLE;
