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
