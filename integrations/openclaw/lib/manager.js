// OpenClaw's MemorySearchManager for one agent, answered by the clawmem daemon serving its workspace.
import { stat } from "node:fs/promises";
import path from "node:path";

import { DaemonUnreachable, PathError, QueryError, RequestTimeout } from "clawmem-client";

import { BACKEND, curatedHit, freshnessOf, projectKeys, providerStatus, searchParams, toHit } from "./answers.js";
import { classifyPath, WriteRecords } from "./provenance.js";

const TRIGGER_LIMIT = 512; // memory-core's most trigger candidates
const PROJECT_LIMIT = 48; // ... and project candidates, by default
const PROVENANCE_TTL_MS = 5_000; // how long a file's unchanged provenance class is reused
const PROVENANCE_KEPT = 4096; // files whose class is kept at most
const BACKSTOP_MS = 1_000; // the client's deadline past the call's
const WRITE_TIMEOUT_MS = 30 * 60_000; // a sync or rebuild asked for (OpenClaw's CLI, `memory index`) may take long

/** Run `work` with a deadline (and the caller's `signal`); past it, a DaemonUnreachable saying what did not answer. */
export async function withDeadline(timeoutMs, what, work, signal) {
  if (signal?.aborted) throw new DaemonUnreachable(`${what} was cancelled by OpenClaw`);
  let timer;
  let onAbort;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(
      () => reject(new DaemonUnreachable(`clawmem did not answer ${what} within ${timeoutMs} ms`)),
      timeoutMs,
    );
    if (signal) {
      onAbort = () => reject(new DaemonUnreachable(`${what} was cancelled by OpenClaw`));
      signal.addEventListener("abort", onAbort, { once: true });
    }
  });
  try {
    return await Promise.race([work(), expired]);
  } finally {
    clearTimeout(timer);
    if (onAbort) signal.removeEventListener("abort", onAbort);
  }
}

/** Whether clawmem can embed, from its status: its embedding error, or why it has no provider. */
function embeddingAvailability(status) {
  const error = status.daemon?.embedding_error ?? (status.provider === "none" ? status.provider_note : null);
  return error ? { ok: false, error: String(error) } : { ok: true };
}

export class ClawmemManager {
  /**
   * @param {{pool: import("./daemons.js").DaemonPool, workspace: string, timeoutMs: number, statusTtlMs: number,
   *   records?: ConstructorParameters<typeof WriteRecords>[1]}} p  `records`: how OpenClaw's write records are read
   */
  constructor({ pool, workspace, timeoutMs, statusTtlMs, logger, records }) {
    this.logger = logger;
    this.pool = pool;
    this.workspace = workspace;
    this.timeoutMs = timeoutMs;
    this.statusTtlMs = statusTtlMs;
    this.lastError = null;
    this.daemon = null;
    this._origins = new Map(); // relative path -> { key, at, originClass }: see _provenance
    this._records = new WriteRecords(workspace, records);
  }

  /** The daemon, reached (or started) within the deadline; a daemon that stopped is looked for again. `request`
   * gets the client and the call's options ({timeoutMs, signal}): past the deadline, or cancelled by OpenClaw,
   * the request's connection is closed (the daemon stops on it) and it is never sent again. */
  async _call(what, request, signal, timeoutMs = this.timeoutMs) {
    const deadline = Date.now() + timeoutMs;
    const over = new AbortController();
    return withDeadline(timeoutMs, what, async () => {
      for (let attempt = 1; ; attempt++) {
        this.daemon = await this.pool.daemonFor(this.workspace);
        if (over.signal.aborted) throw new DaemonUnreachable(`${what} was given up`);
        try {
          // The call's deadline ends the request (through `over`) and says so in the caller's terms; the client's
          // own deadline, a little later, is a backstop.
          const answer = await request(this.daemon.client,
            { signal: over.signal, timeoutMs: Math.max(1, deadline - Date.now()) + BACKSTOP_MS });
          this.lastError = null;
          return answer;
        } catch (error) {
          // A daemon that stopped since the last request: look for it (or start it) once more. One that is slow
          // is not asked again: the caller has been told it did not answer.
          if (!(error instanceof DaemonUnreachable) || error instanceof RequestTimeout || over.signal.aborted) {
            throw error;
          }
          this.pool.forget(this.daemon);
          if (attempt >= 2) throw error;
        }
      }
    }, signal).catch((error) => {
      this.lastError = error.message;
      throw error;
    }).finally(() => over.abort());
  }

  /** clawmem's answer as it came (results, provider, mode, index) plus the hits in OpenClaw's shape, each with
   * its provenance. A keyword-only search (OpenClaw's trigger lane) gives a hit that is one of the curated
   * entries that entry's triggers, so that the lane, which prefers a search hit to a candidate of the same
   * lines, still sees them; no other hit carries triggers (a chunk holds many entries: only the entry is shown). */
  async searchAnswer(query, opts = {}) {
    const params = searchParams(opts);
    const answer = await this._call("search", async (client, call) => {
      try {
        return await client.search(query, params, call);
      } catch (error) {
        // A daemon of an older clawmem (started before an upgrade, still serving) takes no repositories.
        if (!(error instanceof QueryError && params.projects && /'projects'/.test(error.message))) throw error;
        this._older("searches are not weighed by the repositories being worked in");
        const { projects: _, ...without } = params;
        return client.search(query, without, call);
      }
    }, opts.signal);
    const entries = opts.lexicalOnly
      ? await this._entries("triggers", opts.activeProjectKeys, opts.signal).catch(() => []) : [];
    const byLines = new Map(entries.map((e) => [`${e.path}:${e.start_line}:${e.end_line}`, e]));
    const hits = await Promise.all((answer.results ?? []).map(async (result) => {
      const hit = toHit(result);
      const entry = byLines.get(`${hit.path}:${hit.startLine}:${hit.endLine}`);
      if (entry && hit.source === "memory") hit.triggers = entry.triggers;
      hit.provenance = await this._provenance(hit.path, hit.source);
      return hit;
    }));
    return { ...answer, hits, notes: freshnessOf(answer) };
  }

  async search(query, opts = {}) {
    const answer = await this.searchAnswer(query, opts);
    opts.onDebug?.({ backend: BACKEND, configuredMode: answer.mode, effectiveMode: answer.mode });
    return answer.hits;
  }

  /** OpenClaw's lane-1 candidates: the entries of MEMORY.md and USER.md with trigger phrases, most important first. */
  async listTriggerCandidates(opts = {}) {
    return this._candidates("triggers", Math.min(TRIGGER_LIMIT, positive(opts.limit) ?? TRIGGER_LIMIT),
      opts.activeProjectKeys);
  }

  /** The project-memory block's candidates: MEMORY.md's entries scoped to repositories (none without active keys). */
  async listCuratedProjectCandidates(opts = {}) {
    if (!Array.isArray(opts.activeProjectKeys) || opts.activeProjectKeys.length === 0) return [];
    const found = await this._candidates("projects", Math.min(TRIGGER_LIMIT, positive(opts.limit) ?? PROJECT_LIMIT),
      opts.activeProjectKeys);
    return found.filter((hit) => hit.path === "MEMORY.md");
  }

  /** Entries scoped elsewhere are left out by clawmem before the limit, as memory-core leaves them out. */
  async _candidates(kind, limit, activeProjectKeys) {
    const entries = await this._entries(kind, activeProjectKeys, undefined, limit);
    return Promise.all(entries.map(async (entry) => ({
      ...curatedHit(entry),
      provenance: await this._provenance(entry.path, "memory"),
    })));
  }

  async _entries(kind, activeProjectKeys, signal, limit = TRIGGER_LIMIT) {
    const projects = projectKeys(activeProjectKeys);
    const answer = await this._call("curated", async (client, call) => {
      try {
        return await client.curated({ kind, limit, projects }, call);
      } catch (error) {
        if (error?.code !== -32601) throw error; // an older clawmem has no curated entries to list
        this._older("trigger recall and the project block have no entries");
        return { entries: [] };
      }
    }, signal);
    return answer.entries ?? [];
  }

  /** Say once that the daemon is an older clawmem's than the plugin, and what that costs until it restarts. */
  _older(what) {
    if (this._olderSaid) return;
    this._olderSaid = true;
    this.logger?.warn?.(`memory-clawmem: the clawmem daemon of ${this.workspace} is older than the plugin (${what}):` +
      " restart it (`clawmem status --json` in the workspace gives its pid), and the next request starts a current one");
  }

  /** A hit's MemoryEntryProvenance: its file's origin class (provenance.js), its mtime as when it was observed.
   * The class is kept for the file as it is (device, inode, mtime, size) for a few seconds: a search's hits then
   * cost one `stat` each, not two `realpath`s and a read of OpenClaw's records. A file that changed, or was
   * replaced (by a symlink too), is classified again; so is any after PROVENANCE_TTL_MS. OpenClaw's records are
   * read a workspace at a time (WriteRecords), not a round trip to its state worker per hit. */
  async _provenance(relativePath, source) {
    if (source !== "memory") return { originClass: "untrusted", sessionKind: "unknown", observedAt: 0 };
    const st = await stat(path.resolve(this.workspace, relativePath)).catch(() => null);
    const key = st ? `${st.dev}:${st.ino}:${st.mtimeMs}:${st.size}` : "";
    const known = this._origins.get(relativePath);
    let originClass = known && key && known.key === key && Date.now() - known.at < PROVENANCE_TTL_MS
      ? known.originClass : null;
    if (originClass === null) {
      originClass = await classifyPath({ workspaceDir: this.workspace, relativePath,
        recorded: (_workspace, relative) => this._records.origin(relative, st?.ctimeMs) }).catch(() => "untrusted");
      if (this._origins.size >= PROVENANCE_KEPT) this._origins.clear();
      if (key) this._origins.set(relativePath, { key, at: Date.now(), originClass });
    }
    return { originClass, sessionKind: "unknown", observedAt: st ? Math.floor(st.mtimeMs) : 0 };
  }

  async readFile({ relPath, from, lines }) {
    try {
      const answer = await this._call("get", (client, call) => client.get(relPath, { from, lines }, call));
      const out = { status: "ok", text: answer.text, path: answer.path, from: answer.from, lines: answer.lines };
      if (answer.truncated) {
        out.truncated = true;
        const next = answer.next_from ?? (answer.from ?? 1) + (answer.lines ?? 0);
        out.nextFrom = next;
      }
      return out;
    } catch (error) {
      if (error instanceof PathError && error.data?.missing) return { status: "not_found", text: "", path: relPath };
      throw error;
    }
  }

  /** OpenClaw asks synchronously: the last status clawmem gave, refreshed in the background when old. */
  status() {
    const daemon = this.daemon;
    if (daemon && Date.now() - daemon.statusAt > this.statusTtlMs) {
      daemon.refresh(this.timeoutMs).catch((error) => {
        this.lastError = error.message;
      });
    }
    return providerStatus(daemon?.status, {
      workspace: this.workspace,
      socketPath: daemon?.socketPath,
      error: this.lastError ?? undefined,
    });
  }

  /** Fetch a current status (for status-purpose managers, before OpenClaw reads `status()`). */
  async refreshStatus() {
    return this._call("status", async (_client, call) => this.daemon.refresh(call.timeoutMs, call.signal));
  }

  /** Bring the index in step with the files (`wait`: until the pass is done, within `timeoutMs`). */
  async sync({ timeoutMs = WRITE_TIMEOUT_MS } = {}) {
    await this._call("sync", (client, call) => client.request("sync", { wait: true }, call), undefined, timeoutMs);
  }

  /** Rebuild the index from the files; the old one answers until the new one is complete. */
  async reindex({ timeoutMs = WRITE_TIMEOUT_MS } = {}) {
    await this._call("reindex", (client, call) => client.request("reindex", { wait: true }, call), undefined,
      timeoutMs);
  }

  async probeEmbeddingAvailability() {
    try {
      return { ...embeddingAvailability(await this.refreshStatus()), checked: true, checkedAtMs: Date.now() };
    } catch (error) {
      return { ok: false, error: error.message, checked: true, checkedAtMs: Date.now() };
    }
  }

  getCachedEmbeddingAvailability() {
    const status = this.daemon?.status;
    return status ? { ...embeddingAvailability(status), cached: true, checkedAtMs: this.daemon.statusAt } : null;
  }

  async probeVectorAvailability() {
    try {
      const status = await this.refreshStatus();
      return Boolean(status.vector_search && status.vector_search !== "none");
    } catch {
      return false;
    }
  }

  async probeVectorStoreAvailability() {
    return this.probeVectorAvailability();
  }

  /** OpenClaw closes a manager after each RPC; the daemon's connection stays with the pool for the next. */
  async close() {}
}

function positive(value) {
  return Number.isInteger(value) && value > 0 ? value : undefined;
}
