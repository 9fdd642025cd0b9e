import type { FetchFn } from "../../../cli/http-client.js";
import { renderPeersTable } from "../../../cli/peers.js";
import { buildCli } from "../../../cli/program.js";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { parseJson } from "../../../src/http/json.js";
import { refusedUrl, runCli, startRecordingServer, type RecordingServer, type RunResult, type Seen } from "../../helpers/cli-harness.js";

let srv: RecordingServer;
let baseUrl: string;
let seen: Seen[];

beforeAll(async () => {
  srv = await startRecordingServer();
  baseUrl = srv.baseUrl;
  seen = srv.seen;
});

afterAll(() => srv.close());

afterEach(() => {
  seen.length = 0;
  srv.reply = { status: 200, body: "{}" };
  vi.unstubAllEnvs();
});

const cli = (args: readonly string[], fetch?: FetchFn): Promise<RunResult> => runCli(args, fetch);

const peers = (...args: string[]): Promise<RunResult> => cli(["peers", ...args, "--admin", baseUrl]);

const DISABLED = '{"error":"replica sync is disabled","code":"KVMESH_REPLICA_SYNC_DISABLED"}';

describe("kvmesh peers add", () => {
  it("POSTs the canonical endpoint and prints `added` on 201", async () => {
    srv.reply = { status: 201, body: '{"status":"ok","endpoint":"tcp://b.example:7100","added":true}' };
    const r = await peers("add", "tcp://B.Example:07100");
    expect(r).toEqual({ code: 0, out: "added tcp://b.example:7100\n", err: "" });
    expect(seen).toEqual([{ method: "POST", url: "/replica_sync/register_peer", contentType: "application/json", body: '{"endpoint":"tcp://b.example:7100"}' }]);
  });

  it("prints `already present` on 200", async () => {
    srv.reply = { status: 200, body: '{"status":"ok","endpoint":"tcp://b:7100","added":false}' };
    expect(await peers("add", "tcp://b:7100")).toEqual({ code: 0, out: "already present tcp://b:7100\n", err: "" });
  });

  it("prints the endpoint the daemon stored, or ours when the answer has none", async () => {
    srv.reply = { status: 201, body: '{"endpoint":"tcp://[::1]:7100"}' };
    expect((await peers("add", "tcp://[0::1]:7100")).out).toBe("added tcp://[::1]:7100\n");
    srv.reply = { status: 201, body: "" };
    expect((await peers("add", "tcp://[0::1]:7100")).out).toBe("added tcp://[::1]:7100\n");
    expect(seen.map((s) => s.body)).toEqual(['{"endpoint":"tcp://[::1]:7100"}', '{"endpoint":"tcp://[::1]:7100"}']);
  });

  it("exits 1 with `409 replica sync is disabled` when the mesh is off, whatever the body", async () => {
    for (const body of [DISABLED, ""]) {
      srv.reply = { status: 409, body };
      const r = await peers("add", "tcp://b:7100");
      expect(r.code).toBe(1);
      expect(r.out).toBe("");
      expect(r.err).toMatch(/^error: 409 replica sync is disabled \(start the daemon with --replica-sync-port\)\n$/);
    }
  });

  it("reports other daemon errors with their message", async () => {
    srv.reply = { status: 400, body: '{"error":"endpoint must be a string","code":"KVMESH_BAD_REQUEST"}' };
    expect(await peers("add", "tcp://b:7100")).toEqual({ code: 1, out: "", err: "error: 400 endpoint must be a string\n" });
  });

  const usage: readonly [string[], string][] = [
    [["tcp://b"], `error: command-argument value 'tcp://b' is invalid for argument 'endpoint'. endpoint "tcp://b": missing port`],
    [["b:7100"], "expected tcp://host:port"],
    [["tcp://b:0"], "port must be in 1-65535"],
    [["tcp://*:7100"], "wildcard host is only valid for a bind"],
    [[], "error: missing required argument 'endpoint'"],
  ];
  for (const [args, message] of usage) {
    it(`rejects add ${args.join(" ") || "without an endpoint"} before calling the daemon`, async () => {
      const r = await peers("add", ...args);
      expect(r.code).toBe(1);
      expect(r.err).toContain(message);
      expect(seen).toEqual([]);
    });
  }
});

describe("kvmesh peers remove", () => {
  it("POSTs /replica_sync/deregister_peer and prints `removed`", async () => {
    srv.reply = { status: 200, body: '{"status":"ok","endpoint":"tcp://b:7100","removed":true}' };
    const r = await peers("remove", "tcp://B:7100");
    expect(r).toEqual({ code: 0, out: "removed tcp://b:7100\n", err: "" });
    expect(seen).toEqual([{ method: "POST", url: "/replica_sync/deregister_peer", contentType: "application/json", body: '{"endpoint":"tcp://b:7100"}' }]);
  });

  it("exits 1 with `peer not found` on 404", async () => {
    srv.reply = { status: 404, body: '{"error":"peer not found","code":"KVMESH_PEER_NOT_FOUND"}' };
    expect(await peers("remove", "tcp://b:7100")).toEqual({ code: 1, out: "", err: "error: 404 peer not found: tcp://b:7100\n" });
  });

  it("exits 1 on 409 when the mesh is off", async () => {
    srv.reply = { status: 409, body: DISABLED };
    const r = await peers("remove", "tcp://b:7100");
    expect(r.code).toBe(1);
    expect(r.err).toContain("error: 409 replica sync is disabled");
  });

  it("rejects a bad endpoint before calling the daemon", async () => {
    const r = await peers("remove", "udp://b:7100");
    expect(r.code).toBe(1);
    expect(r.err).toContain(`argument 'endpoint'. endpoint "udp://b:7100": unsupported transport "udp"`);
    expect(seen).toEqual([]);
  });
});

describe("kvmesh peers list", () => {
  const U64_MAX = "18446744073709551615";
  const entries = `[{"endpoint":"tcp://b:7100","origin":${U64_MAX},"state":"live","last_seq":42,"lag_p99_ms":3.5,"gaps":0,"snapshots":1},` + '{"endpoint":"tcp://c:7100","state":"connecting"},"tcp://d:7100"]';

  it("GETs /replica_sync/peers and prints the reference's endpoint strings", async () => {
    // Reference (selection/server.rs list_peers; spec §9): a sorted array of endpoint strings.
    srv.reply = { status: 200, body: '["tcp://b:7100","tcp://c:7100"]' };
    const r = await peers("list");
    expect(r.code).toBe(0);
    expect(seen).toEqual([{ method: "GET", url: "/replica_sync/peers", contentType: undefined, body: "" }]);
    expect(parseJson(r.out)).toEqual(["tcp://b:7100", "tcp://c:7100"]);
  });

  it("--status GETs the kvmesh addition /replica_sync/status and prints its JSON, big origins exact", async () => {
    srv.reply = { status: 200, body: entries };
    const r = await peers("list", "--status");
    expect(r.code).toBe(0);
    expect(seen).toEqual([{ method: "GET", url: "/replica_sync/status", contentType: undefined, body: "" }]);
    expect(r.out).toContain(`"origin": ${U64_MAX},`);
    expect(parseJson(r.out)).toEqual(parseJson(entries));
  });

  it("prints a table of /replica_sync/status with --table, tolerating missing fields and bare endpoints", async () => {
    srv.reply = { status: 200, body: entries };
    const r = await peers("list", "--table");
    expect(r.code).toBe(0);
    expect(seen.map((s) => s.url)).toEqual(["/replica_sync/status"]);
    expect(r.out.split("\n")).toEqual([
      "ENDPOINT      ORIGIN                STATE       LAST_SEQ  LAG_P99_MS  GAPS  SNAPSHOTS",
      `tcp://b:7100  ${U64_MAX}  live        42        3.5         0     1`,
      "tcp://c:7100  -                     connecting  -         -           -     -",
      "tcp://d:7100  -                     -           -         -           -     -",
      "",
    ]);
  });

  it("prints only the header for no peers (and for a body that is not a list)", () => {
    const header = "ENDPOINT  ORIGIN  STATE  LAST_SEQ  LAG_P99_MS  GAPS  SNAPSHOTS";
    expect(renderPeersTable([])).toBe(header);
    expect(renderPeersTable({ error: "x" })).toBe(header);
  });

  it("exits 1 on an HTTP error", async () => {
    srv.reply = { status: 500, body: '{"error":"boom"}' };
    expect(await peers("list", "--table")).toEqual({ code: 1, out: "", err: "error: 500 boom\n" });
    expect(await peers("list")).toEqual({ code: 1, out: "", err: "error: 500 boom\n" });
  });

  it("--table falls back to the endpoint strings of a daemon without /replica_sync/status (the reference)", async () => {
    const urls: string[] = [];
    const r = await cli(["peers", "list", "--table"], (url) => {
      urls.push(url.pathname);
      // The reference answers an unknown route 404 {"error":"route not found"} (selection/server.rs not_found).
      if (url.pathname === "/replica_sync/status") return Promise.resolve(new Response('{"error":"route not found"}', { status: 404 }));
      return Promise.resolve(new Response('["tcp://b:7100"]', { status: 200 }));
    });
    expect(urls).toEqual(["/replica_sync/status", "/replica_sync/peers"]);
    expect(r).toEqual({ code: 0, out: "ENDPOINT      ORIGIN  STATE  LAST_SEQ  LAG_P99_MS  GAPS  SNAPSHOTS\ntcp://b:7100  -       -      -         -           -     -\n", err: "" });
  });
});

describe("kvmesh peers: daemon address", () => {
  it("defaults to http://127.0.0.1:8092", async () => {
    const urls: string[] = [];
    const r = await cli(["peers", "list"], (url) => {
      urls.push(url.href);
      return Promise.resolve(new Response("[]", { status: 200 }));
    });
    expect(r).toEqual({ code: 0, out: "[]\n", err: "" });
    expect(urls).toEqual(["http://127.0.0.1:8092/replica_sync/peers"]);
  });

  it("takes the address from KVMESH_ADMIN (path prefix kept) and lets --admin win", async () => {
    vi.stubEnv("KVMESH_ADMIN", `${baseUrl}/kvmesh/`);
    srv.reply = { status: 200, body: "[]" };
    expect((await cli(["peers", "list"])).code).toBe(0);
    expect(seen[0]?.url).toBe("/kvmesh/replica_sync/peers");
    vi.stubEnv("KVMESH_ADMIN", "http://127.0.0.1:1");
    expect((await peers("list")).code).toBe(0);
    expect(seen[1]?.url).toBe("/replica_sync/peers");
  });

  it("rejects a bad KVMESH_ADMIN as a usage error naming it", async () => {
    vi.stubEnv("KVMESH_ADMIN", "127.0.0.1:8092");
    const r = await cli(["peers", "add", "tcp://b:7100"]);
    expect(r.code).toBe(1);
    expect(r.err).toContain("error: option '--admin <url>' value '127.0.0.1:8092' from env 'KVMESH_ADMIN' is invalid.");
    expect(seen).toEqual([]);
  });

  it("names the URL when nothing listens there", async () => {
    const url = await refusedUrl();
    const r = await cli(["peers", "add", "tcp://b:7100", "--admin", url]);
    expect(r).toEqual({ code: 1, out: "", err: `error: cannot reach kvmesh at ${url} (connection refused); is the daemon running?\n` });
  });
});

describe("kvmesh peers: help", () => {
  it("lists the peers commands and documents --admin, KVMESH_ADMIN and --table", () => {
    const program = buildCli();
    const flat = (s: string): string => s.replace(/\s+/g, " ");
    expect(flat(program.helpInformation())).toContain("peers ");
    const group = program.commands.find((c) => c.name() === "peers");
    expect(group?.commands.map((c) => c.name())).toEqual(["add", "remove", "list"]);
    for (const sub of group?.commands ?? []) {
      const help = flat(sub.helpInformation());
      expect(help).toContain("--admin <url>");
      expect(help).toContain("default: http://127.0.0.1:8092, env: KVMESH_ADMIN");
      if (sub.name() !== "list") expect(help).toContain("<endpoint>");
    }
    expect(flat(group?.commands[2]?.helpInformation() ?? "")).toContain("--table");
    expect(flat(group?.commands[2]?.helpInformation() ?? "")).toContain("--status");
  });
});
