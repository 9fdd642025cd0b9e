/**
 * The serving side of a snapshot sent in pages (#29 G16): the binding cursors this replica has
 * handed out with its snapshots, each a live walk of its affinity tables (ReplicaPort.bindingCursor)
 * owned by the replica that asked.
 *
 * A replica may hold 16 partitions x 65,536 bindings; as one reply that was over the 1,000,000
 * bound (refused whole) and took 4.8-7.8 s to decode on the puller's main thread. With pages the
 * puller takes at most MAX_SNAPSHOT_PAGE_BINDINGS per request, and this side holds no copy: a
 * cursor is an iterator over the live tables, so what it holds is one position per partition.
 * Bindings merge last-writer-wins, so a page taken after the snapshot's seq is still right: what
 * changed meanwhile also travels in the stream, and the merge keeps the newest either way.
 *
 * Bounded: at most MAX_OPEN_BINDING_CURSORS at once (a puller asks one snapshot per endpoint at a
 * time, and a mesh has tens of peers); opening one more closes the least recently used, and a
 * cursor idle for BINDING_CURSOR_IDLE_MS is closed. Both are counted (`kvmesh_mesh_binding_cursors_closed_total`);
 * the puller whose cursor went asks for a fresh snapshot.
 */
import type { BindingEvent, Clock } from "../src/core/index.js";

/** Cursors open at once (the concurrent pulls one replica makes, 16, times a few peers). */
export const MAX_OPEN_BINDING_CURSORS = 64;
/** A cursor nobody asked a page of for this long is closed, ms: 5 control timeouts (2 s each). */
export const BINDING_CURSOR_IDLE_MS = 10_000;

interface Cursor {
  readonly owner: bigint;
  readonly walk: Iterator<BindingEvent, void, void>;
  lastUsedMs: number;
}

export interface BindingCursorStats {
  opened: number;
  pagesServed: number;
  bindingsServed: number;
  /** Closed before their end: the bound (least recently used first) or idle. */
  shed: number;
  expired: number;
}

export type BindingPage = { readonly bindings: BindingEvent[]; readonly more: boolean } | { readonly refused: string };

export class BindingCursors {
  readonly stats: BindingCursorStats = { opened: 0, pagesServed: 0, bindingsServed: 0, shed: 0, expired: 0 };
  /** In least-recently-used order (a use moves a cursor to the end). */
  readonly #open = new Map<bigint, Cursor>();
  readonly #clock: Clock;
  readonly #newId: () => bigint;

  /**
   * `newId`: a random u64 (injected). A page is served to the replica the cursor was handed to,
   * and on a plain mesh anyone can claim that replica's id, so the id is what a third party
   * cannot guess: a page taken by someone else would be a page the puller never gets.
   */
  constructor(clock: Clock, newId: () => bigint) {
    this.#clock = clock;
    this.#newId = newId;
  }

  get size(): number {
    return this.#open.size;
  }

  /** A new cursor over `walk` for `owner`; returns its id. */
  open(owner: bigint, walk: Iterator<BindingEvent, void, void>): bigint {
    this.#expire();
    while (this.#open.size >= MAX_OPEN_BINDING_CURSORS) {
      this.#open.delete(this.#open.keys().next().value as bigint);
      this.stats.shed++;
    }
    let id = this.#newId();
    while (this.#open.has(id)) id = this.#newId();
    this.#open.set(id, { owner, walk, lastUsedMs: this.#clock.now() });
    this.stats.opened++;
    return id;
  }

  /** The next page of at most `max` bindings, or why not (unknown, expired, or another owner's cursor). */
  page(owner: bigint, id: bigint, max: number): BindingPage {
    this.#expire();
    const c = this.#open.get(id);
    if (c === undefined) return { refused: `binding cursor ${id} is unknown or expired` };
    if (c.owner !== owner) return { refused: `binding cursor ${id} was not handed to ${owner}` };
    this.#open.delete(id);
    const bindings: BindingEvent[] = [];
    let more = true;
    while (bindings.length < max) {
      const r = c.walk.next();
      if (r.done === true) {
        more = false;
        break;
      }
      bindings.push(r.value);
    }
    if (more) {
      c.lastUsedMs = this.#clock.now();
      this.#open.set(id, c);
    }
    this.stats.pagesServed++;
    this.stats.bindingsServed += bindings.length;
    return { bindings, more };
  }

  #expire(): void {
    const now = this.#clock.now();
    for (const [id, c] of this.#open) {
      if (now - c.lastUsedMs < BINDING_CURSOR_IDLE_MS) break; // least recently used first
      this.#open.delete(id);
      this.stats.expired++;
    }
  }
}
