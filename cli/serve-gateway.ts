/**
 * `kvmesh serve`'s endpoint-picker flags (docs/gateway.md): the ext_proc port, its TLS and health
 * port, the body bound, the headers it reads, what a tokenization failure does, and data-parallel
 * rank ports. Each also from its KVMESH_* variable; src/config.ts checks the combination.
 */
import { InvalidArgumentError, Option, type Command } from "commander";

import { DEFAULT_DAEMON_CONFIG } from "../src/app/config.js";
import { HTTP2_MAX_WINDOW_BYTES, HTTP2_MIN_WINDOW_BYTES, TOKENIZER_FAILURE_MODES } from "../src/extproc/defaults.js";
import { TOKENIZER_MODES, TOKENIZER_OPTION_DEFINITIONS, type TokenizerOptions } from "../src/tokenize/tokenizer-options.js";
import { envNameFor, integerInRange, parseNonEmpty, parseNonZeroPort, parsePort } from "./parsers.js";

/** The largest body bound: Node cannot hold a string much larger than 512 MiB. */
const MAX_EXT_PROC_BODY_BYTES = 512 * 1024 * 1024;
/** A rank port stride past this puts rank 1 beyond any port range: a typo, not a layout. */
const MAX_DP_RANK_PORT_STRIDE = 1_000;

/** Upper bounds of the tokenizer's numeric flags: past them the value is a typo, not a setting. */
const TOKENIZER_FLAG_MAX: Readonly<Record<Exclude<keyof TokenizerOptions, "tokenizer" | "tokenizerFile">, number>> = {
  tokenizerTimeoutMs: 600_000,
  tokenizerConcurrency: 4_096,
  tokenizerMaxQueued: 1_000_000,
  tokenizerAttempts: 64,
  tokenizerCacheEntries: 100_000_000,
  tokenizerCacheTokens: 1_024 * 1_024 * 1_024,
};

const withEnv = (o: Option): Option => o.env(envNameFor(o.long ?? ""));

function valueOption(flags: string, description: string, parse: (v: string) => unknown, defaultValue?: unknown): Option {
  const o = new Option(flags, description).argParser(parse);
  if (defaultValue !== undefined) o.default(defaultValue);
  return withEnv(o);
}

/** A header name: lower-cased, as Envoy hands headers to ext_proc. */
function parseHeaderName(value: string): string {
  const v = value.trim().toLowerCase();
  if (!/^[a-z0-9!#$%&'*+.^_`|~-]+$/.test(v)) throw new InvalidArgumentError("must be an HTTP header name");
  return v;
}

/**
 * The tokenizer's flags, from its own definitions (src/tokenize/tokenizer-options.ts): no
 * commander defaults, so the config sees only what was given (--tokenizer-file alone means file
 * mode; a tokenizer flag without --ext-proc-port is refused), and the help shows each default.
 */
function addTokenizerOptions(cmd: Command): Command {
  for (const def of TOKENIZER_OPTION_DEFINITIONS) {
    const o = new Option(def.flag, def.description);
    if (def.field === "tokenizer") o.choices(TOKENIZER_MODES);
    else if (def.field === "tokenizerFile") o.argParser(parseNonEmpty);
    else o.argParser(integerInRange(1, TOKENIZER_FLAG_MAX[def.field]));
    cmd.addOption(withEnv(o));
  }
  return cmd;
}

export function addServeGatewayOptions(cmd: Command): Command {
  const d = DEFAULT_DAEMON_CONFIG;
  addTokenizerOptions(cmd);
  return cmd
    .addOption(valueOption("--ext-proc-port <port>", "serve the endpoint picker (Envoy ext_proc gRPC, GIE's protocol; docs/gateway.md) on this port of --host (0 = ephemeral) [default: off]", parsePort))
    .addOption(valueOption("--ext-proc-tls-cert-file <file>", "PEM certificate chain for ext_proc over TLS; needs --ext-proc-tls-key-file [default: cleartext HTTP/2]", parseNonEmpty))
    .addOption(valueOption("--ext-proc-tls-key-file <file>", "PEM private key of --ext-proc-tls-cert-file", parseNonEmpty))
    .addOption(valueOption("--ext-proc-health-port <port>", "also serve gRPC Health alone, cleartext, on this port (GIE's EPPs use 9003); needs --ext-proc-port [default: ext_proc port only]", parseNonZeroPort))
    .addOption(valueOption("--ext-proc-max-body-bytes <bytes>", "largest request body the picker buffers (413 beyond)", integerInRange(1, MAX_EXT_PROC_BODY_BYTES), d.extProcMaxBodyBytes))
    .addOption(valueOption("--ext-proc-stream-window-bytes <bytes>", "the ext_proc port's HTTP/2 receive window per stream (Node's default: 65535)", integerInRange(HTTP2_MIN_WINDOW_BYTES, HTTP2_MAX_WINDOW_BYTES), d.extProcStreamWindowBytes))
    .addOption(
      valueOption(
        "--ext-proc-connection-window-bytes <bytes>",
        "the ext_proc port's HTTP/2 receive window per connection, shared by its streams (Node's default: 65535; docs/gateway.md#transport on raising it)",
        integerInRange(HTTP2_MIN_WINDOW_BYTES, HTTP2_MAX_WINDOW_BYTES),
        d.extProcConnectionWindowBytes,
      ),
    )
    .addOption(valueOption("--session-header <name>", "request header carrying the session id (absent: routed by cache and load alone)", parseHeaderName, d.sessionHeader))
    .addOption(valueOption("--routing-group-header <name>", "request header carrying the routing group (absent: the default group)", parseHeaderName, d.routingGroupHeader))
    .addOption(
      withEnv(
        new Option("--tokenizer-failure <mode>", "when tokenization fails: route by session and load alone (counted, logged), or reject with 503").choices(TOKENIZER_FAILURE_MODES).default(d.tokenizerFailure),
      ),
    )
    .addOption(
      valueOption(
        "--dp-rank-port-stride <n>",
        "data-parallel rank r of a worker listens on its endpoint's port + (r - data_parallel_start_rank) x n: the destination Envoy gets, and x-data-parallel-host-port",
        integerInRange(0, MAX_DP_RANK_PORT_STRIDE),
        d.dpRankPortStride,
      ),
    );
}
