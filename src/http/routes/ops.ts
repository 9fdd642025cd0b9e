/** The operator's routes: health, readiness, metrics, the index dump and the status page. */
import { badRequest } from "../../core/index.js";
import type { SelectionService } from "../../core/index.js";
import type { MeshControl } from "../mesh-control.js";
import type { HttpMetrics } from "../metrics.js";
import { readiness, type KvIngestHealth } from "../readiness.js";
import { OK, queryParam, reply, type Route } from "../route.js";
import { parseWorkerIdParam } from "../schemas.js";
import type { StatusPage } from "../ui/ui-routes.js";

export function opsRoutes(svc: SelectionService, mesh: MeshControl | undefined, metrics: HttpMetrics, page: StatusPage, kvIngest?: KvIngestHealth): Route[] {
  return [
    { method: "GET", pattern: "/health", body: "none", handle: () => reply(200, OK) },
    {
      method: "GET",
      pattern: "/ready",
      body: "none",
      handle: (c) => {
        const workers = queryParam(c.query, "workers");
        if (workers !== undefined && workers !== "all") throw badRequest(`workers must be "all" when given, got ${JSON.stringify(workers)}`, "workers");
        const r = readiness(svc, mesh, workers === "all", kvIngest);
        return reply(r.ready ? 200 : 503, r);
      },
    },
    {
      method: "GET",
      pattern: "/dump",
      body: "none",
      handle: (c) => {
        // kvmesh additions (the reference's /dump takes none): one partition's or one worker's index.
        const workerId = queryParam(c.query, "worker_id");
        return reply(200, svc.dump({ modelName: queryParam(c.query, "model_name"), routingGroup: queryParam(c.query, "routing_group"), workerId: workerId === undefined ? undefined : parseWorkerIdParam(workerId) }));
      },
    },
    {
      method: "GET",
      pattern: "/metrics",
      body: "none",
      handle: async () => ({ status: 200, body: undefined, text: { body: await metrics.registry.metrics(), contentType: metrics.registry.contentType } }),
    },
    // The status page: GET / redirects to /ui, its files, and GET /ui/state (src/http/ui/).
    ...page.routes(),
  ];
}
