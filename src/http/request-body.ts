/**
 * Reading a request's JSON body: the content type, the size limit (413 as soon as it is passed,
 * nothing more buffered), and the lossless parse (64-bit ids exact; a prompt's token_ids straight
 * into a Uint32Array).
 */
import type { IncomingHttpHeaders, IncomingMessage } from "node:http";

import { KvmeshError } from "../core/index.js";
import { JsonDepthError, parseJsonBytes } from "./json.js";
import type { BodyMode } from "./route.js";
import { parseJsonBytesWithTokenIds } from "./token-ids.js";

export const JSON_CONTENT_TYPE = "application/json";

/** The client went away before its body was read: nothing to answer. */
export class ClientGoneError extends Error {}

/** Reads and parses a JSON body; undefined when an optional body is absent. */
export async function readJsonBody(req: IncomingMessage, mode: BodyMode, prompt: boolean, limit: number): Promise<unknown> {
  const h = req.headers;
  const declared = h["content-length"] === undefined ? undefined : Number(h["content-length"]);
  const present = h["transfer-encoding"] !== undefined || (declared !== undefined && declared > 0);
  if (!present && mode === "optional") return undefined;
  if (!isJsonContentType(h)) {
    throw new KvmeshError("KVMESH_UNSUPPORTED_MEDIA_TYPE", `expected Content-Type: ${JSON_CONTENT_TYPE}, got ${h["content-type"] ?? "none"}`);
  }
  if (declared !== undefined && declared > limit) throw tooLarge(limit);
  // Parsed inside readBytes, while the (shared) body scratch still holds this body.
  return readBytes(req, limit, (bytes) => {
    if (bytes.length === 0) {
      if (mode === "optional") return undefined;
      throw new KvmeshError("KVMESH_MALFORMED_JSON", "malformed JSON: request body is empty");
    }
    try {
      return prompt ? parseJsonBytesWithTokenIds(bytes) : parseJsonBytes(bytes);
    } catch (err) {
      if (err instanceof JsonDepthError) throw new KvmeshError("KVMESH_INVALID_FIELD", err.message, { details: { field: "body" } });
      if (err instanceof SyntaxError) throw new KvmeshError("KVMESH_MALFORMED_JSON", `malformed JSON: ${err.message}`);
      throw err;
    }
  });
}

const tooLarge = (limit: number): KvmeshError => new KvmeshError("KVMESH_BODY_TOO_LARGE", `request body exceeds the limit of ${limit} bytes`);

function isJsonContentType(h: IncomingHttpHeaders): boolean {
  const ct = h["content-type"];
  if (ct === undefined) return false;
  const semi = ct.indexOf(";");
  const mime = (semi < 0 ? ct : ct.slice(0, semi)).trim().toLowerCase();
  return mime === JSON_CONTENT_TYPE || (mime.startsWith("application/") && mime.endsWith("+json"));
}

/**
 * Bodies of several chunks are joined in one shared scratch buffer rather than a fresh one each.
 * Why: a Buffer.concat per body (bench:http's prompts are ~85 KB) kept V8 running mark-compacts
 * several times as often (--trace-gc), which cost the daemon a good part of its CPU per flow
 * (`npm run bench:http`). The scratch is only read synchronously by `consume`.
 */
let bodyScratch = Buffer.allocUnsafeSlow(0);
/** A larger scratch is not kept: a few 8 MiB bodies must not pin 8 MiB for good. */
const MAX_KEPT_BODY_SCRATCH_BYTES = 1024 * 1024;

function joinChunks(chunks: readonly Buffer[], size: number): Buffer {
  if (chunks.length === 1) return chunks[0] as Buffer;
  let out = bodyScratch;
  if (out.length < size) {
    out = Buffer.allocUnsafeSlow(Math.max(size, 2 * out.length));
    if (out.length <= MAX_KEPT_BODY_SCRATCH_BYTES) bodyScratch = out;
  }
  let at = 0;
  for (const c of chunks) {
    c.copy(out, at);
    at += c.length;
  }
  return out.subarray(0, size);
}

/**
 * Collects the body up to `limit` bytes and hands it to `consume`, synchronously, at its end: the
 * bytes may live in the shared scratch, so `consume` must not keep a view of them (parsing copies
 * what it keeps). Past `limit`, stops reading (nothing more is buffered) and rejects with 413.
 */
function readBytes<T>(req: IncomingMessage, limit: number, consume: (bytes: Buffer) => T): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const cleanup = (): void => {
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("error", onError);
      req.off("close", onClose);
    };
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > limit) {
        cleanup();
        req.pause();
        chunks.length = 0;
        reject(tooLarge(limit));
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = (): void => {
      cleanup();
      try {
        resolve(consume(joinChunks(chunks, size)));
      } catch (err) {
        reject(err instanceof Error ? err : new Error(String(err)));
      }
    };
    const onError = (): void => {
      cleanup();
      reject(new ClientGoneError("request aborted"));
    };
    const onClose = (): void => {
      if (!req.complete) onError();
    };
    req.on("data", onData);
    req.on("end", onEnd);
    req.on("error", onError);
    req.on("close", onClose);
  });
}
