/** The reservation routes: book a prompt's load on a worker, then prefill_complete, output_block and free. */
import { KvmeshError } from "../../core/index.js";
import type { SelectionService } from "../../core/index.js";
import type { MeshControl } from "../mesh-control.js";
import { OK, param, reply, type Route } from "../route.js";
import { parseEmptyRequest, parseOutputBlockRequest, parseReservationRequest, parseSelectionIdParam } from "../schemas.js";

/**
 * Runs a lifecycle call; a reservation unknown here gets one more try once the mesh has applied
 * everything it has received (MeshControl.catchUp): a peer's booking may still sit in the receive
 * thread's next hand-over, up to --mesh-apply-interval-ms behind, and a frontend may send the
 * lifecycle call to any replica right after another one booked it.
 */
async function withCatchUp(mesh: MeshControl | undefined, call: () => void): Promise<void> {
  try {
    call();
  } catch (err) {
    if (mesh === undefined || !(err instanceof KvmeshError) || err.code !== "KVMESH_RESERVATION_NOT_FOUND") throw err;
    await mesh.catchUp();
    call();
  }
}

export function reservationRoutes(svc: SelectionService, mesh: MeshControl | undefined): Route[] {
  /** A lifecycle route: the id from the path, the body checked, then the call (with the catch-up retry). */
  const lifecycle = (method: "POST" | "DELETE", pattern: string, call: (id: string, body: unknown) => () => void): Route => ({
    method,
    pattern,
    body: method === "POST" ? "optional" : "none",
    handle: async (c) => {
      const run = call(parseSelectionIdParam(param(c, 0)), c.body ?? {});
      await withCatchUp(mesh, run);
      return reply(200, OK);
    },
  });
  return [
    { method: "POST", pattern: "/reservations", body: "required", prompt: true, handle: (c) => reply(201, svc.createReservation(parseReservationRequest(c.body, ""))) },
    lifecycle("POST", "/reservations/:id/prefill_complete", (id, body) => {
      parseEmptyRequest(body, "");
      return () => {
        svc.prefillComplete(id);
      };
    }),
    lifecycle("POST", "/reservations/:id/output_block", (id, body) => {
      const b = parseOutputBlockRequest(body, "");
      return () => {
        svc.addOutputBlock(id, b.decay_fraction);
      };
    }),
    lifecycle("DELETE", "/reservations/:id", (id) => () => {
      svc.freeReservation(id);
    }),
  ];
}
