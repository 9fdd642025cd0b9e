/** Free loopback TCP ports for tests that need a known port (the mesh control port is port + 1). */
import { createServer } from "node:net";

function tryListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once("error", () => {
      resolve(false);
    });
    s.listen(port, "127.0.0.1", () => {
      s.close(() => {
        resolve(true);
      });
    });
  });
}

/** A port p such that p and p + 1 are both free right now (the OS picks p). */
export async function freePortPair(): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const p = await new Promise<number>((resolve, reject) => {
      const s = createServer();
      s.once("error", reject);
      s.listen(0, "127.0.0.1", () => {
        const addr = s.address();
        const port = typeof addr === "object" && addr !== null ? addr.port : 0;
        s.close(() => {
          resolve(port);
        });
      });
    });
    if (p < 65535 && (await tryListen(p + 1))) return p;
  }
  throw new Error("no free port pair found");
}

const inUse = (err: unknown): boolean => err instanceof Error && ((err as { code?: unknown }).code === "EADDRINUSE" || /address already in use/i.test(err.message));

/**
 * Runs `bind` with a fresh free port pair, again with another pair when the port was taken
 * between the check and the bind: parallel test files open many outgoing connections, whose
 * ephemeral source ports come from the same range as the OS's "free" ports.
 */
export async function withFreePortPair<T>(bind: (port: number) => Promise<T>, attempts = 5): Promise<T> {
  for (let i = 1; ; i++) {
    const port = await freePortPair();
    try {
      return await bind(port);
    } catch (err) {
      if (!inUse(err) || i >= attempts) throw err;
    }
  }
}
