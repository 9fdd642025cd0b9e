/**
 * Conformance, end to end on real daemons: the command line's defaults, and the peer flow
 * (spec §5.7, §6.1 /replica_sync/*; reference: server.rs register_peer / deregister_peer /
 * list_peers, tests.rs selector_replica_sync_propagates_request_lifecycle) over real ZeroMQ on
 * loopback. Sources are noted as in http-surface.test.ts.
 */
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { parseJson, stringifyJson } from "../../../src/http/json.js";
import { withFreePortPair } from "../../helpers/ports.js";
import { serveInProcess } from "../../helpers/serve-in-process.js";
import { waitFor } from "../../helpers/wait.js";

const log = pino({ level: "silent" });
const running: Daemon[] = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((d) => d.close()));
});

async function replica(): Promise<{ d: Daemon; sync: string }> {
  let port = 0;
  const d = await withFreePortPair(async (p) => {
    port = p;
    return startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false, replicaSyncPort: p }, log);
  });
  running.push(d);
  return { d, sync: `tcp://127.0.0.1:${port}` };
}

async function call(d: Daemon, method: string, path: string, body?: unknown): Promise<{ status: number; text: string; json: unknown }> {
  const res = await fetch(`http://${d.host}:${d.port}${path}`, {
    method,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    ...(body === undefined ? {} : { body: stringifyJson(body) }),
  });
  const text = await res.text();
  return { status: res.status, text, json: text === "" ? null : parseJson(text) };
}

/** The single load row of worker 1 in "model", as the reference's wait_for_service_load reads it. */
async function load(d: Daemon): Promise<[number, number, number]> {
  const parts = (await call(d, "GET", "/loads?model_name=model")).json as { loads: { active_requests: number; potential_decode_blocks: number; potential_prefill_tokens: number }[] }[];
  const l = parts[0]?.loads[0];
  return l === undefined ? [-1, -1, -1] : [l.active_requests, l.potential_decode_blocks, l.potential_prefill_tokens];
}

async function waitLoad(d: Daemon, want: [number, number, number]): Promise<void> {
  let last: [number, number, number] = [-1, -1, -1];
  await waitFor(
    async () => {
      last = await load(d);
      return last.join() === want.join();
    },
    5_000,
    () => `load ${want.join("/")} (last ${last.join("/")})`,
  );
}

describe("conformance: the daemon's defaults (spec §6.4, §6.1)", () => {
  it("serves HTTP on port 8092 as the reference does, bound to loopback where the reference binds 0.0.0.0", async () => {
    const r = await serveInProcess([]);
    expect(r.code).toBeUndefined();
    expect(r.config?.port).toBe(8092); // spec §6.4 `python -m dynamo.select_service --port 8092`
    // kvmesh (docs/compatibility.md row "the server binds 0.0.0.0"): loopback unless --host says otherwise;
    // reference: server.rs run_server binds ("0.0.0.0", port), spec §6.1 "binds 0.0.0.0, no auth".
    expect(r.config?.host).toBe("127.0.0.1");
    expect((await serveInProcess(["--host", "0.0.0.0"])).config?.host).toBe("0.0.0.0");
  });
});

describe("conformance: peers (spec §5.7, §6.1; reference: server.rs replica_sync routes)", () => {
  it("register_peer 201 then 200, peers a sorted array of strings, a booking's lifecycle reaches the peer, deregister 200 then 404", async () => {
    const a = await replica();
    const b = await replica();
    const reg = await call(a.d, "POST", "/replica_sync/register_peer", { endpoint: b.sync });
    expect(reg.status).toBe(201); // reference: register_peer Ok(true) -> json_ok(CREATED)
    // reference: {"status":"ok"}; kvmesh adds endpoint and added (docs/compatibility.md row "peer registration bodies").
    expect(reg.json).toEqual({ status: "ok", endpoint: b.sync, added: true });
    const again = await call(a.d, "POST", "/replica_sync/register_peer", { endpoint: b.sync });
    expect(again.status).toBe(200); // reference: Ok(false) -> json_ok(OK)
    expect((again.json as Record<string, unknown>).status).toBe("ok");
    // reference: list_peers -> Json(list_replica_peers()): a sorted Vec<String>.
    expect((await call(a.d, "GET", "/replica_sync/peers")).text).toBe(JSON.stringify([b.sync]));
    const bad = await call(a.d, "POST", "/replica_sync/register_peer", { endpoint: "not an endpoint" });
    expect(bad.status).toBe(400); // reference: ReplicaPeerError::InvalidEndpoint -> BAD_REQUEST
    expect(typeof (bad.json as Record<string, unknown>).error).toBe("string");

    // reference: tests.rs selector_replica_sync_propagates_request_lifecycle: the same worker on
    // both, a booking on A shows on B as (requests 1, blocks 1, tokens 4), then 4 -> 0 on
    // prefill_complete, then 0/0/0 on free.
    for (const r of [a, b]) expect((await call(r.d, "POST", "/workers", { worker_id: 1, model_name: "model", endpoint: "http://worker-1:8000", block_size: 4 })).status).toBe(201);
    const body = { model_name: "model", token_ids: [1, 2, 3, 4] };
    // kvmesh addition GET /replica_sync/status: wait until each side hears the other (registering
    // B on A also peers B back to A), so no first batch meets a subscription still joining.
    const live = async (r: { d: Daemon }, peer: string): Promise<boolean> =>
      ((await call(r.d, "GET", "/replica_sync/status")).json as { endpoint: string; sync: string | null }[]).some((p) => p.endpoint === peer && p.sync === "live");
    await waitFor(async () => (await live(a, b.sync)) && (await live(b, a.sync)), 5_000, "a live mesh both ways");
    expect((await call(a.d, "POST", "/select_and_reserve", { ...body, selection_id: "replicated" })).status).toBe(200);
    await waitLoad(b.d, [1, 1, 4]);
    expect((await call(a.d, "POST", "/reservations/replicated/prefill_complete", {})).status).toBe(200);
    await waitLoad(b.d, [1, 1, 0]);
    // spec §3.6: bookings mirrored from peers are indexed, so a lifecycle call resolves on any replica.
    expect((await call(b.d, "DELETE", "/reservations/replicated")).status).toBe(200);
    await waitLoad(a.d, [0, 0, 0]);
    await waitLoad(b.d, [0, 0, 0]);

    const dereg = await call(a.d, "POST", "/replica_sync/deregister_peer", { endpoint: b.sync });
    expect(dereg.status).toBe(200); // reference: deregister_peer Ok(true) -> json_ok(OK)
    expect((dereg.json as Record<string, unknown>).status).toBe("ok");
    const gone = await call(a.d, "POST", "/replica_sync/deregister_peer", { endpoint: b.sync });
    expect(gone.status).toBe(404); // reference: Ok(false) -> json_error(NOT_FOUND, "peer not found")
    expect((gone.json as Record<string, unknown>).error).toBe("peer not found");
    expect((await call(a.d, "GET", "/replica_sync/peers")).text).toBe("[]");
  });
});
