/**
 * `kvmesh serve`'s security flags: `--mesh-key`, `--mesh-allow` (CURVE for the replica mesh) and
 * `--api-token-file` (bearer token for the HTTP API), each also from its KVMESH_* variable.
 *
 * Secrets come from files only, never from the command line (argv shows in `ps` and shell
 * history). src/app/config.ts checks the flag combination and reads the files once at startup; every
 * problem is a usage error naming the flag (and the variable, when the value came from one).
 */
import { Option, type Command } from "commander";

import type { SecretFiles } from "../src/app/config.js";
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

/** Option attribute -> the src/app/config.ts field it sets (the config names files, the flags are short). */
export const SECURITY_FLAG_FIELDS = { meshKey: "meshKeyFile", meshAllow: "meshAllowFiles", apiTokenFile: "apiTokenFile" } as const satisfies Record<string, keyof SecretFiles>;

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
