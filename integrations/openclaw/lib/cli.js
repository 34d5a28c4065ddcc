// `openclaw memory status | search | index`, answered by the clawmem daemon of each agent's workspace (started if
// none serves it), with memory-core's flags and output, so scripts written for OpenClaw's memory keep working.
// Every failure is one line on stderr and exit code 1; the daemons' connections are closed when a command ends.
import { BACKEND } from "./answers.js";

const HELP = `
Examples:
  openclaw memory status                     Show each agent's clawmem index.
  openclaw memory status --json              The same as JSON.
  openclaw memory search "meeting notes"     Search the default agent's memory.
  openclaw memory index --force              Rebuild the index from the Markdown.
`;

function positiveInteger(flag) {
  return (value) => {
    const parsed = Number(value);
    if (!/^\d+$/.test(value.trim()) || !Number.isSafeInteger(parsed) || parsed < 1) {
      throw Object.assign(new Error(`${flag} must be a positive integer.`), { code: "commander.invalidArgument", exitCode: 1 });
    }
    return parsed;
  };
}

function score(flag) {
  return (value) => {
    const parsed = Number(value.trim());
    if (value.trim() === "" || !Number.isFinite(parsed) || parsed < 0 || parsed > 1) {
      throw Object.assign(new Error(`${flag} must be a number between 0 and 1.`), { code: "commander.invalidArgument", exitCode: 1 });
    }
    return parsed;
  };
}

/** The agents a command is about: `--agent`, else every configured agent (status, index) or the default one. */
function agentsOf(config, agent, all) {
  if (agent) return [agent];
  const entries = config?.agents?.entries && typeof config.agents.entries === "object" ? Object.keys(config.agents.entries) : [];
  const listed = Array.isArray(config?.agents?.list) ? config.agents.list.map((a) => a?.id).filter(Boolean) : [];
  const ids = [...new Set([...entries, ...listed])];
  if (ids.length === 0) return ["main"];
  if (all) return ids;
  const marked = Array.isArray(config?.agents?.list) ? config.agents.list.find((a) => a?.default)?.id : undefined;
  return [marked ?? (ids.includes("main") ? "main" : ids[0])];
}

function statusLines(agentId, status) {
  const custom = status.custom ?? {};
  return [
    `Memory Search (${agentId})`,
    `Backend: ${BACKEND}${custom.version ? ` ${custom.version}` : ""}`,
    `Provider: ${status.provider}${status.model ? ` (${status.model})` : ""}`,
    `Sources: ${(status.sources ?? []).join(", ") || "memory"}`,
    `Indexed: ${status.files ?? 0} files · ${status.chunks ?? 0} chunks`,
    `Dirty: ${status.dirty ? "yes" : "no"}${custom.pendingFiles ? ` (${custom.pendingFiles} file(s) not indexed yet)` : ""}`,
    `Vectors: ${status.vector?.available ? "ready" : "unavailable"}${custom.pendingEmbeddings ? ` (${custom.pendingEmbeddings} waiting)` : ""}`,
    `Store: ${status.dbPath ?? "?"}`,
    `Workspace: ${status.workspaceDir}`,
    `Socket: ${custom.socket ?? "?"}`,
    ...(status.lastSyncError ? [`Last error: ${status.lastSyncError}`] : []),
  ];
}

/** Register the `memory` command on OpenClaw's CLI; `memory` is the plugin's ClawmemMemory. */
export function registerMemoryCli({ program, config }, memory, out = process.stdout, err = process.stderr) {
  const run = (work) => async (...args) => {
    try {
      await work(...args);
    } catch (error) {
      err.write(`memory-clawmem: ${error?.message ?? String(error)}\n`);
      process.exitCode = 1;
    } finally {
      memory.close();
    }
  };
  const manager = (agentId) => memory.manager(memory.workspaceFor(config, agentId));
  const command = program.command("memory").description("Search, inspect and reindex memory (answered by clawmem)")
    .addHelpText("after", HELP);

  command.command("status").description("Show each agent's memory index")
    .option("--agent <id>", "Agent id (default: all configured agents)").option("--json", "Print JSON")
    .option("--deep", "Probe embedding availability").option("--index", "Sync the index first (implies --deep)")
    .action(run(async (opts) => {
      const found = [];
      for (const agentId of agentsOf(config, opts.agent, true)) {
        const m = manager(agentId);
        if (opts.index) await m.sync();
        await m.refreshStatus();
        const status = m.status();
        const embeddingProbe = opts.deep || opts.index ? await m.probeEmbeddingAvailability() : undefined;
        found.push({ agentId, status, ...(embeddingProbe ? { embeddingProbe } : {}) });
      }
      if (opts.json) {
        out.write(`${JSON.stringify(found, null, 2)}\n`);
        return;
      }
      out.write(`${found.map(({ agentId, status, embeddingProbe }) => [...statusLines(agentId, status),
        ...(embeddingProbe ? [`Embeddings: ${embeddingProbe.ok ? "ready" : `unavailable (${embeddingProbe.error})`}`] : [])]
        .join("\n")).join("\n\n")}\n`);
    }));

  command.command("index").description("Sync the index with the Markdown (--force: rebuild it)")
    .option("--agent <id>", "Agent id (default: all configured agents)").option("--force", "Rebuild from scratch", false)
    .action(run(async (opts) => {
      for (const agentId of agentsOf(config, opts.agent, true)) {
        const m = manager(agentId);
        if (opts.force) await m.reindex();
        else await m.sync();
        await m.refreshStatus();
        const status = m.status();
        out.write(`${agentId}: ${status.files ?? 0} files, ${status.chunks ?? 0} chunks indexed (${status.workspaceDir})\n`);
      }
    }));

  command.command("search").description("Search memory").argument("[query]", "Search query")
    .option("--query <text>", "Search query (alternative to the positional argument)")
    .option("--agent <id>", "Agent id (default: the default agent)")
    .option("--max-results <n>", "Max results", positiveInteger("--max-results"))
    .option("--min-score <n>", "Minimum score (clawmem's scale, 0..1)", score("--min-score"))
    .option("--json", "Print JSON")
    .action(run(async (queryArg, opts) => {
      const query = opts.query ?? queryArg;
      if (!query || !String(query).trim()) throw new Error("missing search query: give it as an argument or with --query <text>");
      const [agentId] = agentsOf(config, opts.agent, false);
      const answer = await manager(agentId).searchAnswer(query, { maxResults: opts.maxResults, minScore: opts.minScore });
      const warning = answer.notes.length ? answer.notes.join("; ") : undefined;
      if (opts.json) {
        out.write(`${JSON.stringify({ results: answer.hits, provider: answer.provider, mode: answer.mode,
          ...(warning ? { warning } : {}) }, null, 2)}\n`);
        return;
      }
      if (warning) err.write(`memory-clawmem: ${warning}\n`);
      if (answer.hits.length === 0) {
        out.write("No matches.\n");
        return;
      }
      out.write(`${answer.hits.map((hit) => `${hit.score.toFixed(3)} ${hit.path}:${hit.startLine}-${hit.endLine}\n${hit.snippet.trim()}`)
        .join("\n\n")}\n`);
    }));
}
