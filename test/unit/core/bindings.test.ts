import { describe, expect, it } from "vitest";
import { SelectionService } from "../../../src/core/selection-service.js";
import type { BindingEvent } from "../../../src/core/replica-events.js";
import { makeService, tokens, worker } from "../../helpers/core-fixtures.js";
import { replicaView } from "../../helpers/replica-view.js";

const AFFINITY = { ttlSecs: 60 };

function published(svc: SelectionService): BindingEvent[] {
  const out: BindingEvent[] = [];
  replicaView(svc).onBindingEvent((e) => out.push(e));
  return out;
}

describe("binding versions (Lamport clock)", () => {
  it("start at the wall clock in ns by default, not at a clock that counts from boot", () => {
    const svc = new SelectionService({ replicaId: 3n, sessionAffinity: AFFINITY });
    const events = published(svc);
    const before = BigInt(Date.now()) * 1_000_000n;
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(2), session_id: "s" });
    expect(events).toHaveLength(1);
    expect(events[0]?.sequence).toBeGreaterThanOrEqual(before);
  });

  it("never start a new partition's table at or below a version already seen, however far the wall clock is behind", () => {
    // The injected wall clock stands for a host whose clock stepped back (or a new host behind).
    const { svc } = makeService({ sessionAffinity: AFFINITY, wallClockNs: () => 5n });
    const events = published(svc);
    svc.upsertWorker(worker(1));
    const peer: BindingEvent = {
      model_name: "default",
      routing_group: "default",
      session_id: "peer-session",
      worker_id: 1n,
      dp_rank: 0,
      sequence: 1_000_000n,
      writer_id: 99n,
      reason: "bind",
    };
    expect(replicaView(svc).applyBindingEvent(peer)).toBe("inserted");
    // A partition created after the peer's binding was seen: its first version beats it.
    svc.upsertWorker(worker(2, { model_name: "m2" }));
    svc.selectAndReserve({ model_name: "m2", token_ids: tokens(2), session_id: "mine" });
    const mine = events.filter((e) => e.session_id === "mine");
    expect(mine).toHaveLength(1);
    expect(mine[0]?.sequence).toBeGreaterThan(1_000_000n);
  });

  it("beat a parked binding's version in the partition it is parked for", () => {
    const { svc } = makeService({ sessionAffinity: AFFINITY, wallClockNs: () => 5n });
    const events = published(svc);
    const parked: BindingEvent = {
      model_name: "m3",
      routing_group: "default",
      session_id: "early",
      worker_id: 7n,
      dp_rank: 0,
      sequence: 2_000_000n,
      writer_id: 99n,
      reason: "bind",
    };
    expect(replicaView(svc).applyBindingEvent(parked)).toBe("parked-unknown-worker");
    svc.upsertWorker(worker(8, { model_name: "m3" }));
    svc.selectAndReserve({ model_name: "m3", token_ids: tokens(2), session_id: "early" });
    const rebound = events.filter((e) => e.session_id === "early");
    expect(rebound).toHaveLength(1);
    expect(rebound[0]?.sequence).toBeGreaterThan(2_000_000n);
  });
});
