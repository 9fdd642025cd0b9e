/**
 * The picker's HTTP/2 receive windows (#24, docs/gateway.md#transport): the ext_proc port
 * advertises the configured stream window in its SETTINGS and raises the connection window as a
 * session opens; and with the defaults, a client in another process that advertises Envoy's own
 * 256 MiB windows and uploads 220 KB bodies on 150 streams of one connection gets every answer.
 * With a 32 MiB connection window it does not: Node's HTTP/2 stops reading its socket while one
 * of its writes is pending, the picker's and the client's both, and once both sides had more in
 * flight than the sockets buffer, neither read again (run it with
 * KVMESH_TEST_WINDOW_ARGS="--ext-proc-stream-window-bytes 1048576
 * --ext-proc-connection-window-bytes 33554432" to see it fail). In one process the two share an
 * event loop and never deadlock, so the picker runs as a child.
 */
import { connect, type ClientHttp2Session } from "node:http2";

import { afterEach, describe, expect, it } from "vitest";

import { DEFAULT_EXT_PROC_CONNECTION_WINDOW_BYTES, DEFAULT_EXT_PROC_STREAM_WINDOW_BYTES } from "../../../src/extproc/defaults.js";
import { EnvoyClient, ENVOY_DEFAULT_WINDOW_BYTES, type EnvoyStream } from "../../helpers/envoy-client.js";
import { completionsBody, startHarness, type Harness } from "../../helpers/picker-harness.js";
import { freePortPair } from "../../../src/bench/ports.js";
import { spawnDaemon, stopDaemon, type DaemonProcess } from "../../helpers/daemon-process.js";
import { waitFor } from "../../helpers/wait.js";

let h: Harness | undefined;
let session: ClientHttp2Session | undefined;
let daemon: DaemonProcess | undefined;
afterEach(async () => {
  await stopDaemon(daemon);
  daemon = undefined;
  session?.destroy();
  session = undefined;
  await h?.close();
  h = undefined;
});

/** What the picker grants a raw HTTP/2 client: its SETTINGS' stream window and the connection's send window. */
async function grantedWindows(port: number): Promise<{ stream: number; connection: number; session: ClientHttp2Session }> {
  const s = connect(`http://127.0.0.1:${port}`);
  session = s;
  const settings = await new Promise<{ initialWindowSize?: number }>((resolve, reject) => {
    s.once("remoteSettings", resolve);
    s.once("error", reject);
  });
  return { stream: settings.initialWindowSize ?? NaN, connection: s.state.remoteWindowSize ?? NaN, session: s };
}

describe("ext_proc receive windows", () => {
  it("advertises the default windows: 256 KiB per stream, 1 MiB per connection (Node's own are 64 KiB)", async () => {
    h = await startHarness();
    const { stream, session: s } = await grantedWindows(h.picker.port);
    expect(stream).toBe(DEFAULT_EXT_PROC_STREAM_WINDOW_BYTES);
    expect(DEFAULT_EXT_PROC_STREAM_WINDOW_BYTES).toBe(256 * 1024);
    // The connection's WINDOW_UPDATE follows the SETTINGS frame.
    await waitFor(() => s.state.remoteWindowSize === DEFAULT_EXT_PROC_CONNECTION_WINDOW_BYTES, 10_000, () => `the connection window raised to 1 MiB (now ${s.state.remoteWindowSize})`);
  });

  it("advertises configured windows, Node's 64 KiB included", async () => {
    h = await startHarness({ config: { streamWindowBytes: 100_000, connectionWindowBytes: 3_000_000 } });
    const a = await grantedWindows(h.picker.port);
    expect(a.stream).toBe(100_000);
    await waitFor(() => a.session.state.remoteWindowSize === 3_000_000, 10_000, () => `the connection window raised to 3,000,000 (now ${a.session.state.remoteWindowSize})`);
    a.session.destroy();
    await h.close();

    h = await startHarness({ config: { streamWindowBytes: 65_535, connectionWindowBytes: 65_535 } });
    const b = await grantedWindows(h.picker.port);
    expect(b.stream).toBe(65_535);
    expect(b.connection).toBe(65_535);
  });

  it("a kvmesh serve child with the default windows answers 150 such streams, three rounds, from another process", async () => {
    const ext = await freePortPair();
    daemon = await spawnDaemon(["--kv-events", "false", "--ext-proc-port", String(ext), ...(process.env["KVMESH_TEST_WINDOW_ARGS"]?.split(" ") ?? [])]);
    for (let i = 1; i <= 4; i++) {
      const res = await fetch(`${daemon.url}/workers`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ worker_id: i, model_name: "m", endpoint: `http://10.0.0.${i}:8000`, block_size: 16 }) });
      expect(res.ok).toBe(true);
    }
    const client = new EnvoyClient(`127.0.0.1:${ext}`, undefined, { receiveWindowBytes: ENVOY_DEFAULT_WINDOW_BYTES });
    try {
      await allAnswered(client, 150, 3);
      const url = daemon.url;
      await waitFor(async () => (await activeRequests(url)) === 0, 10_000, "every booking freed");
    } finally {
      client.close();
    }
  }, 180_000);
});

/** ~220 KB of token ids, a prompt of its own per `n`. */
const body = (n: number): Buffer => completionsBody(Array.from({ length: 31_000 }, (_, i) => 100_000 + ((n * 7_919 + i) % 900_000)));

/** One stream as Envoy runs it, to the end; the echoed body's length. A stream left unanswered fails after a minute (the deadlock this guards against never ends). */
async function oneStream(client: EnvoyClient, n: number): Promise<number> {
  const s: EnvoyStream = client.open();
  client.headers(s, { headers: { "x-session-id": `s${n}` } });
  client.body(s, body(n), 64 * 1024);
  const answer = await s.next(60_000);
  expect(answer.immediate_response).toBeUndefined();
  let echoed = 0;
  for (;;) {
    const r = await s.next(60_000);
    const chunk = r.request_body?.response?.body_mutation?.streamed_response;
    echoed += Buffer.from(chunk?.body ?? Buffer.alloc(0)).length;
    if (chunk?.end_of_stream === true) break;
  }
  s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: Buffer.from("200") }] } } });
  await s.next(60_000);
  s.send({ response_body: { body: Buffer.from("data: [DONE]\n\n"), end_of_stream: true } });
  await s.next(60_000);
  s.end();
  return echoed;
}

/** `streams` at once, each running `rounds` requests back to back; every body echoed whole. */
async function allAnswered(client: EnvoyClient, streams: number, rounds: number): Promise<void> {
  const echoed = await Promise.all(
    Array.from({ length: streams }, async (_, k) => {
      const out: boolean[] = [];
      for (let r = 0; r < rounds; r++) out.push((await oneStream(client, k + r * streams)) === body(k + r * streams).length);
      return out.every(Boolean);
    }),
  );
  expect(echoed.every(Boolean)).toBe(true);
}

async function activeRequests(url: string): Promise<number> {
  const loads = (await (await fetch(`${url}/loads`)).json()) as { loads: { active_requests: number }[] }[];
  return loads.flatMap((m) => m.loads).reduce((a, l) => a + l.active_requests, 0);
}
