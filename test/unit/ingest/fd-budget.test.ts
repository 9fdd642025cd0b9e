import { describe, expect, it } from "vitest";

import { DEFAULT_FD_RESERVE, FDS_PER_KV_RANK, fdReserve, kvRankBudget, processFdLimit } from "../../../src/ingest/fd-budget.js";

const limits = (soft: string): string => `Limit                     Soft Limit           Hard Limit           Units\nMax open files            ${soft}                20000                files\n`;

describe("the KV rank fd budget (#29 F1)", () => {
  it("reads the soft fd limit, and none where it is unlimited or unreadable", () => {
    expect(processFdLimit(() => limits("4096"))).toBe(4_096);
    expect(processFdLimit(() => limits("unlimited"))).toBeNull();
    expect(
      processFdLimit(() => {
        throw new Error("ENOENT");
      }),
    ).toBeNull();
  });

  it("keeps a reserve for HTTP and the mesh, a quarter of a small limit, and budgets the rest by FDS_PER_KV_RANK", () => {
    expect(fdReserve(20_000)).toBe(DEFAULT_FD_RESERVE);
    expect(fdReserve(1_024)).toBe(256);
    expect(kvRankBudget(20_000)).toBe(Math.floor((20_000 - DEFAULT_FD_RESERVE) / FDS_PER_KV_RANK));
    // 4 workers of 1,024 ranks (#29 F1) do not fit under 4,096 fds; they did under 20,000 until EMFILE.
    expect(kvRankBudget(4_096)).toBeLessThan(4 * 1_024);
    expect(kvRankBudget(null)).toBeNull();
    expect(kvRankBudget(8)).toBe(1);
  });
});
