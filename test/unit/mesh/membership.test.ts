import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { ManualClock } from "../../../src/core/index.js";
import { KvmeshError } from "../../../src/core/index.js";
import { MAX_CONCURRENT_STATUS_CHECKS, Membership, SILENT_PEER_REDIAL_MAX_MS, SILENT_PEER_REDIAL_MS, SLOT_REFRESH_MS } from "../../../mesh/membership.js";
import type { PeerState } from "../../../mesh/peer-health.js";
import type { ControlRequest } from "../../../mesh/types.js";
import { FakeReplicaPort } from "../../helpers/fake-replica-port.js";

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
  /** What each control endpoint answers to a status request (none: unreachable). */
  const statuses = new Map<string, { origin: bigint; peers: string[] }>();
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
        if (req.type !== "status") return Promise.resolve({ type: "ok" });
        const st = statuses.get(endpoint);
        return st === undefined ? Promise.reject(new Error("timed out")) : Promise.resolve({ type: "status", ...st });
      },
    },
    inbound: {
      peerStates: () => new Map(states),
      originStats: () => undefined,
      forget: (origin) => void forgotten.push(origin),
      pullSnapshot: (endpoint, origin) => void pulls.push({ endpoint, origin }),
      welcome: () => undefined,
    },
    port,
    logger: pino({ enabled: false }),
    clock,
  });
  return { membership, clock, links, requests, pulls, forgotten, states, statuses, port };
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

  it("keeps the bookings of a deregistered peer that said it was leaving (G8)", async () => {
    const s = setup();
    s.membership.register(PEER);
    s.membership.snapshotFrom("tcp://10.0.0.1:7101", A);
    s.port.leaving.add(A);
    expect(await s.membership.deregister(PEER)).toBe(true);
    expect(s.forgotten).toEqual([A]);
    expect(s.port.dropped).toEqual([]);
  });

  it("lets DNS discovery take over a peer that is here only because it asked to peer back, not one registered by hand", async () => {
    const s = setup();
    s.statuses.set("tcp://10.0.0.1:7101", { origin: A, peers: [] });
    expect(await s.membership.onPeerRequest(PEER, A)).toBeNull();
    // Registered by its own request before our first DNS round: discovery's to remove later.
    expect(s.membership.registerDiscovered(PEER)).toBe(true);
    expect(s.membership.registerDiscovered(PEER)).toBe(false);
    const byHand = "tcp://10.0.0.2:7100";
    expect(s.membership.register(byHand)).toBe(true);
    expect(s.membership.registerDiscovered(byHand)).toBe(false);
    // A peer that asked, then was registered by hand, is not discovery's either.
    const asked = "tcp://10.0.0.3:7100";
    s.statuses.set("tcp://10.0.0.3:7101", { origin: 0xa3n, peers: [] });
    expect(await s.membership.onPeerRequest(asked, 0xa3n)).toBeNull();
    expect(s.membership.register(asked)).toBe(false);
    expect(s.membership.registerDiscovered(asked)).toBe(false);
    expect(s.membership.peerEndpoints()).toEqual([PEER, byHand, asked]);
  });

  it("redials a registered peer that restarted at the same endpoint when it asks to peer", async () => {
    const s = setup();
    s.membership.register(PEER);
    s.membership.peerHeard(PEER, A);
    s.links.length = 0;
    expect(await s.membership.onPeerRequest(PEER, A)).toBeNull();
    expect(s.links).toEqual([]);
    // The restarted process answers for its new origin.
    s.statuses.set(PEER_CONTROL, { origin: 0xa2n, peers: [SELF_EP] });
    expect(await s.membership.onPeerRequest(PEER, 0xa2n)).toBeNull();
    expect(s.links).toEqual([`-${PEER}`, `+${PEER}`]);
  });
});

const PEER_CONTROL = "tcp://10.0.0.1:7101";

describe("Membership: requests from peers are checked before they act (#17 F12-F14)", () => {
  it("peers back only with an endpoint that answers as the origin that asked", async () => {
    const s = setup();
    // Nobody answers at the endpoint: refused, not connected.
    expect(await s.membership.onPeerRequest(PEER, A)).toMatch(/could not be checked: timed out/);
    // Another process answers there.
    s.statuses.set(PEER_CONTROL, { origin: 0xbbn, peers: [] });
    expect(await s.membership.onPeerRequest(PEER, A)).toBe(`${PEER} is origin 187, not ${A}`);
    expect(s.links).toEqual([]);
    s.statuses.set(PEER_CONTROL, { origin: A, peers: [SELF_EP] });
    expect(await s.membership.onPeerRequest(PEER, A)).toBeNull();
    expect(s.links).toEqual([`+${PEER}`]);
    expect(s.pulls).toEqual([{ endpoint: PEER_CONTROL, origin: null }]);
    // Its snapshot pull is then accepted without another check.
    const asked = s.requests.length;
    expect(await s.membership.checkSnapshot(A, undefined)).toBeNull();
    expect(s.requests).toHaveLength(asked);
    expect(s.membership.peerEndpoints()).toEqual([PEER]);
  });

  it("acts on an unpeer only when its sender confirms it no longer peers with us (a forged one keeps the peer and its bookings)", async () => {
    const s = setup();
    s.membership.register(PEER);
    s.membership.peerHeard(PEER, A);
    s.links.length = 0;
    // Forged: the real peer still lists us.
    s.statuses.set(PEER_CONTROL, { origin: A, peers: [SELF_EP, "tcp://10.0.0.2:7100"] });
    expect(await s.membership.onUnpeerRequest(PEER, A)).toBe(`${PEER} still lists ${SELF_EP} among its peers`);
    // Forged, naming an origin that is not the one at that endpoint.
    expect(await s.membership.onUnpeerRequest(PEER, 0xeen)).toMatch(/is origin .* not 238/);
    // Unreachable: not confirmed.
    s.statuses.delete(PEER_CONTROL);
    expect(await s.membership.onUnpeerRequest(PEER, A)).toMatch(/could not be checked/);
    expect([s.links, s.forgotten, s.port.dropped]).toEqual([[], [], []]);
    expect(s.membership.peerEndpoints()).toEqual([PEER]);
    // The peer deregistered us (its own list no longer has us): done.
    s.statuses.set(PEER_CONTROL, { origin: A, peers: [] });
    expect(await s.membership.onUnpeerRequest(PEER, A)).toBeNull();
    expect(s.links).toEqual([`-${PEER}`]);
    expect(s.forgotten).toEqual([A]);
    expect(s.port.dropped).toEqual([A]);
    expect(s.membership.peerEndpoints()).toEqual([]);
  });

  it("checks at most MAX_CONCURRENT_STATUS_CHECKS requests at once; the rest are refused at once", async () => {
    const s = setup();
    // Endpoints that never answer (until released): each check holds a slot.
    const release: (() => void)[] = [];
    const m = new Membership({
      origin: SELF,
      advertise: SELF_EP,
      links: { connectPeer: () => true, disconnectPeer: () => true },
      control: {
        request: () =>
          new Promise((_resolve, reject) => {
            release.push(() => {
              reject(new Error("timed out"));
            });
          }),
      },
      inbound: { peerStates: () => new Map(), originStats: () => undefined, forget: () => undefined, pullSnapshot: () => undefined, welcome: () => undefined },
      port: s.port,
      logger: pino({ enabled: false }),
      clock: s.clock,
    });
    const held = Array.from({ length: MAX_CONCURRENT_STATUS_CHECKS }, (_, i) => m.onPeerRequest(`tcp://10.9.0.${i}:7100`, A));
    expect(await m.onPeerRequest("tcp://10.9.1.1:7100", A)).toBe(`${MAX_CONCURRENT_STATUS_CHECKS} other requests are being checked (retry later)`);
    for (const r of release) r();
    for (const r of await Promise.all(held)) expect(r).toMatch(/could not be checked: timed out/);
    // Slots are free again.
    const again = m.onPeerRequest("tcp://10.9.1.1:7100", A);
    expect(release).toHaveLength(MAX_CONCURRENT_STATUS_CHECKS + 1);
    release.at(-1)?.();
    expect(await again).toMatch(/could not be checked/);
  });

  it("serves a snapshot to a registered or heard origin, or to one whose endpoint answers as it", async () => {
    const s = setup();
    s.membership.register(PEER);
    s.membership.peerHeard(PEER, A);
    expect(await s.membership.checkSnapshot(A, undefined)).toBeNull();
    s.states.set(0xccn, "alive");
    expect(await s.membership.checkSnapshot(0xccn, undefined)).toBeNull();
    expect(await s.membership.checkSnapshot(0xddn, undefined)).toBe(`origin 221 is not a registered peer and gave no endpoint to check`);
    expect(await s.membership.checkSnapshot(0xddn, "tcp://10.0.0.3:7100")).toMatch(/could not be checked/);
    s.statuses.set("tcp://10.0.0.3:7101", { origin: 0xddn, peers: [] });
    expect(await s.membership.checkSnapshot(0xddn, "tcp://10.0.0.3:7100")).toBeNull();
    expect(await s.membership.checkSnapshot(0xdfn, "tcp://10.0.0.3:7100")).toMatch(/is origin/);
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
