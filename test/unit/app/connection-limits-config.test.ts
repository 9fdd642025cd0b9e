/** #29 G10: --max-connections and --max-connections-per-client, checked in the one config place. */
import { describe, expect, it } from "vitest";

import { configErrorField, connectionLimitsOf, DEFAULT_DAEMON_CONFIG, resolveDaemonConfig } from "../../../src/app/config.js";
import { defaultMaxConnections } from "../../../src/util/fd-budget.js";

const refusal = (input: Parameters<typeof resolveDaemonConfig>[0]): unknown => {
  try {
    resolveDaemonConfig(input);
  } catch (err) {
    return configErrorField(err);
  }
  return undefined;
};

describe("HTTP connection caps (#29 G10)", () => {
  it("derive from the fd limit unless set, the per-client cap half the total", () => {
    expect(connectionLimitsOf(DEFAULT_DAEMON_CONFIG, 20_000)).toEqual({ max: defaultMaxConnections(20_000), perClient: defaultMaxConnections(20_000) / 2 });
    expect(connectionLimitsOf({ ...DEFAULT_DAEMON_CONFIG, maxConnections: 10 }, 20_000)).toEqual({ max: 10, perClient: 5 });
    expect(connectionLimitsOf({ ...DEFAULT_DAEMON_CONFIG, maxConnections: 1 }, null)).toEqual({ max: 1, perClient: 1 });
    expect(connectionLimitsOf({ ...DEFAULT_DAEMON_CONFIG, maxConnectionsPerClient: 7 }, null).perClient).toBe(7);
  });

  it("refuse a cap that is not a positive integer, or a per-client cap above the total, naming the field", () => {
    expect(refusal({ maxConnections: 0 })).toBe("maxConnections");
    expect(refusal({ maxConnectionsPerClient: 2.5 })).toBe("maxConnectionsPerClient");
    expect(refusal({ maxConnections: 4, maxConnectionsPerClient: 5 })).toBe("maxConnectionsPerClient");
    expect(refusal({ maxConnections: 4, maxConnectionsPerClient: 4 })).toBeUndefined();
  });
});
