import { describe, expect, it } from "vitest";

import { DEFAULT_MAX_CONNECTIONS_NO_FD_LIMIT, defaultMaxConnections, FDS_PER_KV_RANK, fdReserve, kvRankBudget, processFdLimit } from "../../../src/util/fd-budget.js";

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

  it("keeps a quarter of the limit for HTTP and the mesh, and budgets the rest by FDS_PER_KV_RANK", () => {
    expect(fdReserve(20_000)).toBe(5_000);
    expect(fdReserve(1_024)).toBe(256);
    expect(kvRankBudget(20_000)).toBe(Math.floor(15_000 / FDS_PER_KV_RANK));
    // 4 workers of 1,024 ranks (#29 F1) do not fit under 4,096 fds; they did under 20,000 until EMFILE.
    expect(kvRankBudget(4_096)).toBeLessThan(4 * 1_024);
    expect(kvRankBudget(null)).toBeNull();
    expect(kvRankBudget(8)).toBe(1);
  });

  it("gives HTTP connections half the reserve by default (#29 G10)", () => {
    expect(defaultMaxConnections(20_000)).toBe(2_500);
    // 1,200 idle sockets under a 1,024-fd limit reset new clients: the default stays well below.
    expect(defaultMaxConnections(1_024)).toBe(128);
    expect(defaultMaxConnections(null)).toBe(DEFAULT_MAX_CONNECTIONS_NO_FD_LIMIT);
    expect(defaultMaxConnections(10)).toBe(16);
  });
});
