/** Assertions on the core's typed errors, shared by the unit tests. */
import { KvmeshError } from "../../src/core/index.js";

/** The KvmeshError `fn` throws; fails the test if it throws nothing (rethrows other errors). */
export function kvmeshErrorOf(fn: () => unknown): KvmeshError {
  try {
    fn();
  } catch (e) {
    if (e instanceof KvmeshError) return e;
    throw e;
  }
  throw new Error("expected a KvmeshError");
}

/** The code of the KvmeshError `fn` throws, or undefined when it succeeds. */
export function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    if (e instanceof KvmeshError) return e.code;
    throw e;
  }
  return undefined;
}
