/**
 * `kvmesh serve`'s security flags: `--mesh-key`, `--mesh-allow` (CURVE for the replica mesh) and
 * `--api-token-file` (bearer token for the HTTP API), each also from its KVMESH_* variable.
 *
 * Secrets come from files only, never from the command line (argv shows in `ps` and shell
 * history). Files are read once at startup, after the flag combination was checked; every
 * problem is a usage error naming the flag (and the variable, when the value came from one).
 */
import { Option, type Command } from "commander";

import { loadMeshCurveConfig } from "../mesh/curve.js";
import type { DaemonConfig } from "../src/daemon.js";
import { loadApiTokenFile } from "../src/http/auth.js";
import { envNameFor, parseList, parseNonEmpty } from "./parsers.js";

/**
 * Log fields pino censors, as a second line of defence: the key pair and the token objects
 * already serialise without their secrets (MeshKeyPair, ApiToken), and no code logs headers.
 */
export const LOG_REDACT_PATHS: readonly string[] = [
  "secretKey",
  "*.secretKey",
  "curveSecretKey",
  "*.curveSecretKey",
  "apiToken",
  "*.apiToken",
  "authorization",
  "*.authorization",
  "*.headers.authorization",
  "*.*.headers.authorization",
];

/** Repeated `--mesh-allow` flags add up, like `--peers`. */
function accumulateFiles(value: string, previous: unknown): string[] {
  const before = Array.isArray(previous) ? (previous as string[]) : [];
  return [...new Set([...before, ...parseList(value)])];
}

const withEnv = (o: Option): Option => o.env(envNameFor(o.long ?? ""));

export function addServeSecurityOptions(cmd: Command): Command {
  return cmd
    .addOption(
      withEnv(
        new Option("--mesh-key <file>", "CURVE secret key of this replica (PREFIX.key from `kvmesh keys generate`, mode 0600): encrypts the mesh; needs --mesh-allow and --replica-sync-port [default: plain mesh]").argParser(
          parseNonEmpty,
        ),
      ),
    )
    .addOption(
      withEnv(
        new Option("--mesh-allow <files>", "comma-separated public key files (PREFIX.pub; one or more keys per file) of the replicas this one accepts and connects to; needs --mesh-key").argParser(
          accumulateFiles,
        ),
      ),
    )
    .addOption(
      withEnv(
        new Option("--api-token-file <file>", "file holding the bearer token (one line, >= 16 characters, mode 0600) that POST/PATCH/DELETE routes require [default: no token]").argParser(
          parseNonEmpty,
        ),
      ),
    );
}

interface SecurityOptions {
  readonly meshKey?: string;
  readonly meshAllow?: readonly string[];
  readonly apiTokenFile?: string;
}

/** Flag-combination problems (files not read yet); undefined when fine. */
export function securityUsageProblem(opts: SecurityOptions, config: DaemonConfig, label: (flag: string) => string = (f) => f): string | undefined {
  const key = opts.meshKey !== undefined;
  const allow = opts.meshAllow !== undefined && opts.meshAllow.length > 0;
  if (allow && !key) return `${label("--mesh-allow")} requires ${label("--mesh-key")} (this replica's own key pair)`;
  if (key && !allow) return `${label("--mesh-key")} requires ${label("--mesh-allow")} (the .pub files of the replicas to accept; list this replica's own .pub if the fleet shares one key pair)`;
  if (key && config.replicaSyncPort === undefined) return `${label("--mesh-key")} requires ${label("--replica-sync-port")} (CURVE secures the replica mesh)`;
  return undefined;
}

/**
 * Checks the flag combination, reads the key and token files, and returns `config` with them.
 * Throws an Error whose message names the flag; `warn` receives non-fatal findings (a
 * group-readable secret file) for the log.
 */
export function withServeSecrets(config: DaemonConfig, opts: SecurityOptions, label: (flag: string) => string, warn: (message: string) => void): DaemonConfig {
  const problem = securityUsageProblem(opts, config, label);
  if (problem !== undefined) throw new Error(problem);
  let out: DaemonConfig = config;
  if (opts.meshKey !== undefined) {
    const curve = loadMeshCurveConfig({ keyFile: opts.meshKey, allowFiles: opts.meshAllow ?? [] }, { key: label("--mesh-key"), allow: label("--mesh-allow") });
    for (const w of curve.warnings) warn(w);
    out = { ...out, meshCurve: curve };
  }
  if (opts.apiTokenFile !== undefined) {
    const { token, warnings } = loadApiTokenFile(opts.apiTokenFile, label("--api-token-file"));
    for (const w of warnings) warn(w);
    out = { ...out, apiToken: token };
  }
  return out;
}
