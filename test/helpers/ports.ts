/** Free loopback port pairs: the shared harness's (src/bench/ports.ts), re-exported for the mesh tests. */
export { freePortPair, withFreePortPair } from "../../src/bench/ports.js";
