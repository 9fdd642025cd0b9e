import { describe, it, expect } from "vitest";
import {
  DEFAULT_PENDING_MAX_BYTES,
  DEFAULT_PENDING_MAX_ENTRIES,
  DEFAULT_PENDING_TTL_MS,
  PendingSelections,
} from "../../../src/core/pending-selections.js";
import { ManualClock } from "../../../src/core/time.js";
import { KvmeshError } from "../../../src/core/errors.js";

function make(overrides: { ttlMs?: number; maxEntries?: number; maxBytes?: number; largeEntryBytes?: number; maxLargeBytes?: number } = {}, clock = new ManualClock(0)) {
  return new PendingSelections<string>({ clock, ...overrides });
}

describe("PendingSelections", () => {
  it("uses the reference defaults", () => {
    const cache = make();
    expect(cache.ttlMs).toBe(DEFAULT_PENDING_TTL_MS);
    expect(cache.maxEntries).toBe(DEFAULT_PENDING_MAX_ENTRIES);
    expect(cache.maxBytes).toBe(DEFAULT_PENDING_MAX_BYTES);
    expect([DEFAULT_PENDING_TTL_MS, DEFAULT_PENDING_MAX_ENTRIES, DEFAULT_PENDING_MAX_BYTES]).toEqual([120_000, 4_096, 256 * 1024 * 1024]);
    expect(() => make({ maxEntries: 0 })).toThrow(KvmeshError);
    expect(() => cache.insert("p", "x", "v", -1)).toThrow(KvmeshError);
  });

  it("peek then remove consumes once", () => {
    const cache = make();
    const generation = cache.insert("p", "sel", "value", 100);
    expect(cache.peek("p", "sel")).toEqual({ value: "value", generation });
    expect(cache.peek("p", "sel")).toEqual({ value: "value", generation });
    expect(cache.remove("p", "sel", generation)).toBe(true);
    expect(cache.peek("p", "sel")).toBeUndefined();
    expect(cache.remove("p", "sel", generation)).toBe(false);
    expect(cache.remove("p", "sel")).toBe(false);
    expect(cache.size).toBe(0);
    expect(cache.bytes).toBe(0);
  });

  it("keys by partition and selection id without collisions", () => {
    const cache = make();
    cache.insert("ab", "c", "first", 1);
    cache.insert("a", "bc", "second", 1);
    expect(cache.peek("ab", "c")?.value).toBe("first");
    expect(cache.peek("a", "bc")?.value).toBe("second");
    expect(cache.peek("other", "c")).toBeUndefined();
    expect(cache.size).toBe(2);
  });

  it("peek refuses an expired entry", () => {
    const clock = new ManualClock(0);
    const cache = make({ ttlMs: 1_000 }, clock);
    cache.insert("p", "sel", "v", 10);
    clock.advance(999);
    expect(cache.peek("p", "sel")?.value).toBe("v");
    clock.advance(1);
    expect(cache.peek("p", "sel")).toBeUndefined();
    expect(cache.size).toBe(0);
    expect(cache.bytes).toBe(0);
    expect(cache.evictions).toBe(0);
  });

  it("insert sweeps expired entries", () => {
    const clock = new ManualClock(0);
    const cache = make({ ttlMs: 1_000 }, clock);
    cache.insert("p", "a", "a", 10);
    clock.advance(500);
    cache.insert("p", "b", "b", 20);
    clock.advance(600);
    cache.insert("p", "c", "c", 30);
    expect(cache.size).toBe(2);
    expect(cache.bytes).toBe(50);
    clock.advance(500);
    expect(cache.sweep()).toBe(1);
    expect(cache.peek("p", "c")?.value).toBe("c");
    expect(cache.evictions).toBe(0);
  });

  it("the entry cap evicts the oldest first", () => {
    const cache = make({ maxEntries: 3 });
    for (const id of ["a", "b", "c", "d", "e"]) cache.insert("p", id, id, 1);
    expect(cache.size).toBe(3);
    expect(cache.evictions).toBe(2);
    expect(cache.peek("p", "a")).toBeUndefined();
    expect(cache.peek("p", "b")).toBeUndefined();
    expect(cache.peek("p", "c")?.value).toBe("c");
  });

  it("a re-inserted key moves to the back of the eviction order", () => {
    const cache = make({ maxEntries: 2 });
    cache.insert("p", "a", "a1", 1);
    cache.insert("p", "b", "b", 1);
    cache.insert("p", "a", "a2", 1);
    cache.insert("p", "c", "c", 1);
    expect(cache.peek("p", "b")).toBeUndefined();
    expect(cache.peek("p", "a")?.value).toBe("a2");
    expect(cache.evictions).toBe(1);
  });

  it("the byte budget evicts the oldest first but keeps an oversized newest entry", () => {
    // No entry counts as large here (see the next test for those).
    const cache = make({ maxBytes: 100, largeEntryBytes: 1_000 });
    cache.insert("p", "a", "a", 40);
    cache.insert("p", "b", "b", 40);
    cache.insert("p", "c", "c", 40);
    expect(cache.peek("p", "a")).toBeUndefined();
    expect(cache.bytes).toBe(80);
    expect(cache.evictions).toBe(1);
    cache.insert("p", "huge", "h", 500);
    expect(cache.size).toBe(1);
    expect(cache.peek("p", "huge")?.value).toBe("h");
    expect(cache.bytes).toBe(500);
    expect(cache.evictions).toBe(3);
  });

  it("large entries evict each other past their budget, not the other callers' entries (F7)", () => {
    // Defaults: large above 1 MiB, 64 MiB for all of them, inside the 256 MiB budget.
    const d = make();
    expect([d.largeEntryBytes, d.maxLargeBytes]).toEqual([1024 * 1024, 64 * 1024 * 1024]);
    // Budget 1,000 bytes; entries over 100 bytes are large and share 500 of them.
    const cache = make({ maxBytes: 1_000, largeEntryBytes: 100, maxLargeBytes: 500 });
    for (const id of ["a", "b", "c"]) cache.insert("p", id, id, 50);
    // One caller's flood of big prompts (as 2M-token selects were): 20 x 240 bytes = 4,800.
    for (let i = 0; i < 20; i++) cache.insert("p", `big${i}`, "big", 240);
    for (const id of ["a", "b", "c"]) expect(cache.peek("p", id)?.value).toBe(id);
    // Only the newest two big ones fit the large budget (2 x 240 <= 500).
    expect(cache.peek("p", "big17")).toBeUndefined();
    expect([cache.peek("p", "big18")?.value, cache.peek("p", "big19")?.value]).toEqual(["big", "big"]);
    expect(cache.largeBytes).toBe(480);
    expect(cache.bytes).toBe(630);
    expect(cache.largeEvictions).toBe(18);
    expect(cache.evictions).toBe(18);
    // Removing and expiring keep the large accounting exact.
    expect(cache.remove("p", "big18")).toBe(true);
    expect(cache.largeBytes).toBe(240);
    // A small entry past the whole budget still evicts the oldest of any kind.
    const small = make({ maxBytes: 300, largeEntryBytes: 100, maxLargeBytes: 250 });
    small.insert("p", "L", "L", 200);
    small.insert("p", "s1", "s1", 90);
    small.insert("p", "s2", "s2", 90);
    expect(small.peek("p", "L")).toBeUndefined();
    expect(small.largeBytes).toBe(0);
    expect([small.evictions, small.largeEvictions]).toEqual([1, 0]);
  });

  it("a re-insert replaces the byte count of the previous value", () => {
    const cache = make();
    cache.insert("p", "a", "a", 40);
    cache.insert("p", "a", "a", 10);
    expect(cache.bytes).toBe(10);
    expect(cache.size).toBe(1);
  });

  it("remove yields to a newer selection for the same id", () => {
    const cache = make();
    const older = cache.insert("p", "sel", "old", 1);
    const newer = cache.insert("p", "sel", "new", 1);
    expect(newer).toBeGreaterThan(older);
    expect(cache.remove("p", "sel", older)).toBe(false);
    expect(cache.peek("p", "sel")).toEqual({ value: "new", generation: newer });
    expect(cache.remove("p", "sel", newer)).toBe(true);
    expect(cache.size).toBe(0);
  });

  it("stays bounded by live entries under a pinned front", () => {
    const clock = new ManualClock(0);
    const cache = make({ ttlMs: 1_000_000, maxEntries: 8 }, clock);
    cache.insert("p", "pinned", "front", 5);
    for (let i = 0; i < 10_000; i++) {
      clock.advance(1);
      const g = cache.insert("p", `churn-${i % 3}`, "x", 7);
      cache.insert("p", "same", "y", 3);
      if (i % 2 === 0) cache.remove("p", `churn-${i % 3}`, g);
    }
    expect(cache.size).toBeLessThanOrEqual(5);
    expect(cache.peek("p", "pinned")?.value).toBe("front");
    expect(cache.evictions).toBe(0);
    expect(cache.bytes).toBe(5 + 3 + 7 * (cache.size - 2));
  });
});
