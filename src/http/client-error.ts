/**
 * Answers for requests node:http's parser refuses before any handler runs (bad framing, an
 * invalid method or header, headers over 16 KiB, a client too slow for the header or request
 * timeout): the same `{"error", "code"}` JSON as every other error, instead of node's bare
 * "HTTP/1.1 400 Bad Request" with no body.
 *
 * Ordering matters with pipelining: node has already emitted 'request' for the valid requests
 * ahead of the garbage on the same connection, and their handlers may still be running (reading
 * a body, or awaiting the mesh). Node's default reply writes the 400 at once and destroys the
 * socket, so the client reads that 400 as the answer to its *earlier* request (which may have
 * booked a reservation) and the real answer is lost. Here the error reply waits until every
 * response owed to a fully received request on the connection has been written, then closes it.
 * A request whose body is what broke the parser (a bad chunk size, or a body too slow for the
 * request timeout) will never complete: the error reply is its answer, so it is not waited for.
 */
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { Logger } from "pino";

import { ERROR_CODES, type ErrorCode } from "../core/index.js";

/** Bound on waiting for in-flight responses before the error reply: past it the socket is cut. */
export const CLIENT_ERROR_DRAIN_TIMEOUT_MS = 10_000;

interface SocketState {
  /** Requests on this socket whose response has not finished. */
  readonly inflight: Set<IncomingMessage>;
  /** Set once a parse error was seen: runs when no fully received request awaits its response. */
  pending: (() => void) | undefined;
  done: boolean;
}

/** Responses still owed to requests the parser finished (their handlers will answer). */
const owed = (st: SocketState): boolean => {
  for (const req of st.inflight) if (req.complete) return true;
  return false;
};

/** node's parser error codes -> our status and code (node's default replies use the same statuses). */
function classify(err: NodeJS.ErrnoException): { code: ErrorCode; message: string } {
  switch (err.code) {
    case "HPE_HEADER_OVERFLOW":
      return { code: "KVMESH_HEADERS_TOO_LARGE", message: "request headers exceed the server's limit (16 KiB)" };
    case "HPE_CHUNK_EXTENSIONS_OVERFLOW":
      return { code: "KVMESH_BODY_TOO_LARGE", message: "chunk extensions exceed the server's limit" };
    case "ERR_HTTP_REQUEST_TIMEOUT":
      return { code: "KVMESH_REQUEST_TIMEOUT", message: "request not received within the server's header or request timeout" };
    case undefined:
    default:
      return { code: "KVMESH_BAD_REQUEST", message: `malformed HTTP request (${err.code ?? "parse error"})` };
  }
}

function errorReply(code: ErrorCode, message: string): string {
  const body = JSON.stringify({ error: message, code });
  const status = ERROR_CODES[code].status;
  return (
    `HTTP/1.1 ${status} ${statusText(status)}\r\nconnection: close\r\ncontent-type: application/json\r\n` +
    `content-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
  );
}

const statusText = (status: number): string => ({ 400: "Bad Request", 408: "Request Timeout", 413: "Payload Too Large", 431: "Request Header Fields Too Large" })[status] ?? "Error";

/** Installs the 'clientError' handler (and the per-socket request accounting it needs) on `server`. */
export function handleClientErrors(server: Server, log: Logger): void {
  const sockets = new WeakMap<Socket, SocketState>();
  const stateOf = (s: Socket): SocketState => {
    let st = sockets.get(s);
    if (st === undefined) {
      st = { inflight: new Set(), pending: undefined, done: false };
      sockets.set(s, st);
    }
    return st;
  };

  server.on("request", (req: IncomingMessage, res: ServerResponse) => {
    const st = stateOf(req.socket);
    st.inflight.add(req);
    res.once("close", () => {
      st.inflight.delete(req);
      if (st.pending !== undefined && !owed(st)) st.pending();
    });
  });

  server.on("clientError", (err: NodeJS.ErrnoException, socket: Socket) => {
    const st = stateOf(socket);
    // The parser reports once per chunk after an error; only the first one answers.
    if (st.done) return;
    st.done = true;
    if (err.code === "ECONNRESET" || !socket.writable) {
      socket.destroy();
      return;
    }
    const { code, message } = classify(err);
    log.debug({ code: err.code, remote: socket.remoteAddress }, "refused a malformed or too slow HTTP request");
    const reply = (): void => {
      st.pending = undefined;
      if (!socket.writable) {
        socket.destroy();
        return;
      }
      socket.end(errorReply(code, message));
      // end() waits for the peer's FIN; a client that never sends one must not hold the socket.
      setTimeout(() => socket.destroy(), 1_000).unref();
    };
    if (!owed(st)) {
      reply();
      return;
    }
    st.pending = reply;
    setTimeout(() => {
      if (st.pending !== undefined) socket.destroy();
    }, CLIENT_ERROR_DRAIN_TIMEOUT_MS).unref();
  });
}
