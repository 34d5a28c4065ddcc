// clawmem's answers in the shapes OpenClaw's memory surfaces expect (MemorySearchResult, MemoryReadResult,
// MemoryProviderStatus). Pure functions: no socket, no clock beyond what is passed in.

export const BACKEND = "clawmem";

/** "path#L3" or "path#L3-L9", as memory-core cites. */
export function citation(path, startLine, endLine) {
  return startLine === endLine ? `${path}#L${startLine}` : `${path}#L${startLine}-L${endLine}`;
}

/** One clawmem result as OpenClaw's MemorySearchResult. */
export function toHit(result) {
  const hit = {
    path: result.path,
    startLine: result.start_line,
    endLine: result.end_line,
    score: result.score,
    snippet: result.snippet,
    source: result.source === "sessions" ? "sessions" : "memory",
    citation: citation(result.path, result.start_line, result.end_line),
  };
  if (typeof result.vector_score === "number") hit.vectorScore = result.vector_score;
  if (typeof result.text_score === "number") hit.textScore = result.text_score;
  if (typeof result.importance === "number") hit.importance = result.importance;
  if (typeof result.projects === "string") hit.projectKey = result.projects;
  return hit;
}

/** One of clawmem's curated entries (MEMORY.md or USER.md, with annotations) as a MemorySearchResult candidate. */
export function curatedHit(entry) {
  const hit = {
    path: entry.path,
    startLine: entry.start_line,
    endLine: entry.end_line,
    score: 0,
    snippet: entry.text,
    source: "memory",
    citation: citation(entry.path, entry.start_line, entry.end_line),
  };
  if (typeof entry.importance === "number") hit.importance = entry.importance;
  if (typeof entry.triggers === "string") hit.triggers = entry.triggers;
  if (typeof entry.projects === "string") hit.projectKey = entry.projects;
  return hit;
}

/** What clawmem says about how current and how complete an answer is (empty when it is fully current). */
export function freshnessOf(answer) {
  const index = answer.index ?? {};
  const notes = [];
  if (index.pending_files > 0) notes.push(`${index.pending_files} changed file(s) not yet indexed`);
  if (index.pending_embeddings > 0) {
    notes.push(`${index.pending_embeddings} chunk(s) still waiting for vectors: keyword matches answer for them`);
  }
  if (typeof answer.warning === "string" && answer.warning) notes.push(answer.warning);
  return notes;
}

/** The repository keys clawmem can take: strings of valid Unicode (a lone surrogate names no repository a file can
 * hold), at most 1,000 characters, the first 64. Anything else is left out, as it matches no entry. */
export function projectKeys(keys) {
  if (!Array.isArray(keys)) return [];
  return keys.filter((key) => typeof key === "string" && key.length > 0 && key.length <= 1000 && key.isWellFormed())
    .slice(0, 64);
}

/** The search parameters clawmem takes for OpenClaw's search options. */
export function searchParams(opts = {}) {
  const params = {};
  if (Number.isInteger(opts.maxResults) && opts.maxResults > 0) params.maxResults = opts.maxResults;
  if (typeof opts.minScore === "number" && Number.isFinite(opts.minScore)) params.minScore = opts.minScore;
  if (opts.lexicalOnly) params.mode = "bm25";
  const projects = projectKeys(opts.activeProjectKeys);
  if (projects.length > 0) params.projects = projects;
  const sources = Array.isArray(opts.sources) ? opts.sources : null;
  if (sources && sources.length === 1 && (sources[0] === "memory" || sources[0] === "sessions")) {
    params.source = sources[0];
  }
  return params;
}

/** clawmem's `status` as OpenClaw's MemoryProviderStatus; clawmem's own view sits under `custom`. */
export function providerStatus(status, { workspace, socketPath, error } = {}) {
  if (!status) {
    return {
      backend: BACKEND,
      provider: "clawmem",
      workspaceDir: workspace,
      dirty: true,
      ...(error ? { lastSyncError: error } : {}),
      fts: { enabled: true, available: false, ...(error ? { error } : {}) },
      vector: { enabled: false, available: false },
      custom: { backend: BACKEND, socket: socketPath, reachable: false, ...(error ? { error } : {}) },
    };
  }
  const vectors = status.vector_search && status.vector_search !== "none";
  const daemon = status.daemon ?? {};
  const problem = status.last_error ?? daemon.last_error ?? daemon.embedding_error ?? undefined;
  return {
    backend: BACKEND,
    provider: status.provider || "none",
    model: status.model || undefined,
    requestedProvider: status.configured_provider,
    files: status.files_indexed,
    chunks: status.chunks_indexed,
    dirty: status.fresh !== true,
    ...(problem ? { lastSyncError: String(problem) } : {}),
    workspaceDir: status.workspace ?? workspace,
    dbPath: status.index_path,
    sources: ["memory", "sessions"].filter((s) => (status.sources ?? ["memory"]).includes(s)),
    fts: { enabled: true, available: status.index_exists !== false },
    vector: {
      enabled: status.provider !== "none",
      available: Boolean(vectors),
      semanticAvailable: Boolean(vectors),
      ...(status.dims ? { dims: status.dims } : {}),
    },
    custom: {
      backend: BACKEND,
      version: status.version,
      socket: socketPath ?? status.socket,
      fresh: status.fresh,
      staleReasons: status.stale_reasons ?? [],
      pendingFiles: status.pending_files ?? 0,
      pendingEmbeddings: status.pending_embeddings ?? 0,
      lastSyncAt: status.last_sync_at,
      providerNote: status.provider_note,
      vectorSearch: status.vector_search,
    },
  };
}
