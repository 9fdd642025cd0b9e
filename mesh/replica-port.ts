/**
 * The mesh's port to the core: the core's replication port (src/core/replication/port.ts), all
 * the mesh sees of the selection core. The mesh attaches one link to it (outbound events, the
 * receive thread's hand-overs, the tie-spreading slot) and applies, snapshots, installs and
 * drops through it; tests drive the mesh with a fake (test/helpers/fake-replica-port.ts). What
 * the HTTP layer sees of the mesh is its own (src/http/mesh-control.ts).
 */
export type { ReplicationPort as ReplicaPort, ReplicaAttachment, ReplicaLink } from "../src/core/index.js";
export type { ReplicaEvent, ReplicaSnapshot, OriginFacts } from "../src/core/index.js";
export type { ReplicaSlot } from "../src/core/index.js";
