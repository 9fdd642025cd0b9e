/**
 * The daemon's last closes (the mesh, then the KV ingest) run whatever failed before them: each
 * owns a worker thread with ZeroMQ sockets, and one left running when the process exits is torn
 * down with its sockets receiving, which aborts the process (#29, docs/ingest-thread.md).
 */

/** Runs every close in order, each even after one before it failed; rethrows the first failure once all have run. */
export async function closeAll(closes: readonly (() => Promise<void> | undefined)[]): Promise<void> {
  let first: unknown;
  let failed = false;
  for (const close of closes) {
    try {
      await close();
    } catch (err) {
      if (!failed) first = err;
      failed = true;
    }
  }
  if (failed) throw first;
}
