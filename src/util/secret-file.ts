/**
 * Reading a file that holds a secret (the mesh's CURVE secret key, the HTTP API token), with the
 * checks an operator expects from ssh: a secret readable by other users is refused rather than
 * used, so a leaked key is noticed at startup instead of after the fact.
 *
 * Rules (POSIX modes; `chmod 600 FILE` satisfies all of them):
 * - others have any access (o+r, o+w, o+x), or the group can write: refused;
 * - the group can read (e.g. 0640 / 0440 for a shared service group, as Kubernetes fsGroup
 *   setups do): allowed, with a warning the daemon logs at startup.
 * The mode is read through symlinks (Kubernetes mounts secrets as symlinks into `..data/`).
 */
import { readFileSync, statSync } from "node:fs";

import { KvmeshError } from "../core/index.js";

/** Refused: any access for others, or write access for the group. */
export const SECRET_FILE_REFUSED_MODE_BITS = 0o027;
/** Warned about: read access for the group. */
export const SECRET_FILE_WARNED_MODE_BITS = 0o040;
/** A key or token file is well under 1 KiB; anything this large is the wrong file. */
export const MAX_SECRET_FILE_BYTES = 64 * 1024;

export interface SecretFileText {
  readonly text: string;
  /** Non-fatal findings (group-readable file) for the daemon to log; never contain the secret. */
  readonly warnings: readonly string[];
}

const octal = (mode: number): string => `0${(mode & 0o777).toString(8).padStart(3, "0")}`;

/**
 * A usage error about `file`, given as `field` (the flag that named it, e.g. `--mesh-key`, or
 * `--mesh-key (from KVMESH_MESH_KEY)`): the message starts with both.
 */
export function fileError(field: string, file: string, problem: string, cause?: unknown): KvmeshError {
  return new KvmeshError("KVMESH_BAD_REQUEST", `${field} ${file}: ${problem}`, { details: { field, file }, ...(cause === undefined ? {} : { cause }) });
}

function describeFsError(err: unknown): string {
  const code = typeof err === "object" && err !== null && "code" in err ? String(err.code) : "";
  if (code === "ENOENT") return "no such file";
  if (code === "EACCES") return "permission denied";
  if (code === "EISDIR") return "is a directory";
  return err instanceof Error ? err.message : String(err);
}

/** Reads a small text file (no permission rules: public keys, allow lists). */
export function readSmallTextFile(file: string, field: string): string {
  let size: number;
  let isFile: boolean;
  try {
    const st = statSync(file);
    size = st.size;
    isFile = st.isFile();
  } catch (err) {
    throw fileError(field, file, describeFsError(err), err);
  }
  if (!isFile) throw fileError(field, file, "not a regular file");
  if (size > MAX_SECRET_FILE_BYTES) throw fileError(field, file, `larger than ${MAX_SECRET_FILE_BYTES} bytes (is this the right file?)`);
  try {
    return readFileSync(file, "utf8");
  } catch (err) {
    throw fileError(field, file, describeFsError(err), err);
  }
}

/** Reads a secret file after checking its permissions (see the module comment). */
export function readSecretFile(file: string, field: string): SecretFileText {
  let mode: number;
  try {
    mode = statSync(file).mode;
  } catch (err) {
    throw fileError(field, file, describeFsError(err), err);
  }
  const warnings: string[] = [];
  // Windows has no POSIX modes (stat reports 0o666 for every writable file): skip the rule there.
  if (process.platform !== "win32") {
    if ((mode & SECRET_FILE_REFUSED_MODE_BITS) !== 0) {
      throw fileError(field, file, `permissions ${octal(mode)} are too open: other users can read or change this secret (run chmod 600 on it)`);
    }
    if ((mode & SECRET_FILE_WARNED_MODE_BITS) !== 0) {
      warnings.push(`${field} ${file}: permissions ${octal(mode)} let the file's group read this secret (chmod 600 keeps it to the owner)`);
    }
  }
  return { text: readSmallTextFile(file, field), warnings };
}

/**
 * The file's non-empty lines that are not comments, trimmed. A comment is `#` alone, or `#`
 * followed by a space or tab: Z85 (the key files' encoding) uses `#` as a digit but has no
 * whitespace, so a key line is never mistaken for a comment whatever characters it holds.
 */
export function contentLines(text: string): string[] {
  return text
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l.length > 0 && l !== "#" && !l.startsWith("# ") && !l.startsWith("#\t"));
}
