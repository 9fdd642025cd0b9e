/**
 * Bounds on HTTP connections (#29 G10): 1,200 idle sockets under a 1,024-fd limit left no
 * descriptor for new clients (they were reset) nor for a KV listener. A connection past `max`, or
 * past `perClient` from one remote address, is closed at once (counted, logged throttled); one
 * that has sent no request within FIRST_REQUEST_TIMEOUT_MS is closed, where node's header timeout
 * let it sit 66 to 96 s. Keep-alive connections that served a request keep the 65 s idle timeout
 * (server.ts: above load balancers' 60 s).
 */
import type { Server } from "node:http";
import type { Socket } from "node:net";

/** A new connection that has sent no complete request header in this long is closed, ms. */
export const FIRST_REQUEST_TIMEOUT_MS = 10_000;

export interface ConnectionLimits {
  /** Connections at once (--max-connections). */
  readonly max: number;
  /** Connections at once from one remote address (--max-connections-per-client). */
  readonly perClient: number;
}

export type ConnectionRefusal = "max_connections" | "per_client";

/** Applies the limits to `server`; `onRefused` counts and logs. */
export function limitConnections(server: Server, limits: ConnectionLimits, onRefused: (reason: ConnectionRefusal, remote: string | undefined) => void, firstRequestTimeoutMs = FIRST_REQUEST_TIMEOUT_MS): void {
  const perAddress = new Map<string, number>();
  let open = 0;
  server.on("connection", (socket: Socket) => {
    const remote = socket.remoteAddress ?? "";
    const mine = perAddress.get(remote) ?? 0;
    const reason: ConnectionRefusal | null = open >= limits.max ? "max_connections" : mine >= limits.perClient ? "per_client" : null;
    if (reason !== null) {
      onRefused(reason, socket.remoteAddress);
      socket.destroy();
      return;
    }
    open++;
    perAddress.set(remote, mine + 1);
    socket.once("close", () => {
      open--;
      const n = (perAddress.get(remote) ?? 1) - 1;
      if (n <= 0) perAddress.delete(remote);
      else perAddress.set(remote, n);
    });
    // Until the first request: node's own timeouts start with it.
    socket.setTimeout(firstRequestTimeoutMs, () => socket.destroy());
  });
  server.on("request", (req) => {
    req.socket.setTimeout(0);
  });
}
