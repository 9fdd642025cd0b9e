/**
 * A snapshot sent in pages (#29 G16): the wire's page messages, the serving side's cursors
 * (binding-cursors.ts) and what a replica of an earlier version sees.
 */
import { describe, expect, it } from "vitest";

import { ManualClock, type BindingEvent } from "../../../src/core/index.js";
import { BINDING_CURSOR_IDLE_MS, BindingCursors, MAX_OPEN_BINDING_CURSORS } from "../../../mesh/binding-cursors.js";
import { ControlServer, DEFAULT_SNAPSHOT_PAGE_BINDINGS } from "../../../mesh/control.js";
import { decodeControlReply, decodeControlRequest, encodeControlReply, encodeControlRequest, MAX_SNAPSHOT_PAGE_BINDINGS, MeshWireError, type SkippedEntry } from "../../../mesh/wire.js";
import { FakeReplicaPort } from "../../helpers/fake-replica-port.js";

const binding = (i: number): BindingEvent => ({ model_name: "m", routing_group: "default", session_id: `s${i}`, worker_id: 1n, dp_rank: 0, sequence: 1_000n + BigInt(i), writer_id: 9n, reason: "bind" });

function idsFrom(start: bigint): () => bigint {
  let n = start;
  return () => n++;
}

describe("binding page messages", () => {
  it("a page request and reply round-trip; a page over MAX_SNAPSHOT_PAGE_BINDINGS is refused as over the bound", () => {
    const req = decodeControlRequest(encodeControlRequest({ type: "bindings", from: 5n, cursor: (1n << 63n) + 7n, max: 100 }));
    expect(req).toEqual({ type: "bindings", from: 5n, cursor: (1n << 63n) + 7n, max: 100 });
    const page = [binding(1), binding(2)];
    expect(decodeControlReply(encodeControlReply({ type: "bindings", bindings: page, more: true }))).toEqual({ type: "bindings", bindings: page, more: true });
    expect(() => decodeControlRequest(encodeControlRequest({ type: "bindings", from: 5n, cursor: 1n, max: MAX_SNAPSHOT_PAGE_BINDINGS + 1 }))).toThrow(MeshWireError);
    const over = Array.from({ length: MAX_SNAPSHOT_PAGE_BINDINGS + 1 }, (_, i) => binding(i));
    expect(() => decodeControlReply(encodeControlReply({ type: "bindings", bindings: over, more: false }))).toThrow(/bindings: 65537 items exceeds the maximum of 65536/);
  });

  it("one bad binding in a page is skipped and reported; the rest decode", () => {
    const bad = { ...binding(2), reason: "bogus" } as unknown as BindingEvent;
    const skipped: SkippedEntry[] = [];
    const r = decodeControlReply(encodeControlReply({ type: "bindings", bindings: [binding(1), bad, binding(3)], more: false }), (s) => skipped.push(s));
    expect(r).toEqual({ type: "bindings", bindings: [binding(1), binding(3)], more: false });
    expect(skipped.map((s) => s.field)).toEqual(["bindings[1].reason"]);
  });

  it("a snapshot request offers pages with bp; one without it (an earlier version) decodes as before", () => {
    expect(decodeControlRequest(encodeControlRequest({ type: "snapshot", from: 3n, pageBindings: DEFAULT_SNAPSHOT_PAGE_BINDINGS }))).toEqual({ type: "snapshot", from: 3n, publishEndpoint: undefined, pageBindings: DEFAULT_SNAPSHOT_PAGE_BINDINGS });
    expect(decodeControlRequest(encodeControlRequest({ type: "snapshot", from: 3n }))).toEqual({ type: "snapshot", from: 3n, publishEndpoint: undefined });
  });
});

describe("the leaving origins a snapshot carries (G8)", () => {
  it("round-trip as dg; absent when none", () => {
    const base = { v: 1 as const, origin: 3n, epoch: 1n, seq: 2, bookings: [], bindings: [] };
    const r = decodeControlReply(encodeControlReply({ type: "snapshot", snapshot: { ...base, drainingOrigins: [5n, (1n << 63n) + 1n] } }));
    expect(r).toMatchObject({ type: "snapshot", snapshot: { drainingOrigins: [5n, (1n << 63n) + 1n] } });
    const none = decodeControlReply(encodeControlReply({ type: "snapshot", snapshot: base }));
    expect(none.type === "snapshot" && "drainingOrigins" in none.snapshot).toBe(false);
  });
});

describe("ControlServer with binding cursors", () => {
  function server(bindings: BindingEvent[]): { server: ControlServer; cursors: BindingCursors } {
    const port = new FakeReplicaPort(7n);
    port.bindings = bindings;
    const cursors = new BindingCursors(new ManualClock(0), idsFrom(1n << 40n));
    const peering = { onPeerRequest: () => Promise.resolve(null), onUnpeerRequest: () => Promise.resolve(null), checkSnapshot: () => Promise.resolve(null), peerEndpoints: () => [], knows: () => true };
    const publisher = { origin: 7n, epoch: 1n, seq: 3, settled: () => Promise.resolve() };
    return { server: new ControlServer({ port, publisher, peering, bindingCursors: cursors }), cursors };
  }

  it("a requester that offers pages gets the snapshot with the first page and a cursor, then every other binding page by page", async () => {
    const all = Array.from({ length: 10 }, (_, i) => binding(i));
    const { server: s } = server(all);
    const head = decodeControlReply(await s.handle(encodeControlRequest({ type: "snapshot", from: 5n, pageBindings: 4 })));
    if (head.type !== "snapshot") throw new Error(head.type);
    expect(head.snapshot.bindings).toEqual(all.slice(0, 4));
    const cursor = head.snapshot.bindingCursor;
    expect(cursor).toBe(1n << 40n);
    const got: BindingEvent[] = [...head.snapshot.bindings];
    for (;;) {
      const r = decodeControlReply(await s.handle(encodeControlRequest({ type: "bindings", from: 5n, cursor: cursor ?? 0n, max: 4 })));
      if (r.type !== "bindings") throw new Error(r.type);
      expect(r.bindings.length).toBeLessThanOrEqual(4);
      got.push(...r.bindings);
      if (!r.more) break;
    }
    expect(got).toEqual(all);
    // The cursor ended with its last page.
    const after = decodeControlReply(await s.handle(encodeControlRequest({ type: "bindings", from: 5n, cursor: cursor ?? 0n, max: 4 })));
    expect(after).toMatchObject({ type: "error", message: expect.stringMatching(/unknown or expired/) as unknown });
  });

  it("a snapshot of at most a page of bindings carries them all and opens no cursor", async () => {
    const all = Array.from({ length: 4 }, (_, i) => binding(i));
    const { server: s, cursors } = server(all);
    const r = decodeControlReply(await s.handle(encodeControlRequest({ type: "snapshot", from: 5n, pageBindings: 4 })));
    if (r.type !== "snapshot") throw new Error(r.type);
    expect(r.snapshot.bindings).toEqual(all);
    expect(r.snapshot.bindingCursor).toBeUndefined();
    expect(cursors.size).toBe(0);
  });

  it("a requester of an earlier version (no bp) gets the whole snapshot, bindings included, and no cursor", async () => {
    const all = [binding(1), binding(2)];
    const { server: s, cursors } = server(all);
    const r = decodeControlReply(await s.handle(encodeControlRequest({ type: "snapshot", from: 5n })));
    if (r.type !== "snapshot") throw new Error(r.type);
    expect(r.snapshot.bindings).toEqual(all);
    expect(r.snapshot.bindingCursor).toBeUndefined();
    expect(cursors.size).toBe(0);
  });

  it("a page asked by another replica than the one the cursor was handed to is refused, and the cursor stays", async () => {
    const { server: s, cursors } = server([binding(1), binding(2), binding(3), binding(4), binding(5)]);
    const head = decodeControlReply(await s.handle(encodeControlRequest({ type: "snapshot", from: 5n, pageBindings: 4 })));
    if (head.type !== "snapshot") throw new Error(head.type);
    const r = decodeControlReply(await s.handle(encodeControlRequest({ type: "bindings", from: 6n, cursor: head.snapshot.bindingCursor ?? 0n, max: 4 })));
    expect(r).toMatchObject({ type: "error", message: expect.stringMatching(/not handed to 6/) as unknown });
    expect(cursors.size).toBe(1);
  });
});

describe("BindingCursors", () => {
  it("holds at most MAX_OPEN_BINDING_CURSORS, closing the least recently used first, and closes idle ones; both counted", () => {
    const clock = new ManualClock(0);
    const c = new BindingCursors(clock, idsFrom(1n));
    const walk = (): Iterator<BindingEvent, void, void> => [binding(1), binding(2)].values();
    const first = c.open(1n, walk());
    const second = c.open(1n, walk());
    for (let i = 2; i < MAX_OPEN_BINDING_CURSORS; i++) c.open(1n, walk());
    // A page moves `first` to the most recently used end: the next open sheds `second`.
    expect(c.page(1n, first, 1)).toEqual({ bindings: [binding(1)], more: true });
    c.open(1n, walk());
    expect(c.size).toBe(MAX_OPEN_BINDING_CURSORS);
    expect(c.stats.shed).toBe(1);
    expect(c.page(1n, second, 1)).toEqual({ refused: expect.stringMatching(/unknown or expired/) as unknown });
    expect(c.page(1n, first, 1)).toEqual({ bindings: [binding(2)], more: true });
    clock.advance(BINDING_CURSOR_IDLE_MS);
    expect(c.page(1n, first, 1)).toEqual({ refused: expect.stringMatching(/unknown or expired/) as unknown });
    expect(c.size).toBe(0);
    expect(c.stats.expired).toBe(MAX_OPEN_BINDING_CURSORS);
  });
});
