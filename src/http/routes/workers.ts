/** The worker catalogue's routes: register, list, patch and delete workers. */
import type { SelectionService } from "../../core/index.js";
import type { MeshControl } from "../mesh-control.js";
import { param, queryParam, reply, type Route } from "../route.js";
import { parseWorkerIdParam, parseWorkerPatch, parseWorkerRequest } from "../schemas.js";

export function workerRoutes(svc: SelectionService, mesh: MeshControl | undefined): Route[] {
  return [
    { method: "POST", pattern: "/workers", body: "required", handle: (c) => reply(201, svc.upsertWorker(parseWorkerRequest(c.body, ""))) },
    {
      method: "GET",
      pattern: "/workers",
      body: "none",
      handle: (c) => {
        const records = svc.listWorkers(queryParam(c.query, "model_name"), queryParam(c.query, "routing_group"));
        // kvmesh addition with the mesh: each replica's lifecycle and reasons for the worker (a
        // registration can fail on one replica only). Without the mesh the reference's records as they are.
        return reply(200, mesh === undefined ? records : records.map((r) => ({ ...r, replicas: svc.workerReplicas(r.worker_id) })));
      },
    },
    {
      method: "PATCH",
      pattern: "/workers/:id",
      body: "required",
      handle: (c) => reply(200, svc.patchWorker(parseWorkerIdParam(param(c, 0)), parseWorkerPatch(c.body, ""))),
    },
    { method: "DELETE", pattern: "/workers/:id", body: "none", handle: (c) => reply(200, svc.deleteWorker(parseWorkerIdParam(param(c, 0)))) },
  ];
}
