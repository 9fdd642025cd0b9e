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
/** Descriptors kept out of the KV budget for everything else (HTTP clients, mesh, files), at most. */
export const DEFAULT_FD_RESERVE = 1_024;
/** The reserve is at most this fraction of a small limit, so a 1,024-fd process still gets ranks. */
const RESERVE_FRACTION = 0.25;

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

/** Reserve for a given limit: DEFAULT_FD_RESERVE, or a quarter of a small limit. */
export function fdReserve(fdLimit: number): number {
  return Math.min(DEFAULT_FD_RESERVE, Math.floor(fdLimit * RESERVE_FRACTION));
}

/** KV ranks that fit under `fdLimit` (null: no limit known, no budget). */
export function kvRankBudget(fdLimit: number | null): number | null {
  if (fdLimit === null) return null;
  return Math.max(0, Math.floor((fdLimit - fdReserve(fdLimit)) / FDS_PER_KV_RANK));
}
