/**
 * gRPC Health v1 for the endpoint picker (GIE's EPP protocol, "Health Checking"): `liveness` is
 * SERVING while the process serves; `readiness`, `envoy.service.ext_proc.v3.ExternalProcessor`
 * and the server as a whole (`""`) follow the same rule as GET /ready (src/http/readiness.ts:
 * schedulable workers, not draining, the mesh's startup sync done; a KV ingest thread waiting for
 * its restart leaves it SERVING), so a gateway health-checking
 * the picker with either name stops sending to a replica that drains. Any other service name is
 * NOT_FOUND (Check) or SERVICE_UNKNOWN (Watch), as the protocol says.
 */
import { EXT_PROC_SERVICE, type ServingStatus } from "./protos.js";

/** How often Watch re-reads readiness while someone watches, ms (readiness flips on drain, worker and mesh changes, which have no single event to hook). */
export const DEFAULT_HEALTH_WATCH_INTERVAL_MS = 1_000;

export const HEALTH_SERVICES = ["", "liveness", "readiness", EXT_PROC_SERVICE] as const;

export interface HealthSource {
  /** GET /ready's verdict. */
  ready(): boolean;
  /** The process is shutting down (liveness turns NOT_SERVING). */
  closing(): boolean;
}

export class PickerHealth {
  readonly #source: HealthSource;
  readonly watchIntervalMs: number;

  constructor(source: HealthSource, watchIntervalMs: number = DEFAULT_HEALTH_WATCH_INTERVAL_MS) {
    this.#source = source;
    this.watchIntervalMs = watchIntervalMs;
  }

  /** The service's status, or undefined for a service this server does not know. */
  statusOf(service: string): ServingStatus | undefined {
    if (!(HEALTH_SERVICES as readonly string[]).includes(service)) return undefined;
    if (this.#source.closing()) return "NOT_SERVING";
    if (service === "liveness") return "SERVING";
    return this.#source.ready() ? "SERVING" : "NOT_SERVING";
  }
}
