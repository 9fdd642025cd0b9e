/**
 * Bounds shared by every door state comes in by (#29 G1/G2): the HTTP API, the workers file and
 * host binding apply (through the core's validators) and the mesh decoder (mesh/wire.ts imports
 * these). A value one replica accepts must be one its peers' decoders accept: when the API took a
 * worker of 5,000 taints that the decoder refused, peers dropped the replica's every batch and
 * snapshot while the worker existed (a silent divergence).
 */

/**
 * Entries of one list or map in a worker (taints, kv_events_endpoints, replay_endpoints,
 * router_hint_source_control_endpoints, topology_domains, ...): a worker has at most 1,024 ranks
 * (MAX_DATA_PARALLEL_SIZE), so 4,096 leaves room and bounds the validators' work.
 */
export const MAX_WORKER_FIELD_ENTRIES = 4_096;

/**
 * Hashes of one booking (its prompt's blocks), one mesh add event: a 2M-token prompt at block
 * size 16. A prompt of more blocks (token_ids at a small block size, or precomputed hashes) is
 * refused with 400 naming the field.
 */
export const MAX_HASHES_PER_BOOKING = 131_072;
