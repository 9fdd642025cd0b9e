import { describe, expect, it } from "vitest";

import { parseJson } from "../../../src/http/json.js";
import {
  parseOutputBlockRequest,
  parseReservationRequest,
  parseSelectAndReserveRequest,
  parseSelectRequest,
  parseWorkerIdParam,
  parseWorkerPatch,
  parseWorkerRequest,
} from "../../../src/http/schemas.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";

/** Runs `fn` and returns the KvmeshError it throws (fails the test if it does not). */
const errorOf = kvmeshErrorOf;

describe("request validation", () => {
  it("turns 64-bit fields into bigint whether they arrive as number or bigint", () => {
    const r = parseSelectRequest(
      parseJson(
        `{"block_hashes":[1,-1,18446744073709551615],"sequence_hashes":[2,-9223372036854775808,3],"isl_tokens":12,` +
          `"allowed_worker_ids":[7,18446744073709551615],"pinned_worker":{"worker_id":5,"dp_rank":0},"affinity_target":{"worker_id":9,"dp_rank":null}}`,
      ),
      "",
    );
    expect(r.block_hashes).toEqual([1n, -1n, 18446744073709551615n]);
    expect(r.sequence_hashes).toEqual([2n, -(1n << 63n), 3n]);
    expect(r.allowed_worker_ids).toEqual([7n, 18446744073709551615n]);
    expect(r.pinned_worker).toEqual({ worker_id: 5n, dp_rank: 0 });
    expect(r.affinity_target).toEqual({ worker_id: 9n });
    expect(parseWorkerRequest({ worker_id: 3 }, "").worker_id).toBe(3n);
  });

  it.each([
    [{ block_hashes: [1, 18446744073709551616n] }, "block_hashes[1]: must be an integer in [-9223372036854775808, 18446744073709551615]"],
    [{ sequence_hashes: [-(1n << 63n) - 1n] }, "sequence_hashes[0]: must be an integer in"],
    [{ allowed_worker_ids: [-1] }, "allowed_worker_ids[0]: must be an integer in [0, 18446744073709551615]"],
    [{ allowed_worker_ids: [1.5] }, "allowed_worker_ids[0]: must be an integer"],
    [{ allowed_worker_ids: [1e19] }, "allowed_worker_ids[0]: must be an integer"],
    [{ pinned_worker: { worker_id: 1 } }, "pinned_worker.dp_rank: required integer"],
    [{ pinned_worker: { worker_id: "1", dp_rank: 0 } }, "pinned_worker.worker_id: must be an integer"],
    [{ token_ids: [1, 2, 3, -4] }, "token_ids[3]: must be an integer in [0, 4294967295]"],
    [{ token_ids: [1, 2, 3, 4294967296] }, "token_ids[3]: must be an integer in [0, 4294967295]"],
    [{ token_ids: "1,2" }, "token_ids: must be an array of integers"],
    [{ model_name: 5 }, "model_name: must be a string"],
    [{ advisory: "yes" }, "advisory: must be a boolean"],
    [{ router_config_override: { overlap_score_weight: "1" } }, "router_config_override.overlap_score_weight: must be a finite number"],
    [{ router_config_override: { overlap_weight: 1 } }, "router_config_override.overlap_weight: unknown field"],
    [{ session_context: { parent_session_id: "p" } }, "session_context.session_id: required string"],
    [{ session_context: { session_id: "s", input_trigger: "cron" } }, 'session_context.input_trigger: must be one of "user_message", "tool_result", "other"'],
    [{ routing_constraints: { preferred_taints: { gpu: "high" } } }, "routing_constraints.preferred_taints.gpu: must be a finite number"],
    [{ tokens_ids: [1] }, "tokens_ids: unknown field"],
    [[1, 2], "body: must be a JSON object"],
    ["text", "body: must be a JSON object"],
    [{ token_ids: [[[[1]]]] }, "token_ids[0]: must be an integer"],
  ])("rejects case %# with 422 naming the field", (body, message) => {
    const e = errorOf(() => parseSelectRequest(body, ""));
    expect(e.status).toBe(422);
    expect(e.code).toBe("KVMESH_INVALID_FIELD");
    expect(e.message).toContain(message);
  });

  it("rejects a __proto__ key as an unknown field", () => {
    expect(errorOf(() => parseSelectRequest(parseJson(`{"__proto__":{"token_ids":[1]}}`), "")).message).toBe("__proto__: unknown field");
    expect(errorOf(() => parseSelectRequest(JSON.parse(`{"constructor":1}`), "")).message).toBe("constructor: unknown field");
  });

  it("requires selection_id on reservations and rejects advisory on select_and_reserve", () => {
    expect(errorOf(() => parseReservationRequest({ model_name: "m" }, "")).message).toBe("selection_id: required string");
    expect(errorOf(() => parseReservationRequest({ selection_id: null }, "")).message).toBe("selection_id: required string");
    expect(errorOf(() => parseSelectAndReserveRequest({ advisory: true }, "")).message).toBe("advisory: unknown field");
    expect(parseReservationRequest({ selection_id: "r", worker_id: 18446744073709551615n, dp_rank: 1 }, "")).toEqual({
      selection_id: "r",
      worker_id: 18446744073709551615n,
      dp_rank: 1,
    });
  });

  it("treats null optional fields as absent", () => {
    expect(parseSelectRequest({ model_name: null, lora_name: null, token_ids: [1] }, "")).toEqual({ token_ids: [1] });
  });

  it("answers 400 (as the service does) for ids longer than 256 bytes", () => {
    const e = errorOf(() => parseSelectRequest({ selection_id: "x".repeat(257) }, ""));
    expect(e.status).toBe(400);
    expect(e.message).toContain("selection_id is longer than 256 bytes");
    expect(parseSelectRequest({ selection_id: "x".repeat(256) }, "").selection_id).toHaveLength(256);
    expect(errorOf(() => parseSelectRequest({ session_id: "é".repeat(129) }, "")).status).toBe(400);
  });

  it("validates worker bodies and patches, strictly", () => {
    const w = parseWorkerRequest({ worker_id: 1, block_size: 16, kv_events_endpoints: { "0": "tcp://a" }, taints: ["gpu"] }, "");
    expect(w).toEqual({ worker_id: 1n, block_size: 16, kv_events_endpoints: { "0": "tcp://a" }, taints: ["gpu"] });
    expect(errorOf(() => parseWorkerRequest({ block_size: 16 }, "")).message).toBe("worker_id: required unsigned 64-bit integer");
    expect(errorOf(() => parseWorkerRequest({ worker_id: 1, block_size: "16" }, "")).message).toBe("block_size: must be an integer in [0, 4294967295]");
    expect(errorOf(() => parseWorkerRequest({ worker_id: 1, kv_events_endpoints: { "0": 5 } }, "")).message).toBe("kv_events_endpoints.0: must be a string");
    expect(errorOf(() => parseWorkerRequest({ worker_id: 1, taints: ["a", 1] }, "")).message).toBe("taints[1]: must be a string");
    expect(parseWorkerPatch({ lifecycle: "draining" }, "")).toEqual({ lifecycle: "draining" });
    expect(errorOf(() => parseWorkerPatch({ lifecycle: "unschedulable" }, "")).message).toContain("lifecycle: must be one of");
    expect(errorOf(() => parseWorkerPatch({ worker_id: 2 }, "")).message).toBe("worker_id: unknown field");
  });

  it("accepts a fractional decay_fraction (the range is the service's 400)", () => {
    expect(parseOutputBlockRequest({ decay_fraction: 1.5 }, "")).toEqual({ decay_fraction: 1.5 });
    expect(errorOf(() => parseOutputBlockRequest({ decay_fraction: "0.5" }, "")).status).toBe(422);
  });

  it("parses path worker ids as canonical u64 decimals only", () => {
    expect(parseWorkerIdParam("0")).toBe(0n);
    expect(parseWorkerIdParam("18446744073709551615")).toBe(18446744073709551615n);
    for (const bad of ["18446744073709551616", "-1", "01", "1.0", "abc", "", "1e3", "123456789012345678901"]) {
      const e = errorOf(() => parseWorkerIdParam(bad));
      expect(e.status).toBe(400);
      expect(e.message).toContain("worker_id");
    }
  });
});
