/**
 * The endpoint picker's named defaults, apart from its code so that src/config.ts (and the CLI)
 * read them without loading gRPC: the daemon imports the picker only when --ext-proc-port is set.
 */

/** Largest request body the picker buffers, bytes (16 MiB: a 220 KB chat body is far under it; a 2M-token prompt of ids is about 14 MiB). */
export const DEFAULT_EXT_PROC_MAX_BODY_BYTES = 16 * 1024 * 1024;
/**
 * The picker's HTTP/2 receive window per stream, bytes (256 KiB; Node's default is 64 KiB). A
 * 220 KB body (GIE #2928's case) then arrives without waiting for a WINDOW_UPDATE, which Node
 * sends only once the picker's event loop has read what came before: with 64 KiB windows a
 * 220 KB body took three such round trips through a busy loop (`npm run bench:epp`, 150 streams:
 * 100 req/s and added latency p50 313 ms; with these windows 152 req/s, p50 11 ms; docs/gateway.md).
 */
export const DEFAULT_EXT_PROC_STREAM_WINDOW_BYTES = 256 * 1024;
/**
 * The picker's HTTP/2 receive window per connection, shared by its streams, bytes (1 MiB; Node's
 * default is 64 KiB, which throttled all of a gateway's uploads to 64 KiB per picker event-loop
 * turn). Kept under a loopback socket's send buffer (4 MiB here) on purpose: a Node peer (Node's
 * HTTP/2 stops reading its socket while one of its own writes is pending) deadlocked against the
 * picker, which does the same, once both had more in flight than the sockets could buffer (seen
 * with 32 MiB and a client with Envoy's 256 MiB windows; docs/gateway.md#transport).
 */
export const DEFAULT_EXT_PROC_CONNECTION_WINDOW_BYTES = 1024 * 1024;
/** HTTP/2's default (and the flags' smallest) window and its largest (2^31 - 1; RFC 9113 6.9.1), bytes. */
export const HTTP2_MIN_WINDOW_BYTES = 65_535;
export const HTTP2_MAX_WINDOW_BYTES = 2 ** 31 - 1;
/** The session id's header (the gateway protocol names none; agents and gateways commonly send x-session-id). */
export const DEFAULT_SESSION_HEADER = "x-session-id";
/** The routing group's header (kvmesh's own; absent: the default group). */
export const DEFAULT_ROUTING_GROUP_HEADER = "x-kvmesh-routing-group";
/** Default spacing of data-parallel ranks' ports (vLLM and SGLang offset per-rank ports by the rank). */
export const DEFAULT_DP_RANK_PORT_STRIDE = 1;

/** When tokenization fails: route by session and load alone, or answer 503. */
export type TokenizerFailure = "route" | "reject";
export const TOKENIZER_FAILURE_MODES: readonly TokenizerFailure[] = ["route", "reject"];
