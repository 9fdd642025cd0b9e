/**
 * The endpoint picker's gRPC server (@grpc/grpc-js): envoy.service.ext_proc.v3.ExternalProcessor
 * /Process and grpc.health.v1.Health on one port (cleartext HTTP/2, or TLS from a cert and key),
 * and optionally Health alone on a second, cleartext port (GIE's EPPs serve it on 9003).
 *
 * Each Process call is one ExtProcStream; its messages are handled one at a time, in order, and
 * the stream's end, cancellation or error frees its booking.
 */
import { Server, ServerCredentials, status as GrpcStatus, type sendUnaryData, type ServerDuplexStream, type ServerUnaryCall, type ServerWritableStream, type UntypedServiceImplementation } from "@grpc/grpc-js";
import type { Logger } from "pino";

import { ExtProcStream, type StreamContext } from "./ext-proc-stream.js";
import type { RejectReason } from "./ext-proc-stats.js";
import type { LogThrottle } from "../util/log-throttle.js";
import { PickerHealth } from "./health.js";
import { extProcServiceDefinition } from "./ext-proc-service.js";
import { applyReceiveWindows, type ReceiveWindows } from "./http2-windows.js";
import { HEALTH_SERVICE, serviceDefinition, type HealthCheckRequest, type HealthCheckResponse, type ProcessingRequest, type ProcessingResponse } from "./protos.js";

/** How long close() lets open streams finish before cancelling them, ms. */
export const EXT_PROC_CLOSE_GRACE_MS = 2_000;

export interface ExtProcTls {
  readonly certChain: Buffer;
  readonly privateKey: Buffer;
}

export interface ExtProcServerOptions {
  readonly host: string;
  readonly port: number;
  readonly tls?: ExtProcTls | undefined;
  /** Also serve Health alone, cleartext, on this port (0: ephemeral). */
  readonly healthPort?: number | undefined;
  /** HTTP/2 receive windows of the ext_proc port (http2-windows.ts); unset: Node's 64 KiB. */
  readonly receiveWindows?: ReceiveWindows | undefined;
  readonly context: Omit<StreamContext, "rejectLogs">;
  readonly health: PickerHealth;
  readonly logger: Logger;
}

export interface RunningExtProcServer {
  readonly port: number;
  readonly healthPort: number | undefined;
  /** Open Process streams now. */
  readonly openStreams: number;
  close(): Promise<void>;
}

const bindAddress = (host: string, port: number): string => `${host.includes(":") && !host.startsWith("[") ? `[${host}]` : host}:${port}`;

function bind(server: Server, address: string, credentials: ServerCredentials): Promise<number> {
  return new Promise((resolve, reject) => {
    server.bindAsync(address, credentials, (err, port) => {
      if (err !== null) reject(err);
      else resolve(port);
    });
  });
}

function healthHandlers(health: PickerHealth, watchers: Set<() => void>): UntypedServiceImplementation {
  return {
    Check(call: ServerUnaryCall<HealthCheckRequest, HealthCheckResponse>, callback: sendUnaryData<HealthCheckResponse>): void {
      const service = call.request.service ?? "";
      const status = health.statusOf(service);
      if (status === undefined) callback({ code: GrpcStatus.NOT_FOUND, details: `unknown service ${JSON.stringify(service)}` });
      else callback(null, { status });
    },
    Watch(call: ServerWritableStream<HealthCheckRequest, HealthCheckResponse>): void {
      const service = call.request.service ?? "";
      let last: string | undefined;
      const send = (): void => {
        const status = health.statusOf(service) ?? "SERVICE_UNKNOWN";
        if (status === last) return;
        last = status;
        call.write({ status });
      };
      send();
      const timer = setInterval(send, health.watchIntervalMs);
      const ender = (): void => {
        stop();
        call.end();
      };
      timer.unref();
      const stop = (): void => {
        clearInterval(timer);
        watchers.delete(ender);
      };
      // On server close: the watch ends (a shutdown waits for open calls).
      watchers.add(ender);
      call.on("cancelled", stop);
      call.on("close", stop);
      call.on("error", stop);
    },
  };
}

/**
 * Channelz off: kvmesh serves no channelz service, and with it on grpc-js times and counts every
 * message of every call (two listeners and a Date per message: ~16 per ext_proc stream).
 */
const SERVER_OPTIONS = { "grpc.enable_channelz": 0 } as const;

export async function startExtProcServer(options: ExtProcServerOptions): Promise<RunningExtProcServer> {
  const { logger } = options;
  const context: StreamContext = { ...options.context, rejectLogs: new Map<RejectReason, LogThrottle>() };
  const streams = new Set<ExtProcStream>();
  const watchers = new Set<() => void>();
  const server = new Server(SERVER_OPTIONS);
  server.addService(extProcServiceDefinition(), {
    Process(call: ServerDuplexStream<ProcessingRequest, ProcessingResponse>): void {
      const stream = new ExtProcStream(context);
      streams.add(stream);
      let chain = Promise.resolve();
      const finish = (how: "end_of_stream" | "cancelled" | "error"): void => {
        stream.close(how);
        streams.delete(stream);
      };
      call.on("data", (req: ProcessingRequest) => {
        chain = chain
          .then(async () => {
            const out = await stream.handle(req);
            if (call.cancelled) return;
            for (const m of out) call.write(m);
          })
          .catch((err: unknown) => {
            logger.error({ err }, "ext_proc stream handler failed");
            finish("error");
            call.destroy(err instanceof Error ? err : new Error(String(err)));
          });
      });
      call.on("end", () => {
        void chain.then(() => {
          finish("end_of_stream");
          if (!call.cancelled) call.end();
        });
      });
      call.on("cancelled", () => {
        finish("cancelled");
      });
      call.on("error", () => {
        finish("error");
      });
    },
  });
  server.addService(serviceDefinition(HEALTH_SERVICE), healthHandlers(options.health, watchers));
  const credentials = options.tls === undefined ? ServerCredentials.createInsecure() : ServerCredentials.createSsl(null, [{ cert_chain: options.tls.certChain, private_key: options.tls.privateKey }], false);
  const port = await bind(server, bindAddress(options.host, options.port), credentials);
  if (options.receiveWindows !== undefined) {
    try {
      applyReceiveWindows(server, options.receiveWindows, (err) => {
        logger.warn({ err }, "an ext_proc connection refused the connection receive window: it keeps Node's 64 KiB");
      });
    } catch (err) {
      server.forceShutdown();
      throw err;
    }
  }

  let healthServer: Server | undefined;
  let healthPort: number | undefined;
  if (options.healthPort !== undefined) {
    healthServer = new Server(SERVER_OPTIONS);
    healthServer.addService(serviceDefinition(HEALTH_SERVICE), healthHandlers(options.health, watchers));
    try {
      healthPort = await bind(healthServer, bindAddress(options.host, options.healthPort), ServerCredentials.createInsecure());
    } catch (err) {
      server.forceShutdown();
      throw err;
    }
  }
  logger.info(
    { port, tls: options.tls !== undefined, health_port: healthPort ?? null, stream_window_bytes: options.receiveWindows?.streamBytes ?? null, connection_window_bytes: options.receiveWindows?.connectionBytes ?? null },
    "ext_proc endpoint picker listening",
  );

  const shutdown = (s: Server): Promise<void> =>
    new Promise((resolve) => {
      const t = setTimeout(() => {
        s.forceShutdown();
        resolve();
      }, EXT_PROC_CLOSE_GRACE_MS);
      t.unref();
      s.tryShutdown(() => {
        clearTimeout(t);
        resolve();
      });
    });

  let closing: Promise<void> | undefined;
  return {
    port,
    healthPort,
    get openStreams() {
      return streams.size;
    },
    close(): Promise<void> {
      closing ??= (async () => {
        for (const stop of [...watchers]) stop();
        await Promise.all([shutdown(server), healthServer === undefined ? Promise.resolve() : shutdown(healthServer)]);
        // Streams cut by the shutdown free their bookings here, if grpc-js did not report them.
        for (const s of streams) s.close("server_closed");
        streams.clear();
      })();
      return closing;
    },
  };
}
