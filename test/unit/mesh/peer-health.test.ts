import { describe, expect, it } from "vitest";

import { MeshOptionError } from "../../../mesh/errors.js";

import {
  bindingDigestTerm,
  bookingDigestTerm,
  DEFAULT_DOWN_AFTER_MS,
  DEFAULT_SUSPECT_AFTER_MS,
  formatDigest,
  PeerHealth,
  stateDigest,
} from "../../../mesh/peer-health.js";

const A = 1n;
const B = 2n;

describe("PeerHealth", () => {
  it("goes alive -> suspect -> down with silence, and back to alive on traffic", () => {
    const h = new PeerHealth();
    expect(h.observe(A, 0)).toEqual({ origin: A, from: null, to: "alive" });
    expect(h.tick(DEFAULT_SUSPECT_AFTER_MS - 1)).toEqual([]);
    expect(h.tick(DEFAULT_SUSPECT_AFTER_MS)).toEqual([{ origin: A, from: "alive", to: "suspect" }]);
    expect(h.tick(DEFAULT_SUSPECT_AFTER_MS + 1)).toEqual([]);
    expect(h.tick(DEFAULT_DOWN_AFTER_MS - 1)).toEqual([]);
    expect(h.tick(DEFAULT_DOWN_AFTER_MS)).toEqual([{ origin: A, from: "suspect", to: "down" }]);
    expect(h.tick(DEFAULT_DOWN_AFTER_MS * 5)).toEqual([]);
    expect(h.state(A)).toBe("down");
    expect(h.observe(A, 60_000)).toEqual({ origin: A, from: "down", to: "alive" });
    expect(h.observe(A, 60_001)).toBeNull();
    expect(h.tick(60_001)).toEqual([]);
  });

  it("reports a single alive -> down transition when ticks are sparse", () => {
    const h = new PeerHealth();
    h.observe(A, 0);
    expect(h.tick(DEFAULT_DOWN_AFTER_MS + 5)).toEqual([{ origin: A, from: "alive", to: "down" }]);
  });

  it("keeps peers independent and recovers a suspect peer", () => {
    const h = new PeerHealth({ suspectAfterMs: 100, downAfterMs: 300 });
    h.observe(A, 0);
    h.observe(B, 0);
    h.observe(B, 90);
    expect(h.tick(150)).toEqual([{ origin: A, from: "alive", to: "suspect" }]);
    expect(h.observe(A, 160)).toEqual({ origin: A, from: "suspect", to: "alive" });
    expect(h.tick(200)).toEqual([{ origin: B, from: "alive", to: "suspect" }]);
    expect(h.states()).toEqual(
      new Map([
        [A, "alive"],
        [B, "suspect"],
      ]),
    );
    expect(h.counts()).toEqual({ alive: 1, suspect: 1, down: 0 });
    expect(h.lastSeenMs(B)).toBe(90);
  });

  it("never moves lastSeen backwards on out-of-order observations", () => {
    const h = new PeerHealth({ suspectAfterMs: 100, downAfterMs: 300 });
    h.observe(A, 500);
    h.observe(A, 400);
    expect(h.lastSeenMs(A)).toBe(500);
    expect(h.tick(550)).toEqual([]);
  });

  it("forgets removed peers", () => {
    const h = new PeerHealth();
    h.observe(A, 0);
    expect(h.remove(A)).toBe(true);
    expect(h.remove(A)).toBe(false);
    expect(h.state(A)).toBeUndefined();
    expect(h.tick(DEFAULT_DOWN_AFTER_MS)).toEqual([]);
  });

  it("works with other keys, e.g. endpoints", () => {
    const h = new PeerHealth<string>();
    expect(h.observe("tcp://a:1", 0)?.to).toBe("alive");
    expect(h.tick(DEFAULT_SUSPECT_AFTER_MS)[0]?.origin).toBe("tcp://a:1");
  });

  it("rejects inconsistent thresholds", () => {
    expect(() => new PeerHealth({ suspectAfterMs: 0 })).toThrow(MeshOptionError);
    expect(() => new PeerHealth({ suspectAfterMs: 5_000, downAfterMs: 5_000 })).toThrow(MeshOptionError);
  });
});

describe("stateDigest", () => {
  const bindings = [
    { sessionId: "s1", sequence: 1n, writerId: 7n },
    { sessionId: "s2", sequence: (1n << 64n) - 1n, writerId: 8n },
  ];

  it("is order-independent and a fixed-width hex string", () => {
    const d1 = stateDigest(["a", "b", "c"], bindings);
    const d2 = stateDigest(new Set(["c", "a", "b"]), [...bindings].reverse());
    expect(d1).toBe(d2);
    expect(d1).toMatch(/^[0-9a-f]{16}$/);
    expect(stateDigest([], [])).toBe("0000000000000000");
  });

  it("changes when any item differs, is added or is duplicated", () => {
    const base = stateDigest(["a", "b"], bindings);
    expect(stateDigest(["a", "c"], bindings)).not.toBe(base);
    expect(stateDigest(["a", "b", "d"], bindings)).not.toBe(base);
    expect(stateDigest(["a", "b", "b"], bindings)).not.toBe(base);
    expect(stateDigest(["a", "b"], [bindings[0] as (typeof bindings)[0]])).not.toBe(base);
    expect(stateDigest(["a", "b"], [{ ...bindings[0], sessionId: "s1", sequence: 2n, writerId: 7n }, bindings[1] as (typeof bindings)[0]])).not.toBe(base);
    expect(stateDigest(["a", "b"], [{ sessionId: "s1", sequence: 1n, writerId: 9n }, bindings[1] as (typeof bindings)[0]])).not.toBe(base);
  });

  it("separates bookings from bindings with the same text", () => {
    expect(stateDigest(["s1\u00001\u00007"], [])).not.toBe(stateDigest([], [{ sessionId: "s1", sequence: 1n, writerId: 7n }]));
  });

  it("digests 100k bookings order-independently, equal to the running sum of their terms", () => {
    // Timing: scripts/bench-wire.ts.
    const ids = Array.from({ length: 100_000 }, (_, i) => `1234567:req-${i}`);
    const d = stateDigest(ids, []);
    expect(d).toMatch(/^[0-9a-f]{16}$/);
    expect(stateDigest([...ids].reverse(), [])).toBe(d);
    let sum = 0n;
    for (const id of ids) sum += bookingDigestTerm(id);
    expect(formatDigest(sum)).toBe(d);
    expect(formatDigest(sum - bookingDigestTerm("1234567:req-50000"))).not.toBe(d);
  });
});

describe("running digest", () => {
  it("matches stateDigest when terms are added and subtracted as state changes", () => {
    let sum = 0n;
    for (const id of ["a", "b", "c"]) sum += bookingDigestTerm(id);
    sum += bindingDigestTerm({ sessionId: "s1", sequence: 1n, writerId: 7n });
    sum -= bookingDigestTerm("a");
    sum -= bookingDigestTerm("b");
    sum -= bookingDigestTerm("c");
    sum -= bookingDigestTerm("d"); // negative intermediate sums are fine
    sum += bookingDigestTerm("d");
    sum += bookingDigestTerm("b");
    expect(formatDigest(sum)).toBe(stateDigest(["b"], [{ sessionId: "s1", sequence: 1n, writerId: 7n }]));
  });
});
