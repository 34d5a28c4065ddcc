// OpenClaw's MemoryPluginRuntime: one ClawmemManager per agent workspace, all sharing one daemon pool.
import { BACKEND } from "./answers.js";
import { DaemonPool } from "./daemons.js";
import { ClawmemManager } from "./manager.js";
import { classifyWorkspaceMemoryPaths } from "./provenance.js";

export class ClawmemMemory {
  /**
   * @param {{settings: ReturnType<import("./settings.js").readSettings>,
   *   workspaceOf: (cfg: unknown, agentId: string) => string, logger?: object, env?: object}} p
   */
  constructor({ settings, workspaceOf, logger, env }) {
    this.settings = settings;
    this.workspaceOf = workspaceOf;
    this.logger = logger;
    this.env = env;
    this._pool = null;
    this._managers = new Map();
  }

  /** Nothing starts until the first request: OpenClaw loads plugins several times per process. */
  get pool() {
    this._pool ??= new DaemonPool({ ...this.settings, env: this.env, logger: this.logger });
    return this._pool;
  }

  /** The agent's workspace: the plugin's `workspace` setting, else the agent's OpenClaw workspace. */
  workspaceFor(cfg, agentId) {
    return this.settings.workspace ?? this.workspaceOf(cfg, agentId);
  }

  /** The workspaces of the configured agents (their own, else the default agent's). */
  agentWorkspaces(cfg) {
    const entries = cfg?.agents?.entries;
    const ids = entries && typeof entries === "object" ? Object.keys(entries) : [];
    const folders = new Set();
    for (const agentId of ids.length > 0 ? ids : ["main"]) {
      try {
        folders.add(this.workspaceFor(cfg, agentId));
      } catch (error) {
        this.logger?.warn?.(`memory-clawmem: no workspace for agent ${agentId}: ${error.message}`);
      }
    }
    return [...folders];
  }

  /**
   * Reach (or start) the daemon of every agent's workspace in the background; returns at once. A failure is
   * logged here and reported again, as a tool result, by the first search that needs that daemon.
   */
  warmUp(cfg) {
    for (const workspace of this.agentWorkspaces(cfg)) {
      this.pool.daemonFor(workspace).then(
        (daemon) => this.logger?.info?.(`memory-clawmem: ${workspace} served on ${daemon.socketPath}`),
        (error) => this.logger?.warn?.(`memory-clawmem: ${workspace}: ${error.message}`),
      );
    }
  }

  /** Drop the connections; the daemons go on serving their workspaces. */
  close() {
    this._pool?.closeAll();
  }

  manager(workspace) {
    let manager = this._managers.get(workspace);
    if (!manager) {
      manager = new ClawmemManager({
        pool: this.pool,
        workspace,
        timeoutMs: this.settings.timeoutMs,
        statusTtlMs: this.settings.statusTtlMs,
        logger: this.logger,
      });
      this._managers.set(workspace, manager);
    }
    return manager;
  }

  /** The object OpenClaw registers as the memory capability's runtime. */
  runtime() {
    return {
      getMemorySearchManager: async ({ cfg, agentId, purpose }) => {
        const started = Date.now();
        let workspace;
        try {
          workspace = this.workspaceFor(cfg, agentId);
        } catch (error) {
          return { manager: null, error: `memory-clawmem: no workspace for agent ${agentId}: ${error.message}` };
        }
        const manager = this.manager(workspace);
        if (purpose === "status" || purpose === "cli") {
          await manager.refreshStatus().catch(() => {}); // status() then says what failed
        }
        return { manager, debug: { backend: BACKEND, purpose, managerMs: Date.now() - started } };
      },
      resolveMemoryBackendConfig: () => ({ backend: BACKEND }),
      // MEMORY.md and USER.md go into every turn's system prompt only as far as their origin allows (provenance.js).
      supportsWorkspaceMemoryReadSources: true,
      classifyWorkspaceMemoryPaths: (params) => classifyWorkspaceMemoryPaths(params),
      // Session hits are this agent's own transcripts (its workspace's daemon); a sandbox sees memory only.
      authorizeSearchHits: async ({ sandboxed, hits }) =>
        sandboxed ? hits.filter((hit) => hit.source !== "sessions") : hits,
      closeMemorySearchManager: async () => {},
      closeAllMemorySearchManagers: async () => this.close(),
    };
  }
}
