import { describe, expect, it } from "vitest";
import { makeService, storedBatch, tokens, worker } from "../../helpers/core-fixtures.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";

describe("service counters", () => {
  it("count failed selections, bookings and reservations", () => {
    const { svc } = makeService();
    kvmeshErrorOf(() => svc.select({ token_ids: tokens(2) }));
    expect(svc.stats.selectionErrors).toBe(1);
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(2), selection_id: "a" });
    kvmeshErrorOf(() => svc.selectAndReserve({ token_ids: tokens(2), selection_id: "a" }));
    kvmeshErrorOf(() => svc.createReservation({ selection_id: "never-selected", token_ids: tokens(2) }));
    expect(svc.stats.selectionErrors).toBe(3);
    expect(svc.stats.selections).toBe(1);
    expect(svc.stats.reservations).toBe(1);
  });

  it("count the prompt blocks selected and the blocks the chosen rank held: the router's hit ratio", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    // Worker 1 holds the first 3 blocks of a 5-block prompt.
    svc.applyKvEvents(1n, 0, storedBatch(tokens(3)));
    svc.select({ token_ids: tokens(5) });
    svc.select({ token_ids: tokens(2, 9) });
    expect(svc.stats.selectionPromptBlocks).toBe(7);
    expect(svc.stats.selectionOverlapBlocks).toBe(3);
  });

  it("are a live view that callers cannot write", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const stats = svc.stats;
    svc.select({ token_ids: tokens(2) });
    expect(stats.selections).toBe(1);
    expect(() => {
      (stats as { selections: number }).selections = 99;
    }).toThrow(TypeError);
    expect(svc.stats.selections).toBe(1);
    expect(JSON.parse(JSON.stringify(stats))).toMatchObject({ selections: 1, selectionErrors: 0, reservationsRefused: 0 });
    expect(Object.keys(stats)).toHaveLength(39);
  });
});
