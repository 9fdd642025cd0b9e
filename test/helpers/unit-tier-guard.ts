/**
 * Setup file of the unit tier (vitest.config.ts): a unit test opens no socket and starts no
 * process, so that `npm run test:unit` stays fast and cannot flake on ports. Listening,
 * connecting or spawning throws here, naming the test tier to move the file to. (ZeroMQ sockets
 * are native and not caught here; unit files do not import zeromq.)
 */
import childProcess from "node:child_process";
import { syncBuiltinESMExports } from "node:module";
import net from "node:net";

function refuse(what: string): never {
  throw new Error(`${what} in a unit test: tests that open sockets or start processes belong to the system tier (see vitest.config.ts)`);
}

net.Server.prototype.listen = function listen(): never {
  refuse("net.Server.listen");
};
net.Socket.prototype.connect = function connect(): never {
  refuse("net.Socket.connect");
};
for (const name of ["spawn", "spawnSync", "fork", "exec", "execSync", "execFile", "execFileSync"] as const) {
  Object.defineProperty(childProcess, name, {
    value: () => refuse(`child_process.${name}`),
    configurable: true,
    writable: true,
  });
}
// ESM named imports of node:child_process read the CommonJS exports only after this.
syncBuiltinESMExports();
