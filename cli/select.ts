/** `kvmesh select`: a thin client of POST /select (or /select_and_reserve with --reserve). */
import { Option, type Command } from "commander";
import { addClientOptions, requestOptionsOf, runClientCall, type ClientDeps } from "./http-client.js";
import { parseNonEmpty, parseTokenIds } from "./parsers.js";

interface SelectOptions {
  tokens?: number[];
  tokensFile?: string;
  modelName?: string;
  routingGroup?: string;
  sessionId?: string;
  selectionId?: string;
  reserve?: boolean;
}

export function addSelectCommand(program: Command, deps: ClientDeps): Command {
  const cmd = addClientOptions(
    program
      .command("select")
      .description("ask a running daemon which worker should serve a prompt: POST /select (or /select_and_reserve)")
      .addOption(new Option("--tokens <ids>", "prompt token ids, comma-separated").argParser(parseTokenIds).conflicts("tokensFile"))
      .addOption(new Option("--tokens-file <file>", "file of token ids (comma/whitespace-separated, or a JSON array)").argParser(parseNonEmpty))
      .addOption(new Option("--model-name <name>", "model (default on the daemon: \"default\")").argParser(parseNonEmpty))
      .addOption(new Option("--routing-group <group>", "routing group (default on the daemon: \"default\")").argParser(parseNonEmpty))
      .addOption(new Option("--session-id <id>", "session for affinity").argParser(parseNonEmpty))
      .addOption(new Option("--selection-id <id>", "selection id (a later POST /reservations can book a /select answer by it; --reserve generates one if absent)").argParser(parseNonEmpty))
      .option("--reserve", "also book the load on the chosen worker (POST /select_and_reserve)"),
  );
  cmd.action(async function (this: Command) {
    const o = this.opts<SelectOptions>();
    let tokens = o.tokens;
    if (tokens === undefined) {
      if (o.tokensFile === undefined) this.error("error: one of --tokens or --tokens-file is required");
      const read = await readTokensFile(deps, o.tokensFile);
      if (read === undefined) return;
      tokens = read;
    }
    const body: Record<string, unknown> = { token_ids: tokens };
    if (o.modelName !== undefined) body["model_name"] = o.modelName;
    if (o.routingGroup !== undefined) body["routing_group"] = o.routingGroup;
    if (o.sessionId !== undefined) body["session_context"] = { session_id: o.sessionId };
    if (o.selectionId !== undefined) body["selection_id"] = o.selectionId;
    const path = o.reserve === true ? "/select_and_reserve" : "/select";
    await runClientCall(deps, requestOptionsOf(this.opts(), deps.fetch), { method: "POST", path, body });
  });
  return cmd;
}

/** Reads and parses --tokens-file; on failure reports it (exit 1) and returns undefined. */
async function readTokensFile(deps: ClientDeps, file: string): Promise<number[] | undefined> {
  try {
    return parseTokenIds(await deps.readFile(file));
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    deps.writeErr(`error: --tokens-file ${file}: ${why}\n`);
    deps.exit(1);
    return undefined;
  }
}
