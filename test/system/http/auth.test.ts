/**
 * The HTTP API's bearer token: the token itself, the route policy, a real daemon refusing and
 * admitting requests, and the CLI clients sending it from --api-token-file.
 */
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { inspect } from "node:util";
import { pino } from "pino";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";

import { DEFAULT_DAEMON_CONFIG, isLoopbackHost, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";
import { ApiToken, checkBearer, loadApiTokenFile, readApiTokenText, requiresApiToken, wwwAuthenticateFor } from "../../../src/http/auth.js";
import { runCli } from "../../helpers/cli-harness.js";

const TOKEN = "k3J9s8dLx0qP2vN7mZ4rT6yW1bC5eH8g";
/** Differs from TOKEN in the last character only. */
const NEAR_MISS = "k3J9s8dLx0qP2vN7mZ4rT6yW1bC5eH8h";

const authError = kvmeshErrorOf;

describe("ApiToken and checkBearer", () => {
  const token = ApiToken.fromString(TOKEN);

  it("accepts only the exact token, in a well-formed Bearer header", () => {
    expect(() => { checkBearer(`Bearer ${TOKEN}`, token); }).not.toThrow();
    expect(() => { checkBearer(`bearer  ${TOKEN} `, token); }).not.toThrow();
    const cases: [string | undefined, string][] = [
      [undefined, "missing"],
      ["", "missing"],
      [`Basic ${TOKEN}`, "malformed"],
      ["Bearer", "malformed"],
      [`Bearer ${TOKEN} extra`, "malformed"],
      [`Bearer ${NEAR_MISS}`, "invalid"],
      [`Bearer ${TOKEN}x`, "invalid"],
      [`Bearer ${TOKEN.slice(0, -1)}`, "invalid"],
    ];
    for (const [header, reason] of cases) {
      const e = authError(() => { checkBearer(header, token); });
      expect(e.code, String(header)).toBe("KVMESH_UNAUTHORIZED");
      expect(e.status).toBe(401);
      expect(e.details).toEqual({ reason });
      expect(e.message).not.toContain(TOKEN);
    }
  });

  it("refuses weak or malformed tokens without echoing them", () => {
    expect(() => ApiToken.fromString("short")).toThrow(/shorter than 16/);
    expect(() => ApiToken.fromString("a".repeat(5_000))).toThrow(/longer than 4096/);
    expect(() => ApiToken.fromString("has a space in it......")).toThrow(/one line of letters/);
    expect(() => ApiToken.fromString("abcdefghijklmnop=q")).toThrow(/one line/);
    expect(ApiToken.fromString("abcdefghijklmnop==").matches("abcdefghijklmnop==")).toBe(true);
  });

  it("never serialises the token", () => {
    const lines: string[] = [];
    pino({}, { write: (l: string) => lines.push(l) }).info({ token, config: { apiToken: token } }, "x");
    for (const text of [JSON.stringify(token), inspect(token), inspect({ token }), lines.join("")]) expect(text).not.toContain(TOKEN);
  });

  it("protects every state-changing method, and the host-replication feed among the reads", () => {
    for (const m of ["POST", "PATCH", "DELETE", "PUT"]) expect(requiresApiToken(m, "/select"), m).toBe(true);
    for (const route of ["/health", "/ready", "/metrics", "/loads", "/workers", "/dump", "/replica_sync/peers", "/replica_sync/status"]) {
      expect(requiresApiToken("GET", route), route).toBe(false);
      expect(requiresApiToken("HEAD", route), route).toBe(false);
    }
    expect(requiresApiToken("GET", "/session_bindings/updates")).toBe(true);
    // The status page's data needs it; the page and its files (no data) do not, so a browser can load it and ask.
    expect(requiresApiToken("GET", "/ui/state")).toBe(true);
    for (const route of ["/", "/ui", "/ui/app.js", "/ui/app.css"]) expect(requiresApiToken("GET", route), route).toBe(false);
  });

  it("words the challenge per RFC 6750", () => {
    expect(wwwAuthenticateFor("missing")).toBe('Bearer realm="kvmesh"');
    expect(wwwAuthenticateFor("malformed")).toBe('Bearer realm="kvmesh", error="invalid_request"');
    expect(wwwAuthenticateFor("invalid")).toBe('Bearer realm="kvmesh", error="invalid_token"');
  });
});

describe("token files", () => {
  let dir = "";
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "kvmesh-auth-"));
  });
  afterAll(() => {
    rmSync(dir, { recursive: true, force: true });
  });
  const write = (name: string, text: string, mode: number): string => {
    const f = join(dir, name);
    writeFileSync(f, text, { mode });
    chmodSync(f, mode);
    return f;
  };

  it("loads a 0600 file with comments; refuses open, empty, multi-line and weak ones naming the flag", () => {
    const ok = write("ok", `# api token\n${TOKEN}\n`, 0o600);
    expect(loadApiTokenFile(ok).token.matches(TOKEN)).toBe(true);
    expect(readApiTokenText(ok)).toBe(TOKEN);
    expect(loadApiTokenFile(write("group", `${TOKEN}\n`, 0o640)).warnings).toHaveLength(1);
    const open = authError(() => loadApiTokenFile(write("open", `${TOKEN}\n`, 0o604), "--api-token-file (from KVMESH_API_TOKEN_FILE)"));
    expect(open.message).toMatch(/^--api-token-file \(from KVMESH_API_TOKEN_FILE\) .*open: permissions 0604 are too open/);
    expect(authError(() => loadApiTokenFile(write("empty", "# nothing\n", 0o600))).message).toMatch(/found 0 non-comment lines/);
    expect(authError(() => loadApiTokenFile(write("two", `${TOKEN}\n${TOKEN}\n`, 0o600))).message).toMatch(/found 2/);
    const weak = authError(() => readApiTokenText(write("weak", "hunter2\n", 0o600)));
    expect(weak.message).toMatch(/^--api-token-file .*weak: token is shorter than 16/);
    expect(weak.message).not.toContain("hunter2");
    expect(authError(() => loadApiTokenFile(join(dir, "missing"))).message).toMatch(/missing: no such file/);
  });
});

// ---------------------------------------------------------------- a daemon with a token

interface Answer {
  readonly status: number;
  readonly headers: Record<string, string | string[] | undefined>;
  readonly body: string;
}

/** Raw node:http request (fetch hides Connection headers). */
function send(d: Daemon, method: string, path: string, opts: { token?: string; authorization?: string; body?: string | Buffer } = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string | number> = {};
    if (opts.token !== undefined) headers["authorization"] = `Bearer ${opts.token}`;
    if (opts.authorization !== undefined) headers["authorization"] = opts.authorization;
    if (opts.body !== undefined) {
      headers["content-type"] = "application/json";
      headers["content-length"] = Buffer.byteLength(opts.body);
    }
    const req = httpRequest({ host: d.host, port: d.port, method, path, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString("utf8") });
      });
      res.on("error", reject);
    });
    req.on("error", reject);
    if (opts.body !== undefined) req.write(opts.body);
    req.end();
  });
}

describe("a daemon with --api-token-file", () => {
  const lines: string[] = [];
  let d: Daemon;
  let dir = "";
  let tokenFile = "";
  beforeAll(async () => {
    d = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false, apiToken: ApiToken.fromString(TOKEN) }, pino({ level: "debug" }, { write: (l: string) => lines.push(l) }));
    dir = mkdtempSync(join(tmpdir(), "kvmesh-auth-cli-"));
    tokenFile = join(dir, "token");
    writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
    chmodSync(tokenFile, 0o600);
  });
  afterAll(async () => {
    await d.close();
    rmSync(dir, { recursive: true, force: true });
  });
  afterEach(() => {
    vi.unstubAllEnvs();
  });

  const worker = JSON.stringify({ worker_id: 1, endpoint: "http://w1", block_size: 16 });

  it("leaves reads open and answers 401 with a challenge on writes without a valid token", async () => {
    for (const path of ["/health", "/metrics", "/loads", "/workers", "/replica_sync/peers", "/replica_sync/status", "/dump"]) expect((await send(d, "GET", path)).status, path).toBe(200);
    const none = await send(d, "POST", "/workers", { body: worker });
    expect(none.status).toBe(401);
    expect(none.headers["www-authenticate"]).toBe('Bearer realm="kvmesh"');
    expect(JSON.parse(none.body)).toMatchObject({ code: "KVMESH_UNAUTHORIZED", details: { reason: "missing" } });
    const wrong = await send(d, "POST", "/workers", { token: NEAR_MISS, body: worker });
    expect(wrong.status).toBe(401);
    expect(wrong.headers["www-authenticate"]).toBe('Bearer realm="kvmesh", error="invalid_token"');
    const basic = await send(d, "POST", "/workers", { authorization: `Basic ${TOKEN}`, body: worker });
    expect(basic.headers["www-authenticate"]).toMatch(/invalid_request/);
    expect(d.service.listWorkers()).toHaveLength(0);
    expect((await send(d, "POST", "/workers", { token: TOKEN, body: worker })).status).toBe(201);
  });

  it("requires the token on every state-changing route, data plane included", async () => {
    const prompt = JSON.stringify({ token_ids: Array.from({ length: 32 }, (_, i) => i), selection_id: "s1" });
    const routes: [string, string, string | undefined][] = [
      ["PATCH", "/workers/1", JSON.stringify({ lifecycle: "draining" })],
      ["DELETE", "/workers/1", undefined],
      ["POST", "/select", prompt],
      ["POST", "/select_and_reserve", prompt],
      ["POST", "/reservations", JSON.stringify({ selection_id: "s1" })],
      ["POST", "/reservations/s1/prefill_complete", undefined],
      ["POST", "/reservations/s1/output_block", undefined],
      ["DELETE", "/reservations/s1", undefined],
      ["POST", "/potential_loads", prompt],
      ["POST", "/overlap_scores", prompt],
      ["POST", "/replica_sync/register_peer", JSON.stringify({ endpoint: "tcp://127.0.0.1:1" })],
      ["POST", "/replica_sync/deregister_peer", JSON.stringify({ endpoint: "tcp://127.0.0.1:1" })],
      ["GET", "/session_bindings/updates", undefined],
      ["GET", "/ui/state", undefined],
    ];
    for (const [method, path, body] of routes) {
      const r = await send(d, method, path, body === undefined ? {} : { body });
      expect(r.status, `${method} ${path}`).toBe(401);
    }
    // With the token they reach their handlers (whatever those answer).
    const reserve = await send(d, "POST", "/select_and_reserve", { token: TOKEN, body: prompt });
    expect(reserve.status).toBe(200);
    expect((await send(d, "DELETE", "/reservations/s1", { token: TOKEN })).status).toBe(200);
    expect((await send(d, "POST", "/replica_sync/register_peer", { token: TOKEN, body: JSON.stringify({ endpoint: "tcp://127.0.0.1:1" }) })).status).toBe(409);
  });

  it("refuses an unauthenticated body before reading it, and closes the connection", async () => {
    const big = `{"token_ids":[${"1,".repeat(400_000)}1]}`;
    const r = await send(d, "POST", "/select", { body: big });
    expect(r.status).toBe(401);
    expect(r.headers["connection"]).toBe("close");
  });

  it("counts refusals by reason and never logs a token", async () => {
    const text = (await send(d, "GET", "/metrics")).body;
    expect(text).toMatch(/^kvmesh_http_unauthorized_total\{reason="missing"\} [1-9]/m);
    expect(text).toMatch(/^kvmesh_http_unauthorized_total\{reason="invalid"\} [1-9]/m);
    expect(text).toMatch(/^kvmesh_http_unauthorized_total\{reason="malformed"\} [1-9]/m);
    const all = lines.join("");
    expect(all).toContain("request refused: missing or invalid API token");
    expect(all).not.toContain(TOKEN);
    expect(all).not.toContain(NEAR_MISS);
  });

  it("the CLI clients send the token from --api-token-file or KVMESH_API_TOKEN_FILE", async () => {
    const url = `http://${d.host}:${d.port}`;
    const add = ["workers", "add", "2", "--endpoint", "http://w2", "--block-size", "16", "--url", url];
    const denied = await runCli(add);
    expect(denied.code).toBe(1);
    expect(denied.err).toMatch(/error: 401 .*Authorization: Bearer/);
    expect((await runCli([...add, "--api-token-file", tokenFile])).code).toBe(0);
    vi.stubEnv("KVMESH_API_TOKEN_FILE", tokenFile);
    expect((await runCli(["workers", "remove", "2", "--url", url])).code).toBe(0);
    const sel = await runCli(["select", "--tokens", "1,2,3", "--url", url]);
    expect(sel.err).not.toMatch(/401/);
    // peers: 409 (no mesh) rather than 401 shows the header was sent.
    const peers = await runCli(["peers", "add", "tcp://127.0.0.1:7100", "--admin", url]);
    expect(peers.code).toBe(1);
    expect(peers.err).toMatch(/409 replica sync is disabled/);
    vi.unstubAllEnvs();
    expect((await runCli(["peers", "add", "tcp://127.0.0.1:7100", "--admin", url])).err).toMatch(/401/);
  });

  it("a client token file with open permissions is a usage error naming the flag", async () => {
    const open = join(dir, "open-token");
    writeFileSync(open, `${TOKEN}\n`, { mode: 0o644 });
    chmodSync(open, 0o644);
    const r = await runCli(["workers", "list", "--url", `http://${d.host}:${d.port}`, "--api-token-file", open]);
    expect(r.code).toBe(1);
    expect(r.err).toMatch(/--api-token-file .*open-token: permissions 0644 are too open/);
    expect(r.err).not.toContain(TOKEN);
  });
});

describe("a daemon without a token", () => {
  it("binds loopback by default and knows what loopback is (exposure warnings depend on it)", () => {
    expect(DEFAULT_DAEMON_CONFIG.host).toBe("127.0.0.1");
    for (const h of ["127.0.0.1", "127.1.2.3", "localhost", "LOCALHOST", "::1", "[::1]"]) expect(isLoopbackHost(h), h).toBe(true);
    for (const h of ["0.0.0.0", "::", "*", "10.0.0.5", "128.0.0.1", "127.0.0.1.example.com", "example.com"]) expect(isLoopbackHost(h), h).toBe(false);
  });

  it("stays open for writes (no token configured)", async () => {
    const d = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false }, pino({ level: "silent" }));
    try {
      expect((await send(d, "POST", "/workers", { body: JSON.stringify({ worker_id: 1, endpoint: "http://w1", block_size: 16 }) })).status).toBe(201);
      expect(d.host).toBe("127.0.0.1");
    } finally {
      await d.close();
    }
  });
});
