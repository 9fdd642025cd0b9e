/**
 * libzmq's default context allows 1,023 sockets (ZMQ_MAX_SOCKETS). The daemon keeps one SUB per
 * worker rank plus a DEALER per rank while it replays, so a 1,024-worker fleet failed at the
 * 1,024th subscription with EMFILE, whatever the process's fd limit. libzmq reads the limit when
 * the context creates its first socket, so this must run before any socket exists (later calls
 * change nothing, which is harmless).
 */
import { context } from "zeromq";

/**
 * Slots cost 8 B each. Each KV rank holds 3 sockets (its SUB and the two inproc sockets of the
 * connection observer), plus a replay DEALER while it replays: about 3,400 ranks fit with room
 * for the mesh's sockets (#17 F2 measured the cap at about 3,413 ranks, not the 4,096 once
 * written here). A rank past it makes its worker incomplete with ZeroMQ's EMFILE as the reason
 * (src/app/daemon.ts), never schedulable.
 */
export const DAEMON_ZMQ_MAX_SOCKETS = 10_240;

export function raiseZmqSocketLimit(max = DAEMON_ZMQ_MAX_SOCKETS): void {
  if (context.maxSockets < max) context.maxSockets = max;
}
