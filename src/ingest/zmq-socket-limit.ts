/**
 * libzmq's default context allows 1,023 sockets (ZMQ_MAX_SOCKETS). The daemon keeps one SUB per
 * worker rank plus a DEALER per rank while it replays, so a 1,024-worker fleet failed at the
 * 1,024th subscription with EMFILE, whatever the process's fd limit. libzmq reads the limit when
 * the context creates its first socket, so this must run before any socket exists (later calls
 * change nothing, which is harmless).
 */
import { context } from "zeromq";

/** 4,096 ranks x (SUB + replay DEALER) with room for the mesh's sockets; slots cost 8 B each. */
export const DAEMON_ZMQ_MAX_SOCKETS = 10_240;

export function raiseZmqSocketLimit(max = DAEMON_ZMQ_MAX_SOCKETS): void {
  if (context.maxSockets < max) context.maxSockets = max;
}
