/**
 * Entry point of an engine host: a child process (forked by EngineHostClient) running one
 * MockEngineFleet, so a benchmark spreads 1,024 engines over a few processes and cores instead of
 * one event loop. It exits when told to close, or when its parent goes away (IPC disconnect), so
 * a crashed driver never leaves engines bound to ports.
 */
import { pathToFileURL } from "node:url";

import { MockEngineFleet, sumStats } from "./engine-fleet.js";
import { toWireError, type HostReply, type HostRequest, type SubmitItem } from "./engine-host-protocol.js";
import type { EngineResult } from "./mock-engine.js";

/** Runs the host loop on this process's IPC channel; resolves when the host has closed. */
export function runEngineHost(): Promise<void> {
  const send = process.send?.bind(process);
  if (send === undefined) return Promise.reject(new Error("engine host: no IPC channel (run it through EngineHostClient.spawn)"));

  let fleet: MockEngineFleet | null = null;
  let closing: Promise<void> | null = null;
  let first: number[] = [];
  let results: { id: number; result: EngineResult }[] = [];
  let errors: { id: number; error: ReturnType<typeof toWireError> }[] = [];
  let flushScheduled = false;

  const reply = (msg: HostReply): void => {
    if (process.connected) send(msg);
  };
  const flush = (): void => {
    flushScheduled = false;
    if (first.length === 0 && results.length === 0 && errors.length === 0) return;
    reply({ t: "batch", first, results, errors });
    first = [];
    results = [];
    errors = [];
  };
  const scheduleFlush = (): void => {
    if (flushScheduled) return;
    flushScheduled = true;
    setImmediate(flush);
  };

  const submit = (f: MockEngineFleet, item: SubmitItem): void => {
    f.submit(item.index, {
      requestId: item.requestId,
      tokens: item.tokens,
      outputTokens: item.outputTokens,
      onFirstToken: item.firstToken
        ? () => {
            first.push(item.id);
            scheduleFlush();
          }
        : undefined,
    }).then(
      (result) => {
        results.push({ id: item.id, result });
        scheduleFlush();
      },
      (err: unknown) => {
        errors.push({ id: item.id, error: toWireError(err) });
        scheduleFlush();
      },
    );
  };

  return new Promise<void>((resolve) => {
    const close = (): Promise<void> => {
      closing ??= (async () => {
        await fleet?.close();
        flush();
      })();
      return closing;
    };

    process.on("message", (raw: unknown) => {
      const msg = raw as HostRequest;
      switch (msg.t) {
        case "start":
          if (fleet !== null || closing !== null) return;
          MockEngineFleet.start(msg.options).then(
            (f) => {
              fleet = f;
              reply({ t: "ready", descriptors: f.descriptors });
            },
            (err: unknown) => {
              reply({ t: "failed", error: toWireError(err) });
            },
          );
          return;
        case "submit": {
          const f = fleet;
          for (const item of msg.items) {
            if (f === null || closing !== null) errors.push({ id: item.id, error: { code: "KVMESH_SHUTTING_DOWN", message: "engine host is not running" } });
            else submit(f, item);
          }
          if (errors.length > 0) scheduleFlush();
          return;
        }
        case "stats":
          reply({ t: "stats", reqId: msg.reqId, stats: fleet?.stats() ?? { totals: sumStats([]), engines: [] } });
          return;
        case "waitForSubscribers": {
          const reqId = msg.reqId;
          if (fleet === null) {
            reply({ t: "subscribed", reqId, error: { code: "KVMESH_SHUTTING_DOWN", message: "engine host is not running" } });
            return;
          }
          fleet.waitForSubscribers(msg.n, msg.timeoutMs).then(
            () => {
              reply({ t: "subscribed", reqId, error: null });
            },
            (err: unknown) => {
              reply({ t: "subscribed", reqId, error: toWireError(err) });
            },
          );
          return;
        }
        case "close":
          close().then(
            () => {
              if (process.connected) {
                send({ t: "closed" } satisfies HostReply, () => {
                  process.disconnect();
                  resolve();
                });
              } else resolve();
            },
            () => {
              resolve();
            },
          );
          return;
      }
    });
    // The parent died or closed the channel: stop serving and free the ports.
    process.once("disconnect", () => {
      close().then(resolve, resolve);
    });
  });
}

const entry = process.argv[1];
if (entry !== undefined && import.meta.url === pathToFileURL(entry).href) {
  runEngineHost().then(
    () => {
      process.exitCode = 0;
    },
    (err: unknown) => {
      console.error(err);
      process.exitCode = 1;
    },
  );
}
