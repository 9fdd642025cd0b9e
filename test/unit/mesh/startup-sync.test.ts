import { describe, expect, it } from "vitest";
import { ManualClock } from "../../../src/core/index.js";
import type { PeerView } from "../../../mesh/membership.js";
import { StartupSync, UNREACHABLE_AFTER_MS, type StartupSyncOutcome } from "../../../mesh/startup-sync.js";

const view = (endpoint: string, v: Partial<PeerView> = {}): PeerView => ({
  endpoint,
  origin: null,
  state: "connecting",
  last_seq: null,
  lag_p50_ms: null,
  lag_p99_ms: null,
  gaps: 0,
  snapshots: 0,
  sync: null,
  ...v,
});

function setup(timeoutMs = 10_000) {
  const clock = new ManualClock(5_000);
  const peers: PeerView[] = [];
  const done: StartupSyncOutcome[] = [];
  let discovered = true;
  const sync = new StartupSync({ clock, timeoutMs, peers: () => peers, discovered: () => discovered, onDone: (o) => done.push(o) });
  return {
    clock,
    peers,
    done,
    sync,
    setDiscovered: (v: boolean) => {
      discovered = v;
    },
  };
}

describe("StartupSync", () => {
  it("waits for every registered peer until its origin is live, then stays done", () => {
    const t = setup();
    t.peers.push(view("tcp://a:7100"), view("tcp://b:7100"));
    expect(t.sync.pending()).toEqual(["tcp://a:7100", "tcp://b:7100"]);
    // Heard (alive) but its snapshot not installed yet: still awaited.
    t.peers[0] = view("tcp://a:7100", { origin: "1", state: "alive", sync: "syncing" });
    t.peers[1] = view("tcp://b:7100", { origin: "2", state: "alive", sync: "live", snapshots: 1 });
    expect(t.sync.pending()).toEqual(["tcp://a:7100"]);
    expect(t.done).toEqual([]);
    t.peers[0] = view("tcp://a:7100", { origin: "1", state: "alive", sync: "live", snapshots: 1 });
    t.clock.advance(300);
    expect(t.sync.pending()).toBeNull();
    expect(t.done).toEqual([{ reason: "synced", afterMs: 300, unsynced: [] }]);
    // A later resync (a gap, a restart) does not hold readiness again.
    t.peers[0] = view("tcp://a:7100", { origin: "3", state: "alive", sync: "syncing" });
    t.peers.push(view("tcp://c:7100"));
    expect(t.sync.pending()).toBeNull();
    expect(t.done).toHaveLength(1);
  });

  it("is done at once with no peers, and waits while DNS discovery has not answered", () => {
    expect(setup().sync.pending()).toBeNull();
    const t = setup();
    t.setDiscovered(false);
    expect(t.sync.pending()).toEqual([]);
    t.setDiscovered(true);
    t.peers.push(view("tcp://a:7100"));
    expect(t.sync.pending()).toEqual(["tcp://a:7100"]);
  });

  it("does not wait for a peer heard and then silent (suspect, down): it cannot answer", () => {
    const t = setup();
    t.peers.push(view("tcp://a:7100", { origin: "1", state: "down", sync: "syncing" }), view("tcp://b:7100", { origin: "2", state: "suspect", sync: "syncing" }));
    expect(t.sync.pending()).toBeNull();
    expect(t.done[0]?.reason).toBe("synced");
  });

  it("gives up on a peer never heard from after the timeout, naming it", () => {
    const t = setup(2_000);
    t.peers.push(view("tcp://gone:7100"), view("tcp://a:7100", { origin: "1", state: "alive", sync: "live", snapshots: 1 }));
    t.clock.advance(1_999);
    expect(t.sync.pending()).toEqual(["tcp://gone:7100"]);
    t.clock.advance(1);
    expect(t.sync.pending()).toBeNull();
    expect(t.done).toEqual([{ reason: "timeout", afterMs: 2_000, unsynced: ["tcp://gone:7100"] }]);
  });

  it("with a timeout of 0 never waits", () => {
    const t = setup(0);
    t.peers.push(view("tcp://a:7100"));
    expect(t.sync.pending()).toBeNull();
    expect(t.done).toEqual([]);
  });

  it("stops waiting for never-heard peers whose probe failed once the suspect timeout passed (G15)", () => {
    const clock = new ManualClock(5_000);
    const peers = [view("tcp://live:7100", { state: "alive", sync: "live", snapshots: 1 })];
    for (let i = 0; i < 200; i++) peers.push(view(`tcp://dead${i}:7100`));
    const done: StartupSyncOutcome[] = [];
    const sync = new StartupSync({ clock, timeoutMs: 10_000, peers: () => peers, discovered: () => true, unreachable: (ep) => ep.startsWith("tcp://dead"), onDone: (o) => done.push(o) });
    expect(sync.pending()).toHaveLength(200);
    clock.advance(UNREACHABLE_AFTER_MS);
    expect(sync.pending()).toBeNull();
    expect(done[0]?.reason).toBe("synced");
  });

  it("keeps waiting for a peer that was heard, even if its probe failed", () => {
    const clock = new ManualClock(5_000);
    const peers = [view("tcp://slow:7100", { state: "alive", origin: "1", sync: "syncing" })];
    const sync = new StartupSync({ clock, timeoutMs: 10_000, peers: () => peers, discovered: () => true, unreachable: () => true });
    clock.advance(UNREACHABLE_AFTER_MS);
    expect(sync.pending()).toEqual(["tcp://slow:7100"]);
  });
});
