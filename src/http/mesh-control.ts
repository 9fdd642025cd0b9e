/**
 * The mesh as the HTTP layer drives it: register, deregister and list peers, readiness during the
 * startup sync, and the lifecycle retry's catch-up. (Peers' updates the receive thread handed over
 * are the core's to apply, before each decision: src/core/replication/port.ts `drainInbound`.) The HTTP layer owns this interface (it is the
 * caller); the mesh (mesh/replica-mesh.ts) satisfies it structurally, and the composition root
 * (src/app/daemon.ts) hands one to the other, so src/http imports nothing from mesh/.
 */
export interface MeshControl {
  registerPeer(endpoint: string): Promise<boolean>;
  deregisterPeer(endpoint: string): Promise<boolean>;
  listPeers(): unknown[];
  /**
   * While the mesh pulls its peers' first snapshots after a start (mesh/startup-sync.ts): the
   * peers still awaited, which `/ready` reports with a 503; null once that is over. Optional: a
   * host-provided mesh without it never holds readiness.
   */
  startupSyncPending?(): string[] | null;
  /**
   * The warm join (src/app/warm-join.ts): `index_syncing` while a peer's prefix index is being
   * installed (`/ready` answers 503), `index_sync` naming its state when `/ready` should say it
   * (no reachable peer, timed out); null when there is nothing to say. Optional.
   */
  indexSyncPending?(): { index_syncing?: true; index_sync?: string } | null;
  /**
   * Resolves once every peer message this replica has received is applied (the receive thread
   * hands over between intervals): what a lifecycle call for an unknown reservation waits for
   * before answering 404, since the booking may sit in the thread's next hand-over.
   */
  catchUp(): Promise<void>;
}
