/**
 * The workers file's parser thread (a worker_threads worker; workers-file.ts starts one per
 * read): runs one WorkersFileJob off the main thread and posts its result. Why a thread: see
 * workers-file-job.ts.
 */
import { parentPort, workerData } from "node:worker_threads";

import { runWorkersFileJob, type WorkersFileJob } from "./workers-file-job.js";

// Assertion (a programming error): workers-file.ts starts this file as a worker.
if (parentPort === null) throw new Error("workers-file-thread.ts runs as a worker thread only");
try {
  parentPort.postMessage({ ok: true, result: runWorkersFileJob(workerData as WorkersFileJob) });
} catch (err) {
  parentPort.postMessage({ ok: false, message: err instanceof Error ? err.message : String(err) });
}
