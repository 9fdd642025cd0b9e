/**
 * bench:scale --curve: one CURVE key pair per replica, written as `kvmesh keys generate` would
 * (PREFIX.key mode 0600, PREFIX.pub), and one allow file listing every public key, so every
 * replica accepts and dials every other one, as a Kubernetes StatefulSet sharing one allow list.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { writeKeyPair } from "../../cli/keys.js";
import { MeshKeyPair, publicKeyFileText, type MeshCurveConfig } from "../../mesh/curve.js";

export interface BenchCurveKeys {
  /** `--mesh-key FILE --mesh-allow FILE` for replica `index`. */
  serveArgsOf(index: number): string[];
  /** Replica `index`'s pair and the shared allow list, for an in-process transport (the stress fake origin). */
  config(index: number): MeshCurveConfig;
  /** Removes the key files. */
  remove(): void;
}

export function writeBenchCurveKeys(count: number): BenchCurveKeys {
  const dir = mkdtempSync(join(tmpdir(), "kvmesh-bench-curve-"));
  const pairs = Array.from({ length: count }, () => MeshKeyPair.generate());
  const allowFile = join(dir, "fleet.pub");
  writeFileSync(allowFile, pairs.map((kp) => publicKeyFileText(kp)).join(""));
  const keyFiles = pairs.map((kp, i) => writeKeyPair(join(dir, `replica-${i}`), {}, kp).keyFile);
  const pairAt = (index: number): MeshKeyPair => {
    const kp = pairs[index];
    if (kp === undefined) throw new RangeError(`no CURVE key for replica ${index} of ${count}`);
    return kp;
  };
  return {
    serveArgsOf: (index) => {
      pairAt(index);
      return ["--mesh-key", keyFiles[index] as string, "--mesh-allow", allowFile];
    },
    config: (index) => ({ keyPair: pairAt(index), allow: pairs.map((kp) => kp.publicKey), warnings: [] }),
    remove: () => {
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
