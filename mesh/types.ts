/**
 * The replica mesh's vocabulary (protocol v1, ours; not byte-compatible with Dynamo's).
 *
 * Each replica binds one PUB (`--replica-sync-port`) and one ROUTER for control (the port
 * after it) and connects one SUB to every peer's PUB. Publishers number their batches per
 * `(origin, epoch)`; a receiver that sees a gap, a new epoch or a peer it just connected to asks
 * that peer's ROUTER for a snapshot and replaces what it mirrors of that origin (the ZeroMQ
 * Guide's Clone pattern).
 */
import type { BindingEvent, BookingSnapshot, LoadMarkEvent } from "../src/core/index.js";
import type { ReplicaEvent, ReplicaSnapshot } from "../src/core/index.js";
import type { TraceCause } from "../src/util/trace-cause.js";

export type { TraceCause };

export const TOPIC_BATCH = "kvmesh.batch.v1";
export const TOPIC_HEARTBEAT = "kvmesh.hb.v1";
export const PROTOCOL_VERSION = 1;

/**
 * One replicated change, as the core's replication port emits and applies it (a discriminated
 * union keyed by `kind`, src/core/replication/registry.ts); mesh/wire.ts has one codec entry per kind.
 */
export type MeshEvent = ReplicaEvent;

export interface MeshBatch {
  readonly v: typeof PROTOCOL_VERSION;
  /** Publisher's replica id (non-zero u64). */
  readonly origin: bigint;
  /** Random per process start: a new epoch means the origin restarted and its old state is gone. */
  readonly epoch: bigint;
  /** 1, 2, 3, ... per (origin, epoch). */
  readonly seq: number;
  /**
   * Set only on a batch the receive thread merged from consecutive ones (receive-coalescer.ts):
   * it covers seqs firstSeq..seq. Never on the wire.
   */
  readonly firstSeq?: number;
  /** Publisher's wall clock when the batch was sent, ms since the Unix epoch (lag measurement). */
  readonly sentAtMs: number;
  readonly events: readonly MeshEvent[];
  /**
   * With tracing on at the publisher: the sampled requests whose changes this batch carries (at
   * most MAX_TRACE_CAUSES_PER_BATCH), so a peer's span for applying it links to them.
   */
  readonly causes?: readonly TraceCause[];
}

/**
 * Trace causes one batch carries at most. A flush holds every request since the last one (10 ms
 * apart in aggregate mode: one or two at 100-200 req/s), so 16 links cover all but bursts; past
 * it they are counted (kvmesh_mesh_trace_causes_dropped_total), not sent. 16 x ~50 bytes.
 */
export const MAX_TRACE_CAUSES_PER_BATCH = 16;

export interface Heartbeat {
  readonly v: typeof PROTOCOL_VERSION;
  readonly origin: bigint;
  readonly epoch: bigint;
  /** The last batch seq published (0 = none yet): an idle receiver still sees gaps. */
  readonly seq: number;
  readonly sentAtMs: number;
  /** Where to ask this replica for snapshots and peering (its ROUTER), e.g. tcp://10.0.0.5:7101. */
  readonly controlEndpoint: string;
  /** The PUB endpoint peers connect their SUB to. */
  readonly publishEndpoint: string;
  /**
   * Bookings this origin owns at `seq`: a receiver that applied every batch up to `seq` must
   * mirror exactly this many, or it re-snapshots (the divergence check, mesh/inbound.ts).
   */
  readonly bookings: number;
}

/** A booking as carried in a snapshot: the add, and whether its prefill already completed. */
export type SnapshotBooking = BookingSnapshot;

/** The envelope of a snapshot; its body is the core's (assembled and installed by the replication port). */
export interface SnapshotEnvelope {
  readonly v: typeof PROTOCOL_VERSION;
  readonly origin: bigint;
  readonly epoch: bigint;
  /** The snapshot reflects every batch up to and including this seq. */
  readonly seq: number;
  /**
   * Set when more bindings follow in pages than `bindings` carries (the first page): the cursor
   * to ask for them with a `bindings` request (#29 G16). Only sent to a requester that offered
   * `pageBindings`, so a replica of an earlier version always gets the whole snapshot.
   */
  readonly bindingCursor?: bigint;
}

export type Snapshot = SnapshotEnvelope & ReplicaSnapshot;

/** Requests on the control channel (DEALER -> ROUTER), and their replies. */
export type ControlRequest =
  /**
   * `publishEndpoint`: the requester's PUB as peers reach it, so a replica that has not
   * registered it yet can check who asks (omitted by kvmesh before the status request).
   */
  | {
      readonly type: "snapshot";
      readonly from: bigint;
      readonly publishEndpoint?: string | undefined;
      /**
       * The requester takes the bindings in pages of at most this many (#29 G16); absent (every
       * earlier version): the whole snapshot in one reply.
       */
      readonly pageBindings?: number | undefined;
    }
  /** The next page of a snapshot's bindings (a cursor a snapshot reply handed out to `from`). */
  | { readonly type: "bindings"; readonly from: bigint; readonly cursor: bigint; readonly max: number }
  /** "Who are you, and whom do you peer with?": how a replica checks a peering request's claims. */
  | { readonly type: "status"; readonly from: bigint }
  /**
   * A lifecycle call another replica took for one of the receiver's bookings, sent to it directly
   * (it also goes out in the sender's stream; applying both is idempotent).
   */
  | { readonly type: "lifecycle"; readonly from: bigint; readonly event: LoadMarkEvent }
  /** "Connect your SUB to my PUB at `publishEndpoint`" (symmetric peering). */
  | { readonly type: "peer"; readonly from: bigint; readonly publishEndpoint: string }
  /** "Stop receiving from me" (deregistration both ways). */
  | { readonly type: "unpeer"; readonly from: bigint; readonly publishEndpoint: string };

export type ControlReply =
  | { readonly type: "snapshot"; readonly snapshot: Snapshot }
  | { readonly type: "ok" }
  /** A page of a snapshot's bindings; `more`: ask again with the same cursor. */
  | { readonly type: "bindings"; readonly bindings: readonly BindingEvent[]; readonly more: boolean }
  /** The answering replica's origin and the publish endpoints it has registered. */
  | { readonly type: "status"; readonly origin: bigint; readonly peers: readonly string[] }
  | { readonly type: "error"; readonly message: string };
