/**
 * `kvmesh keys generate` and `kvmesh serve`'s security flags (--mesh-key, --mesh-allow,
 * --api-token-file): files, modes, refusals, and the usage errors that name the flag.
 */
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CommanderError, type Command } from "commander";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";

import { buildCli } from "../../../cli/program.js";
import { writeKeyPair } from "../../../cli/keys.js";
import type { RunningDaemon, ShutdownSignal, SignalSource } from "../../../cli/serve.js";
import { loadAllowFiles, loadMeshKeyFile, MeshKeyPair } from "../../../mesh/curve.js";
import type { DaemonConfig } from "../../../src/app/daemon.js";
import { runCli } from "../../helpers/cli-harness.js";
import { waitFor } from "../../helpers/wait.js";

let dir = "";
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "kvmesh-keys-"));
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
  vi.unstubAllEnvs();
});

const mode = (f: string): number => statSync(f).mode & 0o777;

describe("kvmesh keys generate", () => {
  it("writes PREFIX.key (0600) and PREFIX.pub (0644) that load as a matching pair", async () => {
    const prefix = join(dir, "replica-a");
    const r = await runCli(["keys", "generate", "--out", prefix]);
    expect(r.code).toBe(0);
    expect(mode(`${prefix}.key`)).toBe(0o600);
    expect(mode(`${prefix}.pub`)).toBe(0o644);
    const { keyPair } = loadMeshKeyFile(`${prefix}.key`);
    expect(loadAllowFiles([`${prefix}.pub`])).toEqual([keyPair.publicKey]);
    // The public key is printed; the secret stays in its file.
    expect(r.out).toContain(`public key: ${keyPair.publicKey}`);
    expect(r.out).not.toContain(keyPair.secretKey);
  });

  it("refuses to overwrite either file without --force, and replaces both with it", async () => {
    const prefix = join(dir, "b");
    expect((await runCli(["keys", "generate", "--out", prefix])).code).toBe(0);
    const before = readFileSync(`${prefix}.key`, "utf8");
    rmSync(`${prefix}.key`);
    // Only the .pub left: still refused, and no new .key appears.
    const half = await runCli(["keys", "generate", "--out", prefix]);
    expect(half.code).toBe(1);
    expect(half.err).toMatch(/error: --out .*b: .*b\.pub already exists \(use --force/);
    expect(existsSync(`${prefix}.key`)).toBe(false);
    writeFileSync(`${prefix}.key`, before, { mode: 0o644 });
    chmodSync(`${prefix}.key`, 0o644);
    const refused = await runCli(["keys", "generate", "--out", prefix]);
    expect(refused.code).toBe(1);
    expect(readFileSync(`${prefix}.key`, "utf8")).toBe(before);
    const forced = await runCli(["keys", "generate", "--out", prefix, "--force"]);
    expect(forced.code).toBe(0);
    expect(readFileSync(`${prefix}.key`, "utf8")).not.toBe(before);
    // A replaced secret is 0600 even though the old file was 0644.
    expect(mode(`${prefix}.key`)).toBe(0o600);
    expect(loadAllowFiles([`${prefix}.pub`])).toEqual([loadMeshKeyFile(`${prefix}.key`).keyPair.publicKey]);
  });

  it("rejects a prefix with an extension, a missing directory, and a missing --out", async () => {
    expect((await runCli(["keys", "generate", "--out", join(dir, "x.key")])).err).toMatch(/without \.key\/\.pub/);
    expect((await runCli(["keys", "generate", "--out", join(dir, "nope", "x")])).err).toMatch(/directory .*nope does not exist/);
    expect((await runCli(["keys", "generate"])).code).not.toBe(0);
    expect(() => writeKeyPair(join(dir, "y.pub"))).toThrow(/without/);
  });
});

// ---------------------------------------------------------------- serve's security flags

class NoSignals implements SignalSource {
  readonly handlers = new Set<(s: ShutdownSignal) => void>();
  on(_s: ShutdownSignal, h: (s: ShutdownSignal) => void): void {
    this.handlers.add(h);
  }
  off(_s: ShutdownSignal, h: (s: ShutdownSignal) => void): void {
    this.handlers.delete(h);
  }
}

/** Runs `serve args` against a fake daemon; returns the config it got (or the usage error). */
async function serve(...args: string[]): Promise<{ config?: DaemonConfig; err: string; code: number | undefined; logs: string[] }> {
  const configs: DaemonConfig[] = [];
  const errs: string[] = [];
  const logs: string[] = [];
  const signals = new NoSignals();
  const daemon: RunningDaemon = { host: "127.0.0.1", port: 1, close: () => Promise.resolve() };
  const program = buildCli({
    startDaemon: (config) => {
      configs.push(config);
      return Promise.resolve(daemon);
    },
    signals,
    logDestination: { write: (l: string) => logs.push(l) },
    exit: () => undefined,
    writeOut: () => undefined,
    writeErr: (s) => errs.push(s),
  });
  const all = (c: Command): Command[] => [c, ...c.commands.flatMap(all)];
  for (const c of all(program)) c.exitOverride();
  let code: number | undefined;
  const run = program.parseAsync(["serve", "--port", "0", ...args], { from: "user" }).catch((e: unknown) => {
    if (!(e instanceof CommanderError)) throw e;
    code = e.exitCode;
  });
  await waitFor(() => configs.length > 0 || code !== undefined || errs.length > 0, 5_000, "serve to start or fail");
  for (const h of signals.handlers) h("SIGTERM");
  await run;
  return { ...(configs[0] === undefined ? {} : { config: configs[0] }), err: errs.join(""), code, logs };
}

describe("kvmesh serve --mesh-key / --mesh-allow / --api-token-file", () => {
  const pair = (name: string): { key: string; pub: string; kp: MeshKeyPair } => {
    const w = writeKeyPair(join(dir, name));
    return { key: w.keyFile, pub: w.pubFile, kp: loadMeshKeyFile(w.keyFile).keyPair };
  };
  const tokenFile = (m = 0o600): string => {
    const f = join(dir, "token");
    writeFileSync(f, "k3J9s8dLx0qP2vN7mZ4rT6yW1bC5eH8g\n", { mode: m });
    chmodSync(f, m);
    return f;
  };

  it("loads the key pair, the allow list and the token into the daemon config", async () => {
    const a = pair("a");
    const b = pair("b");
    const r = await serve("--replica-sync-port", "7100", "--mesh-key", a.key, "--mesh-allow", `${a.pub},${b.pub}`, "--api-token-file", tokenFile());
    expect(r.err).toBe("");
    expect(r.config?.meshCurve?.keyPair.publicKey).toBe(a.kp.publicKey);
    expect([...(r.config?.meshCurve?.allow ?? [])].sort()).toEqual([a.kp.publicKey, b.kp.publicKey].sort());
    expect(r.config?.apiToken?.matches("k3J9s8dLx0qP2vN7mZ4rT6yW1bC5eH8g")).toBe(true);
    // The same from the environment; repeated --mesh-allow flags add up.
    vi.stubEnv("KVMESH_MESH_KEY", a.key);
    vi.stubEnv("KVMESH_API_TOKEN_FILE", tokenFile());
    const env = await serve("--replica-sync-port", "7100", "--mesh-allow", a.pub, "--mesh-allow", b.pub);
    expect(env.config?.meshCurve?.allow).toHaveLength(2);
    expect(env.config?.apiToken).toBeDefined();
    expect(env.logs.join("")).not.toContain(a.kp.secretKey);
  });

  it("usage errors name the flag (and the variable it came from)", async () => {
    const a = pair("a");
    const cases: [string[], RegExp][] = [
      [["--mesh-allow", a.pub], /error: --mesh-allow requires --mesh-key/],
      [["--replica-sync-port", "7100", "--mesh-key", a.key], /error: --mesh-key requires --mesh-allow/],
      [["--mesh-key", a.key, "--mesh-allow", a.pub], /error: --mesh-key requires --replica-sync-port/],
      [["--replica-sync-port", "7100", "--mesh-key", join(dir, "missing.key"), "--mesh-allow", a.pub], /error: --mesh-key .*missing\.key: no such file/],
      [["--replica-sync-port", "7100", "--mesh-key", a.key, "--mesh-allow", join(dir, "missing.pub")], /error: --mesh-allow .*missing\.pub: no such file/],
      [["--replica-sync-port", "7100", "--mesh-key", a.pub, "--mesh-allow", a.pub], /error: --mesh-key .*a\.pub: permissions 0644 are too open/],
      [["--replica-sync-port", "7100", "--mesh-key", a.key, "--mesh-allow", a.key], /error: --mesh-allow .*a\.key: is a secret key file/],
      [["--api-token-file", tokenFile(0o644)], /error: --api-token-file .*token: permissions 0644 are too open/],
    ];
    for (const [args, want] of cases) {
      const r = await serve(...args);
      expect(r.config, args.join(" ")).toBeUndefined();
      expect(r.err, args.join(" ")).toMatch(want);
      expect(r.err).not.toContain(a.kp.secretKey);
    }
    const bad = join(dir, "bad.key");
    writeFileSync(bad, "not a key at all\n", { mode: 0o600 });
    chmodSync(bad, 0o600);
    vi.stubEnv("KVMESH_MESH_KEY", bad);
    const fromEnv = await serve("--replica-sync-port", "7100", "--mesh-allow", a.pub);
    expect(fromEnv.err).toMatch(/error: --mesh-key \(from KVMESH_MESH_KEY\) .*bad\.key: secret key must be 40 Z85 characters/);
  });

  it("logs a group-readable key file as a warning and still starts", async () => {
    const a = pair("a");
    chmodSync(a.key, 0o640);
    const r = await serve("--replica-sync-port", "7100", "--mesh-key", a.key, "--mesh-allow", a.pub);
    expect(r.config?.meshCurve).toBeDefined();
    const warning = r.logs.map((l) => JSON.parse(l) as { level: number; msg: string }).find((l) => l.level === 40 && l.msg.includes("group read"));
    expect(warning?.msg).toMatch(/--mesh-key .*a\.key: permissions 0640/);
  });
});
