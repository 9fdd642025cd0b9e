/**
 * `kvmesh keys generate --out PREFIX [--force]`: a CURVE key pair for the replica mesh.
 *
 * Writes PREFIX.key (the secret, mode 0600) and PREFIX.pub (the public key, mode 0644), both Z85
 * text (mesh/curve.ts has the format). Existing files are never overwritten without --force, and
 * with it the new files are written beside the old ones and renamed over them, so a crash leaves
 * the old pair or the new one, never half of each, and a secret is never readable by others even
 * for a moment (the file is created 0600, not chmod-ed afterwards).
 */
import { randomBytes } from "node:crypto";
import { chmodSync, closeSync, existsSync, openSync, renameSync, rmSync, statSync, writeSync } from "node:fs";
import { basename, dirname, resolve } from "node:path";
import { Option, type Command } from "commander";

import { MeshKeyPair, PUBLIC_KEY_FILE_SUFFIX, publicKeyFileText, SECRET_KEY_FILE_SUFFIX, secretKeyFileText } from "../mesh/curve.js";
import { parseNonEmpty } from "./parsers.js";

export const SECRET_KEY_FILE_MODE = 0o600;
export const PUBLIC_KEY_FILE_MODE = 0o644;

export interface KeysDeps {
  readonly writeOut: (text: string) => void;
  readonly writeErr: (text: string) => void;
  readonly exit: (code: number) => void;
}

export interface WrittenKeyPair {
  readonly keyFile: string;
  readonly pubFile: string;
  readonly publicKey: string;
}

/** A failure the command reports as `error: <message>` with exit 1. */
export class KeyFileError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "KeyFileError";
  }
}

const fsCode = (err: unknown): string => (typeof err === "object" && err !== null && "code" in err ? String(err.code) : "");

/** Creates `file` exclusively with `mode` and writes `text` (throws EEXIST if it exists). */
function writeExclusive(file: string, text: string, mode: number): void {
  const fd = openSync(file, "wx", mode);
  try {
    writeSync(fd, text);
  } finally {
    closeSync(fd);
  }
  // The umask may have narrowed the mode further (fine) but never widens it; pin it exactly so
  // the .pub is readable by the peers' operators even under umask 077.
  chmodSync(file, mode);
}

/**
 * Generates a pair and writes PREFIX.key and PREFIX.pub. Without `force`, refuses (and writes
 * nothing) when either exists; with it, replaces both atomically (write beside, then rename).
 */
export function writeKeyPair(prefix: string, opts: { readonly force?: boolean } = {}, keyPair: MeshKeyPair = MeshKeyPair.generate()): WrittenKeyPair {
  if (prefix.endsWith(SECRET_KEY_FILE_SUFFIX) || prefix.endsWith(PUBLIC_KEY_FILE_SUFFIX)) {
    throw new KeyFileError(`--out ${prefix}: give a prefix without .key/.pub (writes PREFIX.key and PREFIX.pub)`);
  }
  const keyFile = resolve(`${prefix}${SECRET_KEY_FILE_SUFFIX}`);
  const pubFile = resolve(`${prefix}${PUBLIC_KEY_FILE_SUFFIX}`);
  const dir = dirname(keyFile);
  let dirOk = false;
  try {
    dirOk = statSync(dir).isDirectory();
  } catch {
    dirOk = false;
  }
  if (!dirOk) throw new KeyFileError(`--out ${prefix}: directory ${dir} does not exist`);
  const force = opts.force === true;
  if (!force) {
    const existing = [keyFile, pubFile].filter((f) => existsSync(f));
    if (existing.length > 0) throw new KeyFileError(`--out ${prefix}: ${existing.join(" and ")} already exist${existing.length === 1 ? "s" : ""} (use --force to replace the pair)`);
  }
  // Temporary names in the same directory, so the rename is atomic (same filesystem).
  const tag = `.${basename(prefix)}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`;
  const tmpKey = resolve(dir, `${tag}${SECRET_KEY_FILE_SUFFIX}`);
  const tmpPub = resolve(dir, `${tag}${PUBLIC_KEY_FILE_SUFFIX}`);
  try {
    writeExclusive(force ? tmpKey : keyFile, secretKeyFileText(keyPair), SECRET_KEY_FILE_MODE);
    try {
      writeExclusive(force ? tmpPub : pubFile, publicKeyFileText(keyPair), PUBLIC_KEY_FILE_MODE);
    } catch (err) {
      // Never leave a secret without its public half (or a stray temporary secret).
      rmSync(force ? tmpKey : keyFile, { force: true });
      throw err;
    }
    if (force) {
      renameSync(tmpPub, pubFile);
      renameSync(tmpKey, keyFile);
    }
  } catch (err) {
    rmSync(tmpKey, { force: true });
    rmSync(tmpPub, { force: true });
    if (err instanceof KeyFileError) throw err;
    const code = fsCode(err);
    // Another process created one of them between our check and our write.
    if (code === "EEXIST") throw new KeyFileError(`--out ${prefix}: the key files appeared while writing them (use --force to replace the pair)`, { cause: err });
    throw new KeyFileError(`--out ${prefix}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
  return { keyFile, pubFile, publicKey: keyPair.publicKey };
}

export function addKeysCommand(program: Command, deps: KeysDeps): Command {
  const keys = program.command("keys").description("manage the CURVE keys that authenticate and encrypt the replica mesh");
  keys
    .command("generate")
    .description("write a new key pair: PREFIX.key (secret, mode 0600, for this replica's --mesh-key) and PREFIX.pub (for the peers' --mesh-allow)")
    .addOption(new Option("--out <prefix>", "path prefix of the two files, e.g. /etc/kvmesh/replica-a").argParser(parseNonEmpty).makeOptionMandatory())
    .option("--force", "replace existing PREFIX.key and PREFIX.pub")
    .action(function (this: Command) {
      const o = this.opts<{ out: string; force?: boolean }>();
      let written: WrittenKeyPair;
      try {
        written = writeKeyPair(o.out, { force: o.force === true });
      } catch (err) {
        if (!(err instanceof KeyFileError)) throw err;
        deps.writeErr(`error: ${err.message}\n`);
        deps.exit(1);
        return;
      }
      // The public key only: the secret stays in its file.
      deps.writeOut(`wrote ${written.keyFile} (secret, mode 0600) and ${written.pubFile}\npublic key: ${written.publicKey}\n`);
    });
  return keys;
}
