/** Bounded concurrency for the benchmarks' admin fan-outs (registrations, probes), on p-queue. */
import PQueue from "p-queue";

/**
 * Runs `fn` over `items` with at most `limit` calls in flight; resolves when all are done and
 * rejects with the first failure (calls already started still run to their end).
 */
export async function mapLimited<T, R = void>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const queue = new PQueue({ concurrency: Math.max(1, limit) });
  return queue.addAll(items.map((item) => () => fn(item)));
}
