// One clawmem daemon per workspace: found by the CLI's socket rules, checked to serve that workspace, and
// started (`clawmem serve`) when none answers. Each OpenClaw agent has its own workspace, so its own daemon:
// a daemon that answers for another folder is refused, never searched.
import { spawn } from "node:child_process";
import { closeSync, mkdirSync, openSync, readFileSync, realpathSync } from "node:fs";
import { homedir } from "node:os";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { ClawmemClient, ClawmemError, DaemonUnreachable, defaultSocketPath, workspaceKey } from "clawmem-client";
import { parse as parseToml } from "smol-toml";

/** clawmem is not installed where the Gateway looks for it. */
export class NotInstalled extends ClawmemError {}
/** The daemon on the socket serves another workspace: never search it for this agent. */
export class WrongWorkspace extends ClawmemError {}

const INSTALL_HINT =
  "install it with `pipx install 'clawmem-index[local]'` (or pip), or set " +
  "plugins.entries.memory-clawmem.config.command to its path";

function canonical(folder) {
  try {
    return realpathSync(folder);
  } catch {
    return path.resolve(folder);
  }
}

/** The settings file clawmem reads for `workspace`: its clawmem.toml, else the user's config.toml. */
export function settingsFile(workspace, env = process.env) {
  const own = path.join(workspace, "clawmem.toml");
  const user = path.join(env.XDG_CONFIG_HOME || path.join(homedir(), ".config"), "clawmem", "config.toml");
  for (const candidate of [own, user]) {
    try {
      return { file: candidate, text: readFileSync(candidate, "utf8") };
    } catch {
      // not there (or unreadable: clawmem itself will say so when it starts)
    }
  }
  return null;
}

/**
 * Where the daemon for `workspace` listens, by clawmem's own rules: the plugin's `socket` setting, else
 * CLAWMEM_SOCKET, else `socket` in the workspace's settings file (relative to that file's folder), else
 * the default place for the workspace.
 */
export function socketFor(workspace, { socket, env = process.env } = {}) {
  if (socket) return path.resolve(workspace, socket);
  if (env.CLAWMEM_SOCKET) return path.resolve(env.CLAWMEM_SOCKET);
  const found = settingsFile(workspace, env);
  if (found) {
    let parsed;
    try {
      parsed = parseToml(found.text);
    } catch {
      parsed = {}; // clawmem refuses the file with a clear error when asked; the default socket is tried
    }
    if (typeof parsed.socket === "string" && parsed.socket) {
      const value = parsed.socket.startsWith("~/") ? path.join(homedir(), parsed.socket.slice(2)) : parsed.socket;
      return path.resolve(path.dirname(found.file), value);
    }
  }
  return defaultSocketPath(workspace, env);
}

/** A daemon's answer to `status`, with when it came. */
export class Daemon {
  constructor({ workspace, socketPath, client, started }) {
    this.workspace = workspace;
    this.socketPath = socketPath;
    this.client = client;
    this.started = started;
    this.status = null;
    this.statusAt = 0;
  }

  async refresh(timeoutMs, signal) {
    const status = await this.client.request("status", undefined, { timeoutMs, signal });
    this.status = status;
    this.statusAt = Date.now();
    return status;
  }
}

export class DaemonPool {
  /**
   * @param {{command: string, autoStart: boolean, socket?: string, startTimeoutMs: number, timeoutMs: number,
   *   env?: Record<string, string | undefined>, logger?: {info?: Function, warn?: Function}}} settings
   */
  constructor(settings) {
    this.settings = settings;
    this.env = settings.env ?? process.env;
    this.logger = settings.logger;
    this._daemons = new Map();
    this._pending = new Map();
  }

  /** The daemon serving `workspace`, started if need be; throws a ClawmemError saying what to do. */
  daemonFor(workspace) {
    const folder = canonical(workspace);
    const known = this._daemons.get(folder);
    if (known) return Promise.resolve(known);
    let pending = this._pending.get(folder);
    if (!pending) {
      pending = this._connect(folder).finally(() => this._pending.delete(folder));
      this._pending.set(folder, pending);
    }
    return pending;
  }

  /** Forget a daemon that stopped answering: the next request looks for it (and starts it) again. */
  forget(daemon) {
    if (this._daemons.get(daemon.workspace) === daemon) this._daemons.delete(daemon.workspace);
    daemon.client.close();
  }

  closeAll() {
    for (const daemon of this._daemons.values()) daemon.client.close();
    this._daemons.clear();
  }

  async _connect(folder) {
    const socketPath = socketFor(folder, { socket: this.settings.socket, env: this.env });
    const client = new ClawmemClient({ socketPath, timeoutMs: this.settings.timeoutMs });
    const daemon = new Daemon({ workspace: folder, socketPath, client, started: false });
    try {
      await this._check(daemon);
    } catch (error) {
      if (!(error instanceof DaemonUnreachable)) {
        client.close();
        throw error;
      }
      if (!this.settings.autoStart) {
        client.close();
        throw new DaemonUnreachable(
          `no clawmem daemon serves ${folder} (socket ${socketPath}): start one with ` +
            `\`clawmem serve --workspace ${folder}\` or \`clawmem install-service --workspace ${folder}\``,
        );
      }
      await this._start(daemon);
    }
    this._daemons.set(folder, daemon);
    return daemon;
  }

  async _check(daemon) {
    const status = await daemon.refresh(Math.min(this.settings.timeoutMs, 5_000));
    const serves = canonical(String(status.workspace ?? ""));
    if (serves !== daemon.workspace) {
      throw new WrongWorkspace(
        `the clawmem daemon on ${daemon.socketPath} serves ${serves}, not this agent's workspace ` +
          `${daemon.workspace}: give this workspace its own socket (plugins.entries.memory-clawmem.config.socket, ` +
          "or unset CLAWMEM_SOCKET)",
      );
    }
  }

  async _start(daemon) {
    const { command, startTimeoutMs } = this.settings;
    const args = ["serve", "--workspace", daemon.workspace];

    if (this.settings.socket) args.push("--socket", daemon.socketPath);
    const logFile = this._logFile(daemon.workspace);
    const log = openSync(logFile, "a", 0o600);
    let child;
    try {
      child = spawn(command, args, {
        cwd: daemon.workspace,
        detached: true, // its own process group: it serves the workspace past this Gateway's restarts
        stdio: ["ignore", log, log],
        // A daemon started here stops when nothing has asked it for a while; the next request starts one again
        // (an environment variable: a clawmem that predates it ignores it, where it would refuse a flag).
        env: this.settings.exitWhenIdleSeconds
          ? { ...this.env, CLAWMEM_EXIT_WHEN_IDLE: String(this.settings.exitWhenIdleSeconds) } : this.env,
      });
    } finally {
      closeSync(log);
    }
    let exited = null;
    const spawnFailed = new Promise((resolve) => {
      child.once("error", (error) => resolve({ error }));
      child.once("exit", (code, signal) => {
        exited = { code, signal };
        resolve(exited);
      });
    });
    child.unref();
    this.logger?.info?.(`memory-clawmem: started \`${command} serve\` for ${daemon.workspace} (log ${logFile})`);
    daemon.started = true;
    const deadline = Date.now() + startTimeoutMs;
    for (let wait = 50; ; wait = Math.min(wait * 2, 500)) {
      const outcome = await Promise.race([spawnFailed, sleep(wait).then(() => null)]);
      if (outcome?.error) {
        throw outcome.error.code === "ENOENT"
          ? new NotInstalled(`clawmem is not installed (no \`${command}\` command): ${INSTALL_HINT}`)
          : new DaemonUnreachable(`could not start \`${command} serve\`: ${outcome.error.message}`);
      }
      try {
        await this._check(daemon);
        return;
      } catch (error) {
        if (!(error instanceof DaemonUnreachable)) throw error;
      }
      if (exited) {
        throw new DaemonUnreachable(
          `\`${command} serve --workspace ${daemon.workspace}\` stopped at once (exit ${exited.code ?? exited.signal}): ` +
            `${lastLine(logFile)}`,
        );
      }
      if (Date.now() >= deadline) {
        throw new DaemonUnreachable(
          `\`${command} serve\` for ${daemon.workspace} did not answer within ${startTimeoutMs} ms ` +
            `(its log: ${logFile})`,
        );
      }
    }
  }

  _logFile(folder) {
    const cache = this.env.XDG_CACHE_HOME || path.join(homedir(), ".cache");
    const dir = path.join(cache, "clawmem", "openclaw");
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    return path.join(dir, `${workspaceKey(folder)}.log`);
  }
}

/** The last line a daemon wrote to its log, or a pointer to the log. */
function lastLine(logFile) {
  try {
    const lines = readFileSync(logFile, "utf8").trim().split("\n");
    const line = lines[lines.length - 1] ?? "";
    try {
      const record = JSON.parse(line);
      return record.message ?? record.msg ?? record.event ?? line;
    } catch {
      return line || `see ${logFile}`;
    }
  } catch {
    return `see ${logFile}`;
  }
}
