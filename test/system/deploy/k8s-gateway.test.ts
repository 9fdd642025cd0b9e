/**
 * deploy/k8s-gateway renders offline (`kubectl kustomize`) into the base fleet plus what makes it
 * an InferencePool's endpoint picker (#24): the InferencePool (inference.networking.k8s.io/v1)
 * whose endpointPickerRef names the kvmesh Service's ext_proc port, that port reaching the
 * container's --ext-proc-port, TLS from the Secret, health on 9003; and `kvmesh serve` accepts
 * the container's args. Skipped, saying why, without kubectl.
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";

import { writeKeyPair } from "../../../cli/keys.js";
import { serveInProcess } from "../../helpers/serve-in-process.js";

const OVERLAY = fileURLToPath(new URL("../../../deploy/k8s-gateway", import.meta.url));

function kubectlMissing(): string | null {
  try {
    execFileSync("kubectl", ["version", "--client"], { stdio: "ignore" });
    return null;
  } catch (err) {
    return err instanceof Error ? (err.message.split("\n")[0] ?? "kubectl failed") : String(err);
  }
}
const missing = kubectlMissing();
if (missing !== null) console.warn(`deploy/k8s-gateway test skipped: kubectl is not available (${missing})`);

interface Doc {
  apiVersion: string;
  kind: string;
  metadata: { name: string };
  spec: Record<string, unknown>;
}
interface Container {
  args: string[];
  ports: { name: string; containerPort: number }[];
  volumeMounts: { name: string; mountPath: string }[];
}
interface Volume {
  name: string;
  configMap?: { name: string };
  secret?: { secretName: string; defaultMode: number };
}
interface Pool {
  selector: { matchLabels: Record<string, string> };
  targetPorts: { number: number }[];
  endpointPickerRef: { name: string; kind?: string; port: { number: number }; failureMode?: string };
}

const render = (): Doc[] => parseAllDocuments(execFileSync("kubectl", ["kustomize", OVERLAY], { encoding: "utf8" })).map((d) => d.toJS() as Doc);
const find = (docs: Doc[], kind: string, name: string): Doc => {
  const d = docs.find((x) => x.kind === kind && x.metadata.name === name);
  if (d === undefined) throw new Error(`no ${kind}/${name} in the rendered overlay`);
  return d;
};
const podSpec = (sts: Doc): { containers: Container[]; volumes: Volume[] } => (sts.spec["template"] as { spec: { containers: Container[]; volumes: Volume[] } }).spec;

const pod = mkdtempSync(join(tmpdir(), "kvmesh-k8s-gateway-"));
afterAll(() => {
  rmSync(pod, { recursive: true, force: true });
});

describe.skipIf(missing !== null)("deploy/k8s-gateway", () => {
  it("renders the base fleet and an InferencePool whose endpoint picker is the kvmesh Service's ext_proc port", () => {
    const docs = render();
    expect(docs.map((d) => `${d.kind}/${d.metadata.name}`).sort()).toEqual([
      "ConfigMap/kvmesh-workers",
      "InferencePool/kvmesh-pool",
      "PodDisruptionBudget/kvmesh",
      "Service/kvmesh",
      "Service/kvmesh-mesh",
      "StatefulSet/kvmesh",
    ]);
    const poolDoc = find(docs, "InferencePool", "kvmesh-pool");
    expect(poolDoc.apiVersion).toBe("inference.networking.k8s.io/v1");
    const pool = poolDoc.spec as unknown as Pool;
    expect(Object.keys(pool.selector.matchLabels).length).toBeGreaterThan(0);
    expect(pool.targetPorts.length).toBeGreaterThanOrEqual(1);
    expect(pool.endpointPickerRef.failureMode).toBe("FailClose");
    // The ref names a Service port, which reaches the container's ext_proc port, which is --ext-proc-port.
    const svc = find(docs, pool.endpointPickerRef.kind ?? "Service", pool.endpointPickerRef.name);
    const port = (svc.spec["ports"] as { name: string; port: number; targetPort: string; appProtocol?: string }[]).find((p) => p.port === pool.endpointPickerRef.port.number);
    expect(port).toMatchObject({ targetPort: "ext-proc", appProtocol: "http2" });
    const c = podSpec(find(docs, "StatefulSet", "kvmesh")).containers[0] as Container;
    const containerPort = c.ports.find((p) => p.name === port?.targetPort)?.containerPort;
    expect(c.args).toContain(`--ext-proc-port=${String(containerPort)}`);
    expect(c.args).toContain(`--ext-proc-health-port=${String(c.ports.find((p) => p.name === "grpc-health")?.containerPort)}`);
    // The base's mesh stays as it was: CURVE and DNS peers.
    expect(c.args.some((a) => a.startsWith("--mesh-key="))).toBe(true);
    expect(c.args.some((a) => a.startsWith("--peers=dns:"))).toBe(true);
  });

  it("gives kvmesh serve args it accepts: ext_proc over TLS from the Secret's files, health on its own port", async () => {
    const docs = render();
    const sts = find(docs, "StatefulSet", "kvmesh");
    const spec = podSpec(sts);
    const c = spec.containers[0] as Container;
    const sources = new Map(spec.volumes.map((v) => [v.name, v]));
    const configMap = find(docs, "ConfigMap", "kvmesh-workers") as unknown as { data: Record<string, string> };
    const mounts: [string, string][] = [];
    for (const m of c.volumeMounts) {
      const dir = join(pod, m.name);
      mkdirSync(dir, { recursive: true });
      mounts.push([m.mountPath, dir]);
      const v = sources.get(m.name);
      if (v?.configMap !== undefined) for (const [k, text] of Object.entries(configMap.data)) writeFileSync(join(dir, k), text);
      if (v?.secret?.secretName === "kvmesh-mesh-key") writeKeyPair(join(dir, "mesh"), { force: true });
      if (v?.secret?.secretName === "kvmesh-api-token") writeFileSync(join(dir, "token"), "t".repeat(32) + "\n", { mode: 0o600 });
      if (v?.secret?.secretName === "kvmesh-ext-proc-tls") {
        writeFileSync(join(dir, "tls.crt"), "certificate\n");
        writeFileSync(join(dir, "tls.key"), "key\n", { mode: 0o600 });
      }
    }
    const env: Record<string, string> = { POD_IP: "10.1.2.3", POD_NAMESPACE: "prod", POD_NAME: "kvmesh-0" };
    const args = c.args.map((a) => {
      let out = a.replace(/\$\((\w+)\)/g, (_, k: string) => env[k] ?? `$(${k})`);
      for (const [mountPath, dir] of mounts) out = out.replace(`=${mountPath}/`, `=${dir}/`);
      return out;
    });
    const r = await serveInProcess(args.slice(1));
    expect(r.err).toBe("");
    expect(r.config).toMatchObject({
      extProcPort: 9002,
      extProcHealthPort: 9003,
      extProcTlsCertFile: join(pod, "ext-proc-tls", "tls.crt"),
      extProcTlsKeyFile: join(pod, "ext-proc-tls", "tls.key"),
      replicaSyncPort: 7100,
    });
  });
});
