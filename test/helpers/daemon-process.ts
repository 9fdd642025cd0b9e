/** Runs `kvmesh serve` as a real child process (from source, through tsx) for fault tests. */
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";

import { waitForListening } from "../../src/bench/listening.js";

const CLI = fileURLToPath(new URL("../../cli/main.ts", import.meta.url));

export interface DaemonProcess {
  readonly child: ChildProcess;
  readonly port: number;
  readonly url: string;
  /** Resolves with the exit code (or signal name) when the process ends. */
  readonly exited: Promise<number | string>;
}

export async function spawnDaemon(args: readonly string[], timeoutMs = 15_000): Promise<DaemonProcess> {
  const child = spawn(process.execPath, ["--import", "tsx", CLI, "serve", "--port", "0", "--log-level", "info", ...args], { stdio: ["ignore", "pipe", "pipe"] });
  const exited = new Promise<number | string>((resolve) => {
    child.on("exit", (code, signal) => {
      resolve(code ?? signal ?? "unknown");
    });
  });
  const port = await waitForListening(child, { label: "daemon", timeoutMs });
  return { child, port, url: `http://127.0.0.1:${port}`, exited };
}

export async function stopDaemon(d: DaemonProcess | undefined): Promise<void> {
  if (d === undefined || d.child.exitCode !== null || d.child.signalCode !== null) return;
  d.child.kill("SIGTERM");
  const t = setTimeout(() => d.child.kill("SIGKILL"), 3_000);
  await d.exited;
  clearTimeout(t);
}
