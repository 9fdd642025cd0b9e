/** The status page's routes over HTTP, on an in-process daemon: redirect, files, headers, state, errors and the token. */
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { ApiToken } from "../../../src/http/auth.js";

const TOKEN = "uI7tK2pQ9xV4mN8bR3wS6yZ1cF5hJ0dL";
const silent = pino({ level: "silent" });
const url = (d: Daemon, path: string): string => `http://127.0.0.1:${String(d.port)}${path}`;

describe("GET /ui and /ui/state", () => {
  let d: Daemon;
  beforeAll(async () => {
    d = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false }, silent);
    d.service.upsertWorker({ worker_id: 5n, endpoint: "http://w5", block_size: 16, total_kv_blocks: 64, data_parallel_size: 2 });
  });
  afterAll(async () => {
    await d.close();
  });

  it("redirects / to /ui", async () => {
    const r = await fetch(url(d, "/"), { redirect: "manual" });
    expect(r.status).toBe(302);
    expect(r.headers.get("location")).toBe("/ui");
  });

  it("serves the page, its script and its style with their types, a CSP and no caching of stale copies", async () => {
    const page = await fetch(url(d, "/ui"));
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toBe("text/html; charset=utf-8");
    expect(page.headers.get("content-security-policy")).toContain("script-src 'self'");
    expect(page.headers.get("cache-control")).toBe("no-cache");
    expect(await page.text()).toContain("<title>kvmesh status</title>");
    const js = await fetch(url(d, "/ui/app.js"));
    expect(js.headers.get("content-type")).toBe("text/javascript; charset=utf-8");
    expect(js.headers.get("x-content-type-options")).toBe("nosniff");
    expect((await fetch(url(d, "/ui/app.css"))).headers.get("content-type")).toBe("text/css; charset=utf-8");
    const head = await fetch(url(d, "/ui"), { method: "HEAD" });
    expect([head.status, await head.text()]).toEqual([200, ""]);
  });

  it("answers the state as one JSON document, not cached, ranks busiest first", async () => {
    const booked = await fetch(url(d, "/select_and_reserve"), { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ token_ids: Array.from({ length: 40 }, (_, i) => i) }) });
    expect(booked.status).toBe(200);
    const r = await fetch(url(d, "/ui/state?top=1"));
    expect(r.status).toBe(200);
    expect(r.headers.get("cache-control")).toBe("no-store");
    const s = (await r.json()) as { replica: { id: string; http: string; mesh_endpoint: string | null }; peers: unknown[]; ranks: { total: number; rows: { worker_id: string; active_requests: number; capacity_blocks: number }[] }; routing: { totals: { selections: number } } };
    expect(s.replica.id).toBe(d.service.replicaId.toString());
    expect(s.replica.http).toBe(`127.0.0.1:${String(d.port)}`);
    expect(s.replica.mesh_endpoint).toBeNull();
    expect(s.peers).toEqual([]);
    expect(s.ranks.total).toBe(2);
    expect(s.ranks.rows).toEqual([expect.objectContaining({ worker_id: "5", active_requests: 1, capacity_blocks: 64 })]);
    expect(s.routing.totals.selections).toBe(1);
  });

  it("refuses a bad query 400 naming the field, and other methods 405", async () => {
    const bad = await fetch(url(d, "/ui/state?top=0"));
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ code: "KVMESH_BAD_REQUEST", details: { field: "top" } });
    const post = await fetch(url(d, "/ui"), { method: "POST" });
    expect(post.status).toBe(405);
    expect(post.headers.get("allow")).toBe("GET, HEAD");
  });
});

describe("the status page with --api-token-file", () => {
  let d: Daemon;
  beforeAll(async () => {
    d = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false, apiToken: ApiToken.fromString(TOKEN) }, silent);
  });
  afterAll(async () => {
    await d.close();
  });

  it("serves the page openly but its data only with the token", async () => {
    expect((await fetch(url(d, "/ui"))).status).toBe(200);
    expect((await fetch(url(d, "/ui/app.js"))).status).toBe(200);
    const none = await fetch(url(d, "/ui/state"));
    expect(none.status).toBe(401);
    expect(none.headers.get("www-authenticate")).toBe('Bearer realm="kvmesh"');
    const wrong = await fetch(url(d, "/ui/state"), { headers: { authorization: `Bearer ${TOKEN.slice(0, -1)}x` } });
    expect(wrong.status).toBe(401);
    const ok = await fetch(url(d, "/ui/state"), { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(ok.status).toBe(200);
    expect(((await ok.json()) as { replica: { id: string } }).replica.id).toBe(d.service.replicaId.toString());
  });
});
