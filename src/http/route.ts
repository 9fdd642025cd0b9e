/**
 * What a route is: its method, pattern, body mode and handler, and what a handler returns. The
 * route groups (src/http/routes/, the status page) build these; the server (src/http/server.ts)
 * dispatches to them.
 */
import type { IncomingMessage, ServerResponse } from "node:http";

import type { SelectionNote } from "../core/index.js";

export type BodyMode = "none" | "required" | "optional";

export interface Reply {
  readonly status: number;
  readonly body: unknown;
  /** Pre-rendered non-JSON body (GET /metrics, the status page's files). */
  readonly text?: { readonly body: string; readonly contentType: string };
  /** Extra response headers (a redirect's location, the status page's cache and CSP headers). */
  readonly headers?: Readonly<Record<string, string>>;
  /** Takes over the response (GET /session_bindings/updates streams NDJSON). */
  readonly stream?: (req: IncomingMessage, res: ServerResponse) => void;
}

export interface RequestContext {
  readonly params: readonly string[];
  readonly query: URLSearchParams | undefined;
  readonly body: unknown;
  /** With tracing on: filled by the selection routes with what the choice decided (the span's attributes). */
  readonly note: SelectionNote | undefined;
}

export interface Route {
  readonly method: "GET" | "POST" | "PATCH" | "DELETE";
  /** Metric label and matcher: ":id" matches one URL-decoded path segment. */
  readonly pattern: string;
  readonly body: BodyMode;
  /** The body may carry a prompt: its token_ids are parsed straight into a Uint32Array (token-ids.ts). */
  readonly prompt?: true;
  readonly handle: (ctx: RequestContext) => Reply | Promise<Reply>;
}

export const OK = { status: "ok" } as const;

export const reply = (status: number, body: unknown): Reply => ({ status, body });

/** A query parameter, undefined when absent or empty. */
export const queryParam = (q: URLSearchParams | undefined, name: string): string | undefined => {
  const v = q?.get(name);
  return v === null || v === undefined || v === "" ? undefined : v;
};

/** The i-th ":id" path parameter (URL-decoded). */
export const param = (ctx: RequestContext, i: number): string => ctx.params[i] ?? "";
