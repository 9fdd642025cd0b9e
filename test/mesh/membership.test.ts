import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { ManualClock } from "../../src/core/clock.js";
import { KvmeshError } from "../../src/core/errors.js";
import { Membership, SILENT_PEER_REDIAL_MAX_MS, SILENT_PEER_REDIAL_MS, SLOT_REFRESH_MS } from "../../mesh/membership.js";
import type { PeerState } from "../../mesh/peer-health.js";
import type { ControlRequest } from "../../mesh/types.js";
import { FakeReplicaPort } from "./fake-replica-port.js";

const SELF = 0x50n;
const SELF_EP = "tcp://10.0.0.9:7100";
const PEER = "tcp://10.0.0.1:7100";
const A = 0xa1n;

function setup() {
  const clock = new ManualClock(10_000);
  const links: string[] = [];
  const requests: { endpoint: string; req: ControlRequest }[] = [];
  const pulls: { endpoint: string; origin: bigint | null }[] = [];
  const forgotten: bigint[] = [];
  const states = new Map<bigint, PeerState>();
  const port = new FakeReplicaPort(SELF);
  const membership = new Membership({
    origin: SELF,
    advertise: SELF_EP,
    links: {
      connectPeer: (ep) => (links.push(`+${ep}`), true),
      disconnectPeer: (ep) => (links.push(`-${ep}`), true),
    },
    control: {
      request: (endpoint, req) => {
        requests.push({ endpoint, req });
        return Promise.resolve({ type: "ok" });
      },
    },
    inbound: {
      peerStates: () => new Map(states),
      originStats: () => undefined,
      forget: (origin) => void forgotten.push(origin),
      pullSnapshot: (endpoint, origin) => void pulls.push({ endpoint, origin }),
    },
    port,
    logger: pino({ enabled: false }),
    clock,
  });
  return { membership, clock, links, requests, pulls, forgotten, states, port };
}

describe("Membership: register and deregister", () => {
  it("connects, asks the peer to connect back and pulls its snapshot; refuses itself", async () => {
    const s = setup();
    expect(s.membership.register(` ${PEER} `)).toBe(true);
    expect(s.membership.register(PEER)).toBe(false);
    expect(s.links).toEqual([`+${PEER}`]);
    expect(s.requests[0]).toEqual({ endpoint: "tcp://10.0.0.1:7101", req: { type: "peer", from: SELF, publishEndpoint: SELF_EP } });
    expect(s.pulls[0]).toEqual({ endpoint: "tcp://10.0.0.1:7101", origin: null });
    expect(() => s.membership.register(SELF_EP)).toThrow(KvmeshError);
    expect(s.membership.list().map((p) => [p.endpoint, p.state])).toEqual([[PEER, "connecting"]]);

    s.membership.snapshotFrom("tcp://10.0.0.1:7101", A);
    expect(s.membership.list().map((p) => p.origin)).toEqual([A.toString()]);
    expect(await s.membership.deregister(PEER)).toBe(true);
    expect(await s.membership.deregister(PEER)).toBe(false);
    expect(s.links).toEqual([`+${PEER}`, `-${PEER}`]);
    expect(s.requests.at(-1)?.req).toEqual({ type: "unpeer", from: SELF, publishEndpoint: SELF_EP });
    expect(s.forgotten).toEqual([A]);
    expect(s.port.dropped).toEqual([A]);
  });

  it("redials a registered peer that restarted at the same endpoint when it asks to peer", () => {
    const s = setup();
    s.membership.register(PEER);
    s.membership.peerHeard(PEER, A);
    s.links.length = 0;
    s.membership.onPeerRequest(PEER, A);
    expect(s.links).toEqual([]);
    s.membership.onPeerRequest(PEER, 0xa2n);
    expect(s.links).toEqual([`-${PEER}`, `+${PEER}`]);
  });
});

describe("Membership: redial of silent peers (manual clock)", () => {
  it("gives a never-heard peer the suspect timeout, then backs off doubling up to the max", () => {
    const s = setup();
    s.membership.register(PEER);
    s.links.length = 0;
    const t0 = s.clock.now();
    const redialsAt: number[] = [];
    for (let t = 0; t <= 120_000; t += 100) {
      s.clock.set(t0 + t);
      const before = s.membership.stats.redials;
      s.membership.redialSilentPeers(s.clock.now());
      if (s.membership.stats.redials > before) redialsAt.push(t);
    }
    const R = SILENT_PEER_REDIAL_MS;
    // Gaps: R, 2R, 4R, 8R, then capped at the max.
    expect(redialsAt.slice(0, 6)).toEqual([R, 2 * R, 4 * R, 8 * R, 16 * R, 16 * R + SILENT_PEER_REDIAL_MAX_MS]);
    expect(s.links.slice(0, 2)).toEqual([`-${PEER}`, `+${PEER}`]);
  });

  it("redials a suspect peer at once and stops once it is alive again", () => {
    const s = setup();
    s.membership.register(PEER);
    s.membership.peerHeard(PEER, A);
    s.states.set(A, "alive");
    s.membership.redialSilentPeers(s.clock.now());
    expect(s.membership.stats.redials).toBe(0);
    s.states.set(A, "suspect");
    s.membership.redialSilentPeers(s.clock.now());
    expect(s.membership.stats.redials).toBe(1);
    s.clock.advance(SILENT_PEER_REDIAL_MS - 1);
    s.membership.redialSilentPeers(s.clock.now());
    expect(s.membership.stats.redials).toBe(1);
    s.states.set(A, "alive");
    s.clock.advance(1);
    s.membership.redialSilentPeers(s.clock.now());
    expect(s.membership.stats.redials).toBe(1);
    // Silent again later: the backoff starts over, at once.
    s.states.set(A, "down");
    s.membership.redialSilentPeers(s.clock.now());
    expect(s.membership.stats.redials).toBe(2);
  });
});

describe("Membership: slot for tie spreading", () => {
  it("ranks this replica among the live peers by id, refreshed every SLOT_REFRESH_MS", () => {
    const s = setup();
    expect(s.membership.slot()).toEqual({ index: 0, count: 1 });
    s.states.set(0x10n, "alive");
    s.states.set(0x60n, "alive");
    s.states.set(0x20n, "down");
    s.clock.advance(SLOT_REFRESH_MS - 1);
    expect(s.membership.slot()).toEqual({ index: 0, count: 1 });
    s.clock.advance(1);
    expect(s.membership.slot()).toEqual({ index: 1, count: 3 });
  });
});
