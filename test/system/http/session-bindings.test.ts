import { EventEmitter } from "node:events";
import { request, type IncomingMessage, type ServerResponse } from "node:http";
import { connect, type Socket } from "node:net";

import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { ManualClock } from "../../../src/core/index.js";
import { parseJson } from "../../../src/http/json.js";
import { startHttpServer } from "../../../src/http/server.js";
import { BindingReplayRing, MAX_UNFLUSHED_SNAPSHOTS, NDJSON_CONTENT_TYPE, SessionBindingsHttp } from "../../../src/http/session-bindings.js";
import { SelectionService } from "../../../src/core/index.js";
import { makeService, tokens, worker } from "../../helpers/core-fixtures.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";
import { startTestServer, testMetrics, type TestServer } from "../../helpers/http-client.js";
import { waitFor } from "../../helpers/wait.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()?.();
});

type Line = Record<string, unknown> & { cursor: string; bindings: Record<string, unknown>[] };

function hostSvc(writerId: bigint): SelectionService {
  const { svc } = makeService({ sessionAffinity: { ttlSecs: 60, mode: "soft" }, sessionReplicationWriterId: writerId, replicaId: writerId, wallClockNs: () => 1_700_000_000_000_000_000n });
  return svc;
}

async function serve(svc: SelectionService): Promise<TestServer> {
  const t = await startTestServer({ svc });
  cleanups.push(() => t.close());
  for (const id of [1, 2]) expect((await t.call("POST", "/workers", worker(id))).status).toBe(201);
  return t;
}

interface StreamReader {
  readonly status: number;
  readonly contentType: string | undefined;
  /** Raw lines as received (without the newline). */
  readonly raw: string[];
  readonly lines: Line[];
  /** Resolves when the response closes: true when the server ended it (the whole chunked body arrived), false when the connection was cut. */
  readonly ended: Promise<boolean>;
  close(): void;
}

/** Opens GET /session_bindings/updates and collects its NDJSON lines as they arrive. */
function openStream(t: TestServer, query = ""): Promise<StreamReader> {
  return new Promise((resolve, reject) => {
    const req = request(`${t.base}/session_bindings/updates${query}`, (res) => {
      const raw: string[] = [];
      const lines: Line[] = [];
      let buf = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => {
        buf += chunk;
        let nl: number;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const l = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          raw.push(l);
          lines.push(parseJson(l) as Line);
        }
      });
      const ended = new Promise<boolean>((done) => {
        res.on("close", () => {
          done(res.complete);
        });
      });
      resolve({ status: res.statusCode ?? 0, contentType: res.headers["content-type"], raw, lines, ended, close: () => req.destroy() });
    });
    req.on("error", reject);
    req.end();
    cleanups.push(() => {
      req.destroy();
    });
  });
}

const obj = (v: unknown): Record<string, unknown> => v as Record<string, unknown>;
const withBindings = (s: StreamReader): Line[] => s.lines.filter((l) => l.bindings.length > 0);
const selectSession = async (t: TestServer, sessionId: string): Promise<unknown> => obj((await t.call("POST", "/select", { token_ids: tokens(1, 9), session_id: sessionId })).json).worker_id;

describe("HTTP host replication: disabled", () => {
  it("answers 409 on both routes without a writer id", async () => {
    const t = await startTestServer({ svc: makeService({ sessionAffinity: { ttlSecs: 60 } }).svc });
    cleanups.push(() => t.close());
    const get = await t.call("GET", "/session_bindings/updates");
    expect(get.status).toBe(409);
    expect(obj(get.json).code).toBe("KVMESH_HOST_REPLICATION_DISABLED");
    const post = await t.call("POST", "/session_bindings", { bindings: [] });
    expect(post.status).toBe(409);
    expect(obj(post.json).code).toBe("KVMESH_HOST_REPLICATION_DISABLED");
    expect((await t.call("GET", "/metrics")).text).not.toContain("kvmesh_session_bindings_stream_clients");
  });
});

describe("HTTP host replication: stream and apply", () => {
  it("streams batches as NDJSON, and a line POSTed verbatim to a peer applies there", async () => {
    const a = await serve(hostSvc(1n));
    const b = await serve(hostSvc(2n));
    const s = await openStream(a);
    expect(s.status).toBe(200);
    expect(s.contentType).toBe(NDJSON_CONTENT_TYPE);
    await waitFor(() => s.lines.length >= 1, 2_000, "the first line");
    expect(s.lines[0]).toMatchObject({ bindings: [], dropped: 0 });
    expect(s.lines[0]?.cursor).toMatch(/^[0-9a-f]{8}-0$/);

    const r = await a.call("POST", "/select_and_reserve", { token_ids: tokens(2), session_id: "conv", selection_id: "x" });
    await waitFor(() => withBindings(s).length >= 1, 2_000, "a binding line");
    const line = withBindings(s)[0] as Line;
    expect(line.bindings).toEqual([
      { model_name: "default", routing_group: "default", session_id: "conv", worker_id: obj(r.json).worker_id, dp_rank: 0, sequence: 1_700_000_000_000_000_000n, writer_id: 1, reason: "bind" },
    ]);
    expect(typeof line.sent_at_ms).toBe("number");
    // u64 fields stay exact in the text.
    expect(s.raw.find((l) => l.includes('"conv"'))).toContain('"sequence":1700000000000000000');

    const raw = s.raw[s.lines.indexOf(line)] as string;
    const applied = await b.call("POST", "/session_bindings", raw);
    expect(applied.status).toBe(200);
    expect(applied.json).toEqual({ outcomes: [{ outcome: "inserted" }] });
    expect(await selectSession(b, "conv")).toBe(obj(r.json).worker_id);
    // Replaying it is a refresh; its own line coming back to A is an echo.
    expect((await b.call("POST", "/session_bindings", raw)).json).toEqual({ outcomes: [{ outcome: "refreshed" }] });
    expect((await a.call("POST", "/session_bindings", raw)).json).toEqual({ outcomes: [{ outcome: "ignored-own" }] });
    // A finished request publishes a refresh line.
    await a.call("DELETE", "/reservations/x");
    await waitFor(() => withBindings(s).length >= 2, 2_000, "a refresh line");
    expect(withBindings(s)[1]?.bindings[0]).toMatchObject({ session_id: "conv", reason: "refresh" });

    const metrics = (await a.call("GET", "/metrics")).text;
    expect(metrics).toMatch(/^kvmesh_session_bindings_published_total 2$/m);
    expect(metrics).toMatch(/^kvmesh_session_bindings_dropped_total 0$/m);
    expect(metrics).toMatch(/^kvmesh_session_bindings_stream_clients 1$/m);
    s.close();
    await s.ended;
    await waitFor(async () => /^kvmesh_session_bindings_stream_clients 0$/m.test((await a.call("GET", "/metrics")).text), 2_000, "the stream to be gone");
  });

  it("refuses a bad body with a 4xx naming the field, and applies nothing from it", async () => {
    const b = await serve(hostSvc(2n));
    const good = { model_name: "default", routing_group: "default", session_id: "g", worker_id: 1, dp_rank: 0, sequence: 5, writer_id: 9 };
    const cases: [unknown, number, string][] = [
      [[good], 422, "body"],
      [{}, 422, "bindings"],
      [{ bindings: {} }, 422, "bindings"],
      [{ bindings: [good], extra: 1 }, 422, "extra"],
      [{ bindings: [good, { ...good, colour: "red" }] }, 422, "bindings[1].colour"],
      [{ bindings: [good, { ...good, worker_id: "1" }] }, 422, "bindings[1].worker_id"],
      [{ bindings: [good, { ...good, dp_rank: -1 }] }, 400, "bindings[1].dp_rank"],
      [{ bindings: [good, { ...good, session_id: "" }] }, 400, "bindings[1].session_id"],
      [{ bindings: [good, { ...good, sequence: 18446744073709551616n }] }, 400, "bindings[1].sequence"],
      [{ bindings: [good, { ...good, writer_id: undefined }] }, 422, "bindings[1].writer_id"],
      [{ bindings: [good, { ...good, reason: "moved" }] }, 400, "bindings[1].reason"],
      [{ bindings: [good, 7] }, 422, "bindings[1]"],
    ];
    for (const [body, status, field] of cases) {
      const r = await b.call("POST", "/session_bindings", body);
      expect(r.status, field).toBe(status);
      expect(obj(obj(r.json).details).field, field).toBe(field);
      expect(String(obj(r.json).error), field).toContain(field);
    }
    expect((await b.call("POST", "/session_bindings", "{")).status).toBe(400);
    // None of the valid first bindings was applied.
    expect(b.svc.stats.bindingsApplied).toBe(0);
    expect((await b.call("POST", "/session_bindings", { bindings: [good], cursor: "x-1", sent_at_ms: 1, dropped: 0 })).json).toEqual({ outcomes: [{ outcome: "inserted" }] });
  });

  it("resumes from a cursor after a reconnect, restarts from a snapshot, and refuses bad cursors", async () => {
    const a = await serve(hostSvc(1n));
    const first = await openStream(a);
    await waitFor(() => first.lines.length >= 1, 2_000, "the first line");
    const c0 = first.lines[0]?.cursor as string;
    first.close();
    await first.ended;
    // While nobody listens: two bindings, in two batches.
    await a.call("POST", "/select_and_reserve", { token_ids: tokens(2, 1), session_id: "s1", selection_id: "r1" });
    await waitFor(async () => /^kvmesh_session_bindings_stream_batches_total 1$/m.test((await a.call("GET", "/metrics")).text), 2_000, "the first batch in the ring");
    await a.call("POST", "/select_and_reserve", { token_ids: tokens(2, 2), session_id: "s2", selection_id: "r2" });
    await waitFor(async () => /^kvmesh_session_bindings_stream_batches_total 2$/m.test((await a.call("GET", "/metrics")).text), 2_000, "the second batch in the ring");

    const resumed = await openStream(a, `?cursor=${c0}`);
    await waitFor(() => resumed.lines.length >= 2, 2_000, "the missed batches");
    expect(resumed.lines.map((l) => l.bindings.map((x) => x.session_id))).toEqual([["s1"], ["s2"]]);
    const [, n] = c0.split("-");
    expect(resumed.lines.map((l) => l.cursor)).toEqual([`${c0.split("-")[0]}-${Number(n) + 1}`, `${c0.split("-")[0]}-${Number(n) + 2}`]);
    // Resuming at the latest cursor replays nothing: the first line repeats the cursor.
    const latest = resumed.lines[1]?.cursor as string;
    const caughtUp = await openStream(a, `?cursor=${latest}`);
    await waitFor(() => caughtUp.lines.length >= 1, 2_000, "the first line");
    expect(caughtUp.lines[0]).toMatchObject({ cursor: latest, bindings: [] });

    const snap = await openStream(a, "?snapshot=true");
    await waitFor(() => snap.lines.length >= 1, 2_000, "the snapshot line");
    expect(snap.lines[0]).toMatchObject({ cursor: latest, snapshot: true });
    expect(snap.lines[0]?.bindings.map((x) => x.session_id).sort()).toEqual(["s1", "s2"]);

    const run = c0.split("-")[0] as string;
    const bad: [string, number, string][] = [
      ["?cursor=garbage", 400, "KVMESH_BAD_REQUEST"],
      [`?cursor=${run}-99`, 400, "KVMESH_BAD_REQUEST"],
      [`?cursor=${run === "aaaaaaaa" ? "bbbbbbbb" : "aaaaaaaa"}-1`, 410, "KVMESH_CURSOR_EXPIRED"],
      [`?cursor=${c0}&snapshot=true`, 400, "KVMESH_BAD_REQUEST"],
      ["?snapshot=yes", 400, "KVMESH_BAD_REQUEST"],
    ];
    for (const [q, status, code] of bad) {
      const r = await a.call("GET", `/session_bindings/updates${q}`);
      expect(r.status, q).toBe(status);
      expect(obj(r.json).code, q).toBe(code);
    }
  });

  it("a cursor older than the replay ring gets 410 with the oldest resumable cursor", async () => {
    const a = await serve(hostSvc(1n));
    const s = await openStream(a);
    await waitFor(() => s.lines.length >= 1, 2_000, "the first line");
    const c0 = s.lines[0]?.cursor as string;
    s.close();
    // One batch per event-loop turn: 4,097 turns push the first batch out of the 4,096-batch ring.
    for (let i = 0; i < 4_097; i++) {
      a.svc.selectAndReserve({ token_ids: tokens(1, i), session_id: `s${i}` });
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    await waitFor(async () => /^kvmesh_session_bindings_stream_batches_total 4097$/m.test((await a.call("GET", "/metrics")).text), 5_000, "every batch in the ring");
    const r = await a.call("GET", `/session_bindings/updates?cursor=${c0}`);
    expect(r.status).toBe(410);
    expect(obj(r.json).code).toBe("KVMESH_CURSOR_EXPIRED");
    expect(obj(obj(r.json).details).oldest_cursor).toBe(`${c0.split("-")[0]}-1`);
    const ok = await openStream(a, `?cursor=${c0.split("-")[0]}-1`);
    expect(ok.status).toBe(200);
  });

  it("a stream outlives the server's request and header timeouts", async () => {
    const svc = hostSvc(1n);
    const metrics = testMetrics(svc);
    const server = await startHttpServer({ service: svc, host: "127.0.0.1", port: 0, logger: pino({ level: "silent" }), metrics, timeouts: { requestMs: 100, headersMs: 100, checkIntervalMs: 25 } });
    cleanups.push(() => server.close());
    const t = { base: `http://127.0.0.1:${server.port}` } as TestServer;
    const s = await openStream(t);
    await new Promise((resolve) => setTimeout(resolve, 400));
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(1), session_id: "late" });
    await waitFor(() => withBindings(s).length === 1, 2_000, "a line after the timeouts passed");
  });

  it("closing the server ends open streams", async () => {
    const a = await serve(hostSvc(1n));
    const s = await openStream(a);
    await waitFor(() => s.lines.length >= 1, 2_000, "the first line");
    await a.close();
    // Ended by the server (the stream's last chunk), not cut by the 2 s close grace's closeAllConnections.
    expect(await s.ended).toBe(true);
  });
});

/** A ServerResponse stand-in: records writes; `needDrain` makes the relay wait for 'drain'. */
class FakeResponse extends EventEmitter {
  readonly written: string[] = [];
  status = 0;
  ended = false;
  needDrain = false;
  get writableNeedDrain(): boolean {
    return this.needDrain;
  }
  writeHead(status: number): this {
    this.status = status;
    return this;
  }
  write(chunk: string): boolean {
    this.written.push(chunk);
    return !this.needDrain;
  }
  end(chunk?: string): this {
    if (chunk !== undefined) this.written.push(chunk);
    this.ended = true;
    this.emit("close");
    return this;
  }
  lines(): Line[] {
    return this.written.map((l) => parseJson(l) as Line);
  }
}

function openFake(relay: SessionBindingsHttp, query = ""): FakeResponse {
  const res = new FakeResponse();
  relay.updates(new URLSearchParams(query)).stream?.({ method: "GET" } as unknown as IncomingMessage, res as unknown as ServerResponse);
  return res;
}

describe("session binding relay internals", () => {
  function relayFor(o: Partial<ConstructorParameters<typeof SessionBindingsHttp>[0]> = {}): { svc: SelectionService; relay: SessionBindingsHttp } {
    const svc = hostSvc(1n);
    svc.upsertWorker(worker(1));
    const relay = new SessionBindingsHttp({ service: svc, logger: pino({ level: "silent" }), run: "abc", wallClock: new ManualClock(123), ...o });
    cleanups.push(() => {
      relay.close();
    });
    return { svc, relay };
  }
  const turn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

  it("cuts a reader that fell behind the ring with a final error line", async () => {
    const { svc, relay } = relayFor({ maxBatches: 2 });
    const res = openFake(relay);
    expect(res.lines()).toEqual([{ cursor: "abc-0", sent_at_ms: 123, dropped: 0, bindings: [] }]);
    res.needDrain = true;
    for (let i = 0; i < 4; i++) {
      svc.selectAndReserve({ token_ids: tokens(1, i), session_id: `s${i}` });
      await turn();
    }
    await waitFor(() => relay.stats.batches === 4, 2_000, "four batches");
    expect(res.written).toHaveLength(1);
    res.needDrain = false;
    res.emit("drain");
    expect(res.ended).toBe(true);
    expect(res.lines().at(-1)).toMatchObject({ code: "KVMESH_CURSOR_EXPIRED", cursor: "abc-0" });
    expect(relay.stats.streamsExpired).toBe(1);
    expect(relay.clients).toBe(0);
    // A reader that keeps up gets every batch in order.
    const ok = openFake(relay, "cursor=abc-3");
    svc.selectAndReserve({ token_ids: tokens(1, 9), session_id: "late" });
    await waitFor(() => ok.written.length === 2, 2_000, "the replayed and the new batch");
    expect(ok.lines().map((l) => l.cursor)).toEqual(["abc-4", "abc-5"]);
  });

  it("publishes a snapshot batch after its own queue shed bindings", async () => {
    const { svc, relay } = relayFor({ maxPendingBindings: 1 });
    const res = openFake(relay);
    for (let i = 0; i < 3; i++) svc.selectAndReserve({ token_ids: tokens(1, i), session_id: `s${i}` });
    await waitFor(() => relay.stats.batches === 2, 2_000, "the batch and its repair");
    const [, batch, repair] = res.lines();
    expect(batch).toMatchObject({ dropped: 2 });
    expect(batch?.bindings).toHaveLength(1);
    expect(repair).toMatchObject({ resync: true, dropped: 0 });
    expect(repair?.bindings.map((b) => b.session_id).sort()).toEqual(["s0", "s1", "s2"]);
    expect(svc.stats.droppedBindings).toBe(2);
    expect(relay.stats.resyncs).toBe(1);
  });

  it("sends an empty batch on an idle stream every heartbeat", async () => {
    const { relay } = relayFor({ heartbeatMs: 20, wallClock: { now: () => Date.now() } });
    const res = openFake(relay);
    await waitFor(() => res.written.length >= 3, 2_000, "two heartbeats");
    expect(res.lines().every((l) => l.cursor === "abc-0" && l.bindings.length === 0)).toBe(true);
  });

  it("ends streams when the service shuts down, after what was queued", async () => {
    const { svc, relay } = relayFor();
    const res = openFake(relay);
    svc.selectAndReserve({ token_ids: tokens(1), session_id: "last" });
    svc.shutdown();
    await waitFor(() => res.ended, 2_000, "the stream to end");
    expect(res.lines().at(-1)?.bindings.map((b) => b.session_id)).toEqual(["last"]);
  });
});

describe("BindingReplayRing", () => {
  it("evicts by batches and by bindings, never the newest", () => {
    const b = { model_name: "m", routing_group: "g", session_id: "s", worker_id: 1n, dp_rank: 0, sequence: 1n, writer_id: 1n, reason: "bind" } as const;
    const ring = new BindingReplayRing("r1", 3, 4);
    for (let i = 0; i < 3; i++) ring.append({ sent_at_ms: 0, dropped: 0, bindings: [b] });
    expect([ring.oldestSeq, ring.latestSeq, ring.size]).toEqual([1, 3, 3]);
    ring.append({ sent_at_ms: 0, dropped: 0, bindings: [b] });
    expect([ring.oldestSeq, ring.latestSeq]).toEqual([2, 4]);
    ring.append({ sent_at_ms: 0, dropped: 0, bindings: [b, b, b, b, b] });
    expect([ring.oldestSeq, ring.size]).toEqual([5, 1]);
    expect(ring.at(4)).toBeUndefined();
    expect(ring.at(5)?.line).toMatch(/^\{"cursor":"r1-5",/);
    expect(ring.resumePoint("r1-4")).toBe(4);
    expect(kvmeshErrorOf(() => ring.resumePoint("r1-3")).code).toBe("KVMESH_CURSOR_EXPIRED");
    expect(kvmeshErrorOf(() => ring.resumePoint("r1-6")).code).toBe("KVMESH_BAD_REQUEST");
    expect(kvmeshErrorOf(() => ring.resumePoint("r2-5")).status).toBe(410);
    expect(kvmeshErrorOf(() => ring.resumePoint("r1-05")).details).toEqual({ field: "cursor" });
    // Thousands of appends keep the storage compacted and lookups right.
    for (let i = 0; i < 5_000; i++) ring.append({ sent_at_ms: 0, dropped: 0, bindings: [] });
    expect(ring.size).toBe(3);
    expect(ring.at(ring.latestSeq - 1)?.seq).toBe(ring.latestSeq - 1);
  });
});

describe("binding snapshot streams nobody reads (#29 G11)", () => {
  it(`refuses ?snapshot=true with 429 while ${String(MAX_UNFLUSHED_SNAPSHOTS)} snapshots are unread, and serves it again once they go`, async () => {
    const svc = hostSvc(7n);
    const t = await serve(svc);
    // ~15 MB of snapshot: far more than a socket's buffers take at once.
    const pad = "s".repeat(200);
    for (let b = 0; b < 6; b++) {
      const batch = Array.from({ length: 10_000 }, (_, i) => ({ model_name: "default", routing_group: "default", session_id: `${pad}-${String(b)}-${String(i)}`, worker_id: 1n, dp_rank: 0, sequence: 1_700_000_000_000_000_000n + BigInt(b * 10_000 + i), writer_id: 9n, reason: "bind" as const }));
      svc.applySessionBinding(batch);
    }
    const url = new URL(t.base);
    const stalled: Socket[] = [];
    // A couple more than the bound: whichever the server takes first hold it.
    for (let i = 0; i < MAX_UNFLUSHED_SNAPSHOTS + 2; i++) {
      const s = connect(Number(url.port), url.hostname);
      s.on("error", () => undefined);
      s.pause();
      s.write("GET /session_bindings/updates?snapshot=true HTTP/1.1\r\nHost: x\r\n\r\n");
      stalled.push(s);
    }
    cleanups.push(() => {
      for (const s of stalled) s.destroy();
    });
    const status = async (): Promise<number> => {
      const ac = new AbortController();
      const r = await fetch(`${t.base}/session_bindings/updates?snapshot=true`, { signal: ac.signal });
      ac.abort();
      return r.status;
    };
    // Before the fix every stream took its own copy of the snapshot, however many went unread.
    await waitFor(async () => (await status()) === 429, 10_000, "a snapshot stream refused with 429");
    for (const s of stalled) s.destroy();
    await waitFor(async () => (await status()) === 200, 10_000, "snapshot streams served again");
  });
});
