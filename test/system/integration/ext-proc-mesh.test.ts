/**
 * The endpoint picker active-active (#24): two meshed daemons, each serving ext_proc, a gateway
 * that sends each session's turns through either replica at random. Every turn of a session
 * lands on the worker its first turn was routed to, and once every stream has finished (or was
 * cancelled) neither replica holds a booking: GET /loads shows 0 active on both.
 */
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { descriptorsToWorkerRequests, MockEngineFleet } from "../../../src/mock/engine-fleet.js";
import { destinationOf, EnvoyClient, type EnvoyStream } from "../../helpers/envoy-client.js";
import { freePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

const log = pino({ level: "silent" });
const SESSIONS = 12;
const TURNS = 4;
const BLOCK = 16;

interface Loads {
  loads: { worker_id: number; active_requests: number }[];
}

const activeOn = async (d: Daemon): Promise<number> => {
  const res = await fetch(`http://127.0.0.1:${d.port}/loads`);
  const body = (await res.json()) as Loads[];
  return body.flatMap((m) => m.loads).reduce((n, l) => n + l.active_requests, 0);
};

/** One turn through a replica, as Envoy runs it; returns the picked endpoint. `cancel`: the client leaves mid-response. */
async function turn(client: EnvoyClient, session: string, prompt: number[], cancel: boolean): Promise<string> {
  const s: EnvoyStream = client.open();
  client.headers(s, { headers: { "x-session-id": session } });
  client.body(s, Buffer.from(JSON.stringify({ model: "m", prompt, max_tokens: 4 })), 4_096);
  const headers = await s.next();
  const dest = destinationOf(headers)?.split(",")[0] ?? "";
  while ((await s.next()).request_body?.response?.body_mutation?.streamed_response?.end_of_stream !== true);
  s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: Buffer.from("200") }] } } });
  await s.next();
  s.send({ response_body: { body: Buffer.from("data: {}\n\n") } });
  await s.next();
  if (cancel) {
    s.cancel();
    return dest;
  }
  s.send({ response_body: { body: Buffer.from("data: [DONE]\n\n"), end_of_stream: true } });
  await s.next();
  s.end();
  return dest;
}

describe("ext_proc across a 2-replica mesh", () => {
  let a: Daemon;
  let b: Daemon;
  let clients: EnvoyClient[];

  beforeAll(async () => {
    const [pa, pb] = [await freePortPair(), await freePortPair()];
    const common = { ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false, extProcPort: 0, sessionAffinityTtlSecs: 600, sessionAffinityMode: "soft" as const, meshStartupSyncSecs: 0 };
    a = await startDaemon({ ...common, replicaSyncPort: pa }, log);
    b = await startDaemon({ ...common, replicaSyncPort: pb, peers: [`tcp://127.0.0.1:${pa}`] }, log);
    for (const id of [1, 2, 3]) a.service.upsertWorker({ worker_id: BigInt(id), model_name: "m", endpoint: `http://10.0.0.${id}:8000`, block_size: BLOCK });
    await waitFor(() => b.service.listWorkers().length === 3, 10_000, "the catalogue to reach B");
    clients = [a, b].map((d) => new EnvoyClient(`127.0.0.1:${String(d.extProcPort)}`));
  }, 60_000);

  afterAll(async () => {
    for (const c of clients) c.close();
    await Promise.all([a.close(), b.close()]);
  });

  it("keeps each session on one worker through either replica, and leaves no booking on either", async () => {
    let rnd = 12_345;
    const next = (): number => {
      rnd = (rnd * 1_103_515_245 + 12_345) % 2 ** 31;
      return rnd;
    };
    const stuck: string[] = [];
    for (let s = 0; s < SESSIONS; s++) {
      const session = `conv-${s}`;
      const prompt: number[] = [];
      let first: string | undefined;
      for (let t = 0; t < TURNS; t++) {
        for (let i = 0; i < 3 * BLOCK; i++) prompt.push(s * 1_000_000 + t * 1_000 + i);
        const via = next() % 2;
        const dest = await turn(clients[via] as EnvoyClient, session, [...prompt], next() % 10 === 0);
        first ??= dest;
        if (dest !== first) stuck.push(`${session} turn ${t}: ${dest} != ${first}`);
        // The next turn may go through the other replica: let the binding reach it, as real turns are seconds apart.
        const other = via === 0 ? b : a;
        await waitFor(() => other.service.bindingsSnapshot().some((e) => e.session_id === session && e.reason !== "unbind"), 5_000, "the binding to reach the other replica");
      }
    }
    expect(stuck).toEqual([]);
    await waitFor(async () => (await activeOn(a)) === 0 && (await activeOn(b)) === 0, 10_000, "every booking freed on both replicas");
    expect(a.service.reservationCount + b.service.reservationCount).toBe(0);
  }, 120_000);

  it("health follows /ready: draining turns the replica's readiness NOT_SERVING", async () => {
    const c = clients[1] as EnvoyClient;
    expect((await c.check("readiness")).status).toBe("SERVING");
    void b.drain();
    expect((await c.check("readiness")).status).toBe("NOT_SERVING");
    expect((await c.check("liveness")).status).toBe("SERVING");
  });
});

/**
 * The whole data path (#24's integration test): two meshed daemons with the default engine
 * tokenizer, mock engines that speak vLLM's OpenAI API and publish real KV events, and a gateway
 * that sends each turn of a chat conversation (text, so the daemons ask an engine to render it)
 * through either replica, then forwards the body to the picked endpoint over HTTP. Each session
 * stays on one worker, the engines measure the prefix hits the router aimed for, and no booking
 * is left on either replica's /loads.
 */
describe("ext_proc across a 2-replica mesh, chat text through the engine tokenizer to HTTP mock engines", () => {
  const ENGINES = 3;
  const CHAT_SESSIONS = 6;
  const CHAT_TURNS = 3;
  let fleet: MockEngineFleet;
  let a: Daemon;
  let b: Daemon;
  let clients: EnvoyClient[];

  beforeAll(async () => {
    fleet = await MockEngineFleet.start({ engines: ENGINES, blockSize: BLOCK, kvBlocks: 8_192, prefillMsPerToken: 0.001, decodeMsPerToken: 0.5, speedup: 100, expectedSubscribers: 2, openai: { model: "m" } });
    const [pa, pb] = [await freePortPair(), await freePortPair()];
    const common = { ...DEFAULT_DAEMON_CONFIG, port: 0, extProcPort: 0, sessionAffinityTtlSecs: 600, sessionAffinityMode: "soft" as const, meshStartupSyncSecs: 0 };
    a = await startDaemon({ ...common, replicaSyncPort: pa }, log);
    b = await startDaemon({ ...common, replicaSyncPort: pb, peers: [`tcp://127.0.0.1:${pa}`] }, log);
    for (const w of descriptorsToWorkerRequests(fleet.descriptors, { modelName: "m", blockSize: BLOCK })) a.service.upsertWorker(w);
    await waitFor(() => b.service.listWorkers().filter((w) => w.lifecycle === "schedulable").length === ENGINES, 10_000, "the catalogue to reach B");
    await fleet.waitForSubscribers(2);
    clients = [a, b].map((d) => new EnvoyClient(`127.0.0.1:${String(d.extProcPort)}`));
  }, 60_000);

  afterAll(async () => {
    for (const c of clients) c.close();
    await Promise.all([a.close(), b.close()]);
    await fleet.close();
  });

  interface ChatAnswer {
    usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } };
    choices: { message: { content: string } }[];
  }

  /** One chat turn: routed through `client`, forwarded to the picked endpoint, the response played back. */
  async function chatTurn(client: EnvoyClient, session: string, body: Buffer): Promise<{ dest: string; answer: ChatAnswer }> {
    const s = client.open();
    client.headers(s, { path: "/v1/chat/completions", headers: { "x-session-id": session } });
    client.body(s, body, 1_024);
    const routed = await s.next();
    expect(routed.immediate_response, "the picker routed the turn").toBeUndefined();
    const dest = destinationOf(routed)?.split(",")[0] ?? "";
    while ((await s.next()).request_body?.response?.body_mutation?.streamed_response?.end_of_stream !== true);
    const res = await fetch(`http://${dest}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body });
    expect(res.status).toBe(200);
    const answer = (await res.json()) as ChatAnswer;
    s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: Buffer.from("200") }] } } });
    await s.next();
    s.send({ response_body: { body: Buffer.from(JSON.stringify(answer)), end_of_stream: true } });
    await s.next();
    s.end();
    return { dest, answer };
  }

  it("keeps each conversation on one worker through either replica, the engines hit the prefix, and no booking is left", async () => {
    const stuck: string[] = [];
    let promptTokens = 0;
    let laterTurnsCached = 0;
    for (let c = 0; c < CHAT_SESSIONS; c++) {
      const session = `chat-${c}`;
      const messages: { role: string; content: string }[] = [{ role: "system", content: `Conversation ${c}. ${"Answer carefully and cite the rules. ".repeat(40)}` }];
      let first: string | undefined;
      for (let t = 0; t < CHAT_TURNS; t++) {
        messages.push({ role: "user", content: `Turn ${t} of ${c}: ${"tell me more about prefix caching ".repeat(6 + t)}` });
        const via = (c + t) % 2;
        const { dest, answer } = await chatTurn(clients[via] as EnvoyClient, session, Buffer.from(JSON.stringify({ model: "m", messages, max_tokens: 8 })));
        first ??= dest;
        if (dest !== first) stuck.push(`${session} turn ${t}: ${dest} != ${first}`);
        promptTokens += answer.usage.prompt_tokens;
        if (t > 0) laterTurnsCached += answer.usage.prompt_tokens_details.cached_tokens;
        messages.push({ role: "assistant", content: answer.choices[0]?.message.content ?? "" });
        const other = via === 0 ? b : a;
        await waitFor(() => other.service.bindingsSnapshot().some((e) => e.session_id === session && e.reason !== "unbind"), 5_000, "the binding to reach the other replica");
      }
    }
    expect(stuck).toEqual([]);
    expect(promptTokens).toBeGreaterThan(0);
    // Later turns extend the conversation on its worker: the engine finds the earlier turns cached.
    expect(laterTurnsCached).toBeGreaterThan(0);
    // Both replicas tokenized through an engine (render), none fell back to routing without ids.
    for (const d of [a, b]) {
      const metrics = await (await fetch(`http://127.0.0.1:${d.port}/metrics`)).text();
      expect(metrics).toMatch(/kvmesh_tokenizer_engine_calls_total\{endpoint="render"\} [1-9]/);
      expect(metrics).toMatch(/kvmesh_extproc_tokenize_failures_total 0/);
    }
    await waitFor(async () => (await activeOn(a)) === 0 && (await activeOn(b)) === 0, 10_000, "every booking freed on both replicas");
    expect(a.service.reservationCount + b.service.reservationCount).toBe(0);
  }, 120_000);
});
