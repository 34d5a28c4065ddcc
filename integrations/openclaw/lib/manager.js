// OpenClaw's MemorySearchManager for one agent, answered by the clawmem daemon serving its workspace.
import { DaemonUnreachable, PathError } from "clawmem-client";

import { BACKEND, freshnessOf, providerStatus, searchParams, toHit } from "./answers.js";

/** Run `work` with a deadline; past it, a DaemonUnreachable that says what did not answer. */
export async function withDeadline(timeoutMs, what, work) {
  let timer;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(
      () => reject(new DaemonUnreachable(`clawmem did not answer ${what} within ${timeoutMs} ms`)),
      timeoutMs,
    );
  });
  try {
    return await Promise.race([work(), expired]);
  } finally {
    clearTimeout(timer);
  }
}

/** Whether clawmem can embed, from its status: its embedding error, or why it has no provider. */
function embeddingAvailability(status) {
  const error = status.daemon?.embedding_error ?? (status.provider === "none" ? status.provider_note : null);
  return error ? { ok: false, error: String(error) } : { ok: true };
}

export class ClawmemManager {
  /**
   * @param {{pool: import("./daemons.js").DaemonPool, workspace: string, timeoutMs: number, statusTtlMs: number}} p
   */
  constructor({ pool, workspace, timeoutMs, statusTtlMs }) {
    this.pool = pool;
    this.workspace = workspace;
    this.timeoutMs = timeoutMs;
    this.statusTtlMs = statusTtlMs;
    this.lastError = null;
    this.daemon = null;
  }

  /** The daemon, reached (or started) within the deadline; a daemon that stopped is looked for again. */
  async _call(what, request) {
    return withDeadline(this.timeoutMs, what, async () => {
      for (let attempt = 1; ; attempt++) {
        this.daemon = await this.pool.daemonFor(this.workspace);
        try {
          const answer = await request(this.daemon.client);
          this.lastError = null;
          return answer;
        } catch (error) {
          if (!(error instanceof DaemonUnreachable)) throw error;
          // A daemon that stopped since the last request: look for it (or start it) once more.
          this.pool.forget(this.daemon);
          if (attempt >= 2) throw error;
        }
      }
    }).catch((error) => {
      this.lastError = error.message;
      throw error;
    });
  }

  /** clawmem's answer as it came (results, provider, mode, index) plus the hits in OpenClaw's shape. */
  async searchAnswer(query, opts = {}) {
    const answer = await this._call("search", (client) => client.search(query, searchParams(opts)));
    return { ...answer, hits: (answer.results ?? []).map(toHit), notes: freshnessOf(answer) };
  }

  async search(query, opts = {}) {
    const answer = await this.searchAnswer(query, opts);
    opts.onDebug?.({ backend: BACKEND, configuredMode: answer.mode, effectiveMode: answer.mode });
    return answer.hits;
  }

  async readFile({ relPath, from, lines }) {
    try {
      const answer = await this._call("get", (client) => client.get(relPath, { from, lines }));
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
    return this._call("status", async () => this.daemon.refresh(this.timeoutMs));
  }

  async sync() {
    await this._call("sync", (client) => client.sync({ wait: true }));
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
