/**
 * The endpoint picker's named defaults, apart from its code so that src/config.ts (and the CLI)
 * read them without loading gRPC: the daemon imports the picker only when --ext-proc-port is set.
 */

/** Largest request body the picker buffers, bytes (16 MiB: a 220 KB chat body is far under it; a 2M-token prompt of ids is about 14 MiB). */
export const DEFAULT_EXT_PROC_MAX_BODY_BYTES = 16 * 1024 * 1024;
/** The session id's header (the gateway protocol names none; agents and gateways commonly send x-session-id). */
export const DEFAULT_SESSION_HEADER = "x-session-id";
/** The routing group's header (kvmesh's own; absent: the default group). */
export const DEFAULT_ROUTING_GROUP_HEADER = "x-kvmesh-routing-group";
/** Default spacing of data-parallel ranks' ports (vLLM and SGLang offset per-rank ports by the rank). */
export const DEFAULT_DP_RANK_PORT_STRIDE = 1;

/** When tokenization fails: route by session and load alone, or answer 503. */
export type TokenizerFailure = "route" | "reject";
export const TOKENIZER_FAILURE_MODES: readonly TokenizerFailure[] = ["route", "reject"];
