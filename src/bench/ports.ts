/**
 * Free loopback TCP ports for the benchmarks' and tests' `kvmesh serve` children, which need a
 * known mesh port before they start (the mesh's control port is its sync port + 1).
 */
import { createServer } from "node:net";

/** Tries this many OS-picked ports before giving up on finding p and p + 1 both free. */
const PORT_PAIR_ATTEMPTS = 50;
/** withFreePortPair binds at most this many times when the port is taken under it. */
export const DEFAULT_BIND_ATTEMPTS = 5;
const MAX_PORT = 65_535;

/** Listens on `port` (0: the OS picks) on loopback and closes again: the port it got, or null if taken. */
function listenOnce(port: number): Promise<number | null> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once("error", () => {
      resolve(null);
    });
    s.listen(port, "127.0.0.1", () => {
      const addr = s.address();
      const got = typeof addr === "object" && addr !== null ? addr.port : null;
      s.close(() => {
        resolve(got);
      });
    });
  });
}

/** A port p such that p and p + 1 are both free right now (the OS picks p). */
export async function freePortPair(): Promise<number> {
  for (let attempt = 0; attempt < PORT_PAIR_ATTEMPTS; attempt++) {
    const p = await listenOnce(0);
    if (p !== null && p < MAX_PORT && (await listenOnce(p + 1)) !== null) return p;
  }
  throw new Error("no free loopback port pair found");
}

const inUse = (err: unknown): boolean => err instanceof Error && ((err as { code?: unknown }).code === "EADDRINUSE" || /address already in use/i.test(err.message));

/**
 * Runs `bind` with a fresh free port pair, again with another pair when the port was taken
 * between the check and the bind: parallel test files open many outgoing connections, whose
 * ephemeral source ports come from the same range as the OS's "free" ports.
 */
export async function withFreePortPair<T>(bind: (port: number) => Promise<T>, attempts = DEFAULT_BIND_ATTEMPTS): Promise<T> {
  for (let i = 1; ; i++) {
    const port = await freePortPair();
    try {
      return await bind(port);
    } catch (err) {
      if (!inUse(err) || i >= attempts) throw err;
    }
  }
}
