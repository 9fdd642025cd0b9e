/**
 * An observer in event-emitter mode (`observer.on`), closed after its socket while its read loop
 * waits: zeromq.js's own loop left that rejection (ENOTSOCK) unhandled, which ends a Node process
 * (a daemon whose KV listener's observer did not end within the close grace, seen under load).
 * observe() gives it a loop that ends instead; events still arrive before the close.
 */
import { Subscriber } from "zeromq";
import { afterEach, describe, expect, it } from "vitest";

import { observe, watchEvents } from "../../../src/util/zmq-observers.js";
import { waitFor } from "../../helpers/wait.js";

const unhandled: unknown[] = [];
const onUnhandled = (e: unknown): void => {
  unhandled.push(e);
};

afterEach(() => {
  process.off("unhandledRejection", onUnhandled);
});

describe("observe() and watchEvents(): a zmq observer closed after its socket", () => {
  it("delivers events, then closes without an unhandled rejection", async () => {
    process.on("unhandledRejection", onUnhandled);
    const sub = new Subscriber();
    const observer = observe(sub);
    let retries = 0;
    const watching = watchEvents(observer, (e) => {
      if (e.type === "connect:retry") retries++;
    });
    // Nothing listens on port 9: libzmq retries the connection and says so.
    sub.connect("tcp://127.0.0.1:9");
    await waitFor(() => retries > 0, 20_000, "a connect:retry event");
    sub.close();
    observer.close();
    // Give a rejection of the pending read time to surface.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(unhandled).toEqual([]);
    expect(observer.closed).toBe(true);
    await watching;
  });
});
