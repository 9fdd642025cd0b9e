/**
 * The picker's seam to an OpenAI body parser: bytes of a /v1/completions or /v1/chat/completions
 * body -> the contract's OpenAIRequest, or a registry error naming the field.
 *
 * LEAD: src/openai/ (branch epp-tokenize) owns the full parser. This minimal one checks only what
 * the picker needs (model; prompt or messages; token ids when the prompt is a token array) and
 * is swapped by passing that parser as ExtProcOptions.parseBody (src/daemon.ts).
 */
import { badRequest, KvmeshError } from "../core/errors.js";
import type { OpenAIKind, OpenAIRequest } from "../tokenize/contract.js";

/** Parses one body; `modelOverride` (x-gateway-model-name-rewrite) replaces the body's model. */
export type OpenAIBodyParser = (kind: OpenAIKind, body: Buffer, modelOverride?: string) => OpenAIRequest;

const MAX_TOKEN_ID = 0xffff_ffff;

/** The OpenAI path a request was sent to, or undefined for any other (routed without a prompt). */
export function openAIKindOf(path: string | undefined): OpenAIKind | undefined {
  const p = (path ?? "").split("?")[0]?.replace(/\/+$/, "");
  if (p === "/v1/completions") return "completions";
  if (p === "/v1/chat/completions") return "chat";
  return undefined;
}

function tokenIdsOf(prompt: readonly unknown[]): number[] | undefined {
  if (prompt.length === 0 || typeof prompt[0] !== "number") return undefined;
  prompt.forEach((t, i) => {
    if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t > MAX_TOKEN_ID) throw badRequest(`prompt[${i}]: a token id must be an integer in [0, ${MAX_TOKEN_ID}]`, `prompt[${i}]`);
  });
  return prompt as number[];
}

export const parseOpenAIBody: OpenAIBodyParser = (kind, body, modelOverride) => {
  let decoded: unknown;
  try {
    decoded = JSON.parse(body.toString("utf8"));
  } catch (err) {
    throw new KvmeshError("KVMESH_MALFORMED_JSON", `request body is not valid JSON: ${(err as Error).message}`, { details: { field: "body" } });
  }
  if (decoded === null || typeof decoded !== "object" || Array.isArray(decoded)) throw badRequest("request body must be a JSON object", "body");
  const obj = decoded as Record<string, unknown>;
  const bodyModel = obj["model"];
  if (typeof bodyModel !== "string" || bodyModel === "") throw badRequest("model: required non-empty string", "model");
  let tokenIds: number[] | undefined;
  if (kind === "completions") {
    const prompt = obj["prompt"];
    if (typeof prompt !== "string" && !Array.isArray(prompt)) throw badRequest("prompt: required string or array (of strings or token ids)", "prompt");
    if (Array.isArray(prompt)) tokenIds = tokenIdsOf(prompt);
  } else if (!Array.isArray(obj["messages"])) {
    throw badRequest("messages: required array", "messages");
  }
  const model = modelOverride !== undefined && modelOverride !== "" ? modelOverride : bodyModel;
  return { kind, model, body: model === bodyModel ? obj : { ...obj, model }, tokenIds };
};
