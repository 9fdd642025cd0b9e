import { InvalidArgumentError } from "commander";
import { describe, expect, it } from "vitest";
import { errorMessageOf, prettyJson, resolveUrl } from "../../../cli/http-client.js";
import {
  envNameFor,
  integerInRange,
  parseBoolean,
  parseEndpointMap,
  parseHttpUrl,
  parseAdvertiseHost,
  parseNonNegativeNumber,
  parseNonZeroPort,
  parsePeerEndpointArg,
  parsePeerList,
  parseTokenIds,
  parseU64,
} from "../../../cli/parsers.js";

const rejects = (fn: () => unknown, message: string): void => {
  expect(fn).toThrow(InvalidArgumentError);
  expect(fn).toThrow(message);
};

describe("cli parsers", () => {
  it("derives env names from long flags", () => {
    expect(envNameFor("--port")).toBe("KVMESH_PORT");
    expect(envNameFor("--router-track-prefill-tokens")).toBe("KVMESH_ROUTER_TRACK_PREFILL_TOKENS");
  });

  it("accepts integers only inside the range, in plain decimal", () => {
    const p = integerInRange(1, 10);
    expect(p("1")).toBe(1);
    expect(p("10")).toBe(10);
    for (const bad of ["0", "11", "", " 5", "5 ", "1e1", "0x5", "5.0", "-3", "+5"]) rejects(() => p(bad), "must be an integer in [1, 10]");
  });

  it("accepts non-negative finite decimals for selector weights", () => {
    expect(parseNonNegativeNumber("0")).toBe(0);
    expect(parseNonNegativeNumber("0.75")).toBe(0.75);
    expect(parseNonNegativeNumber(".5")).toBe(0.5);
    expect(parseNonNegativeNumber("1e-3")).toBe(0.001);
    for (const bad of ["", " ", "-0.1", "Infinity", "NaN", "1e400", "abc", "0x1"]) rejects(() => parseNonNegativeNumber(bad), "must be a finite number >= 0");
  });

  it("parses booleans strictly", () => {
    expect(["true", "1", "YES", "on"].map(parseBoolean)).toEqual([true, true, true, true]);
    expect(["false", "0", "no", "Off"].map(parseBoolean)).toEqual([false, false, false, false]);
    rejects(() => parseBoolean(""), "must be true or false");
    rejects(() => parseBoolean("maybe"), "must be true or false");
  });

  it("keeps u64 ids exact up to 2^64-1", () => {
    expect(parseU64("0")).toBe(0n);
    expect(parseU64("9007199254740993")).toBe(9_007_199_254_740_993n);
    expect(parseU64("18446744073709551615")).toBe(18_446_744_073_709_551_615n);
    for (const bad of ["18446744073709551616", "-1", "1.0", "", "0x10", "100000000000000000000"]) rejects(() => parseU64(bad), "unsigned 64-bit");
  });

  it("parses token lists with commas, whitespace or JSON brackets", () => {
    expect(parseTokenIds("1,2,3")).toEqual([1, 2, 3]);
    expect(parseTokenIds(" [1, 2,\n3]\n")).toEqual([1, 2, 3]);
    expect(parseTokenIds("4294967295")).toEqual([4_294_967_295]);
    rejects(() => parseTokenIds(""), "needs at least one token id");
    rejects(() => parseTokenIds("[]"), "needs at least one token id");
    rejects(() => parseTokenIds("1,-2"), 'token #2 "-2"');
  });

  it("parses rank=endpoint maps", () => {
    expect(parseEndpointMap("0=tcp://h:1, 07=ipc:///tmp/kv")).toEqual({ "0": "tcp://h:1", "7": "ipc:///tmp/kv" });
    rejects(() => parseEndpointMap("tcp://h:1"), "is not rank=endpoint");
    rejects(() => parseEndpointMap("0=tcp://h"), "is not a ZeroMQ endpoint");
    rejects(() => parseEndpointMap("1=tcp://h:1,01=tcp://h:2"), "dp rank 1 is given twice");
  });

  it("accepts only http(s) base URLs", () => {
    expect(parseHttpUrl("http://127.0.0.1:8092").href).toBe("http://127.0.0.1:8092/");
    rejects(() => parseHttpUrl("127.0.0.1:8092"), "is not a URL");
    rejects(() => parseHttpUrl("tcp://h:1"), "is not an http(s) URL");
    rejects(() => parseHttpUrl("http://h/?x=1"), "must not have a query");
  });
});

describe("cli replica mesh parsers", () => {
  it("accepts only non-zero ports for the replica mesh (reference: parses_only_nonzero_ports)", () => {
    expect(parseNonZeroPort("1")).toBe(1);
    expect(parseNonZeroPort("65535")).toBe(65_535);
    for (const bad of ["0", "00", "65536", "-1", "", "7100.0"]) rejects(() => parseNonZeroPort(bad), "must be an integer in [1, 65535]");
  });

  it("canonicalises a peer endpoint and turns the mesh's error into a usage error", () => {
    expect(parsePeerEndpointArg(" tcp://Node-1.Example.:07100 ")).toBe("tcp://node-1.example:7100");
    expect(parsePeerEndpointArg("tcp://[0:0:0:0:0:0:0:1]:7100")).toBe("tcp://[::1]:7100");
    expect(parsePeerEndpointArg("ipc:///tmp/kvmesh.sock")).toBe("ipc:///tmp/kvmesh.sock");
    rejects(() => parsePeerEndpointArg("tcp://h"), 'endpoint "tcp://h": missing port');
    rejects(() => parsePeerEndpointArg("tcp://::1:7100"), "IPv6 addresses must be bracketed");
    rejects(() => parsePeerEndpointArg("h:7100"), "expected tcp://host:port");
    rejects(() => parsePeerEndpointArg("tcp://h:*"), "wildcard port is only valid for a bind");
  });

  it("parses a peer list into canonical, de-duplicated endpoints in first-seen order", () => {
    expect(parsePeerList("tcp://b:2, tcp://A:1,tcp://B:02,tcp://a:1")).toEqual(["tcp://b:2", "tcp://a:1"]);
    expect(parsePeerList("")).toEqual([]);
    expect(parsePeerList("  ")).toEqual([]);
    rejects(() => parsePeerList(","), "peer #1 is empty");
    rejects(() => parsePeerList("tcp://a:1,,tcp://b:2"), "peer #2 is empty (stray comma?)");
    rejects(() => parsePeerList("tcp://a:1,tcp://b:99999"), 'endpoint "tcp://b:99999": port must be in 1-65535');
  });

  it("accepts advertise hosts peers can dial, IPv6 bracketed", () => {
    expect(parseAdvertiseHost("10.0.0.5")).toBe("10.0.0.5");
    expect(parseAdvertiseHost("Node-1.example")).toBe("node-1.example");
    expect(parseAdvertiseHost("fe80:0::1")).toBe("[fe80::1]");
    expect(parseAdvertiseHost("[::1]")).toBe("[::1]");
    for (const bad of ["", "*", "node:1", "tcp://node", "300.1.1.1", "bad_name"]) rejects(() => parseAdvertiseHost(bad), "must be a hostname or an IP address");
    for (const wild of ["0.0.0.0", "::", "[0::0]"]) rejects(() => parseAdvertiseHost(wild), "not a wildcard");
  });
});

describe("cli http helpers", () => {
  it("pretty-prints bigints as bare integers", () => {
    expect(prettyJson({ a: 18_446_744_073_709_551_615n, b: [], c: {}, d: [1, "x"], e: undefined })).toBe(
      '{\n  "a": 18446744073709551615,\n  "b": [],\n  "c": {},\n  "d": [\n    1,\n    "x"\n  ]\n}',
    );
  });

  it("joins paths under a base path and adds only set query parameters", () => {
    expect(resolveUrl(new URL("http://h:1/api//"), "/workers", { a: "x y", b: undefined }).href).toBe("http://h:1/api/workers?a=x+y");
    expect(resolveUrl(new URL("http://h:1"), "/select").href).toBe("http://h:1/select");
  });

  it("builds the error line from the body's error field, else its text, else the status", () => {
    expect(errorMessageOf({ status: 409, ok: false, body: { error: "selection_id s is already live" }, text: "" })).toBe("409 selection_id s is already live");
    expect(errorMessageOf({ status: 500, ok: false, body: "oops", text: " oops\n" })).toBe("500 oops");
    expect(errorMessageOf({ status: 500, ok: false, body: null, text: "" })).toBe("500");
  });
});
