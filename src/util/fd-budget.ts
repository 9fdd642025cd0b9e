/**
 * How many KV ranks this process can hold open without running out of file descriptors.
 *
 * A rank costs about 3 descriptors while idle (its SUB's mailbox and the two PAIR mailboxes of its
 * connection observer: 500 ranks measured 1,504 fds in /proc/self/fd) plus its TCP connection, and
 * 2 more while it replays. Reaching the process's limit is not just a refused rank: at EMFILE,
 * libzmq stopped reaping every socket closed afterwards (its observers never ended, and the
 * process stayed at the limit after all its workers were deleted, 4,071 of 4,096 fds as eventfds:
 * #29 F1), and the HTTP server could no longer accept a connection. So ranks past the budget are
 * refused before a socket is opened, keeping a reserve of descriptors for HTTP clients, the mesh,
 * files and the replay DEALERs.
 */
import { readFileSync } from "node:fs";

/** Descriptors one KV rank holds: 3 socket mailboxes and its TCP connection. */
export const FDS_PER_KV_RANK = 4;
/**
 * The fraction of the fd limit kept out of the KV budget for everything else; HTTP connections get
 * half of it (defaultMaxConnections), the mesh, files and replay DEALERs the rest. At 20,000 fds
 * that leaves 3,750 KV ranks, more than ZeroMQ's socket cap allows anyway (zmq-socket-limit.ts).
 */
export const FD_RESERVE_FRACTION = 0.25;
/** HTTP connections at once where the fd limit is unknown (not Linux) or unlimited. */
export const DEFAULT_MAX_CONNECTIONS_NO_FD_LIMIT = 4_096;
/** Fewest HTTP connections a default allows, however low the fd limit. */
const MIN_DEFAULT_MAX_CONNECTIONS = 16;

/** The soft RLIMIT_NOFILE from /proc/self/limits, or null where that is unknown (not Linux) or unlimited. */
export function processFdLimit(read: () => string = () => readFileSync("/proc/self/limits", "utf8")): number | null {
  let text: string;
  try {
    text = read();
  } catch {
    return null;
  }
  const m = /^Max open files\s+(\d+|unlimited)\s/m.exec(text);
  if (m?.[1] === undefined || m[1] === "unlimited") return null;
  const n = Number(m[1]);
  return Number.isSafeInteger(n) && n > 0 ? n : null;
}

/** Descriptors kept out of the KV budget. */
export function fdReserve(fdLimit: number): number {
  return Math.floor(fdLimit * FD_RESERVE_FRACTION);
}

/** --max-connections' default: half the reserve (#29 G10: 1,200 idle sockets under a 1,024-fd limit reset new clients). */
export function defaultMaxConnections(fdLimit: number | null): number {
  if (fdLimit === null) return DEFAULT_MAX_CONNECTIONS_NO_FD_LIMIT;
  return Math.max(MIN_DEFAULT_MAX_CONNECTIONS, Math.floor(fdReserve(fdLimit) / 2));
}

/** KV ranks that fit under `fdLimit` (null: no limit known, no budget). */
export function kvRankBudget(fdLimit: number | null): number | null {
  if (fdLimit === null) return null;
  return Math.max(0, Math.floor((fdLimit - fdReserve(fdLimit)) / FDS_PER_KV_RANK));
}
