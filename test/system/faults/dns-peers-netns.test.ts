/**
 * Peers found by DNS, end to end (#15 Tests): real daemons in a network namespace whose
 * /etc/hosts gives one name 3 loopback addresses, each replica at its own address with
 * `--peers dns:NAME:PORT` re-resolved every second. Scale up (a 4th address in the hosts file, a
 * 4th replica) and scale down (an address removed, its replica stopped) must reach every replica's
 * GET /replica_sync/peers, through DNS re-resolution (each replica resolved the name again).
 * How long each change took is printed, not asserted. Skipped, saying why, without `ip netns`
 * (not root, not Linux).
 */
import { afterAll, describe, expect, it } from "vitest";

import { metricSum } from "../../../src/bench/router-client.js";
import { spawnServe, stopServe, type ServeProcess } from "../../../src/bench/serve-process.js";
import { createHostsNamespace, netnsUnavailableReason, type HostsNamespace } from "../../helpers/netns-hosts.js";
import { waitFor } from "../../helpers/wait.js";

const unavailable = netnsUnavailableReason();
if (unavailable !== null) console.warn(`DNS peers netns test skipped: ${unavailable}`);

const NAME = "kvmesh-mesh";
/** Every replica's mesh port: the DNS entry gives addresses, the port is the entry's. A fresh namespace has it free. */
const MESH_PORT = 7100;
const INTERVAL_SECS = 1;
/**
 * How long a wait gives a change to show before the test fails: a deadline for liveness, not a
 * speed target (a change takes about the interval plus a registration's own work; printed).
 */
const WITHIN_MS = 20_000;

const addr = (i: number): string => `127.0.0.${11 + i}`;
const endpoint = (i: number): string => `tcp://${addr(i)}:${MESH_PORT}`;

describe("fault: peers from DNS in a network namespace", () => {
  let ns: HostsNamespace | undefined;
  const replicas = new Map<number, ServeProcess>();

  afterAll(async () => {
    await Promise.all([...replicas.values()].map((r) => stopServe(r)));
    ns?.destroy();
  });

  const start = async (i: number): Promise<void> => {
    const r = await spawnServe({
      label: `replica ${i}`,
      host: addr(i),
      prefix: (ns as HostsNamespace).prefix,
      args: ["--no-kv-events", "--replica-sync-port", String(MESH_PORT), "--peers", `dns:${NAME}:${MESH_PORT}`, "--peer-dns-interval-secs", String(INTERVAL_SECS)],
      startTimeoutMs: 60_000,
    });
    replicas.set(i, r);
  };
  const get = async (i: number, path: string): Promise<string> => {
    const r = replicas.get(i) as ServeProcess;
    const res = await (ns as HostsNamespace).fetch(`http://${addr(i)}:${r.port}${path}`);
    expect(res.status).toBe(200);
    return res.text;
  };
  const peersOf = async (i: number): Promise<string[]> => JSON.parse(await get(i, "/replica_sync/peers")) as string[];
  const resolutions = async (i: number): Promise<number> => metricSum(await get(i, "/metrics"), "kvmesh_mesh_peer_dns_resolutions_total");
  /**
   * Until each of `members` has resolved the name twice more: a round in flight may have read the
   * hosts file before it changed, the next one read it after and applied what it found.
   */
  const resolvedAgain = async (members: number[]): Promise<void> => {
    const before = await Promise.all(members.map(resolutions));
    await waitFor(async () => (await Promise.all(members.map(resolutions))).every((n, k) => n >= (before[k] as number) + 2), WITHIN_MS, "two more DNS rounds on every replica");
  };
  /** Every running replica lists exactly the others among `members`. */
  const meshIs = async (members: number[]): Promise<boolean> => {
    for (const i of members) {
      const want = members.filter((j) => j !== i).map(endpoint).sort();
      if (JSON.stringify(await peersOf(i)) !== JSON.stringify(want)) return false;
    }
    return true;
  };
  const describeMesh = async (): Promise<string> =>
    JSON.stringify(Object.fromEntries(await Promise.all([...replicas.keys()].map(async (i) => [addr(i), await peersOf(i).catch((e: unknown) => String(e))]))));
  const waitMesh = async (members: number[], ms: number, what: string): Promise<void> => {
    let last = "";
    await waitFor(
      async () => {
        const ok = await meshIs(members);
        if (!ok) last = await describeMesh();
        return ok;
      },
      ms,
      () => `${what}; last seen ${last}`,
    );
  };

  it("peers 3 replicas by one name, adds a 4th on scale-up and deregisters a removed one everywhere", async (ctx) => {
    if (unavailable !== null) ctx.skip(`ip netns unavailable: ${unavailable}`);
    ns = createHostsNamespace();
    ns.setHosts([0, 1, 2].map((i) => [addr(i), NAME]));
    await Promise.all([0, 1, 2].map(start));
    await waitMesh([0, 1, 2], WITHIN_MS, "3 replicas peered through DNS");

    // Scale up as a StatefulSet does: the 4th replica starts, and its address reaches DNS after
    // it already asked the others to peer back. Every replica lists it, and it is live both ways.
    await start(3);
    ns.setHosts([0, 1, 2, 3].map((i) => [addr(i), NAME]));
    const changed = performance.now();
    await waitMesh([0, 1, 2, 3], WITHIN_MS, "a full mesh of 4");
    console.log(`DNS peers: a full mesh of 4 ${Math.round(performance.now() - changed)} ms after the name listed the 4th (interval ${INTERVAL_SECS} s)`);
    // Every replica's discovery has now seen it in DNS too (what makes it theirs to remove).
    await resolvedAgain([0, 1, 2]);
    expect(await meshIs([0, 1, 2, 3])).toBe(true);
    await waitFor(
      async () => {
        const r = replicas.get(0) as ServeProcess;
        const st = JSON.parse((await (ns as HostsNamespace).fetch(`http://${addr(0)}:${r.port}/replica_sync/status`)).text) as { endpoint: string; sync: string | null }[];
        return st.find((p) => p.endpoint === endpoint(3))?.sync === "live";
      },
      WITHIN_MS,
      "replica 0 live with the 4th",
    );

    // Scale down (a StatefulSet removes the highest ordinal): its address leaves the name and it
    // stops (stopping does not unpeer). DNS discovery deregisters it on every replica, although
    // they had it from its own peer-back request before DNS listed it.
    ns.setHosts([0, 1, 2].map((i) => [addr(i), NAME]));
    await stopServe(replicas.get(3) as ServeProcess);
    replicas.delete(3);
    const removed = performance.now();
    await waitMesh([0, 1, 2], WITHIN_MS, "the removed replica deregistered everywhere");
    console.log(`DNS peers: the removed replica deregistered everywhere ${Math.round(performance.now() - removed)} ms after it left the name`);
  }, 150_000);
});
