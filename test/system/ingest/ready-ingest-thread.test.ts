/**
 * What GET /ready says while the KV ingest thread is dead and waits for its restart: it stays as
 * it was (200 with a schedulable worker; routing on an index a moment stale beats refusing every
 * request) and says so, `kv_ingest: "restarting"` with the restart count; once the new thread is
 * up the fields are gone. A real daemon in this process, a real ZeroMQ publisher on loopback.
 */
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { MockKvPublisher } from "../../helpers/kv-publisher.js";
import { waitFor } from "../../helpers/wait.js";

/** Liveness deadlines for a loaded machine (a thread starts through tsx), not speed targets. */
const WAIT_MS = 20_000;

let cleanup: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanup.reverse()) await c();
  cleanup = [];
});

async function ready(d: Daemon): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`http://${d.host}:${d.port}/ready`);
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

describe("GET /ready and a dead KV ingest thread", () => {
  it("stays ready while the thread restarts, saying kv_ingest: restarting with the restart count", async () => {
    const pub = await MockKvPublisher.create();
    cleanup.push(() => pub.close());
    const daemon = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0 }, pino({ level: "silent" }));
    cleanup.push(() => daemon.close());
    const thread = daemon.ingestThread;
    if (thread === undefined) throw new Error("the daemon runs its KV ingest thread by default");
    const reg = await fetch(`http://${daemon.host}:${daemon.port}/workers`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ worker_id: 1, endpoint: "http://w1", block_size: 16, kv_events_endpoint: pub.endpoint }),
    });
    expect(reg.status).toBeLessThan(300);
    await waitFor(async () => (await ready(daemon)).status === 200, WAIT_MS, "the worker schedulable");
    expect((await ready(daemon)).body).not.toHaveProperty("kv_ingest");

    thread.crashThreadForTest();
    // Between the thread's death and its restart (its sockets' close, then 100 ms of backoff).
    let seen: { status: number; body: Record<string, unknown> } | undefined;
    await waitFor(
      async () => {
        const r = await ready(daemon);
        if (r.body.kv_ingest !== undefined) seen = r;
        return seen !== undefined || thread.restarts > 0 && thread.up;
      },
      WAIT_MS,
      "the restart",
    );
    expect(seen, "GET /ready polled while the thread was down").toBeDefined();
    expect(seen?.status).toBe(200);
    expect(seen?.body).toMatchObject({ ready: true, kv_ingest: "restarting", kv_ingest_restarts: 1 });

    await waitFor(() => thread.up, WAIT_MS, "the new thread up");
    const after = await ready(daemon);
    expect(after.status).toBe(200);
    expect(after.body).not.toHaveProperty("kv_ingest");
  }, 60_000);
});
