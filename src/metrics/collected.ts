/**
 * Metrics whose values are read at scrape time from counters a component keeps as plain numbers
 * (a property increment on the hot path), rather than observed through prom-client as they
 * change. Each scrape resets the family and copies the current values in, so a labelled series
 * whose subject is gone (a removed worker rank) disappears with it.
 */
import { Counter, Gauge, type LabelValues, type Registry } from "prom-client";

export interface CollectedMetric {
  readonly name: string;
  readonly help: string;
}

/** One labelled sample: label values and the value. */
export type LabelledSample<L extends string> = readonly [LabelValues<L>, number];

/** A counter read from `read()` at each scrape (`read` must never go down, as a counter). */
export function collectedCounter(registry: Registry, m: CollectedMetric, read: () => number): Counter {
  return new Counter({
    name: m.name,
    help: m.help,
    registers: [registry],
    collect(this: Counter) {
      this.reset();
      this.inc(read());
    },
  });
}

/** A gauge read from `read()` at each scrape. */
export function collectedGauge(registry: Registry, m: CollectedMetric, read: () => number): Gauge {
  return new Gauge({
    name: m.name,
    help: m.help,
    registers: [registry],
    collect(this: Gauge) {
      this.set(read());
    },
  });
}

/** A labelled counter whose samples are read at each scrape. */
export function collectedLabelledCounter<L extends string>(registry: Registry, m: CollectedMetric, labelNames: readonly L[], read: () => Iterable<LabelledSample<L>>): Counter<L> {
  return new Counter<L>({
    name: m.name,
    help: m.help,
    labelNames,
    registers: [registry],
    collect(this: Counter<L>) {
      this.reset();
      for (const [labels, value] of read()) this.inc(labels, value);
    },
  });
}

/** A labelled gauge whose samples are read at each scrape (a label set no longer read is gone). */
export function collectedLabelledGauge<L extends string>(registry: Registry, m: CollectedMetric, labelNames: readonly L[], read: () => Iterable<LabelledSample<L>>): Gauge<L> {
  return new Gauge<L>({
    name: m.name,
    help: m.help,
    labelNames,
    registers: [registry],
    collect(this: Gauge<L>) {
      this.reset();
      for (const [labels, value] of read()) this.set(labels, value);
    },
  });
}
