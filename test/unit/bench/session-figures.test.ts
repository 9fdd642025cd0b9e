import { describe, expect, it } from "vitest";

import { stickiness } from "../../../scripts/lib/session-figures.js";

describe("stickiness", () => {
  it("counts the turns of multi-turn sessions that stayed on the first turn's worker", () => {
    const rec = (sessionSerial: number, turn: number, worker: number): { sessionSerial: number; turn: number; worker: number } => ({ sessionSerial, turn, worker });
    // Session 1 stays on 7 (3 turns, recorded out of order); session 2 moves once (2 of 3);
    // session 3 has one turn and does not count.
    const s = stickiness([rec(1, 2, 7), rec(1, 0, 7), rec(2, 0, 4), rec(1, 1, 7), rec(2, 1, 5), rec(2, 2, 4), rec(3, 0, 9)]);
    expect(s).toEqual({ multiTurnSessions: 2, turnShareOnFirstWorker: 5 / 6, sessionsThatMoved: 1 });
    expect(Number.isNaN(stickiness([rec(1, 0, 1)]).turnShareOnFirstWorker)).toBe(true);
  });
});
