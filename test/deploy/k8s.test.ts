/**
 * deploy/k8s renders (`kubectl kustomize`, offline) into what a fleet needs, and the container's
 * args are ones `kvmesh serve` accepts and maps to the intended config: a renamed flag, or a
 * manifest edit that drops the DNS peers or the drain, fails here rather than in a cluster.
 */
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

import type { DaemonConfig } from "../../src/daemon.js";
import { serveInProcess } from "../helpers/serve-in-process.js";

const BASE = fileURLToPath(new URL("../../deploy/k8s", import.meta.url));

function kubectl(): boolean {
  try {
    execFileSync("kubectl", ["version", "--client"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

/** The rendered manifests, split into documents. */
function render(): string[] {
  return execFileSync("kubectl", ["kustomize", BASE], { encoding: "utf8" }).split(/^---$/m);
}

/** The container's args: the `- args:` list of the Deployment, as rendered. */
function containerArgs(deployment: string): string[] {
  const lines = deployment.split("\n");
  const start = lines.findIndex((l) => /^\s+- args:$/.test(l));
  expect(start, "the Deployment has container args").toBeGreaterThan(0);
  const out: string[] = [];
  for (const l of lines.slice(start + 1)) {
    const m = /^\s+- (.+)$/.exec(l);
    if (m === null || /^\s+- name:/.test(l)) break;
    out.push(m[1] as string);
  }
  return out;
}

/** `kvmesh serve ...args` (args after "serve") through the real parser with a fake daemon; the config it got. */
async function serveConfig(args: string[]): Promise<DaemonConfig> {
  const r = await serveInProcess(args);
  expect(r.err).toBe("");
  if (r.config === undefined) throw new Error(`kvmesh refused the manifest's args: ${r.err}`);
  return r.config;
}

describe.skipIf(!kubectl())("deploy/k8s", () => {
  it("renders a Deployment, its Services and a PodDisruptionBudget, wired for discovery and draining", () => {
    const docs = render();
    const kinds = docs.map((d) => `${/^kind: (\S+)$/m.exec(d)?.[1]}/${/^ {2}name: (\S+)$/m.exec(d)?.[1]}`).sort();
    expect(kinds).toEqual(["ConfigMap/kvmesh-workers", "Deployment/kvmesh", "PodDisruptionBudget/kvmesh", "Service/kvmesh", "Service/kvmesh-mesh"]);
    const mesh = docs.find((d) => d.includes("name: kvmesh-mesh")) ?? "";
    // Headless, and listing pods before they are ready: a new replica must peer to become ready.
    expect(mesh).toMatch(/clusterIP: None/);
    expect(mesh).toMatch(/publishNotReadyAddresses: true/);
    const deployment = docs.find((d) => d.includes("kind: Deployment")) ?? "";
    expect(deployment).toMatch(/readinessProbe:\n\s+failureThreshold: 1\n\s+httpGet:\n\s+path: \/ready/);
    expect(deployment).toMatch(/livenessProbe:[\s\S]*path: \/health/);
    expect(deployment).toMatch(/fieldPath: status.podIP/);
    const grace = Number(/terminationGracePeriodSeconds: (\d+)/.exec(deployment)?.[1]);
    const drain = Number(/--drain-secs=(\d+)/.exec(deployment)?.[1]);
    expect(grace).toBeGreaterThan(drain + 10);
  });

  it("gives kvmesh serve args it accepts: DNS peers on the headless Service, the pod IP advertised, a drain window", async () => {
    const deployment = render().find((d) => d.includes("kind: Deployment")) ?? "";
    // What the kubelet substitutes from the env (downward API).
    const args = containerArgs(deployment).map((a) => a.replace("$(POD_IP)", "10.1.2.3").replace("$(POD_NAMESPACE)", "prod"));
    expect(args[0]).toBe("serve");
    const config = await serveConfig(args.slice(1));
    expect(config).toMatchObject({
      host: "0.0.0.0",
      port: 8092,
      replicaSyncPort: 7100,
      replicaSyncAdvertiseHost: "10.1.2.3",
      peers: ["dns:kvmesh-mesh.prod.svc.cluster.local:7100"],
      peerDnsIntervalSecs: 5,
      meshInsecure: true,
      drainSecs: 5,
      workersFile: "/etc/kvmesh/workers.yaml",
    });
    // The file is the mounted ConfigMap's key.
    expect(deployment).toMatch(/mountPath: \/etc\/kvmesh/);
  });
});
