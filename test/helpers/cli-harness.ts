/**
 * CLI test scaffolding: a node:http server that records requests and answers with a queued
 * reply, and a runner for the real command tree with process effects captured.
 */
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { CommanderError, type Command } from "commander";
import { expect } from "vitest";
import type { FetchFn } from "../../cli/http-client.js";
import { buildCli } from "../../cli/program.js";

export interface Seen {
  readonly method: string;
  readonly url: string;
  readonly contentType: string | undefined;
  readonly body: string;
}

export interface Reply {
  readonly status: number;
  readonly body: string;
}

export interface RecordingServer {
  readonly baseUrl: string;
  readonly seen: Seen[];
  /** The reply to the next requests (until changed). */
  reply: Reply;
  close(): Promise<void>;
}

const readBody = async (req: IncomingMessage): Promise<string> => {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString("utf8");
};

export async function startRecordingServer(): Promise<RecordingServer> {
  const state = { reply: { status: 200, body: "{}" } as Reply };
  const seen: Seen[] = [];
  const server: Server = createServer((req, res) => {
    void readBody(req).then((body) => {
      seen.push({ method: req.method ?? "", url: req.url ?? "", contentType: req.headers["content-type"], body });
      res.writeHead(state.reply.status, { "content-type": "application/json" }).end(state.reply.body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    get reply() {
      return state.reply;
    },
    set reply(r: Reply) {
      state.reply = r;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => {
          resolve();
        });
      }),
  };
}

export interface RunResult {
  readonly code: number;
  readonly out: string;
  readonly err: string;
}

/** Runs the real command tree with process effects captured; `code` is the exit code. */
export async function runCli(args: readonly string[], fetch?: FetchFn): Promise<RunResult> {
  const out: string[] = [];
  const err: string[] = [];
  const exits: number[] = [];
  const program = buildCli({
    writeOut: (s) => out.push(s),
    writeErr: (s) => err.push(s),
    exit: (c) => exits.push(c),
    startDaemon: () => Promise.reject(new Error("no daemon in client tests")),
    ...(fetch === undefined ? {} : { fetch }),
  });
  const all = (c: Command): Command[] => [c, ...c.commands.flatMap(all)];
  for (const c of all(program)) c.exitOverride();
  let code: number;
  try {
    await program.parseAsync([...args], { from: "user" });
    expect(exits.length).toBeLessThanOrEqual(1);
    code = exits[0] ?? 0;
  } catch (e) {
    if (!(e instanceof CommanderError)) throw e;
    code = e.exitCode;
  }
  return { code, out: out.join(""), err: err.join("") };
}

/** A loopback URL where nothing listens (a port just released). */
export async function refusedUrl(): Promise<string> {
  const closed = createServer();
  await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
  const port = (closed.address() as AddressInfo).port;
  await new Promise<void>((resolve) => {
    closed.close(() => {
      resolve();
    });
  });
  return `http://127.0.0.1:${port}`;
}
