import { describe, expect, it } from "vitest";

import {
  bindEndpointFor,
  controlEndpointFor,
  isIpv6Endpoint,
  parseBindEndpoint,
  parsePeerEndpoint,
} from "../../../mesh/endpoints.js";
import { KvmeshError } from "../../../src/core/index.js";

function expectBad(f: () => unknown, fragment: string): void {
  try {
    f();
  } catch (err) {
    expect(err).toBeInstanceOf(KvmeshError);
    const e = err as KvmeshError;
    expect(e.code).toBe("KVMESH_BAD_REQUEST");
    expect(e.message).toContain("endpoint");
    expect(e.message).toContain(fragment);
    expect(e.details).toEqual({ field: "endpoint" });
    return;
  }
  throw new Error("expected a KVMESH_BAD_REQUEST");
}

describe("parsePeerEndpoint", () => {
  it.each([
    ["tcp://127.0.0.1:7100", "tcp://127.0.0.1:7100"],
    ["  tcp://10.0.0.5:1  ", "tcp://10.0.0.5:1"],
    ["TCP://Replica-0.Mesh.svc:07100", "tcp://replica-0.mesh.svc:7100"],
    ["tcp://host.example.:65535", "tcp://host.example:65535"],
    ["tcp://[::1]:7100", "tcp://[::1]:7100"],
    ["tcp://[0:0:0:0:0:0:0:1]:7100", "tcp://[::1]:7100"],
    ["tcp://[FE80::A]:7100", "tcp://[fe80::a]:7100"],
    ["ipc:///tmp/kvmesh/a.pub", "ipc:///tmp/kvmesh/a.pub"],
    ["ipc://@abstract-name", "ipc://@abstract-name"],
    ["inproc://replica-a", "inproc://replica-a"],
  ])("canonicalises %s", (input, expected) => {
    expect(parsePeerEndpoint(input)).toBe(expected);
  });

  it.each([
    ["", "expected tcp://host:port"],
    ["127.0.0.1:7100", "expected tcp://host:port"],
    ["udp://1.2.3.4:5", "unsupported transport"],
    ["tcp://1.2.3.4", "missing port"],
    ["tcp://[::1]", "missing port"],
    ["tcp://:7100", "missing host"],
    ["tcp://1.2.3.4:0", "port must be in 1-65535"],
    ["tcp://1.2.3.4:65536", "port must be in 1-65535"],
    ["tcp://1.2.3.4:-1", "decimal"],
    ["tcp://1.2.3.4:7100x", "decimal"],
    ["tcp://1.2.3.4:", "decimal"],
    ["tcp://256.1.1.1:7100", "IPv4"],
    ["tcp://1.2.3:7100", "IPv4"],
    ["tcp://::1:7100", "must be bracketed"],
    ["tcp://[::1:7100", "unterminated"],
    ["tcp://[nothex::1]:7100", "IPv6"],
    ["tcp://under_score:7100", "hostname"],
    ["tcp://-lead.example:7100", "hostname"],
    [`tcp://${"a".repeat(64)}.example:7100`, "hostname"],
    ["tcp://eth0;1.2.3.4:7100", "expected tcp://host:port"],
    ["tcp://*:7100", "wildcard host is only valid for a bind"],
    ["tcp://1.2.3.4:*", "wildcard port is only valid for a bind"],
    ["ipc://", "missing ipc path"],
    ["ipc://*", "wildcard ipc path"],
    [`ipc:///${"p".repeat(120)}`, "longer than 107 bytes"],
    ["inproc://", "missing inproc name"],
  ])("rejects %j", (input, fragment) => {
    expectBad(() => parsePeerEndpoint(input), fragment);
  });
});

describe("parseBindEndpoint and bindEndpointFor", () => {
  it("accept wildcards that peers may not use", () => {
    expect(parseBindEndpoint("tcp://*:7100")).toBe("tcp://*:7100");
    expect(parseBindEndpoint("tcp://127.0.0.1:*")).toBe("tcp://127.0.0.1:*");
    expect(parseBindEndpoint("ipc://*")).toBe("ipc://*");
    expectBad(() => parseBindEndpoint("tcp://*:0"), "port must be in");
  });

  it("builds bind endpoints, bracketing bare IPv6 hosts", () => {
    expect(bindEndpointFor("0.0.0.0", 7100)).toBe("tcp://0.0.0.0:7100");
    expect(bindEndpointFor("*", 7100)).toBe("tcp://*:7100");
    expect(bindEndpointFor("127.0.0.1", "*")).toBe("tcp://127.0.0.1:*");
    expect(bindEndpointFor("::", 7100)).toBe("tcp://[::]:7100");
    expect(bindEndpointFor("[::1]", 7100)).toBe("tcp://[::1]:7100");
    expectBad(() => bindEndpointFor("0.0.0.0", 70_000), "port must be in");
    expectBad(() => bindEndpointFor("0.0.0.0", 71.5), "decimal");
  });

  it("detects bracketed IPv6 endpoints only", () => {
    expect(isIpv6Endpoint("tcp://[::1]:7100")).toBe(true);
    expect(isIpv6Endpoint("tcp://localhost:7100")).toBe(false);
    expect(isIpv6Endpoint("ipc:///tmp/x")).toBe(false);
  });
});

describe("controlEndpointFor", () => {
  it.each([
    ["tcp://h:7100", "tcp://h:7101"],
    ["tcp://[::1]:7100", "tcp://[::1]:7101"],
    ["tcp://*:7100", "tcp://*:7101"],
    ["tcp://127.0.0.1:*", "tcp://127.0.0.1:*"],
    ["ipc:///tmp/a.pub", "ipc:///tmp/a.pub.ctl"],
    ["ipc://*", "ipc://*"],
    ["inproc://a", "inproc://a.ctl"],
  ])("%s -> %s", (input, expected) => {
    expect(controlEndpointFor(input)).toBe(expected);
  });

  it("rejects a publish port with no room after it, and an ipc path that would get too long", () => {
    expectBad(() => controlEndpointFor("tcp://h:65535"), "no room for the control port");
    expectBad(() => controlEndpointFor(`ipc:///${"p".repeat(104)}`), "control path");
  });
});
