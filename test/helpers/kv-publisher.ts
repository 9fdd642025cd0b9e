/** The mock engines' KV-event publisher, re-exported for the ingest and daemon tests. */
export * from "../../src/mock/kv-event-publisher.js";
