/** Host replication's routes (src/http/session-bindings.ts): the binding stream and the apply. */
import type { Route } from "../route.js";
import type { SessionBindingsHttp } from "../session-bindings.js";

export function bindingRoutes(bindings: SessionBindingsHttp): Route[] {
  return [
    { method: "GET", pattern: "/session_bindings/updates", body: "none", handle: (c) => bindings.updates(c.query) },
    { method: "POST", pattern: "/session_bindings", body: "required", handle: (c) => bindings.apply(c.body) },
  ];
}
