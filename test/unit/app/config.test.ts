/**
 * src/app/config.ts: the daemon's defaults come from the modules that own them, and
 * resolveDaemonConfig is the one check of the rules spanning several fields (the daemon's own,
 * and the core's, converted into config errors naming the daemon's field).
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { DEFAULT_MESH_FLUSH_INTERVAL_MS, DEFAULT_MESH_HEARTBEAT_INTERVAL_MS } from "../../../mesh/replica-mesh.js";
import {
  configErrorField,
  DEFAULT_DAEMON_CONFIG,
  isConfigError,
  resolveDaemonConfig,
  serviceOptionsOf,
  type ConfigField,
  type DaemonConfigInput,
} from "../../../src/app/config.js";
import { KvmeshError } from "../../../src/core/index.js";
import { DEFAULT_PENDING_MAX_BYTES, DEFAULT_PENDING_MAX_ENTRIES, DEFAULT_PENDING_TTL_MS } from "../../../src/core/index.js";
import { DEFAULT_ACTIVE_REQUEST_EXPIRY_MS, DEFAULT_MAX_LOCAL_RESERVATIONS } from "../../../src/core/index.js";
import { startDaemon } from "../../../src/app/daemon.js";
import { DEFAULT_BODY_LIMIT_BYTES } from "../../../src/http/server.js";
import { DEFAULT_REPLAY_TIMEOUT_MS } from "../../../src/ingest/kv-event-listener.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";

const dir = mkdtempSync(join(tmpdir(), "kvmesh-config-"));
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

/** The config error resolveDaemonConfig throws for `input`. */
function configErrorOf(input: DaemonConfigInput, name?: (field: ConfigField) => string): KvmeshError {
  const err = kvmeshErrorOf(() => resolveDaemonConfig(input, name === undefined ? {} : { name }));
  expect(err.code).toBe("KVMESH_INVALID_OPTION");
  expect(err.status).toBe(400);
  return err;
}

describe("DEFAULT_DAEMON_CONFIG", () => {
  it("takes its defaults from the modules that own them", () => {
    const d = DEFAULT_DAEMON_CONFIG;
    expect(d.activeRequestExpirySecs * 1_000).toBe(DEFAULT_ACTIVE_REQUEST_EXPIRY_MS);
    expect(d.maxReservations).toBe(DEFAULT_MAX_LOCAL_RESERVATIONS);
    expect(d.selectionCacheTtlSecs * 1_000).toBe(DEFAULT_PENDING_TTL_MS);
    expect(d.selectionCacheMaxEntries).toBe(DEFAULT_PENDING_MAX_ENTRIES);
    // The reference's --selection-cache-max-bytes default, 256 MiB (services/selection/pending.rs).
    expect(d.selectionCacheMaxBytes).toBe(268_435_456);
    expect(d.replayTimeoutMs).toBe(DEFAULT_REPLAY_TIMEOUT_MS);
    expect(d.bodyLimitBytes).toBe(DEFAULT_BODY_LIMIT_BYTES);
    expect(d.meshFlushIntervalMs).toBe(DEFAULT_MESH_FLUSH_INTERVAL_MS);
    expect(d.meshHeartbeatIntervalMs).toBe(DEFAULT_MESH_HEARTBEAT_INTERVAL_MS);
    // The values docs/configuration.md documents.
    expect([d.host, d.port, d.activeRequestExpirySecs, d.maxReservations, d.replayTimeoutMs, d.selectionCacheTtlSecs, d.selectionCacheMaxEntries, d.bodyLimitBytes]).toEqual([
      "127.0.0.1", 8092, 300, 131_072, 2_000, 120, 4_096, 8_388_608,
    ]);
    expect(Object.isFrozen(d)).toBe(true);
  });
});

describe("resolveDaemonConfig", () => {
  it("fills in the defaults for whatever is not given (undefined counts as not given)", () => {
    expect(resolveDaemonConfig()).toEqual(DEFAULT_DAEMON_CONFIG);
    const c = resolveDaemonConfig({ port: 0, host: undefined, selector: { temperature: 0.5 }, meshFlushIntervalMs: 0 });
    expect(c).toEqual({ ...DEFAULT_DAEMON_CONFIG, port: 0, selector: { temperature: 0.5 }, meshFlushIntervalMs: 0 });
    expect(Object.isFrozen(c)).toBe(true);
  });

  it("hands back a config it resolved as it is, so the daemon does not check it again", () => {
    const c = resolveDaemonConfig({ port: 0 });
    expect(resolveDaemonConfig(c)).toBe(c);
    // A changed copy is a new input, checked again.
    expect(configErrorField(kvmeshErrorOf(() => resolveDaemonConfig({ ...c, peers: ["tcp://b:7100"] })))).toBe("peers");
  });

  it("maps the config to the core's options (seconds to ms, the mesh's endpoints)", () => {
    const o = serviceOptionsOf(resolveDaemonConfig({ host: "0.0.0.0", replicaSyncPort: 7100, meshInsecure: true, peers: ["tcp://b:7100"], sessionAffinityTtlSecs: 60, sessionAffinityMode: "soft" }));
    expect(o).toMatchObject({
      replicaSync: { publishBind: "tcp://*:7100", advertiseEndpoint: "tcp://127.0.0.1:7100", peers: ["tcp://b:7100"] },
      activeRequestExpiryMs: DEFAULT_ACTIVE_REQUEST_EXPIRY_MS,
      maxLocalReservations: DEFAULT_MAX_LOCAL_RESERVATIONS,
      requireKvEventsEndpoint: true,
      selectionCache: { ttlMs: DEFAULT_PENDING_TTL_MS, maxEntries: DEFAULT_PENDING_MAX_ENTRIES, maxBytes: DEFAULT_PENDING_MAX_BYTES },
      sessionAffinity: { ttlSecs: 60, mode: "soft" },
      // The daemon coalesces binding refreshes by default (issue 13); the library's default is 0.
      bindingRefreshCoalesceMs: 1_000,
    });
    expect(serviceOptionsOf(DEFAULT_DAEMON_CONFIG).replicaSync).toBeUndefined();
    expect(serviceOptionsOf(resolveDaemonConfig({ bindingRefreshCoalesceMs: 0 })).bindingRefreshCoalesceMs).toBe(0);
    expect(serviceOptionsOf(resolveDaemonConfig({ selectionCacheMaxBytes: 4_096 })).selectionCache?.maxBytes).toBe(4_096);
  });

  it("leaves tracing off by default and keeps a traces endpoint as given", () => {
    expect(DEFAULT_DAEMON_CONFIG.otlpTracesEndpoint).toBeUndefined();
    expect(DEFAULT_DAEMON_CONFIG.otlpServiceName).toBe("kvmesh");
    const c = resolveDaemonConfig({ otlpTracesEndpoint: "http://127.0.0.1:4318", otlpServiceName: "router-a" });
    expect([c.otlpTracesEndpoint, c.otlpServiceName]).toEqual(["http://127.0.0.1:4318", "router-a"]);
  });

  describe("the daemon's own rules", () => {
    const cases: [DaemonConfigInput, ConfigField, string][] = [
      [{ peers: ["tcp://b:7100"] }, "peers", "peers requires replicaSyncPort"],
      [{ replicaSyncAdvertiseHost: "a.example" }, "replicaSyncAdvertiseHost", "replicaSyncAdvertiseHost requires replicaSyncPort"],
      [{ replicaSyncPort: 65_535 }, "replicaSyncPort", "replicaSyncPort 65535 leaves no room for the control port (65535 + 1 > 65535)"],
      [{ port: 7100, replicaSyncPort: 7100 }, "replicaSyncPort", "replicaSyncPort 7100 is the same as port 7100 (the HTTP port)"],
      [{ port: 7101, replicaSyncPort: 7100 }, "replicaSyncPort", "replicaSyncPort 7100 puts its control port (7101) on port 7101 (the HTTP port)"],
      [{ sessionReplicationWriterId: 3n }, "sessionReplicationWriterId", "sessionReplicationWriterId requires sessionAffinityTtlSecs"],
      [{ meshAllowFiles: ["a.pub"] }, "meshAllowFiles", "meshAllowFiles requires meshKeyFile"],
      [{ replicaSyncPort: 7100, meshKeyFile: "a.key" }, "meshKeyFile", "meshKeyFile requires meshAllowFiles"],
      [{ meshKeyFile: "a.key", meshAllowFiles: ["a.pub"] }, "meshKeyFile", "meshKeyFile requires replicaSyncPort"],
      [{ host: "0.0.0.0", replicaSyncPort: 7100 }, "meshInsecure", "replicaSyncPort on host 0.0.0.0 without CURVE lets anyone who reaches ports 7100 and 7101 join the mesh"],
      [{ host: "10.1.2.3", replicaSyncPort: 7100, meshInsecure: false }, "meshInsecure", "give meshKeyFile and meshAllowFiles, or meshInsecure"],
      [{ otlpTracesEndpoint: "collector:4318" }, "otlpTracesEndpoint", 'otlpTracesEndpoint: "collector:4318" is not an http(s) URL'],
      [{ otlpTracesEndpoint: "nonsense" }, "otlpTracesEndpoint", 'otlpTracesEndpoint: "nonsense" is not a URL'],
      [{ otlpServiceName: " " }, "otlpServiceName", "otlpServiceName must not be empty"],
    ];
    for (const [input, field, message] of cases) {
      it(`refuses ${JSON.stringify(input, (_k, v: unknown) => (typeof v === "bigint" ? `${v}n` : v))}`, () => {
        const err = configErrorOf(input);
        expect(err.details).toEqual({ field });
        expect(err.message).toContain(message);
      });
    }

    it("runs a plain mesh beyond loopback only when told it is insecure; loopback and CURVE need nothing (#17 F12)", () => {
      expect(resolveDaemonConfig({ host: "0.0.0.0", replicaSyncPort: 7100, meshInsecure: true }).meshInsecure).toBe(true);
      for (const host of ["127.0.0.1", "127.9.9.9", "localhost", "::1"]) expect(resolveDaemonConfig({ host, replicaSyncPort: 7100 }).replicaSyncPort).toBe(7100);
      // An HTTP API beyond loopback without a mesh is a warning at startup, not this refusal.
      expect(resolveDaemonConfig({ host: "0.0.0.0" }).host).toBe("0.0.0.0");
    });

    it("refuses a CURVE config without a mesh (an embedder's meshCurve, not files)", () => {
      const meshCurve = { keyPair: { publicKey: "p" }, allow: [], warnings: [] } as unknown as NonNullable<DaemonConfigInput["meshCurve"]>;
      expect(configErrorOf({ meshCurve }).message).toContain("meshCurve requires replicaSyncPort");
    });

    it("names fields the caller's way (the CLI passes its flags)", () => {
      const flag = (field: ConfigField): string => `--${field}`;
      expect(configErrorOf({ peers: ["tcp://b:7100"] }, flag).message).toBe("--peers requires --replicaSyncPort");
    });
  });

  describe("the tokenizer's fields", () => {
    it("default to the engine tokenizer; --tokenizer-file alone means file mode", () => {
      expect(resolveDaemonConfig({ extProcPort: 9002 }).tokenizer).toBe("engine");
      const file = join(dir, "tokenizer.json");
      writeFileSync(file, "{}");
      expect(resolveDaemonConfig({ extProcPort: 9002, tokenizerFile: file })).toMatchObject({ tokenizer: "file", tokenizerFile: file });
    });

    const cases: [DaemonConfigInput, ConfigField, string][] = [
      [{ tokenizerTimeoutMs: 500 }, "tokenizerTimeoutMs", "tokenizerTimeoutMs requires extProcPort (tokenization serves the endpoint picker)"],
      [{ extProcPort: 9002, tokenizer: "file" }, "tokenizerFile", "tokenizerFile: is required with tokenizer file"],
      [{ extProcPort: 9002, tokenizer: "engine", tokenizerFile: "/x" }, "tokenizerFile", "tokenizerFile: is only read with tokenizer file (drop one of the two)"],
      [{ extProcPort: 9002, tokenizerAttempts: 0 }, "tokenizerAttempts", "tokenizerAttempts: must be a positive integer, got 0"],
      [{ extProcPort: 9002, tokenizerFile: "/nonexistent/tokenizer.json" }, "tokenizerFile", "tokenizerFile: cannot read /nonexistent/tokenizer.json (ENOENT)"],
    ];
    for (const [input, field, message] of cases) {
      it(`refuses ${JSON.stringify(input)} naming ${field}`, () => {
        const err = configErrorOf(input);
        expect(err.details).toEqual({ field });
        expect(err.message).toBe(message);
      });
    }
  });

  describe("the core's rules, left to the core", () => {
    const cases: [DaemonConfigInput, ConfigField, RegExp][] = [
      [{ sessionAffinityTtlSecs: 60, sessionReplicationWriterId: 3n, replicaSyncPort: 7100 }, "sessionReplicationWriterId", /^sessionReplicationWriterId \(host replication\) and replicaSyncPort \(the built-in mesh\) exclude each other/],
      [{ sessionAffinityTtlSecs: 0 }, "sessionAffinityTtlSecs", /^sessionAffinityTtlSecs must be an integer in \[1, 31536000\]/],
      [{ maxReservations: 0 }, "maxReservations", /^maxReservations must be a positive integer/],
      [{ activeRequestExpirySecs: 0 }, "activeRequestExpirySecs", /^activeRequestExpirySecs must be > 0/],
      [{ bindingRefreshCoalesceMs: -1 }, "bindingRefreshCoalesceMs", /^bindingRefreshCoalesceMs must be a non-negative integer/],
      [{ selector: { temperature: -1 } }, "selector.temperature", /selector\.temperature must be a finite number >= 0, got -1/],
      [{ selector: { trackPrefillTokens: "yes" as unknown as boolean } }, "selector.trackPrefillTokens", /selector\.trackPrefillTokens must be a boolean/],
    ];
    for (const [input, field, message] of cases) {
      it(`converts the core's refusal of ${field}`, () => {
        const err = configErrorOf(input);
        expect(err.details).toEqual({ field });
        expect(err.message).toMatch(message);
        // The core's own error stays reachable.
        expect(err.cause).toBeInstanceOf(KvmeshError);
      });
    }

    it("names the core's options the caller's way too", () => {
      const err = configErrorOf({ sessionAffinityTtlSecs: 60, sessionReplicationWriterId: 3n, replicaSyncPort: 7100 }, (f) => `<${f}>`);
      expect(err.message).toMatch(/^<sessionReplicationWriterId> \(host replication\) and <replicaSyncPort> \(the built-in mesh\)/);
    });
  });

  it("reads secret files last, and a bad one is a config error naming its field", () => {
    const missing = join(dir, "missing.token");
    const err = configErrorOf({ apiTokenFile: missing });
    expect(err.details).toEqual({ field: "apiTokenFile" });
    expect(err.message).toContain(`apiTokenFile ${missing}: no such file`);
    // Rules come first: a flag combination that makes no sense reads no file.
    expect(configErrorOf({ apiTokenFile: missing, peers: ["tcp://b:7100"] }).details).toEqual({ field: "peers" });
    expect(isConfigError(new KvmeshError("KVMESH_BAD_REQUEST", "x"))).toBe(false);
  });

  it("is what startDaemon checks a config with, before it opens anything", async () => {
    const err = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, peers: ["tcp://b:7100"] }, pino({ level: "silent" })).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isConfigError(err)).toBe(true);
    expect(configErrorField(err)).toBe("peers");
  });
});
