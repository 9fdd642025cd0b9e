/** A picker on loopback over an in-process SelectionService, and the Envoy-playing client for it. */
import { pino } from "pino";

import { ManualClock } from "../../src/core/index.js";
import { seededRandom } from "../../src/core/index.js";
import { SelectionService, type SelectionServiceOptions } from "../../src/core/index.js";
import type { WorkerRequest } from "../../src/core/index.js";
import { startEndpointPicker, type EndpointPickerConfig, type EndpointPickerDeps, type RunningEndpointPicker } from "../../src/extproc/ext-proc.js";
import { createMetricsRegistry, type MetricsRegistry } from "../../src/metrics/registry.js";
import { EnvoyClient } from "./envoy-client.js";

export const BLOCK = 4;

export interface Harness {
  readonly svc: SelectionService;
  readonly picker: RunningEndpointPicker;
  readonly client: EnvoyClient;
  readonly registry: MetricsRegistry;
  ready: boolean;
  close(): Promise<void>;
}

export function worker(id: number, endpoint: string, extra: Partial<WorkerRequest> = {}): WorkerRequest {
  return { worker_id: BigInt(id), endpoint, block_size: BLOCK, ...extra };
}

export async function startHarness(
  o: { service?: SelectionServiceOptions; config?: Partial<EndpointPickerConfig>; deps?: Partial<EndpointPickerDeps> } = {},
): Promise<Harness> {
  const svc = new SelectionService({ clock: new ManualClock(1_000), random: seededRandom(3), replicaId: 5n, wallClockNs: () => 1_000n, ...o.service });
  const registry = createMetricsRegistry();
  const h: { ready: boolean } = { ready: true };
  const picker = await startEndpointPicker(
    { host: "127.0.0.1", port: 0, ...o.config },
    {
      service: svc,
      health: { ready: () => h.ready && svc.ready().ready, closing: () => svc.shuttingDown },
      logger: pino({ level: "silent" }),
      registry,
      healthWatchIntervalMs: 20,
      ...o.deps,
    },
  );
  const client = new EnvoyClient(`127.0.0.1:${picker.port}`);
  return Object.assign(h, {
    svc,
    picker,
    client,
    registry,
    async close(): Promise<void> {
      client.close();
      await picker.close();
    },
  });
}

/** A /v1/completions body whose prompt is token ids (no tokenizer needed). */
export const completionsBody = (ids: readonly number[], model = "m", extra: Record<string, unknown> = {}): Buffer => Buffer.from(JSON.stringify({ model, prompt: ids, max_tokens: 8, ...extra }));

export const ids = (blocks: number, seed = 0): number[] => Array.from({ length: blocks * BLOCK }, (_, i) => seed * 100_000 + i);

export const activeOn = (svc: SelectionService, workerId: number, model = "m"): number =>
  svc.loads(model).flatMap((m) => m.loads).filter((l) => l.worker_id === BigInt(workerId)).reduce((n, l) => n + l.active_requests, 0);
