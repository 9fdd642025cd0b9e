/**
 * The fault-injecting TCP proxy itself: transparent by default, and each knob does what it says
 * (delay keeps order, drop and truncate lose bytes, stall holds and backpressures, cut resets and
 * refuses until healed), including against real ZeroMQ sockets, whose connection must reset on
 * corrupted ZMTP and recover once the faults stop.
 */
import { createServer, Socket, type AddressInfo, type Server } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { Dealer, Publisher, Router, Subscriber } from "zeromq";

import { seededRandom } from "../../../src/core/index.js";
import { FaultProxy, startMeshPeerProxy } from "../../../scripts/lib/fault-proxy.js";
import { freePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A TCP server that echoes, or (sink) records what it receives. */
async function startTarget(mode: "echo" | "sink"): Promise<{ port: number; received: () => Buffer; connections: () => number }> {
  const chunks: Buffer[] = [];
  let connections = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((s) => {
    connections++;
    sockets.add(s);
    s.on("error", () => undefined);
    s.on("close", () => sockets.delete(s));
    s.on("data", (d: Buffer) => {
      if (mode === "echo") s.write(d);
      else chunks.push(d);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => {
          resolve();
        });
      }),
  );
  return { port: (server.address() as AddressInfo).port, received: () => Buffer.concat(chunks), connections: () => connections };
}

async function proxyTo(port: number, extra: Partial<Parameters<typeof FaultProxy.start>[0]> = {}): Promise<FaultProxy> {
  const p = await FaultProxy.start({ routes: [{ targetHost: "127.0.0.1", targetPort: port }], random: seededRandom(3), ...extra });
  cleanups.push(() => p.close());
  return p;
}

interface Client {
  readonly sock: Socket;
  readonly data: () => Buffer;
  readonly closed: Promise<boolean>;
}

async function connect(port: number): Promise<Client> {
  const sock = new Socket();
  const chunks: Buffer[] = [];
  let errored = false;
  sock.on("data", (d: Buffer) => chunks.push(d));
  sock.on("error", () => {
    errored = true;
  });
  const closed = new Promise<boolean>((resolve) => sock.on("close", () => { resolve(errored); }));
  await new Promise<void>((resolve, reject) => {
    sock.once("error", reject);
    sock.connect(port, "127.0.0.1", () => {
      sock.off("error", reject);
      resolve();
    });
  });
  cleanups.push(() => {
    sock.destroy();
  });
  return { sock, data: () => Buffer.concat(chunks), closed };
}

const payload = (n: number, seed = 0): Buffer => Buffer.from(Array.from({ length: n }, (_, i) => (i * 31 + seed) & 0xff));

describe("FaultProxy", () => {
  it("is transparent without faults and counts what it forwards", async () => {
    const t = await startTarget("echo");
    const p = await proxyTo(t.port);
    const c = await connect(p.listenPorts[0] as number);
    const data = payload(200_000);
    c.sock.write(data);
    await waitFor(() => c.data().length === data.length, 5_000, "echo through the proxy");
    expect(c.data().equals(data)).toBe(true);
    const k = p.counters();
    expect(k.connectionsAccepted).toBe(1);
    expect(k.connectionsActive).toBe(1);
    expect(k.bytesForwarded).toBe(2 * data.length);
    expect(k.chunksDropped + k.chunksTruncated + k.chunksDelayed).toBe(0);
  });

  it("delays every chunk and keeps their order under jitter", async () => {
    const t = await startTarget("echo");
    const p = await proxyTo(t.port, { faults: { delayMs: 40, jitterMs: 30 } });
    const c = await connect(p.listenPorts[0] as number);
    const t0 = performance.now();
    c.sock.write(Buffer.from("ping"));
    await waitFor(() => c.data().length === 4, 5_000, "delayed echo");
    // Both directions are delayed by >= 40 ms each.
    expect(performance.now() - t0).toBeGreaterThanOrEqual(78);
    const parts = Array.from({ length: 100 }, (_, i) => payload(100, i));
    for (const part of parts) {
      c.sock.write(part);
      await new Promise((r) => setImmediate(r));
    }
    await waitFor(() => c.data().length === 4 + 100 * 100, 5_000, "all parts echoed");
    expect(c.data().subarray(4).equals(Buffer.concat(parts))).toBe(true);
    expect(p.counters().chunksDelayed).toBeGreaterThan(2);
  });

  it("drops and truncates chunks in one direction only, and counts them", async () => {
    const sink = await startTarget("sink");
    const p = await proxyTo(sink.port, { faults: { dropRate: 1, direction: "to-target" } });
    const c = await connect(p.listenPorts[0] as number);
    c.sock.write(payload(1000));
    await waitFor(() => p.counters().chunksDropped >= 1, 2_000, "a dropped chunk");
    expect(p.counters().bytesDropped).toBe(1000);
    p.setFaults({ truncateRate: 1, direction: "to-target" });
    c.sock.write(payload(1000, 1));
    await waitFor(() => p.counters().chunksTruncated >= 1, 2_000, "a truncated chunk");
    await waitFor(() => sink.received().length > 0, 2_000, "the truncated prefix");
    const k = p.counters();
    expect(sink.received().length).toBe(1000 - k.bytesTruncated);
    expect(sink.received().equals(payload(1000, 1).subarray(0, sink.received().length))).toBe(true);
    // Faults for "to-client" leave this direction alone.
    p.setFaults({ dropRate: 1, direction: "to-client" });
    c.sock.write(payload(10, 2));
    await waitFor(() => sink.received().length === 1000 - k.bytesTruncated + 10, 2_000, "untouched direction");
    expect(() => { p.setFaults({ dropRate: 1.5 }); }).toThrow(RangeError);
    expect(() => { p.setFaults({ delayMs: -1 }); }).toThrow(RangeError);
  });

  it("stalls (holding data, pausing the source beyond maxHeldBytes) and resumes in order", async () => {
    const sink = await startTarget("sink");
    const p = await proxyTo(sink.port, { maxHeldBytes: 64 * 1024 });
    const c = await connect(p.listenPorts[0] as number);
    c.sock.write(Buffer.from("before"));
    await waitFor(() => sink.received().length === 6, 2_000, "data before the stall");
    p.stall();
    const big = payload(8 * 1024 * 1024);
    c.sock.write(big);
    await new Promise((r) => setTimeout(r, 300));
    expect(sink.received().length).toBe(6);
    const k = p.counters();
    expect(k.stalls).toBe(1);
    // Stalled: the proxy stopped reading, so the sender's data sits in kernel buffers and in its
    // own write queue, not in the proxy.
    expect(k.maxHeldBytes).toBeLessThanOrEqual(64 * 1024 + 256 * 1024);
    expect(c.sock.writableLength).toBeGreaterThan(0);
    p.resume();
    await waitFor(() => sink.received().length === 6 + big.length, 10_000, "everything after resume");
    expect(sink.received().subarray(6).equals(big)).toBe(true);
    // A timed stall ends by itself.
    p.stall(100);
    c.sock.write(Buffer.from("x"));
    await waitFor(() => sink.received().length === 7 + big.length, 2_000, "timed stall ends");
    expect(p.counters().stalls).toBe(2);
  });

  it("cuts every connection, refuses new ones until healed", async () => {
    const t = await startTarget("echo");
    const p = await proxyTo(t.port);
    const c = await connect(p.listenPorts[0] as number);
    c.sock.write(Buffer.from("a"));
    await waitFor(() => c.data().length === 1, 2_000, "echo");
    p.cut();
    expect(await c.closed).toBe(true); // reset, not an orderly close
    // Accepted, then reset at once: the client sees an error, never data.
    const refused = new Socket();
    const refusedErr = new Promise<boolean>((resolve) => {
      refused.on("error", () => { resolve(true); });
      refused.on("close", (hadError) => { resolve(hadError); });
    });
    refused.connect(p.listenPorts[0] as number, "127.0.0.1");
    expect(await refusedErr).toBe(true);
    expect(p.counters()).toMatchObject({ cuts: 1, connectionsCut: 1, connectionsRefused: 1, connectionsActive: 0 });
    p.heal();
    const again = await connect(p.listenPorts[0] as number);
    again.sock.write(Buffer.from("b"));
    await waitFor(() => again.data().toString() === "b", 2_000, "echo after heal");
    expect(t.connections()).toBe(2);
  });

  it("covers a mesh endpoint's two ports; ZeroMQ resets on corrupted ZMTP and recovers", async () => {
    const port = await freePortPair();
    const pub = new Publisher({ linger: 0 });
    const router = new Router({ linger: 0 });
    await pub.bind(`tcp://127.0.0.1:${port}`);
    await router.bind(`tcp://127.0.0.1:${port + 1}`);
    const { proxy, endpoint } = await startMeshPeerProxy({ target: `tcp://127.0.0.1:${port}`, random: seededRandom(5) });
    cleanups.push(() => {
      pub.close();
      router.close();
    });
    cleanups.push(() => proxy.close());
    const proxyPort = Number(endpoint.split(":").pop());
    expect(proxy.listenPorts).toEqual([proxyPort, proxyPort + 1]);

    // Control port: a DEALER request through the proxy's second listener.
    const dealer = new Dealer({ linger: 0 });
    cleanups.push(() => {
      dealer.close();
    });
    dealer.connect(`tcp://127.0.0.1:${proxyPort + 1}`);
    await dealer.send(["", "hello"]);
    const [id, , body] = await router.receive();
    expect(body?.toString()).toBe("hello");
    await router.send([id as Buffer, "", "world"]);
    expect((await dealer.receive())[1]?.toString()).toBe("world");

    // Publish port: a SUB through the first listener. ZMTP has no checksum: a truncated stream
    // either breaks framing at once (a protocol error) or reads as a long message that never
    // completes, which the ZMTP heartbeat timeout ends (as the mesh transport sets it, 10x
    // shorter here). Either way the connection goes.
    const subscribe = (): { sub: Subscriber; got: string[]; disconnects: () => number; done: Promise<void> } => {
      const sub = new Subscriber({ linger: 0, reconnectInterval: 20, reconnectMaxInterval: 100, heartbeatInterval: 100, heartbeatTimeout: 300 });
      let disconnects = 0;
      sub.events.on("disconnect", () => {
        disconnects++;
      });
      sub.subscribe();
      sub.connect(endpoint);
      const got: string[] = [];
      const done = (async () => {
        try {
          for await (const [m] of sub) got.push(m?.toString() ?? "");
        } catch {
          // closed
        }
      })();
      cleanups.push(async () => {
        sub.close();
        await done;
      });
      return { sub, got, disconnects: () => disconnects, done };
    };
    let n = 0;
    const publishUntil = async (pred: () => boolean, what: string | (() => string)): Promise<void> => {
      await waitFor(
        async () => {
          await pub.send(`m${n++}`);
          return pred();
        },
        8_000,
        what,
      );
    };
    const first = subscribe();
    await publishUntil(() => first.got.length > 0, "first message through the proxy");
    // Truncating the publisher's stream breaks ZMTP framing: libzmq drops the connection.
    proxy.setFaults({ truncateRate: 0.5, direction: "to-client" });
    await publishUntil(
      () => proxy.counters().chunksTruncated > 0 && first.disconnects() > 0,
      () => `a reset under truncation: ${JSON.stringify(proxy.counters())}, ${first.got.length} received`,
    );
    // After a protocol error libzmq does not redial that endpoint (session_base: protocol_error
    // terminates the session): whoever owns the socket must. A fresh dial through the healed
    // proxy carries messages again.
    proxy.clearFaults();
    const second = subscribe();
    await publishUntil(() => second.got.length > 5, "messages flowing on a fresh connection after the faults stop");
    expect(second.got.slice(-3).every((m) => /^m\d+$/.test(m))).toBe(true);
    expect(proxy.counters().connectionsAccepted).toBeGreaterThanOrEqual(3);
  });
});
