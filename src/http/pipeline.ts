/**
 * HTTP/1.1 pipelining with back-pressure (#29 G9). node:http parses every request already read
 * from a socket and emits each at once; a client that pipelines thousands of `GET /loads` and
 * never reads made the daemon compute and buffer every answer (RSS 100 MB -> 3.6 GB in 30 s).
 * Here a socket has at most MAX_PIPELINED_IN_FLIGHT requests being answered; the next waits
 * (handled in order) until an earlier answer has finished and the socket's write buffer has
 * drained, and the socket is paused meanwhile. A client that queues more than
 * MAX_PIPELINED_WAITING behind them is cut off (counted, logged throttled): no real client
 * pipelines that deep, and what waits costs memory.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Socket } from "node:net";

/** Requests of one socket being answered at once. */
export const MAX_PIPELINED_IN_FLIGHT = 4;
/** Requests of one socket waiting behind those; past it the connection is closed. */
export const MAX_PIPELINED_WAITING = 32;

interface SocketState {
  inFlight: number;
  /** Cut off: the requests node still parses from what it had read are dropped. */
  cut: boolean;
  readonly waiting: (() => void)[];
}

export class PipelineGate {
  readonly #sockets = new WeakMap<Socket, SocketState>();
  readonly #onOverflow: (socket: Socket) => void;

  /** `onOverflow`: a socket cut off for queueing too many requests (count and log it). */
  constructor(onOverflow: (socket: Socket) => void) {
    this.#onOverflow = onOverflow;
  }

  /** Runs `handle` now, or once the socket's earlier answers are out; never for a socket cut off. */
  admit(req: IncomingMessage, res: ServerResponse, handle: () => void): void {
    const socket = req.socket;
    let st = this.#sockets.get(socket);
    if (st === undefined) {
      const fresh: SocketState = { inFlight: 0, cut: false, waiting: [] };
      st = fresh;
      this.#sockets.set(socket, fresh);
      socket.once("close", () => {
        fresh.waiting.length = 0;
      });
    }
    const state = st;
    if (state.cut) return;
    const start = (): void => {
      state.inFlight++;
      let done = false;
      const finished = (): void => {
        if (done) return;
        done = true;
        state.inFlight--;
        if (socket.writableNeedDrain && !socket.destroyed) socket.once("drain", () => { this.#next(socket, state); });
        else this.#next(socket, state);
      };
      res.once("finish", finished);
      res.once("close", finished);
      handle();
    };
    if (state.inFlight < MAX_PIPELINED_IN_FLIGHT && state.waiting.length === 0) {
      start();
      return;
    }
    if (state.waiting.length >= MAX_PIPELINED_WAITING) {
      state.cut = true;
      state.waiting.length = 0;
      this.#onOverflow(socket);
      socket.destroy();
      return;
    }
    state.waiting.push(start);
    socket.pause();
  }

  #next(socket: Socket, state: SocketState): void {
    while (state.inFlight < MAX_PIPELINED_IN_FLIGHT && !socket.destroyed) {
      const start = state.waiting.shift();
      if (start === undefined) break;
      start();
    }
    if (state.waiting.length === 0 && !socket.destroyed && socket.isPaused()) socket.resume();
  }
}
