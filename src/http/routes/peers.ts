/** The replica mesh's routes: list, register and deregister peers, and each peer's sync status. */
import { KvmeshError } from "../../core/index.js";
import type { MeshControl } from "../mesh-control.js";
import { reply, type Route } from "../route.js";
import { parsePeerRequest } from "../schemas.js";

/**
 * GET /replica_sync/peers: the endpoints of MeshControl.listPeers()'s views (mesh/membership.ts
 * PeerView; a bare string is taken as the endpoint), sorted by code unit as the reference's
 * list_replica_peers() is.
 */
export function peerEndpoints(views: readonly unknown[]): string[] {
  const out: string[] = [];
  for (const v of views) {
    const e = typeof v === "string" ? v : typeof v === "object" && v !== null ? (v as { endpoint?: unknown }).endpoint : undefined;
    if (typeof e === "string") out.push(e);
  }
  return out.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

export function peerRoutes(mesh: MeshControl | undefined): Route[] {
  const required = (): MeshControl => {
    if (mesh === undefined) throw new KvmeshError("KVMESH_REPLICA_SYNC_DISABLED", "replica sync is disabled");
    return mesh;
  };
  return [
    // The reference's shape: a sorted array of endpoint strings, [] without the mesh (server.rs
    // list_peers -> Json(list_replica_peers())); Dynamo's endpoint-picker reconciler diffs it.
    { method: "GET", pattern: "/replica_sync/peers", body: "none", handle: () => reply(200, peerEndpoints(mesh?.listPeers() ?? [])) },
    // kvmesh addition: the per-peer detail (origin, state, last_seq, lag, gaps, snapshots, sync).
    { method: "GET", pattern: "/replica_sync/status", body: "none", handle: () => reply(200, mesh?.listPeers() ?? []) },
    {
      method: "POST",
      pattern: "/replica_sync/register_peer",
      body: "required",
      handle: async (c) => {
        const { endpoint } = parsePeerRequest(c.body, "");
        const added = await required().registerPeer(endpoint);
        return reply(added ? 201 : 200, { status: "ok", endpoint, added });
      },
    },
    {
      method: "POST",
      pattern: "/replica_sync/deregister_peer",
      body: "required",
      handle: async (c) => {
        const { endpoint } = parsePeerRequest(c.body, "");
        if (!(await required().deregisterPeer(endpoint))) throw new KvmeshError("KVMESH_PEER_NOT_FOUND", "peer not found");
        return reply(200, { status: "ok", endpoint, removed: true });
      },
    },
  ];
}
