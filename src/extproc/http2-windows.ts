/**
 * HTTP/2 flow-control windows of the ext_proc server. Node's HTTP/2 defaults are RFC 7540's 65,535
 * bytes, per stream and per connection, and grpc-js's Server has no option to change them. With
 * them a gateway may send a stream 64 KiB of body, then must wait for the picker's WINDOW_UPDATE,
 * which the picker sends only when its event loop has read the data: a 220 KB body took four
 * such round trips, each queued behind whatever the loop was doing (another stream's pick), and
 * every stream of a connection shared one 64 KiB connection window. bench:epp measured the time
 * from the client's last chunk to the picker's reading it at 39-79 ms p50 with 20 streams, against
 * 1.7 ms from reading it to answering (load ~8, 2 cores).
 *
 * Envoy advertises 256 MiB windows of its own by default, so the answer path is not limited; this
 * sets the picker's receive windows so that a whole body is in flight at once.
 */
import type { Http2Server, ServerHttp2Session } from "node:http2";

import type { Server } from "@grpc/grpc-js";
import type { Logger } from "pino";

/** Each stream's receive window, bytes: a 220 KB body (GIE #2928's case) and bodies up to 1 MiB arrive without waiting for the picker. */
export const EXT_PROC_STREAM_WINDOW_BYTES = 1024 * 1024;
/** The connection's receive window, bytes: 150 streams x 220 KB (33 MB) over a few connections, as Envoy multiplexes them; bounded, so one connection cannot make the picker buffer without limit. */
export const EXT_PROC_CONNECTION_WINDOW_BYTES = 32 * 1024 * 1024;

export interface Http2Windows {
  readonly streamBytes: number;
  readonly connectionBytes: number;
}

/**
 * Applies the windows to every HTTP/2 server a bound grpc-js Server runs. grpc-js keeps them in a
 * private map (1.14.x: `http2Servers`); when a future version does not, the picker keeps Node's
 * defaults (slower, still correct) and says so in the log. test/system/extproc checks the
 * windows a client is actually offered.
 */
export function applyHttp2Windows(server: Server, windows: Http2Windows, logger: Logger): boolean {
  const servers = (server as unknown as { http2Servers?: unknown }).http2Servers;
  if (!(servers instanceof Map)) {
    logger.warn("grpc-js keeps no http2Servers map: the ext_proc server keeps HTTP/2's 64 KiB flow-control windows (large bodies wait for window updates)");
    return false;
  }
  for (const h of servers.keys() as IterableIterator<Http2Server>) {
    h.updateSettings({ initialWindowSize: windows.streamBytes });
    h.on("session", (session: ServerHttp2Session) => {
      session.setLocalWindowSize(windows.connectionBytes);
    });
  }
  return true;
}
