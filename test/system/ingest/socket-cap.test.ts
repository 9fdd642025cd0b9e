/**
 * #17 F2: a worker whose KV-event sockets cannot be opened (ZeroMQ's socket cap: EMFILE) must
 * not count as schedulable. This file's process pins the default context's cap low before any
 * socket exists (libzmq reads it at the first socket, so the daemon's own raise changes nothing
 * here), then registers more ranks than fit.
 */
import { pino } from "pino";
import { context, Publisher } from "zeromq";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { freePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

/** Sockets this process may open: the pinning socket, the daemon's (none without a mesh) and a few KV ranks. */
const CAP = 12;
/** Each KV rank holds 3 sockets (its SUB and its connection observer's pair). */
const RANKS = 8;

describe("a worker past the ZeroMQ socket cap (#17 F2)", () => {
  let d: Daemon;
  let pin: Publisher;
  beforeAll(async () => {
    context.maxSockets = CAP;
    // The first socket fixes the cap for the context.
    pin = new Publisher({ linger: 0 });
    d = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0 }, pino({ level: "silent" }));
  });
  afterAll(async () => {
    await d.close();
    pin.close();
  });

  it("is registered incomplete with ZeroMQ's refusal as the reason, and is never ready or selected", async () => {
    const base = await freePortPair();
    const endpoints = Object.fromEntries(Array.from({ length: RANKS }, (_, r) => [String(r), `tcp://127.0.0.1:${base + 2 + r}`]));
    const w = d.service.upsertWorker({ worker_id: 7n, endpoint: "http://w7", block_size: 16, data_parallel_size: RANKS, kv_events_endpoints: endpoints });
    // Accepted first (its endpoints are well formed); the listeners then fail to open.
    expect(w.lifecycle).toBe("schedulable");
    await waitFor(() => d.service.getWorker(7n)?.lifecycle === "incomplete", 10_000, "the worker incomplete");
    const reasons = d.service.getWorker(7n)?.not_schedulable_reasons ?? [];
    expect(reasons.join("\n")).toMatch(/ZeroMQ refused `tcp:\/\/127\.0\.0\.1:\d+`: .*(Too many open files|EMFILE)/i);
    const ready = await fetch(`http://127.0.0.1:${String(d.port)}/ready`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { schedulable_workers: number }).schedulable_workers).toBe(0);
    const sel = await fetch(`http://127.0.0.1:${String(d.port)}/select`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ token_ids: [1, 2, 3, 4] }) });
    expect(sel.status).toBe(503);
  });
});
