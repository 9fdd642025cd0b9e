/** Polling wait for tests that observe asynchronous socket effects, instead of fixed sleeps. */

export const DEFAULT_WAIT_TIMEOUT_MS = 5_000;
export const WAIT_POLL_INTERVAL_MS = 5;

/**
 * Resolves as soon as `predicate` returns true; rejects after `timeoutMs` with `message` (or the
 * result of calling it, so the failure can show the state that was observed last).
 */
export async function waitFor(
  predicate: () => boolean | Promise<boolean>,
  timeoutMs: number = DEFAULT_WAIT_TIMEOUT_MS,
  message: string | (() => string) = "condition",
): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if (await predicate()) return;
    if (performance.now() >= deadline) {
      const what = typeof message === "string" ? message : message();
      throw new Error(`waitFor: timed out after ${timeoutMs} ms waiting for ${what}`);
    }
    await new Promise<void>((resolve) => setTimeout(resolve, WAIT_POLL_INTERVAL_MS));
  }
}
