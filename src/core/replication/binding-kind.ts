/** Session bindings: merged by `(sequence, writer_id)` everywhere (bindings.ts); a snapshot carries every live one and recent unbinds. */
import type { BindingEvent } from "../replica-events.js";
import type { ReplicaKindFactory } from "./kind.js";

export type BindingKindEvent = { readonly kind: "binding"; readonly event: BindingEvent };

export interface BindingSnapshotPart {
  readonly bindings: readonly BindingEvent[];
}

export const bindingKind: ReplicaKindFactory<BindingKindEvent, BindingSnapshotPart> = ({ bindings }, emit) => {
  bindings.onBindingEvent((event) => {
    emit({ kind: "binding", event });
  });
  return {
    kinds: ["binding"],
    apply: (_origin, e) => bindings.applyBindingEvent(e.event),
    snapshot: () => ({ bindings: bindings.snapshot() }),
    install(_origin, s) {
      for (const b of s.bindings) bindings.applyBindingEvent(b);
    },
  };
};
