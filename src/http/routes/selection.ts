/** The selection routes: choose a worker for a prompt, score the workers, read their loads. */
import type { SelectionService } from "../../core/index.js";
import { queryParam, reply, type Route } from "../route.js";
import { parseScoreRequest, parseSelectAndReserveRequest, parseSelectRequest } from "../schemas.js";

export function selectionRoutes(svc: SelectionService): Route[] {
  return [
    { method: "POST", pattern: "/select", body: "required", prompt: true, handle: (c) => reply(200, svc.select(parseSelectRequest(c.body, ""), c.note)) },
    {
      method: "POST",
      pattern: "/select_and_reserve",
      body: "required",
      prompt: true,
      handle: (c) => reply(200, svc.selectAndReserve(parseSelectAndReserveRequest(c.body, ""), c.note)),
    },
    { method: "GET", pattern: "/loads", body: "none", handle: (c) => reply(200, svc.loads(queryParam(c.query, "model_name"), queryParam(c.query, "routing_group"))) },
    { method: "POST", pattern: "/potential_loads", body: "required", prompt: true, handle: (c) => reply(200, svc.potentialLoads(parseScoreRequest(c.body, ""))) },
    { method: "POST", pattern: "/overlap_scores", body: "required", prompt: true, handle: (c) => reply(200, svc.overlapScores(parseScoreRequest(c.body, ""))) },
  ];
}
