import { describe, expect, it } from "vitest";

import { parsePinLayout, PIN_LAYOUTS, tasksetPrefix } from "../../../src/bench/cpu-pin.js";

const ROLES = ["peer", "joiner", "client"];

describe("CPU pinning layouts (bench:warm-join --pin)", () => {
  it("reads none, a named layout and role=cpus lists", () => {
    expect(parsePinLayout("none", ROLES, 2).size).toBe(0);
    expect(Object.fromEntries(parsePinLayout("peer-alone", ROLES, 2))).toEqual(PIN_LAYOUTS["peer-alone"]);
    expect(Object.fromEntries(parsePinLayout("peer=0, joiner=1-3", ROLES, 4))).toEqual({ peer: "0", joiner: "1-3" });
  });

  it("refuses an unknown role, a repeated one, a malformed CPU list and CPUs the host does not have, naming them", () => {
    expect(() => parsePinLayout("server=0", ROLES, 2)).toThrow(/server.*peer, joiner, client/);
    expect(() => parsePinLayout("peer=0,peer=1", ROLES, 2)).toThrow(/peer is named twice/);
    expect(() => parsePinLayout("peer=a", ROLES, 2)).toThrow(/peer=a/);
    expect(() => parsePinLayout("peer=1-0", ROLES, 2)).toThrow(/peer=1-0/);
    expect(() => parsePinLayout("peer", ROLES, 2)).toThrow(/role=cpus/);
    expect(() => parsePinLayout("peer=2", ROLES, 2)).toThrow(/CPUs 0-1/);
    expect(() => parsePinLayout("peer-alone", ROLES, 1)).toThrow(/CPUs 0-0/);
  });

  it("starts a pinned process under taskset, an unpinned one as it is", () => {
    expect(tasksetPrefix("1")).toEqual(["taskset", "-c", "1"]);
    expect(tasksetPrefix(undefined)).toEqual([]);
  });
});
