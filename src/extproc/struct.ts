/**
 * google.protobuf.Struct as @grpc/proto-loader hands it over (each Value a oneof `kind`), to and
 * from plain JSON-like values: Envoy's filter metadata comes in as Structs and the picker's
 * dynamic metadata goes out as one.
 */
import type { Struct, StructValue } from "./protos.js";

export type Plain = null | boolean | number | string | Plain[] | { [key: string]: Plain };

export function fromValue(v: StructValue | undefined): Plain {
  // A Value whose kind is unset or unknown reads as null, as protobuf's JSON mapping does.
  const kind = v?.kind;
  if (kind === "numberValue") return v?.numberValue ?? 0;
  if (kind === "stringValue") return v?.stringValue ?? "";
  if (kind === "boolValue") return v?.boolValue ?? false;
  if (kind === "structValue") return fromStruct(v?.structValue);
  if (kind === "listValue") return (v?.listValue?.values ?? []).map(fromValue);
  return null;
}

export function fromStruct(s: Struct | undefined): { [key: string]: Plain } {
  const out: { [key: string]: Plain } = {};
  for (const [k, v] of Object.entries(s?.fields ?? {})) out[k] = fromValue(v);
  return out;
}

export function toValue(p: Plain): StructValue {
  if (p === null) return { nullValue: "NULL_VALUE" };
  if (typeof p === "boolean") return { boolValue: p };
  if (typeof p === "number") return { numberValue: p };
  if (typeof p === "string") return { stringValue: p };
  if (Array.isArray(p)) return { listValue: { values: p.map(toValue) } };
  return { structValue: toStruct(p) };
}

export function toStruct(obj: { readonly [key: string]: Plain }): Struct {
  const fields: Record<string, StructValue> = {};
  for (const [k, v] of Object.entries(obj)) fields[k] = toValue(v);
  return { fields };
}
