/** The load strategies by mode: the one place a LoadReplication name is turned into behaviour. */
import type { LoadReplication } from "../replica-events.js";
import { AggregateLoad } from "./aggregate-load.js";
import { ExactLoad } from "./exact-load.js";
import type { LoadStrategy, LoadStrategyOptions } from "./load-strategy.js";

export const LOAD_STRATEGIES: Readonly<Record<LoadReplication, (o: LoadStrategyOptions) => LoadStrategy>> = {
  exact: (o) => new ExactLoad(o),
  aggregate: (o) => new AggregateLoad(o),
};
