import { describe, expect, it } from "vitest";

import type { ReplicaEvent } from "../../../src/core/index.js";
import { MAX_DRAINING_ORIGINS } from "../../../src/core/index.js";
import { decodeBatch, decodeSnapshot, encodeBatch, encodeSnapshot } from "../../../mesh/wire.js";
import { makeService } from "../../helpers/core-fixtures.js";

/** The drain flag: a replicated kind added as one core file, a registry line and a codec entry. */
describe("the drain flag of a leaving replica", () => {
  it("is told to peers once draining starts, recorded per origin, carried by snapshots and dropped with the origin", () => {
    const { svc: a } = makeService({ replicaId: 1n });
    const { svc: b } = makeService({ replicaId: 2n });
    const { svc: c } = makeService({ replicaId: 3n });
    const sent: ReplicaEvent[] = [];
    a.replication.attach({ event: (e) => sent.push(e) });
    expect(a.replication.snapshot().draining).toBeUndefined();
    a.drain();
    a.drain(); // once
    expect(sent).toEqual([{ kind: "drain", event: { draining: true } }]);
    b.replication.apply(1n, sent);
    expect(b.replication.describe(1n)).toMatchObject({ draining: true });
    expect(b.replication.describe(3n).draining).toBeUndefined();
    // A joiner learns it from the snapshot.
    const snap = a.replication.snapshot();
    expect(snap.draining).toBe(true);
    c.replication.install(1n, snap);
    expect(c.replication.describe(1n).draining).toBe(true);
    // A later snapshot without it (the origin restarted, say) clears it; so does the origin's departure.
    c.replication.install(1n, { ...snap, draining: false });
    expect(c.replication.describe(1n).draining).toBeUndefined();
    b.replication.dropOrigin(1n);
    expect(b.replication.describe(1n).draining).toBeUndefined();
  });

  it("keeps at most MAX_DRAINING_ORIGINS flags, the oldest going first", () => {
    const { svc } = makeService({ replicaId: 1n });
    for (let i = 0; i < MAX_DRAINING_ORIGINS + 10; i++) svc.replication.apply(BigInt(i + 100), [{ kind: "drain", event: { draining: true } }]);
    expect(svc.replication.describe(100n).draining).toBeUndefined();
    expect(svc.replication.describe(BigInt(MAX_DRAINING_ORIGINS + 109)).draining).toBe(true);
  });

  it("round-trips on the wire: an event kind \"d\" and a snapshot key \"dn\" (absent when not draining)", () => {
    const batch = { v: 1 as const, origin: 5n, epoch: 9n, seq: 1, sentAtMs: 0, events: [{ kind: "drain" as const, event: { draining: true } }] };
    expect(decodeBatch(encodeBatch(batch))).toEqual(batch);
    const snap = { v: 1 as const, origin: 5n, epoch: 9n, seq: 3, bookings: [], bindings: [] };
    expect(decodeSnapshot(encodeSnapshot({ ...snap, draining: true }))).toEqual({ ...snap, draining: true });
    expect(decodeSnapshot(encodeSnapshot(snap))).toEqual(snap);
  });
});
