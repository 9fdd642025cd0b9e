/**
 * #29 G3/G4: versions more than DEFAULT_MAX_VERSION_SKEW_NS ahead of the local wall clock are
 * refused where they enter and never move a Lamport clock; a clock or an entry that holds one
 * already (the wall clock stepped back past the skew) recovers.
 */
import { describe, expect, it } from "vitest";

import { DEFAULT_MAX_VERSION_SKEW_NS, LamportClock, compareVersionsWithin, type VersionRefusal } from "../../../src/core/lamport.js";
import { seededRandom } from "../../../src/core/random.js";
import type { BindingEvent, CatalogEvent } from "../../../src/core/replica-events.js";
import { SelectionService } from "../../../src/core/selection-service.js";
import { ManualClock } from "../../../src/core/time.js";
import { tokens, worker } from "../../helpers/core-fixtures.js";
import { replicaView } from "../../helpers/replica-view.js";

const U64_MAX = (1n << 64n) - 1n;
const NOW_NS = 1_700_000_000_000_000_000n;

/** A replica whose wall clock the test moves; records what it refused. */
function replica(writerId: bigint, wall: { ns: bigint }, hostReplication = false) {
  const refused: VersionRefusal[] = [];
  const svc = new SelectionService({
    clock: new ManualClock(1_000),
    random: seededRandom(Number(writerId)),
    replicaId: writerId,
    wallClockNs: () => wall.ns,
    sessionAffinity: { ttlSecs: 600, mode: "soft" },
    ...(hostReplication ? { sessionReplicationWriterId: writerId } : {}),
  });
  svc.onVersionRefused((r) => refused.push(r));
  for (const id of [1, 2]) svc.upsertWorker(worker(id));
  return { svc, refused };
}

const binding = (over: Partial<BindingEvent>): BindingEvent => ({ model_name: "default", routing_group: "default", session_id: "s", worker_id: 2n, dp_rank: 0, sequence: NOW_NS, writer_id: 9n, reason: "bind", ...over });
const target = (svc: SelectionService): bigint => svc.select({ token_ids: tokens(1, 77), session_id: "s" }).worker_id;

describe("the Lamport clock's horizon", () => {
  it("never observes a sequence past wall clock + skew, and admits one at the horizon", () => {
    const c = new LamportClock(() => NOW_NS);
    c.observe(U64_MAX);
    expect(c.admits(U64_MAX)).toBe(false);
    expect(c.peek()).toBe(NOW_NS);
    c.observe(NOW_NS + DEFAULT_MAX_VERSION_SKEW_NS);
    expect(c.admits(NOW_NS + DEFAULT_MAX_VERSION_SKEW_NS)).toBe(true);
    expect(c.peek()).toBe(NOW_NS + DEFAULT_MAX_VERSION_SKEW_NS + 1n);
  });

  it("recovers when the wall clock steps back past the skew: it issues from the wall clock again", () => {
    const wall = { ns: NOW_NS + 10n * DEFAULT_MAX_VERSION_SKEW_NS };
    const c = new LamportClock(() => wall.ns);
    expect(c.next()).toBe(wall.ns);
    wall.ns = NOW_NS;
    expect(c.next()).toBe(NOW_NS);
  });

  it("orders a version past the horizon below every version within it", () => {
    const h = NOW_NS + DEFAULT_MAX_VERSION_SKEW_NS;
    expect(compareVersionsWithin({ sequence: NOW_NS, writerId: 1n }, { sequence: U64_MAX, writerId: 9n }, h)).toBeGreaterThan(0);
    expect(compareVersionsWithin({ sequence: U64_MAX, writerId: 9n }, { sequence: NOW_NS, writerId: 1n }, h)).toBeLessThan(0);
    expect(compareVersionsWithin({ sequence: 2n, writerId: 1n }, { sequence: 1n, writerId: 9n }, h)).toBeGreaterThan(0);
  });
});

describe("a session binding at 2^64-1 (#29 G3)", () => {
  it("is refused over the mesh, counted and reported; later rebinds still apply", () => {
    const { svc, refused } = replica(1n, { ns: NOW_NS });
    expect(replicaView(svc).applyBindingEvent(binding({ sequence: U64_MAX, worker_id: 1n }))).toBe("rejected-invalid");
    expect(svc.stats.versionsRefusedAhead).toBe(1);
    expect(refused).toEqual([{ kind: "binding", writerId: 9n, sequence: U64_MAX }]);
    // Before the fix the clock saturated and this newer rebind was "ignored-conflict".
    expect(replicaView(svc).applyBindingEvent(binding({ sequence: NOW_NS + 1n, worker_id: 2n }))).toBe("inserted");
    expect(target(svc)).toBe(2n);
  });

  it("is refused through POST /session_bindings with the field named", () => {
    const { svc } = replica(1n, { ns: NOW_NS }, true);
    const out = svc.applySessionBinding({ ...binding({ sequence: U64_MAX }) });
    expect(out.outcome).toBe("rejected-invalid");
    expect(out.reason).toMatch(/^sequence: more than 300 s ahead/);
    expect(svc.applySessionBinding(binding({ sequence: NOW_NS + 5n })).outcome).toBe("inserted");
  });

  it("held already (the wall clock stepped back past the skew), is replaced by the next valid binding, and local binds issue from the wall clock", () => {
    const wall = { ns: NOW_NS + 10n * DEFAULT_MAX_VERSION_SKEW_NS };
    const a = replica(1n, wall);
    // Taken while the clock was ahead: within the horizon then.
    expect(replicaView(a.svc).applyBindingEvent(binding({ sequence: wall.ns, worker_id: 1n }))).toBe("inserted");
    wall.ns = NOW_NS;
    expect(replicaView(a.svc).applyBindingEvent(binding({ sequence: NOW_NS + 1n, worker_id: 2n, writer_id: 8n }))).toBe("replaced-newer");
    expect(target(a.svc)).toBe(2n);
    const published: BindingEvent[] = [];
    replicaView(a.svc).onBindingEvent((e) => published.push(e));
    a.svc.selectAndReserve({ token_ids: tokens(1, 78), session_id: "t", request_id: "r1" } as never);
    const own = published.find((e) => e.session_id === "t");
    expect(own?.sequence).toBeLessThanOrEqual(NOW_NS + DEFAULT_MAX_VERSION_SKEW_NS);
  });
});

describe("a catalogue event at 2^64-1 (#29 G4)", () => {
  it("is refused, and so is one on an origin's stream that it did not write", () => {
    const wall = { ns: NOW_NS };
    const a = replica(1n, wall);
    const b = replica(2n, wall);
    const events: CatalogEvent[] = [];
    replicaView(b.svc).onCatalogEvent((e) => events.push(e));
    b.svc.upsertWorker(worker(6));
    const real = events.at(-1) as CatalogEvent;
    expect(replicaView(a.svc).applyCatalogEvent({ ...real, sequence: U64_MAX })).toBe("refused");
    expect(replicaView(a.svc).applyCatalogEvent(real, 3n)).toBe("refused");
    expect(a.refused.map((r) => r.kind)).toEqual(["catalog", "catalog"]);
    expect(a.svc.stats.versionsRefusedAhead).toBe(2);
    // The genuine event from its writer still applies: catalogue replication is not frozen.
    expect(replicaView(a.svc).applyCatalogEvent(real, 2n)).toBe("applied");
  });

  it("held already, is superseded by the next valid change", () => {
    const wall = { ns: NOW_NS + 10n * DEFAULT_MAX_VERSION_SKEW_NS };
    const a = replica(1n, wall);
    const b = replica(2n, wall);
    const events: CatalogEvent[] = [];
    replicaView(b.svc).onCatalogEvent((e) => events.push(e));
    b.svc.upsertWorker(worker(5));
    expect(replicaView(a.svc).applyCatalogEvent(events.at(-1) as CatalogEvent, 2n)).toBe("applied");
    wall.ns = NOW_NS;
    b.svc.deleteWorker(5n);
    expect(replicaView(a.svc).applyCatalogEvent(events.at(-1) as CatalogEvent, 2n)).toBe("deleted");
    expect(a.svc.getWorker(5n)).toBeUndefined();
  });
});
