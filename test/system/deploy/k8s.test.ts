/**
 * deploy/k8s renders (`kubectl kustomize`, offline) into what a fleet needs, and the container's
 * args are ones `kvmesh serve` accepts and maps to the intended config: a renamed flag, a probe on
 * a route that does not exist, or a manifest edit that drops the DNS peers, CURVE, the token or
 * the drain fails here rather than in a cluster. Skipped, saying why, without kubectl.
 */
import { execFileSync } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";

import { writeKeyPair } from "../../../cli/keys.js";
import type { DaemonConfig } from "../../../src/app/daemon.js";
import { parseWorkersFile } from "../../../src/app/workers-file.js";
import { startTestServer } from "../../helpers/http-client.js";
import { serveInProcess } from "../../helpers/serve-in-process.js";

const BASE = fileURLToPath(new URL("../../../deploy/k8s", import.meta.url));

function kubectlMissing(): string | null {
  try {
    execFileSync("kubectl", ["version", "--client"], { stdio: "ignore" });
    return null;
  } catch (err) {
    return err instanceof Error ? err.message.split("\n")[0] ?? "kubectl failed" : String(err);
  }
}
const missing = kubectlMissing();
if (missing !== null) console.warn(`deploy/k8s test skipped: kubectl is not available (${missing})`);

// The parts of the rendered manifests these tests read (the YAML is not checked against them).
type Labels = Record<string, string>;
interface Doc {
  kind: string;
  metadata: { name: string };
}
interface Probe {
  httpGet: { path: string; port: string };
  periodSeconds: number;
  failureThreshold: number;
}
interface Container {
  args: string[];
  ports: { name: string; containerPort: number }[];
  volumeMounts: { name: string; mountPath: string }[];
  readinessProbe: Probe;
  livenessProbe: Probe;
  lifecycle: { preStop: { exec: { command: string[] } } };
}
interface Volume {
  name: string;
  configMap?: { name: string };
  secret?: { secretName: string; defaultMode: number };
}
interface StatefulSet extends Doc {
  spec: {
    serviceName: string;
    selector: { matchLabels: Labels };
    template: {
      metadata: { labels: Labels; annotations: Labels };
      spec: { containers: Container[]; volumes: Volume[]; terminationGracePeriodSeconds: number };
    };
  };
}
interface Service extends Doc {
  spec: { type?: string; selector: Labels; ports: { name: string; port: number; targetPort: string }[] };
}
interface Pdb extends Doc {
  spec: { selector: { matchLabels: Labels } };
}
interface ConfigMap extends Doc {
  data: Record<string, string>;
}

/** The rendered manifests, parsed. */
function render(): Doc[] {
  const text = execFileSync("kubectl", ["kustomize", BASE], { encoding: "utf8" });
  return parseAllDocuments(text).map((d) => d.toJS() as Doc);
}
function find(docs: Doc[], kind: string, name: string): Doc {
  const d = docs.find((x) => x.kind === kind && x.metadata.name === name);
  if (d === undefined) throw new Error(`no ${kind}/${name} in the rendered base`);
  return d;
}
const container = (sts: StatefulSet): Container => sts.spec.template.spec.containers[0] as Container;

/** Where each mount of the container is, in the temp dir standing in for the pod's filesystem. */
const pod = mkdtempSync(join(tmpdir(), "kvmesh-k8s-"));
afterAll(() => {
  rmSync(pod, { recursive: true, force: true });
});

/**
 * Fills the mounts the container expects with what its Secrets and ConfigMap hold (a generated key
 * pair, a token with the mode the kubelet gives it, the ConfigMap's workers file) and returns the
 * args with the kubelet's substitutions and the mount paths moved under the temp dir.
 */
function podArgs(sts: StatefulSet, configMap: ConfigMap): string[] {
  const c = container(sts);
  const sources = new Map(sts.spec.template.spec.volumes.map((v) => [v.name, v]));
  const mounts: [string, string][] = [];
  for (const m of c.volumeMounts) {
    const dir = join(pod, m.name);
    mkdirSync(dir, { recursive: true });
    mounts.push([m.mountPath, dir]);
    const v = sources.get(m.name);
    if (v?.configMap?.name === configMap.metadata.name) for (const [k, text] of Object.entries(configMap.data)) writeFileSync(join(dir, k), text);
    if (v?.secret?.secretName === "kvmesh-mesh-key") writeKeyPair(join(dir, "mesh"), { force: true });
    if (v?.secret?.secretName === "kvmesh-api-token") writeFileSync(join(dir, "token"), "t".repeat(32) + "\n");
    // The kubelet's mode for a Secret volume (defaultMode, group fsGroup).
    const mode = v?.secret?.defaultMode;
    if (mode !== undefined) for (const f of readdirSync(dir)) chmodSync(join(dir, f), mode);
  }
  const env: Record<string, string> = { POD_IP: "10.1.2.3", POD_NAMESPACE: "prod", POD_NAME: "kvmesh-0" };
  return c.args.map((a) => {
    let out = a.replace(/\$\((\w+)\)/g, (_, k: string) => env[k] ?? `$(${k})`);
    for (const [mountPath, dir] of mounts) out = out.replace(`=${mountPath}/`, `=${dir}/`);
    return out;
  });
}

/** `kvmesh serve ...args` (args after "serve") through the real parser with a fake daemon; the config it got. */
async function serveConfig(args: string[]): Promise<DaemonConfig> {
  const r = await serveInProcess(args);
  expect(r.err).toBe("");
  if (r.config === undefined) throw new Error(`kvmesh refused the manifest's args: ${r.err}`);
  return r.config;
}

describe.skipIf(missing !== null)("deploy/k8s", () => {
  it("renders a StatefulSet, a headless mesh Service, a ClusterIP API Service, a PodDisruptionBudget and the workers ConfigMap", () => {
    const docs = render();
    expect(docs.map((d) => `${d.kind}/${d.metadata.name}`).sort()).toEqual(["ConfigMap/kvmesh-workers", "PodDisruptionBudget/kvmesh", "Service/kvmesh", "Service/kvmesh-mesh", "StatefulSet/kvmesh"]);
    const sts = find(docs, "StatefulSet", "kvmesh") as StatefulSet;
    // Stable pod names under the headless Service; all start at once (readiness needs workers and peers).
    expect(sts.spec).toMatchObject({ serviceName: "kvmesh-mesh", podManagementPolicy: "Parallel", updateStrategy: { type: "RollingUpdate" } });
    const mesh = find(docs, "Service", "kvmesh-mesh") as Service;
    // Headless, and listing pods before they are ready: a new replica must peer to become ready.
    expect(mesh.spec).toMatchObject({ clusterIP: "None", publishNotReadyAddresses: true });
    const api = find(docs, "Service", "kvmesh") as Service;
    expect(api.spec.type).toBe("ClusterIP");
    expect(api.spec.ports).toEqual([{ name: "http", port: 8092, targetPort: "http" }]);
    const pdb = find(docs, "PodDisruptionBudget", "kvmesh") as Pdb;
    expect(pdb.spec).toMatchObject({ maxUnavailable: 1, unhealthyPodEvictionPolicy: "AlwaysAllow" });
    // Every selector picks the StatefulSet's pods.
    const labels = sts.spec.template.metadata.labels;
    for (const sel of [sts.spec.selector.matchLabels, mesh.spec.selector, api.spec.selector, pdb.spec.selector.matchLabels]) {
      for (const [k, v] of Object.entries(sel)) expect(labels[k], k).toBe(v);
    }
  });

  it("gives kvmesh serve args it accepts: DNS peers on the headless Service, the pod IP advertised, CURVE and the token from Secrets, the workers from the ConfigMap", async () => {
    const docs = render();
    const sts = find(docs, "StatefulSet", "kvmesh") as StatefulSet;
    const configMap = find(docs, "ConfigMap", "kvmesh-workers") as ConfigMap;
    const args = podArgs(sts, configMap);
    expect(args[0]).toBe("serve");
    const config = await serveConfig(args.slice(1));
    expect(config).toMatchObject({
      host: "0.0.0.0",
      port: 8092,
      replicaSyncPort: 7100,
      replicaSyncAdvertiseHost: "10.1.2.3",
      peers: ["dns:kvmesh-mesh.prod.svc.cluster.local:7100"],
      peerDnsIntervalSecs: 5,
      meshInsecure: false,
      drainSecs: 5,
      meshStartupSyncSecs: 10,
      workersFile: join(pod, "workers", "workers.yaml"),
    });
    // CURVE on, with the fleet's one key pair as its own allow list; the token is loaded.
    expect(config.meshCurve?.allow).toEqual([config.meshCurve?.keyPair.publicKey]);
    expect(config.apiToken).toBeDefined();
    // The ConfigMap's workers file is one the daemon accepts.
    expect(parseWorkersFile("workers.yaml", configMap.data["workers.yaml"] ?? "")).toEqual([]);
    // The Secrets the pod mounts are the ones README (Run it on Kubernetes) says to create.
    const secrets = sts.spec.template.spec.volumes.flatMap((v) => (v.secret === undefined ? [] : [v.secret.secretName]));
    expect(secrets.sort()).toEqual(["kvmesh-api-token", "kvmesh-mesh-key"]);
    // The mesh Service's ports are the ones the mesh binds (--replica-sync-port and the next).
    expect((find(docs, "Service", "kvmesh-mesh") as Service).spec.ports.map((p) => p.port)).toEqual([7100, 7101]);
  });

  it("probes and scrapes routes the daemon serves, on its port, and drains within the termination grace", async () => {
    const sts = find(render(), "StatefulSet", "kvmesh") as StatefulSet;
    const c = container(sts);
    const flag = (name: string): string | undefined => c.args.find((a) => a.startsWith(`--${name}=`))?.split("=")[1];
    const httpPort = Number(flag("port"));
    expect(c.readinessProbe.httpGet).toEqual({ path: "/ready", port: "http" });
    expect(c.livenessProbe.httpGet).toEqual({ path: "/health", port: "http" });
    expect(c.ports.find((p) => p.name === "http")?.containerPort).toBe(httpPort);
    const annotations = sts.spec.template.metadata.annotations;
    expect(annotations).toMatchObject({ "prometheus.io/scrape": "true", "prometheus.io/port": String(httpPort), "prometheus.io/path": "/metrics" });
    // The routes answer (200 or 503, not 404 or 405) on a real server, without a token.
    const server = await startTestServer();
    try {
      for (const path of [c.readinessProbe.httpGet.path, c.livenessProbe.httpGet.path, annotations["prometheus.io/path"] ?? ""]) {
        expect([200, 503], path).toContain((await server.call("GET", path)).status);
      }
    } finally {
      await server.close();
    }
    // preStop, then the drain, then the close (HTTP close grace 2 s, ~1 s more) fit in the grace;
    // and the readiness probe sees the drain's 503 well within the drain.
    const [sleep, preStopSecs] = c.lifecycle.preStop.exec.command;
    expect(sleep).toBe("sleep");
    const drainSecs = Number(flag("drain-secs"));
    expect(sts.spec.template.spec.terminationGracePeriodSeconds).toBeGreaterThan(Number(preStopSecs) + drainSecs + 3 + 10);
    expect(c.readinessProbe.periodSeconds * c.readinessProbe.failureThreshold).toBeLessThan(drainSecs);
  });
});
