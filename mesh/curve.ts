/**
 * Key material for the mesh's CURVE security (ZeroMQ RFC 26): Z85 text (RFC 32), key pairs,
 * key files and allow lists. No sockets here (see zap-handler.ts, curve-key-directory.ts and
 * curve-subscribers.ts for those).
 *
 * Files (written by `kvmesh keys generate --out PREFIX`):
 * - `PREFIX.key`: the secret key, one Z85 line (40 characters) after `#` comment lines; mode
 *   0600. Only the secret is needed: the public key is derived from it (X25519, the same
 *   Curve25519 scalar multiplication libzmq's CURVE uses), so a pair can never be mismatched.
 * - `PREFIX.pub`: the public key, one Z85 line. Not secret: hand it to every replica that
 *   should accept this one (`--mesh-allow`).
 * An allow file may list several public keys, one per line (`cat a.pub b.pub > fleet.pub`).
 *
 * Secrets never reach logs: MeshKeyPair keeps the secret in a #private field (invisible to
 * JSON.stringify, pino and util.inspect) and serialises as its public key only.
 */
import { createPrivateKey, createPublicKey } from "node:crypto";
import { inspect } from "node:util";
import { curveKeyPair } from "zeromq";

import { badRequest, KvmeshError } from "../src/core/index.js";
import { contentLines, fileError, readSecretFile, readSmallTextFile } from "../src/util/secret-file.js";

/** RFC 32's alphabet: 85 printable characters, 4 bytes -> 5 characters. */
export const Z85_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
export const CURVE_KEY_BYTES = 32;
export const CURVE_KEY_Z85_CHARS = (CURVE_KEY_BYTES / 4) * 5;
/**
 * Bound on an allow list. Finding a peer's key tries every listed key in one handshake each
 * (curve-key-directory.ts), so the list is also the worst-case probe fan-out; a fleet of more
 * than 1,024 replicas in one mesh is far beyond what the full-mesh design is for anyway.
 */
export const MAX_MESH_ALLOW_KEYS = 1_024;
/** First line of a generated secret key file; an allow file carrying it is refused. */
export const SECRET_KEY_FILE_MARKER = "# kvmesh mesh secret key";
export const SECRET_KEY_FILE_SUFFIX = ".key";
export const PUBLIC_KEY_FILE_SUFFIX = ".pub";

const Z85_DECODE = (() => {
  const table = new Int16Array(128).fill(-1);
  for (let i = 0; i < Z85_ALPHABET.length; i++) table[Z85_ALPHABET.charCodeAt(i)] = i;
  return table;
})();
/** PKCS#8 DER prefix of an X25519 private key; the 32 raw secret bytes follow (RFC 8410). */
const X25519_PKCS8_PREFIX = Buffer.from("302e020100300506032b656e04220420", "hex");
const X25519_SPKI_BYTES = 44;

/** Z85-encodes bytes whose length is a multiple of 4. */
export function z85Encode(bytes: Uint8Array): string {
  // Assertion (a programming error): only keys (32 bytes) are encoded.
  if (bytes.length % 4 !== 0) throw new RangeError(`z85Encode: length must be a multiple of 4, got ${bytes.length}`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let out = "";
  for (let i = 0; i < bytes.length; i += 4) {
    let v = view.getUint32(i, false);
    let chunk = "";
    for (let k = 0; k < 5; k++) {
      chunk = (Z85_ALPHABET[v % 85] as string) + chunk;
      v = Math.floor(v / 85);
    }
    out += chunk;
  }
  return out;
}

/** Decodes Z85 text; throws KVMESH_BAD_REQUEST naming the problem (length, character, overflow). */
export function z85Decode(text: string): Buffer {
  if (text.length % 5 !== 0) throw badRequest(`Z85 text length must be a multiple of 5, got ${text.length}`);
  const out = Buffer.alloc((text.length / 5) * 4);
  for (let i = 0; i < text.length; i += 5) {
    let v = 0;
    for (let k = 0; k < 5; k++) {
      const code = text.charCodeAt(i + k);
      const d = code < 128 ? (Z85_DECODE[code] ?? -1) : -1;
      if (d < 0) throw badRequest(`invalid Z85 character ${JSON.stringify(text[i + k])} at position ${i + k}`);
      v = v * 85 + d;
    }
    // Five characters can spell up to 85^5 - 1 > 2^32 - 1: such text encodes no 4 bytes.
    if (v > 0xffff_ffff) throw badRequest(`Z85 group at position ${i} exceeds 32 bits`);
    out.writeUInt32BE(v, (i / 5) * 4);
  }
  return out;
}

/** Decodes a 40-character Z85 CURVE key to its 32 bytes; `what` names it in errors (KVMESH_BAD_REQUEST). */
export function decodeCurveKey(z85: string, what: string): Buffer {
  if (z85.length !== CURVE_KEY_Z85_CHARS) throw badRequest(`${what} must be ${CURVE_KEY_Z85_CHARS} Z85 characters, got ${z85.length}`, what);
  try {
    return z85Decode(z85);
  } catch (err) {
    throw badRequest(`${what} is not valid Z85: ${(err as Error).message}`, what);
  }
}

/** The public key (Z85) of a Z85 secret key: X25519(secret, 9), as crypto_box_keypair computes it. */
export function curvePublicKeyOf(secretZ85: string): string {
  const secret = decodeCurveKey(secretZ85, "secret key");
  const priv = createPrivateKey({ key: Buffer.concat([X25519_PKCS8_PREFIX, secret]), format: "der", type: "pkcs8" });
  const spki = createPublicKey(priv).export({ format: "der", type: "spki" });
  // Assertion (node:crypto's X25519 SPKI is fixed-size): never input.
  if (spki.length !== X25519_SPKI_BYTES) throw new Error(`unexpected X25519 SPKI length ${spki.length}`);
  return z85Encode(spki.subarray(spki.length - CURVE_KEY_BYTES));
}

/** A CURVE key pair whose secret never serialises (JSON, pino, util.inspect show the public key). */
export class MeshKeyPair {
  readonly publicKey: string;
  readonly #secretKey: string;

  private constructor(publicKey: string, secretKey: string) {
    this.publicKey = publicKey;
    this.#secretKey = secretKey;
  }

  /** A fresh pair from libzmq (libsodium's / tweetnacl's crypto_box_keypair). */
  static generate(): MeshKeyPair {
    const kp = curveKeyPair();
    return new MeshKeyPair(kp.publicKey, kp.secretKey);
  }

  /** The pair of a Z85 secret key (throws KVMESH_BAD_REQUEST on malformed text). */
  static fromSecretKey(secretZ85: string): MeshKeyPair {
    return new MeshKeyPair(curvePublicKeyOf(secretZ85), secretZ85);
  }

  /** For socket options only: never log or return this. */
  get secretKey(): string {
    return this.#secretKey;
  }

  toJSON(): { publicKey: string; secretKey: string } {
    return { publicKey: this.publicKey, secretKey: "[redacted]" };
  }

  [inspect.custom](): string {
    return `MeshKeyPair { publicKey: '${this.publicKey}', secretKey: [redacted] }`;
  }
}

/** What a CURVE mesh needs: this replica's pair and the public keys it accepts (and connects to). */
export interface MeshCurveConfig {
  readonly keyPair: MeshKeyPair;
  /** Z85 public keys, deduplicated, at most MAX_MESH_ALLOW_KEYS. */
  readonly allow: readonly string[];
  /** Non-fatal findings while loading (e.g. a group-readable key file), logged at startup. */
  readonly warnings: readonly string[];
}

/** Text of a `PREFIX.key` file. */
export function secretKeyFileText(kp: MeshKeyPair): string {
  return `${SECRET_KEY_FILE_MARKER} (CURVE, Z85). Keep it private (mode 0600); never list it in --mesh-allow.\n# public key: ${kp.publicKey}\n${kp.secretKey}\n`;
}

/** Text of a `PREFIX.pub` file. */
export function publicKeyFileText(kp: MeshKeyPair): string {
  return `# kvmesh mesh public key (CURVE, Z85): list this file in the --mesh-allow of every replica that should accept this one.\n${kp.publicKey}\n`;
}

/** Loads `--mesh-key FILE` (permission rules of src/util/secret-file.ts); `field` names the flag in errors. */
export function loadMeshKeyFile(file: string, field = "--mesh-key"): { keyPair: MeshKeyPair; warnings: readonly string[] } {
  const { text, warnings } = readSecretFile(file, field);
  const lines = contentLines(text);
  if (lines.length !== 1) throw fileError(field, file, `expected one Z85 secret key line, found ${lines.length} (generate one with kvmesh keys generate)`);
  try {
    return { keyPair: MeshKeyPair.fromSecretKey(lines[0] as string), warnings };
  } catch (err) {
    throw fileError(field, file, (err as Error).message, err);
  }
}

/** Loads the public keys of `--mesh-allow FILE[,FILE...]` (each file one or more Z85 lines). */
export function loadAllowFiles(files: readonly string[], field = "--mesh-allow"): string[] {
  if (files.length === 0) throw new KvmeshError("KVMESH_BAD_REQUEST", `${field}: no files given`, { details: { field } });
  const keys = new Set<string>();
  for (const file of files) {
    const text = readSmallTextFile(file, field);
    if (text.startsWith(SECRET_KEY_FILE_MARKER)) throw fileError(field, file, "is a secret key file: list the peers' .pub files, never a .key");
    const lines = contentLines(text);
    if (lines.length === 0) throw fileError(field, file, "lists no public key");
    for (const [i, line] of lines.entries()) {
      try {
        decodeCurveKey(line, `public key ${i + 1}`);
      } catch (err) {
        throw fileError(field, file, (err as Error).message, err);
      }
      keys.add(line);
    }
  }
  if (keys.size > MAX_MESH_ALLOW_KEYS) throw new KvmeshError("KVMESH_BAD_REQUEST", `${field}: ${keys.size} keys, more than ${MAX_MESH_ALLOW_KEYS}`, { details: { field } });
  return [...keys];
}

/** Loads `--mesh-key` and `--mesh-allow` into a MeshCurveConfig (labels name the flags in errors). */
export function loadMeshCurveConfig(
  files: { readonly keyFile: string; readonly allowFiles: readonly string[] },
  labels: { readonly key?: string; readonly allow?: string } = {},
): MeshCurveConfig {
  const { keyPair, warnings } = loadMeshKeyFile(files.keyFile, labels.key);
  const allow = loadAllowFiles(files.allowFiles, labels.allow);
  return { keyPair, allow, warnings };
}
