// memory_search and memory_get, with memory-core's argument schemas and result shapes, answered by clawmem.
// A failure never throws into the Gateway: it comes back as the result memory-core gives when memory is
// unavailable (`disabled`, `unavailable`, `error`, `warning`, `action`), carrying clawmem's own message.
import { BACKEND } from "./answers.js";

export const SEARCH_PARAMETERS = {
  type: "object",
  properties: {
    query: { type: "string" },
    maxResults: { type: "integer", minimum: 1 },
    minScore: { type: "number" },
    // The names models also send, as OpenClaw accepts them for memory-core.
    max_results: { type: "integer", minimum: 1 },
    min_score: { type: "number" },
    corpus: { type: "string", enum: ["memory", "wiki", "all", "sessions"] },
  },
  required: ["query"],
  additionalProperties: false,
};

export const GET_PARAMETERS = {
  type: "object",
  properties: {
    path: { type: "string" },
    from: { type: "integer", minimum: 1 },
    lines: { type: "integer", minimum: 1 },
    corpus: { type: "string", enum: ["memory", "wiki", "all"] },
  },
  required: ["path"],
  additionalProperties: false,
};

const DEFAULT_MAX_RESULTS = 6;

/** OpenClaw's own result count for the agent (`memory.search.query.maxResults`, the agent's over the shared). */
function configuredMaxResults(config, agentId) {
  const own = config?.agents?.entries?.[agentId]?.memory?.search?.query?.maxResults;
  const shared = config?.memory?.search?.query?.maxResults;
  const value = own ?? shared;
  return Number.isInteger(value) && value > 0 ? value : DEFAULT_MAX_RESULTS;
}

function jsonResult(payload) {
  return { content: [{ type: "text", text: JSON.stringify(payload, null, 2) }], details: payload };
}

function unavailable(error, action) {
  const message = error?.message ?? String(error);
  const warning = "Memory search is unavailable: clawmem did not answer.";
  return {
    results: [],
    disabled: true,
    unavailable: true,
    error: message,
    warning,
    action,
    debug: { backend: BACKEND, warning, action, error: message },
  };
}

/** OpenClaw's citations setting: "on", "off" or "auto" (memory-core cites in direct chats under "auto"). */
function citesFor(config, sessionKey) {
  const mode = config?.memory?.citations ?? "auto";
  if (mode === "on" || mode === "off") return { mode, include: mode === "on" };
  const direct = !sessionKey || !/:(group|channel|room|thread):/.test(String(sessionKey));
  return { mode, include: direct };
}

/** Both tools for one agent's turn; `managerFor()` gives the agent's ClawmemManager. */
export function createTools({ managerFor, config, sessionKey, sandboxed, agentId, activeProjectKeys }) {
  const memorySearch = {
    label: "Memory Search",
    name: "memory_search",
    description:
      "Mandatory recall step: search MEMORY.md and the Markdown files under memory/ (clawmem's index: keyword " +
      "and semantic, fused) before answering questions about prior work, decisions, dates, people, preferences, " +
      "or todos. `corpus=sessions` searches indexed session transcripts. If the response has disabled=true or " +
      "stale=true, tell the user and include the warning/action guidance.",
    parameters: SEARCH_PARAMETERS,
    async execute(_toolCallId, params) {
      const started = Date.now();
      const query = typeof params?.query === "string" ? params.query : "";
      const corpus = params?.corpus ?? "memory";
      if (corpus === "wiki") {
        return jsonResult({ results: [], provider: BACKEND, warning: "clawmem has no wiki corpus", debug: { backend: BACKEND } });
      }
      if (corpus === "sessions" && sandboxed) {
        return jsonResult({ results: [], provider: BACKEND, warning: "session transcripts are not searched from a sandbox", debug: { backend: BACKEND } });
      }
      const manager = managerFor();
      try {
        const answer = await manager.searchAnswer(query, {
          maxResults: params?.maxResults ?? params?.max_results ?? configuredMaxResults(config, agentId),
          minScore: params?.minScore ?? params?.min_score,
          sources: corpus === "all" ? (sandboxed ? ["memory"] : undefined) : [corpus],
          activeProjectKeys,
        });
        const cites = citesFor(config, sessionKey);
        const results = answer.hits.map((hit) => ({
          ...hit,
          corpus: hit.source,
          snippet: cites.include ? `${hit.snippet.trimEnd()}\n\nSource: ${hit.citation}` : hit.snippet,
          ...(cites.include ? {} : { citation: undefined }),
        }));
        const payload = {
          results,
          provider: answer.provider,
          model: answer.model || undefined,
          mode: answer.mode,
          citations: cites.mode,
          debug: {
            backend: BACKEND,
            agentId,
            mode: answer.mode,
            pendingFiles: answer.index?.pending_files ?? 0,
            pendingEmbeddings: answer.index?.pending_embeddings ?? 0,
            toolMs: Date.now() - started,
          },
        };
        if (answer.notes.length > 0) {
          payload.warning = answer.notes.join("; ");
          if (answer.index?.pending_files > 0 || answer.first_pass) payload.stale = true;
        }
        return jsonResult(payload);
      } catch (error) {
        return jsonResult(unavailable(error, actionFor(error)));
      }
    },
  };

  const memoryGet = {
    label: "Memory Get",
    name: "memory_get",
    description:
      "Safe exact excerpt read from MEMORY.md or a Markdown file under memory/ (clawmem). Defaults to a bounded " +
      "excerpt when lines are omitted and includes truncation/continuation info when more content exists. " +
      "status=ok means the excerpt was read; status=not_found means no such memory file; status=error means the " +
      "read failed or the path is refused.",
    parameters: GET_PARAMETERS,
    async execute(_toolCallId, params) {
      const relPath = typeof params?.path === "string" ? params.path : "";
      if (params?.corpus === "wiki") {
        return jsonResult({ status: "not_found", text: "", path: relPath, warning: "clawmem has no wiki corpus" });
      }
      try {
        const read = await managerFor().readFile({ relPath, from: params?.from, lines: params?.lines });
        return jsonResult({ ...read, debug: { backend: BACKEND } });
      } catch (error) {
        return jsonResult({
          path: relPath,
          text: "",
          status: "error",
          code: error?.data?.type ?? error?.name ?? "MEMORY_READ_FAILED",
          error: error?.message ?? String(error),
          debug: { backend: BACKEND },
        });
      }
    },
  };
  return [memorySearch, memoryGet];
}

function actionFor(error) {
  if (error?.name === "NotInstalled") return "Install clawmem on the Gateway's host, then retry memory_search.";
  if (error?.name === "WrongWorkspace") return "Give this agent's workspace its own clawmem socket, then retry.";
  return "Check the clawmem daemon for this workspace (`clawmem status --workspace <dir>`), then retry memory_search.";
}
