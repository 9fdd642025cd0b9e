/**
 * The picker's HTTP/2 receive windows (docs/gateway.md#transport).
 *
 * Node's defaults are 64 KiB per stream and 64 KiB per connection, and Node sends a WINDOW_UPDATE
 * only once the event loop has read what came before. All of a gateway's uploads then share 64 KiB
 * per turn of the picker's loop: at 150 streams of 220 KB bodies that, not the CPU, bounded the
 * picker (100 req/s, added latency p50 313 ms; with 256 KiB / 1 MiB windows 152 req/s, p50 11 ms).
 *
 * grpc-js 1.14 has no server option for either window (its `grpc-node.flow_control_window` is read
 * by clients only), so this reaches the node:http2 servers a grpc-js Server keeps once bound. A
 * grpc-js that keeps them elsewhere fails the start loudly (and test/system/extproc/windows.test.ts)
 * rather than serving with the small windows unnoticed.
 */
import type { Http2Server, Http2SecureServer, ServerHttp2Session } from "node:http2";

import type { Server } from "@grpc/grpc-js";

import { KvmeshError } from "../core/index.js";

export interface ReceiveWindows {
  /** Per stream, bytes: SETTINGS_INITIAL_WINDOW_SIZE. */
  readonly streamBytes: number;
  /** Per connection, bytes: raised by a WINDOW_UPDATE on stream 0 as each session opens. */
  readonly connectionBytes: number;
}

type Http2Like = Http2Server | Http2SecureServer;

function boundHttp2Servers(server: Server): Http2Like[] {
  const held = (server as unknown as { http2Servers?: unknown }).http2Servers;
  if (!(held instanceof Map)) throw new KvmeshError("KVMESH_INTERNAL", "@grpc/grpc-js keeps no http2Servers map: the ext_proc receive windows cannot be set (is @grpc/grpc-js newer than 1.14?)");
  const out: Http2Like[] = [];
  for (const h2 of held.keys() as IterableIterator<unknown>) {
    const candidate = h2 as Partial<Http2Like>;
    if (typeof candidate.updateSettings !== "function" || typeof candidate.on !== "function") throw new KvmeshError("KVMESH_INTERNAL", "@grpc/grpc-js's http2Servers holds something other than node:http2 servers");
    out.push(h2 as Http2Like);
  }
  if (out.length === 0) throw new KvmeshError("KVMESH_INTERNAL", "@grpc/grpc-js holds no bound http2 server: set the receive windows after bindAsync");
  return out;
}

/**
 * Applies `windows` to every connection `server` accepts from now on (call it right after
 * bindAsync, before a connection can arrive). `onError` hears a session that refused the
 * connection window (it keeps Node's 64 KiB and still works).
 */
export function applyReceiveWindows(server: Server, windows: ReceiveWindows, onError: (err: unknown) => void): void {
  for (const h2 of boundHttp2Servers(server)) {
    h2.updateSettings({ initialWindowSize: windows.streamBytes });
    h2.on("session", (session: ServerHttp2Session) => {
      try {
        session.setLocalWindowSize(windows.connectionBytes);
      } catch (err) {
        onError(err);
      }
    });
  }
}
