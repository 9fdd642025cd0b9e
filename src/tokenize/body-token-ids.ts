/** The "body" path every tokenizer shares: a request that carries its ids skips tokenization. */
import type { OpenAIRequest, TokenizeResult } from "./contract.js";

export function tokenIdsFromBody(req: OpenAIRequest): TokenizeResult | undefined {
  if (req.tokenIds === undefined) return undefined;
  return { tokenIds: Uint32Array.from(req.tokenIds), source: "body" };
}
