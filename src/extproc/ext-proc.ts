/**
 * The endpoint picker, assembled: picker + stream context + health + gRPC server, with its
 * metrics on the daemon's registry. src/app/daemon.ts calls startEndpointPicker when --ext-proc-port
 * is given; tests call it directly with fakes for the tokenizer and the resolver.
 */
import { readFileSync } from "node:fs";

import type { Logger } from "pino";

import { systemClock, type Clock } from "../core/index.js";
import type { SelectionService } from "../core/index.js";
import type { MetricsRegistry } from "../metrics/registry.js";
import { registerExtProcMetrics } from "../metrics/extproc-metrics.js";
import type { PromptTokenizer } from "../tokenize/contract.js";
import { EndpointPicker, parseOpenAIBody, type OpenAIBodyParser } from "./endpoint-picker.js";
import { startExtProcServer, type RunningExtProcServer } from "./ext-proc-server.js";
import { ExtProcStats } from "./ext-proc-stats.js";
import { DEFAULT_DP_RANK_PORT_STRIDE, DEFAULT_EXT_PROC_CONNECTION_WINDOW_BYTES, DEFAULT_EXT_PROC_MAX_BODY_BYTES, DEFAULT_EXT_PROC_STREAM_WINDOW_BYTES, DEFAULT_ROUTING_GROUP_HEADER, DEFAULT_SESSION_HEADER, type TokenizerFailure } from "./defaults.js";
import { PickerHealth, type HealthSource } from "./health.js";
import { systemResolver, WorkerEndpoints, type HostResolver } from "./worker-endpoints.js";

export * from "./defaults.js";
export type { RunningExtProcServer } from "./ext-proc-server.js";


export interface EndpointPickerConfig {
  readonly host: string;
  readonly port: number;
  /** PEM files; both or neither (cleartext). */
  readonly tlsCertFile?: string | undefined;
  readonly tlsKeyFile?: string | undefined;
  readonly healthPort?: number | undefined;
  readonly maxBodyBytes?: number | undefined;
  /** HTTP/2 receive windows, bytes (defaults.ts). */
  readonly streamWindowBytes?: number | undefined;
  readonly connectionWindowBytes?: number | undefined;
  readonly sessionHeader?: string | undefined;
  readonly routingGroupHeader?: string | undefined;
  readonly tokenizerFailure?: TokenizerFailure | undefined;
  readonly dpRankPortStride?: number | undefined;
  readonly fallbacks?: number | undefined;
}

export interface EndpointPickerDeps {
  readonly service: SelectionService;
  readonly health: HealthSource;
  readonly logger: Logger;
  readonly registry?: MetricsRegistry | undefined;
  readonly tokenizer?: PromptTokenizer | undefined;
  readonly parseBody?: OpenAIBodyParser | undefined;
  readonly resolve?: HostResolver | undefined;
  readonly clock?: Clock | undefined;
  readonly healthWatchIntervalMs?: number | undefined;
}

export interface RunningEndpointPicker extends RunningExtProcServer {
  readonly stats: ExtProcStats;
}

export async function startEndpointPicker(config: EndpointPickerConfig, deps: EndpointPickerDeps): Promise<RunningEndpointPicker> {
  const stats = new ExtProcStats();
  if (deps.registry !== undefined) registerExtProcMetrics(deps.registry, stats);
  const logger = deps.logger;
  const endpoints = new WorkerEndpoints({ resolve: deps.resolve ?? systemResolver, clock: deps.clock ?? systemClock, rankPortStride: config.dpRankPortStride ?? DEFAULT_DP_RANK_PORT_STRIDE });
  const picker = new EndpointPicker({
    service: deps.service,
    endpoints,
    parseBody: deps.parseBody ?? parseOpenAIBody,
    tokenizer: deps.tokenizer,
    sessionHeader: (config.sessionHeader ?? DEFAULT_SESSION_HEADER).toLowerCase(),
    routingGroupHeader: (config.routingGroupHeader ?? DEFAULT_ROUTING_GROUP_HEADER).toLowerCase(),
    rejectOnTokenizeFailure: config.tokenizerFailure === "reject",
    ...(config.fallbacks === undefined ? {} : { fallbacks: config.fallbacks }),
    stats,
    logger,
  });
  const tls =
    config.tlsCertFile === undefined || config.tlsKeyFile === undefined ? undefined : { certChain: readFileSync(config.tlsCertFile), privateKey: readFileSync(config.tlsKeyFile) };
  const server = await startExtProcServer({
    host: config.host,
    port: config.port,
    tls,
    healthPort: config.healthPort,
    receiveWindows: { streamBytes: config.streamWindowBytes ?? DEFAULT_EXT_PROC_STREAM_WINDOW_BYTES, connectionBytes: config.connectionWindowBytes ?? DEFAULT_EXT_PROC_CONNECTION_WINDOW_BYTES },
    context: { picker, service: deps.service, stats, logger, clock: deps.clock ?? systemClock, maxBodyBytes: config.maxBodyBytes ?? DEFAULT_EXT_PROC_MAX_BODY_BYTES },
    health: new PickerHealth(deps.health, deps.healthWatchIntervalMs),
    logger,
  });
  return {
    port: server.port,
    healthPort: server.healthPort,
    get openStreams() {
      return server.openStreams;
    },
    close: () => server.close(),
    stats,
  };
}
