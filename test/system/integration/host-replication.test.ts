/**
 * Host replication end to end: the serve flag (and its usage errors) through the real command
 * parser, then two real `kvmesh serve` processes whose bindings a "host" (this test) relays from
 * one's NDJSON stream to the other's POST /session_bindings.
 */
import { request } from "node:http";
import { afterEach, describe, expect, it, vi } from "vitest";
import { hostReplicationProblem } from "../../../src/app/config.js";
import { DEFAULT_DAEMON_CONFIG } from "../../../src/app/daemon.js";
import { spawnDaemon, stopDaemon, type DaemonProcess } from "../../helpers/daemon-process.js";
import { serveInProcess, type ServeOutcome } from "../../helpers/serve-in-process.js";
import { waitFor } from "../../helpers/wait.js";

/** Runs `kvmesh serve ...args` in process with a fake daemon; the config it got, or the usage error. */
const serveWith = (...args: string[]): Promise<ServeOutcome> => serveInProcess(args);

afterEach(() => {
  vi.unstubAllEnvs();
});

describe("kvmesh serve --session-replication-writer-id", () => {
  it("maps the flag and its environment variable to the daemon config", async () => {
    const flag = await serveWith("--session-affinity-ttl-secs", "60", "--session-replication-writer-id", "18446744073709551615");
    expect(flag.config?.sessionReplicationWriterId).toBe(18446744073709551615n);
    vi.stubEnv("KVMESH_SESSION_REPLICATION_WRITER_ID", "7");
    vi.stubEnv("KVMESH_SESSION_AFFINITY_TTL_SECS", "60");
    expect((await serveWith()).config?.sessionReplicationWriterId).toBe(7n);
    vi.unstubAllEnvs();
    expect((await serveWith()).config?.sessionReplicationWriterId).toBeUndefined();
  });

  it("refuses it without session affinity, with the mesh, or as 0", async () => {
    const cases: [string[], string][] = [
      [["--session-replication-writer-id", "3"], "error: --session-replication-writer-id requires --session-affinity-ttl-secs"],
      [
        ["--session-affinity-ttl-secs", "60", "--session-replication-writer-id", "3", "--replica-sync-port", "7100"],
        "error: --session-replication-writer-id (host replication) and --replica-sync-port (the built-in mesh) exclude each other",
      ],
      [["--session-affinity-ttl-secs", "60", "--session-replication-writer-id", "0"], "must be a non-zero unsigned 64-bit decimal integer"],
      [["--session-affinity-ttl-secs", "60", "--session-replication-writer-id", "x"], "must be an unsigned 64-bit decimal integer"],
    ];
    for (const [args, message] of cases) {
      const r = await serveWith(...args);
      expect(r.code, args.join(" ")).toBe(1);
      expect(r.err, args.join(" ")).toContain(message);
      expect(r.config).toBeUndefined();
    }
    vi.stubEnv("KVMESH_SESSION_REPLICATION_WRITER_ID", "3");
    expect((await serveWith()).err).toContain("--session-replication-writer-id (from KVMESH_SESSION_REPLICATION_WRITER_ID) requires --session-affinity-ttl-secs");
    expect(hostReplicationProblem({ ...DEFAULT_DAEMON_CONFIG, sessionAffinityTtlSecs: 60, sessionReplicationWriterId: 3n })).toBeUndefined();
  });
});

describe("host replication between two daemons", () => {
  const daemons: DaemonProcess[] = [];
  afterEach(async () => {
    await Promise.all(daemons.splice(0).map((d) => stopDaemon(d)));
  });

  const call = async (d: DaemonProcess, method: string, path: string, body?: string): Promise<{ status: number; text: string }> => {
    const res = await fetch(d.url + path, { method, ...(body === undefined ? {} : { body, headers: { "content-type": "application/json" } }) });
    return { status: res.status, text: await res.text() };
  };

  /** Relays every line of `from`'s stream to `to` (the host's transport); returns a stop function. */
  function relay(from: DaemonProcess, to: DaemonProcess, posted: string[]): () => void {
    const req = request(`${from.url}/session_bindings/updates`, (res) => {
      let buf = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => {
        buf += chunk;
        let nl: number;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (line.includes('"bindings":[]')) continue;
          void call(to, "POST", "/session_bindings", line).then((r) => posted.push(r.text));
        }
      });
    });
    req.on("error", () => undefined);
    req.end();
    return () => req.destroy();
  }

  it("a session bound on one daemon is steered on the other through the host's relay", async () => {
    const common = ["--no-kv-events", "--session-affinity-ttl-secs", "60", "--session-affinity-mode", "soft"];
    const [a, b] = await Promise.all([spawnDaemon([...common, "--session-replication-writer-id", "1"]), spawnDaemon([...common, "--session-replication-writer-id", "2"])]);
    daemons.push(a, b);
    for (const d of [a, b]) {
      for (const w of [1, 2]) expect((await call(d, "POST", "/workers", JSON.stringify({ worker_id: w, endpoint: `http://w${w}`, block_size: 4 }))).status).toBe(201);
    }
    const posted: string[] = [];
    const stops = [relay(a, b, posted), relay(b, a, posted)];
    try {
      const prompt = JSON.stringify({ token_ids: [1, 2, 3, 4, 5, 6, 7, 8], session_id: "conv", allowed_worker_ids: [2] });
      // The streams may still be connecting: bind until the relay has carried one binding.
      await waitFor(
        async () => {
          await call(a, "POST", "/select_and_reserve", prompt);
          return posted.length > 0;
        },
        5_000,
        "a relayed binding",
      );
      expect(posted[0]).toMatch(/"outcome":"(inserted|refreshed)"/);
      const probe = JSON.stringify({ token_ids: [9, 9, 9, 9], session_id: "conv" });
      const answer = JSON.parse((await call(b, "POST", "/select", probe)).text) as { worker_id: number };
      expect(answer.worker_id).toBe(2);
      // And back: B moves the session to worker 1 (soft mode), A follows.
      await call(b, "POST", "/select_and_reserve", JSON.stringify({ token_ids: [1, 2, 3, 4], session_id: "conv", allowed_worker_ids: [1] }));
      await waitFor(async () => (JSON.parse((await call(a, "POST", "/select", probe)).text) as { worker_id: number }).worker_id === 1, 5_000, "A to follow the rebind");
      expect((await call(a, "GET", "/metrics")).text).toMatch(/^kvmesh_session_bindings_stream_clients 1$/m);
    } finally {
      for (const stop of stops) stop();
    }
  });
});
