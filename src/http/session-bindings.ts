/**
 * Host replication over HTTP, for hosts written in other languages:
 *
 *   GET  /session_bindings/updates[?cursor=C | ?snapshot=true]   NDJSON, one batch a line
 *   POST /session_bindings   {"bindings": [...]}  ->  {"outcomes": [{"outcome": ...}, ...]}
 *
 * Both answer 409 KVMESH_HOST_REPLICATION_DISABLED unless the service runs in host-replication
 * mode (`kvmesh serve --session-replication-writer-id N`).
 *
 * One library subscription (`sessionBindingUpdates()`) feeds a replay ring of serialized lines;
 * every HTTP stream reads from the ring at its own position, so a line is serialized once however
 * many hosts listen, and a host that reconnects with the cursor of the last line it handled gets
 * what it missed. A line is
 *
 *   {"cursor":"<run>-<n>","sent_at_ms":<wall ms>,"dropped":0,"bindings":[{model_name, routing_group,
 *    session_id, worker_id, dp_rank, sequence, writer_id, reason}, ...]}
 *
 * and can be POSTed verbatim to a peer (the envelope fields are accepted and ignored there).
 * `<run>` changes when the daemon restarts, so a cursor from a previous run is refused (410)
 * rather than silently misread. The ring is bounded (DEFAULT_REPLAY_RING_MAX_BATCHES /
 * _MAX_BINDINGS); a cursor older than the ring, or a stream whose reader fell that far behind,
 * gets 410 / a final error line: the host then reconnects with `snapshot=true`, whose first line
 * carries every live binding (LWW makes re-applying them harmless). A stream that is idle gets an
 * empty batch every DEFAULT_STREAM_HEARTBEAT_MS, so both sides notice a dead connection.
 */
import { randomBytes } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "pino";
import type { Registry } from "prom-client";

import { systemWallClock, type Clock } from "../core/index.js";
import { KvmeshError, badRequest, invalidField } from "../core/index.js";
import type { BindingEvent } from "../core/index.js";
import type { SelectionService } from "../core/index.js";
import type { SessionBindingInput, SessionBindingOutcome } from "../core/index.js";
import type { SessionBindingSubscription } from "../core/index.js";
import { collectedCounter, collectedGauge } from "../metrics/collected.js";
import { LogThrottle } from "../util/log-throttle.js";
import { stringifyJson } from "./json.js";

/** Batches the replay ring keeps (at ~2 batches per routed request burst, minutes of traffic). */
export const DEFAULT_REPLAY_RING_MAX_BATCHES = 4_096;
/** Bindings the replay ring keeps, all batches together (~200 bytes of JSON each: ~13 MB). */
export const DEFAULT_REPLAY_RING_MAX_BINDINGS = 65_536;
/** An idle stream gets an empty batch about this often (at most 1.5x apart), ms: below common 30-60 s proxy idle timeouts. */
export const DEFAULT_STREAM_HEARTBEAT_MS = 10_000;
export const NDJSON_CONTENT_TYPE = "application/x-ndjson";

/** Envelope fields of a stream line, accepted (and ignored) by POST so a line can be relayed verbatim. */
const ENVELOPE_FIELDS = new Set(["bindings", "cursor", "sent_at_ms", "dropped", "snapshot", "resync"]);
const BINDING_FIELDS = new Set(["model_name", "routing_group", "session_id", "worker_id", "dp_rank", "sequence", "writer_id", "reason"]);

/** What a route handler answers with; `stream` takes over the response (server.ts). */
export interface BindingsReply {
  readonly status: number;
  readonly body: unknown;
  readonly stream?: (req: IncomingMessage, res: ServerResponse) => void;
}

interface RingEntry {
  readonly seq: number;
  readonly line: string;
  readonly bindings: number;
}

/**
 * The last N batches as serialized lines, numbered 1, 2, 3, ... per run. Entries live in an array
 * with a moving head (compacted when half of it is dead), so eviction is O(1) amortised.
 */
export class BindingReplayRing {
  readonly run: string;
  readonly maxBatches: number;
  readonly maxBindings: number;
  #entries: RingEntry[] = [];
  #head = 0;
  #bindings = 0;
  #latest = 0;

  constructor(run: string, maxBatches = DEFAULT_REPLAY_RING_MAX_BATCHES, maxBindings = DEFAULT_REPLAY_RING_MAX_BINDINGS) {
    if (!/^[0-9a-z]+$/.test(run)) throw badRequest(`run id must be lowercase alphanumeric, got ${JSON.stringify(run)}`, "run");
    if (!Number.isSafeInteger(maxBatches) || maxBatches < 1) throw badRequest(`maxBatches must be a positive integer, got ${maxBatches}`, "maxBatches");
    if (!Number.isSafeInteger(maxBindings) || maxBindings < 1) throw badRequest(`maxBindings must be a positive integer, got ${maxBindings}`, "maxBindings");
    this.run = run;
    this.maxBatches = maxBatches;
    this.maxBindings = maxBindings;
  }

  /** Seq of the newest batch (0 before the first). */
  get latestSeq(): number {
    return this.#latest;
  }

  /** Seq of the oldest batch still held (latestSeq + 1 when empty). */
  get oldestSeq(): number {
    return this.#entries[this.#head]?.seq ?? this.#latest + 1;
  }

  get size(): number {
    return this.#entries.length - this.#head;
  }

  cursorOf(seq: number): string {
    return `${this.run}-${seq}`;
  }

  /** Appends a batch: `fields` are serialized around a fresh cursor. The newest batch is never evicted. */
  append(fields: { readonly sent_at_ms: number; readonly dropped: number; readonly bindings: readonly BindingEvent[]; readonly resync?: true }): RingEntry {
    const seq = ++this.#latest;
    const line = `${stringifyJson({ cursor: this.cursorOf(seq), ...fields })}\n`;
    const entry: RingEntry = { seq, line, bindings: fields.bindings.length };
    this.#entries.push(entry);
    this.#bindings += entry.bindings;
    while (this.size > 1 && (this.size > this.maxBatches || this.#bindings > this.maxBindings)) {
      this.#bindings -= (this.#entries[this.#head] as RingEntry).bindings;
      this.#head++;
    }
    if (this.#head > 1024 && this.#head * 2 > this.#entries.length) {
      this.#entries = this.#entries.slice(this.#head);
      this.#head = 0;
    }
    return entry;
  }

  /** The batch numbered `seq`, or undefined when evicted (or not written yet). */
  at(seq: number): RingEntry | undefined {
    const first = this.oldestSeq;
    if (seq < first || seq > this.#latest) return undefined;
    return this.#entries[this.#head + (seq - first)];
  }

  /**
   * The seq a client resumes after. Throws 400 for a malformed cursor or one ahead of the stream,
   * 410 for one from another run or older than the ring (what it missed is gone).
   */
  resumePoint(cursor: string): number {
    const m = /^([0-9a-z]+)-(0|[1-9]\d{0,14})$/.exec(cursor);
    if (m === null) throw badRequest(`cursor: ${JSON.stringify(cursor)} is not a cursor of this stream (expected "<run>-<n>" as sent in a line)`, "cursor");
    const [, run, n] = m as unknown as [string, string, string];
    const seq = Number(n);
    const details = { field: "cursor", oldest_cursor: this.cursorOf(this.oldestSeq - 1), latest_cursor: this.cursorOf(this.#latest) };
    if (run !== this.run) {
      throw new KvmeshError("KVMESH_CURSOR_EXPIRED", `cursor ${cursor} is from another run of this daemon (it restarted): reconnect with snapshot=true`, { details });
    }
    if (seq > this.#latest) throw badRequest(`cursor ${cursor} is ahead of this stream (latest ${this.cursorOf(this.#latest)})`, "cursor");
    if (seq < this.oldestSeq - 1) {
      throw new KvmeshError("KVMESH_CURSOR_EXPIRED", `cursor ${cursor} is older than the replay ring (oldest resumable ${details.oldest_cursor}): reconnect with snapshot=true`, { details });
    }
    return seq;
  }
}

interface StreamClient {
  readonly res: ServerResponse;
  /** Seq of the last batch written to this client. */
  pos: number;
  lastWriteMs: number;
  waitingDrain: boolean;
}

export interface SessionBindingsHttpOptions {
  readonly service: SelectionService;
  readonly logger: Logger;
  /** Identifies this run in cursors (default: 8 random hex digits). */
  readonly run?: string;
  /** Wall clock for `sent_at_ms` (ms since the Unix epoch), so a host can measure relay lag. */
  readonly wallClock?: Clock;
  readonly maxBatches?: number;
  readonly maxBindings?: number;
  readonly heartbeatMs?: number;
  /** Bound of the relay's own library subscription (default DEFAULT_MAX_PENDING_BINDINGS). */
  readonly maxPendingBindings?: number;
  /** Where the relay's series go while it runs (only when host replication is on). */
  readonly registry?: Registry;
}

export interface SessionBindingsHttpStats {
  batches: number;
  bindings: number;
  resyncs: number;
  streamsOpened: number;
  streamsExpired: number;
  /** `?snapshot=true` streams refused (429) while MAX_UNFLUSHED_SNAPSHOTS snapshots were still unread. */
  snapshotsRefused: number;
}

/**
 * Snapshot lines written and not yet flushed to their readers, at once: each holds a whole
 * snapshot in memory (about 11 MB; 40 stalled readers added 455 MB, #29 G11). Past it a
 * `?snapshot=true` stream is refused with 429 until one drains.
 */
export const MAX_UNFLUSHED_SNAPSHOTS = 4;

export class SessionBindingsHttp {
  readonly #svc: SelectionService;
  readonly #log: Logger;
  readonly #clock: Clock;
  readonly #ring: BindingReplayRing | undefined;
  readonly #clients = new Set<StreamClient>();
  readonly #heartbeatMs: number;
  #sub: SessionBindingSubscription | undefined;
  #timer: NodeJS.Timeout | undefined;
  #closed = false;
  #unregisterMetrics: (() => void) | undefined;
  readonly stats: SessionBindingsHttpStats = { batches: 0, bindings: 0, resyncs: 0, streamsOpened: 0, streamsExpired: 0, snapshotsRefused: 0 };
  /** Snapshot lines still buffered for their readers (MAX_UNFLUSHED_SNAPSHOTS). */
  #unflushedSnapshots = 0;
  readonly #snapshotLog = new LogThrottle();

  constructor(o: SessionBindingsHttpOptions) {
    this.#svc = o.service;
    this.#log = o.logger;
    this.#clock = o.wallClock ?? systemWallClock;
    this.#heartbeatMs = o.heartbeatMs ?? DEFAULT_STREAM_HEARTBEAT_MS;
    if (!(this.#heartbeatMs > 0)) throw badRequest(`heartbeatMs must be > 0, got ${this.#heartbeatMs}`, "heartbeatMs");
    if (o.service.sessionReplicationWriterId === undefined) {
      this.#ring = undefined;
      return;
    }
    this.#ring = new BindingReplayRing(o.run ?? randomBytes(4).toString("hex"), o.maxBatches, o.maxBindings);
    const sub = o.service.sessionBindingUpdates(o.maxPendingBindings === undefined ? {} : { maxPendingBindings: o.maxPendingBindings });
    this.#sub = sub;
    this.#relay(sub).catch((err: unknown) => {
      this.#log.error({ err }, "session binding relay failed: streams closed");
      this.#endStreams();
    });
    // Ticks every heartbeat; a stream silent for half of one gets a line: idle gaps stay within 1.5x.
    this.#timer = setInterval(this.#heartbeat, this.#heartbeatMs);
    this.#timer.unref();
    if (o.registry !== undefined) this.#unregisterMetrics = this.#registerMetrics(o.registry, this.#ring);
  }

  get enabled(): boolean {
    return this.#ring !== undefined;
  }

  get clients(): number {
    return this.#clients.size;
  }

  /** GET /session_bindings/updates: checks the query now (4xx as a normal reply), then streams. */
  updates(query: URLSearchParams | undefined): BindingsReply {
    const ring = this.#requireRing();
    const cursor = query?.get("cursor") ?? undefined;
    const snapshotRaw = query?.get("snapshot") ?? undefined;
    if (snapshotRaw !== undefined && snapshotRaw !== "true" && snapshotRaw !== "false") {
      throw badRequest(`snapshot: must be true or false, got ${JSON.stringify(snapshotRaw)}`, "snapshot");
    }
    const snapshot = snapshotRaw === "true";
    if (snapshot && cursor !== undefined) throw badRequest("snapshot=true and cursor exclude each other: a snapshot restarts the stream, a cursor resumes it", "snapshot");
    if (snapshot && this.#unflushedSnapshots >= MAX_UNFLUSHED_SNAPSHOTS) {
      this.stats.snapshotsRefused++;
      this.#snapshotLog.hit((suppressed) => {
        this.#log.warn({ unflushed: this.#unflushedSnapshots, suppressed }, "session binding snapshot stream refused (429): earlier snapshots are still unread (kvmesh_session_bindings_snapshots_refused_total)");
      });
      throw new KvmeshError("KVMESH_OVERLOADED", `${String(MAX_UNFLUSHED_SNAPSHOTS)} binding snapshots are still being read by other streams: retry shortly`);
    }
    const resumeAfter = cursor === undefined ? undefined : ring.resumePoint(cursor);
    return {
      status: 200,
      body: undefined,
      stream: (req, res) => {
        this.#open(req, res, ring, resumeAfter, snapshot);
      },
    };
  }

  /** POST /session_bindings: validates the whole batch (nothing applies if any binding is malformed), then merges it. */
  apply(body: unknown): BindingsReply {
    this.#requireRing();
    if (typeof body !== "object" || body === null || Array.isArray(body)) throw invalidField("body", 'must be a JSON object {"bindings": [...]}');
    const env = body as Record<string, unknown>;
    for (const k of Object.keys(env)) if (!ENVELOPE_FIELDS.has(k)) throw invalidField(k, "unknown field");
    const list = env.bindings;
    if (!Array.isArray(list)) throw invalidField("bindings", "required array of bindings");
    const checked: SessionBindingInput[] = [];
    for (let i = 0; i < list.length; i++) {
      const at = `bindings[${i}]`;
      const b: unknown = list[i];
      if (typeof b === "object" && b !== null && !Array.isArray(b)) {
        for (const k of Object.keys(b)) if (!BINDING_FIELDS.has(k)) throw invalidField(`${at}.${k}`, "unknown field");
      }
      const c = this.#svc.checkSessionBinding(b);
      if (!c.ok) {
        // c.reason is "<field>: <problem>"; "binding" is the element itself.
        const field = c.field === "binding" ? at : `${at}.${c.field}`;
        const message = c.field === "binding" ? `${at}: must be an object` : `${at}.${c.reason}`;
        if (c.problem === "shape") throw new KvmeshError("KVMESH_INVALID_FIELD", message, { details: { field } });
        throw badRequest(message, field);
      }
      checked.push(c.binding);
    }
    const outcomes: SessionBindingOutcome[] = this.#svc.applySessionBinding(checked);
    return { status: 200, body: { outcomes } };
  }

  /** Ends every stream and stops relaying (the server is closing). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#endStreams();
    void this.#sub?.return();
    // A server started again on the same registry registers them anew.
    this.#unregisterMetrics?.();
  }

  /** The relay's series, read at scrape time; returns their removal. */
  #registerMetrics(registry: Registry, ring: BindingReplayRing): () => void {
    const gauges = [
      { name: "kvmesh_session_bindings_stream_clients", help: "Open GET /session_bindings/updates streams.", read: () => this.#clients.size },
      { name: "kvmesh_session_bindings_replay_ring_batches", help: "Batches held in the replay ring.", read: () => ring.size },
    ];
    const counters = [
      { name: "kvmesh_session_bindings_stream_batches_total", help: "Binding batches added to the replay ring.", read: () => this.stats.batches },
      { name: "kvmesh_session_bindings_stream_resyncs_total", help: "Snapshot batches added after the relay's queue shed bindings.", read: () => this.stats.resyncs },
      { name: "kvmesh_session_bindings_stream_expired_total", help: "Streams ended because their reader fell behind the replay ring.", read: () => this.stats.streamsExpired },
      { name: "kvmesh_session_bindings_snapshots_refused_total", help: "?snapshot=true streams refused (429) while 4 snapshots were still unread by their streams.", read: () => this.stats.snapshotsRefused },
    ];
    for (const g of gauges) collectedGauge(registry, g, g.read);
    for (const c of counters) collectedCounter(registry, c, c.read);
    return () => {
      for (const m of [...gauges, ...counters]) registry.removeSingleMetric(m.name);
    };
  }

  #requireRing(): BindingReplayRing {
    if (this.#ring === undefined) {
      throw new KvmeshError("KVMESH_HOST_REPLICATION_DISABLED", "host replication is disabled: start kvmesh serve with --session-replication-writer-id N");
    }
    return this.#ring;
  }

  async #relay(sub: SessionBindingSubscription): Promise<void> {
    for await (const batch of sub) {
      this.#append(batch.bindings, batch.dropped);
      if (batch.dropped > 0) {
        // Peers missed bindings nobody can name any more: send them everything live once.
        this.#log.warn({ dropped: batch.dropped, dropped_total: this.#svc.stats.droppedBindings }, "session binding queue shed bindings: publishing a snapshot to repair");
        this.stats.resyncs++;
        this.#append(this.#svc.bindingsSnapshot(), 0, true);
      }
    }
    this.#endStreams();
  }

  #append(bindings: readonly BindingEvent[], dropped: number, resync?: true): void {
    const ring = this.#ring;
    if (ring === undefined) return;
    ring.append({ sent_at_ms: this.#clock.now(), dropped, bindings, ...(resync === undefined ? {} : { resync }) });
    this.stats.batches++;
    this.stats.bindings += bindings.length;
    for (const c of this.#clients) this.#pump(ring, c);
  }

  #open(req: IncomingMessage, res: ServerResponse, ring: BindingReplayRing, resumeAfter: number | undefined, snapshot: boolean): void {
    res.writeHead(200, { "content-type": NDJSON_CONTENT_TYPE, "cache-control": "no-store" });
    if (req.method === "HEAD" || this.#closed) {
      res.end();
      return;
    }
    const now = this.#clock.now();
    const client: StreamClient = { res, pos: resumeAfter ?? ring.latestSeq, lastWriteMs: now, waitingDrain: false };
    this.stats.streamsOpened++;
    if (snapshot) {
      const bindings = this.#svc.bindingsSnapshot();
      const flushed = res.write(`${stringifyJson({ cursor: ring.cursorOf(client.pos), sent_at_ms: now, dropped: 0, snapshot: true, bindings })}\n`);
      if (!flushed) {
        this.#unflushedSnapshots++;
        let held = true;
        const release = (): void => {
          if (!held) return;
          held = false;
          this.#unflushedSnapshots--;
        };
        res.once("drain", release);
        res.once("close", release);
      }
    } else if (client.pos === ring.latestSeq) {
      // Nothing to replay: a first line tells the client its cursor at once.
      res.write(this.#emptyLine(ring, client.pos, now));
    }
    this.#clients.add(client);
    res.on("close", () => {
      this.#clients.delete(client);
    });
    this.#pump(ring, client);
  }

  /** Writes the client's missing batches until the socket wants a drain; cuts a client the ring left behind. */
  #pump(ring: BindingReplayRing, c: StreamClient): void {
    if (c.waitingDrain) return;
    while (c.pos < ring.latestSeq) {
      if (c.res.writableNeedDrain) {
        c.waitingDrain = true;
        c.res.once("drain", () => {
          c.waitingDrain = false;
          this.#pump(ring, c);
        });
        return;
      }
      const entry = ring.at(c.pos + 1);
      if (entry === undefined) {
        this.stats.streamsExpired++;
        this.#log.warn({ cursor: ring.cursorOf(c.pos), oldest: ring.cursorOf(ring.oldestSeq) }, "session binding stream fell behind the replay ring: closed (the host reconnects with snapshot=true)");
        const error = `stream fell behind the replay ring after cursor ${ring.cursorOf(c.pos)}: reconnect with snapshot=true`;
        c.res.end(`${stringifyJson({ error, code: "KVMESH_CURSOR_EXPIRED", cursor: ring.cursorOf(c.pos) })}\n`);
        this.#clients.delete(c);
        return;
      }
      c.res.write(entry.line);
      c.pos = entry.seq;
      c.lastWriteMs = this.#clock.now();
    }
  }

  #emptyLine(ring: BindingReplayRing, seq: number, now: number): string {
    return `${stringifyJson({ cursor: ring.cursorOf(seq), sent_at_ms: now, dropped: 0, bindings: [] })}\n`;
  }

  readonly #heartbeat = (): void => {
    const ring = this.#ring;
    if (ring === undefined) return;
    const now = this.#clock.now();
    for (const c of this.#clients) {
      if (c.waitingDrain || c.pos !== ring.latestSeq || now - c.lastWriteMs < this.#heartbeatMs / 2) continue;
      c.res.write(this.#emptyLine(ring, c.pos, now));
      c.lastWriteMs = now;
    }
  };

  #endStreams(): void {
    for (const c of this.#clients) c.res.end();
    this.#clients.clear();
  }
}
