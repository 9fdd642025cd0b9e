/**
 * #29 G10: HTTP connections past --max-connections, or past --max-connections-per-client from one
 * address, are closed on arrival and counted; the server keeps answering the connections it holds
 * and, once the flood leaves, new ones. Counts only, never durations.
 */
import { connect, type Socket } from "node:net";

import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { startHttpServer } from "../../../src/http/server.js";
import { makeService } from "../../helpers/core-fixtures.js";
import { testMetrics } from "../../helpers/http-client.js";
import { waitFor } from "../../helpers/wait.js";

const cleanups: (() => void | Promise<void>)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()?.();
});

async function serve(max: number, perClient: number) {
  const svc = makeService().svc;
  const metrics = testMetrics(svc);
  const server = await startHttpServer({ service: svc, host: "127.0.0.1", port: 0, logger: pino({ level: "silent" }), metrics, connections: { max, perClient } });
  cleanups.push(() => server.close());
  const refused = async (reason: string): Promise<number> => {
    const m = metrics.registry.getSingleMetric("kvmesh_http_connections_refused_total");
    return ((await m?.get())?.values ?? []).filter((v) => v.labels.reason === reason).reduce((s, v) => s + v.value, 0);
  };
  return { port: server.port, refused };
}

/** Opens `n` sockets and resolves once each is connected. */
async function open(port: number, n: number): Promise<Socket[]> {
  const socks = await Promise.all(
    Array.from({ length: n }, () => new Promise<Socket>((resolve) => {
      const s = connect(port, "127.0.0.1", () => { resolve(s); });
      s.on("error", () => undefined);
    })),
  );
  cleanups.push(() => {
    for (const s of socks) s.destroy();
  });
  return socks;
}

describe("HTTP connection caps (#29 G10)", () => {
  it("closes connections past --max-connections on arrival, counts them, and serves again once the flood leaves", async () => {
    const { port, refused } = await serve(8, 8);
    const flood = await open(port, 20);
    await waitFor(async () => (await refused("max_connections")) >= 12, 5_000, "12 connections refused");
    expect(await refused("max_connections")).toBe(12);
    for (const s of flood) s.destroy();
    await waitFor(async () => (await fetch(`http://127.0.0.1:${String(port)}/health`, { signal: AbortSignal.timeout(1_000) }).then((r) => r.status).catch(() => 0)) === 200, 5_000, "/health answered after the flood");
  });

  it("closes one address's connections past --max-connections-per-client", async () => {
    const { port, refused } = await serve(100, 3);
    await open(port, 10);
    await waitFor(async () => (await refused("per_client")) >= 7, 5_000, "7 connections refused");
    expect(await refused("per_client")).toBe(7);
    expect(await refused("max_connections")).toBe(0);
  });
});
