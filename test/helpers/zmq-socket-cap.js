/**
 * Preloaded into a `kvmesh serve` child (`node --import`) to pin its ZeroMQ socket cap low: libzmq
 * fixes the default context's cap at its first socket, so the daemon's own raise (10,240,
 * src/ingest/zmq-socket-limit.ts) then changes nothing. A worker with more ranks (3 sockets each)
 * than fit is refused on this replica only: how the system tests make a registration fail on one
 * replica of a mesh (its KV endpoints cannot be opened there, as #17 F2 found with EMFILE).
 */
import { context, Publisher } from "zeromq";

/** The pin, the mesh's PUB, control ROUTER and a few control DEALERs, and four 1-rank workers. */
export const PINNED_MAX_SOCKETS = 24;

context.maxSockets = PINNED_MAX_SOCKETS;
// The first socket fixes the cap; kept open for the life of the process.
globalThis.kvmeshTestSocketCapPin = new Publisher({ linger: 0 });
