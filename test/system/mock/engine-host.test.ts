/** Engine hosts: fleets in child processes driven over IPC (real processes, real sockets). */
import { afterEach, describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/index.js";
import { KvIngest } from "../../../src/ingest/kv-ingest.js";
import { EngineHostClient, EngineHostGroup } from "../../../src/mock/engine-host-client.js";
import { promptTokensFor } from "../../../src/mock/token-blocks.js";
import { waitFor } from "../../helpers/wait.js";

const FAST = { blockSize: 16, kvBlocks: 512, prefillMsPerToken: 0.001, decodeMsPerToken: 1, speedup: 100 } as const;

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe("engine hosts", () => {
  it("spreads workers over host processes, serves requests through them and closes them", async () => {
    const group = await EngineHostGroup.spawn({ hosts: 2, engines: 5, firstWorkerId: 100n, ...FAST });
    cleanups.push(() => group.close());
    expect(group.descriptors.map((d) => d.workerId)).toEqual([100n, 101n, 102n, 103n, 104n]);
    expect(group.hosts.map((h) => h.descriptors.length)).toEqual([3, 2]);
    const pids = group.pids;
    expect(new Set([...pids, process.pid]).size).toBe(3);

    // KV events of engines in child processes reach a subscriber in this one.
    let batches = 0;
    const ingest = new KvIngest({ onBatch: () => batches++, onReset: () => undefined });
    cleanups.push(() => ingest.close());
    for (const d of group.descriptors) await ingest.upsert(String(d.workerId), [{ rank: 0, endpoint: d.kvEndpoint, replayEndpoint: d.replayEndpoint }]);
    await group.waitForSubscribers(1);
    await expect(group.waitForSubscribers(2, 50)).rejects.toThrow(/1\/2 subscribers after 50 ms/);

    const tokens = promptTokensFor([1, 2, 3], 1_500);
    const order: string[] = [];
    const results = await Promise.all(
      group.descriptors.map((_, i) =>
        group.submit(i, { requestId: `r${i}`, tokens, outputTokens: 3, onFirstToken: () => order.push(`first r${i}`) }).then((r) => {
          order.push(`done ${r.requestId}`);
          return r;
        }),
      ),
    );
    expect(results.map((r) => r.requestId)).toEqual(["r0", "r1", "r2", "r3", "r4"]);
    for (const r of results) expect(r).toMatchObject({ promptTokens: 1_500, cachedTokens: 0, outputTokens: 3 });
    for (let i = 0; i < 5; i++) expect(order.indexOf(`first r${i}`)).toBeLessThan(order.indexOf(`done r${i}`));
    // Same prompt again on engine 4: its cache hits, measured in the child.
    const again = await group.submit(4, { requestId: "again", tokens, outputTokens: 1 });
    expect(again.cachedTokens).toBe(93 * 16);
    const stats = await group.stats();
    expect(stats.totals.batchesPublished).toBeGreaterThanOrEqual(5);
    await waitFor(() => batches === stats.totals.batchesPublished, 5_000, () => `${batches}/${stats.totals.batchesPublished} KV event batches from the hosts`);
    expect(stats.engines).toHaveLength(5);
    expect(stats.totals).toMatchObject({ requests: 6, promptTokens: 9_000, cachedTokens: 93 * 16, kvCapacityBlocks: 5 * 512 });

    // Typed errors keep their code across the process boundary.
    const tooBig = await group.submit(0, { requestId: "big", tokens: promptTokensFor([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], 8_500), outputTokens: 1 }).catch((e: unknown) => e);
    expect(tooBig).toBeInstanceOf(KvmeshError);
    expect((tooBig as KvmeshError).code).toBe("KVMESH_BAD_REQUEST");
    await expect(group.submit(5, { requestId: "x", tokens, outputTokens: 1 })).rejects.toThrow(RangeError);

    await group.close();
    const codes = await Promise.all(group.hosts.map((h) => h.exited));
    expect(codes).toEqual([0, 0]);
    for (const pid of pids) expect(alive(pid)).toBe(false);
    await expect(group.submit(0, { requestId: "late", tokens, outputTokens: 1 })).rejects.toThrow(/clos/);
  });

  it("fails in-flight requests when a host dies, and reports a host that cannot start", async () => {
    const host = await EngineHostClient.spawn({ engines: 1, ...FAST, speedup: 1, decodeMsPerToken: 1_000 });
    cleanups.push(() => host.close());
    const slow = host.submit(0, { requestId: "slow", tokens: promptTokensFor([1], 64), outputTokens: 1_000 });
    await waitFor(async () => (await host.stats()).totals.running === 1, 5_000, "the request to run");
    process.kill(host.pid, "SIGKILL");
    const err: unknown = await slow.catch((e: unknown) => e);
    expect((err as KvmeshError).code).toBe("KVMESH_INTERNAL");
    expect((err as Error).message).toMatch(/exited unexpectedly \(SIGKILL\)/);
    await expect(host.submit(0, { requestId: "after", tokens: promptTokensFor([1], 64), outputTokens: 1 })).rejects.toThrow(/exited/);

    await expect(EngineHostClient.spawn({ engines: 2, ranksPerWorker: 3 })).rejects.toThrow(/ranksPerWorker/);
  });
});
