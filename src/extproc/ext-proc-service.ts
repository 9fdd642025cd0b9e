/**
 * The ExternalProcessor service definition the picker serves (and the benchmark's client calls):
 * proto-loader's method table, with Process's messages on the hand-written codec.
 */
import type { ServiceDefinition } from "@grpc/grpc-js";

import { decodeProcessingRequest, decodeProcessingResponse, encodeProcessingRequest, encodeProcessingResponseTransient } from "./ext-proc-codec.js";
import { EXT_PROC_PROTO, EXT_PROC_SERVICE, serviceDefinition } from "./protos.js";

/**
 * ExternalProcessor with Process's messages on the hand-written codec (ext-proc-codec.ts) rather
 * than protobufjs: the same objects, without copying bodies. Health stays on proto-loader's.
 */
export function extProcServiceDefinition(): ServiceDefinition {
  const base = serviceDefinition(EXT_PROC_SERVICE);
  const process = base["Process"];
  // Assertion: our own external_processor.proto defines Process.
  if (process === undefined) throw new Error(`${EXT_PROC_PROTO} defines no Process method`);
  return {
    ...base,
    Process: {
      ...process,
      requestSerialize: encodeProcessingRequest,
      requestDeserialize: decodeProcessingRequest,
      responseSerialize: encodeProcessingResponseTransient,
      responseDeserialize: decodeProcessingResponse,
    },
  };
}
