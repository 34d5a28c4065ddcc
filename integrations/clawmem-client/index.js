// clawmem's socket API from Node: newline-delimited JSON-RPC 2.0 over the workspace daemon's Unix socket.
//
// One connection per client, opened on the first request and kept for the next ones (the daemon
// answers many requests per connection, in order); each request has a deadline; the daemon's errors
// arrive as ClawmemError subclasses carrying its message and JSON-RPC code. No dependencies.

import { createHash } from "node:crypto";
import { realpathSync } from "node:fs";
import net from "node:net";
import { homedir } from "node:os";
import path from "node:path";

export class ClawmemError extends Error {
  /** @param {string} message @param {number | null} code @param {unknown} [data] */
  constructor(message, code = null, data = undefined) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    this.data = data;
  }
}
export class ConfigError extends ClawmemError {}
export class PathError extends ClawmemError {}
export class QueryError extends ClawmemError {}
export class ProviderError extends ClawmemError {}
export class IndexUnavailable extends ClawmemError {}
export class ServerBusy extends IndexUnavailable {}
export class DaemonUnreachable extends IndexUnavailable {}
export class ProtocolError extends ClawmemError {}

// The daemon's codes (clawmem_index.errors and JSON-RPC 2.0's own).
const BY_CODE = new Map([
  [-32010, ConfigError],
  [-32011, PathError],
  [-32012, QueryError],
  [-32020, ProviderError],
  [-32030, IndexUnavailable],
  [-32001, ServerBusy],
  [-32700, ProtocolError],
  [-32600, ProtocolError],
  [-32601, ProtocolError],
  [-32602, QueryError],
]);

/** The error a JSON-RPC error object stands for. */
export function errorFrom(error) {
  const code = typeof error?.code === "number" ? error.code : null;
  const message = typeof error?.message === "string" ? error.message : "clawmem answered an error without a message";
  const Kind = BY_CODE.get(code) ?? ClawmemError;
  return new Kind(message, code, error?.data);
}

function resolved(workspace) {
  const absolute = path.resolve(workspace);
  try {
    return realpathSync(absolute);
  } catch {
    return absolute; // as Python's Path.resolve(strict=False) for a folder not there yet
  }
}

/** The name clawmem gives a workspace's socket and index folder: its folder name and a hash of its path. */
export function workspaceKey(workspace) {
  const full = resolved(workspace);
  const digest = createHash("sha256").update(full, "utf8").digest("hex").slice(0, 12);
  const name = Array.from(path.basename(full))
    .map((c) => (/^[\p{L}\p{N}_-]$/u.test(c) ? c : "_"))
    .slice(0, 40)
    .join("");
  return `${name || "root"}-${digest}`;
}

/**
 * Where the daemon serving `workspace` listens, by the CLI's rules: CLAWMEM_SOCKET, else
 * $XDG_RUNTIME_DIR/clawmem/<key>.sock, else $XDG_CACHE_HOME (or ~/.cache)/clawmem/run/<key>.sock.
 * (A `socket` set in the workspace's clawmem.toml is not read here: pass it as `socketPath`.)
 */
export function defaultSocketPath(workspace, env = process.env) {
  if (env.CLAWMEM_SOCKET) return env.CLAWMEM_SOCKET;
  const key = `${workspaceKey(workspace)}.sock`;
  if (env.XDG_RUNTIME_DIR) return path.join(env.XDG_RUNTIME_DIR, "clawmem", key);
  const cache = env.XDG_CACHE_HOME || path.join(homedir(), ".cache");
  return path.join(cache, "clawmem", "run", key);
}

const SEARCH_PARAMS = {
  maxResults: "max_results",
  minScore: "min_score",
  mode: "mode",
  pathPrefix: "path_prefix",
  source: "source",
  since: "since",
  before: "before",
  explain: "explain",
  workspaces: "workspaces",
  budget: "budget",
  projects: "projects",
};

function snake(options) {
  const out = {};
  for (const [key, value] of Object.entries(options ?? {})) {
    if (value === undefined) continue;
    out[SEARCH_PARAMS[key] ?? key] = value;
  }
  return out;
}

export class ClawmemClient {
  /**
   * @param {{socketPath?: string, workspace?: string, timeoutMs?: number}} [options]
   * `socketPath`, else the socket of `workspace` (default: the current folder) by the CLI's rules.
   */
  constructor({ socketPath, workspace = process.cwd(), timeoutMs = 30_000 } = {}) {
    this.socketPath = socketPath ?? defaultSocketPath(workspace);
    this.timeoutMs = timeoutMs;
    this._conn = null;
    this._connecting = null;
    this._buffer = "";
    this._nextId = 1;
    this._pending = new Map();
  }

  /** One JSON-RPC call: its result, or the daemon's error as a ClawmemError. */
  async request(method, params = undefined, { timeoutMs = this.timeoutMs } = {}) {
    const conn = await this._connection();
    const id = this._nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this._pending.delete(id);
        // The answer may still come, on a connection whose order is now unknown to us: start afresh.
        this._drop(new DaemonUnreachable(`clawmem did not answer ${method} within ${timeoutMs} ms`));
        reject(new DaemonUnreachable(`clawmem did not answer ${method} within ${timeoutMs} ms`));
      }, timeoutMs);
      this._pending.set(id, { resolve, reject, timer });
      const message = { jsonrpc: "2.0", id, method, ...(params === undefined ? {} : { params }) };
      conn.write(JSON.stringify(message) + "\n");
    });
  }

  search(query, options = {}) {
    return this.request("search", { query, ...snake(options) });
  }

  get(filePath, { from, lines, maxBytes } = {}) {
    const params = { path: filePath };
    if (from !== undefined) params.from = from;
    if (lines !== undefined) params.lines = lines;
    if (maxBytes !== undefined) params.max_bytes = maxBytes;
    return this.request("get", params);
  }

  status() {
    return this.request("status");
  }

  context(query, options = {}) {
    return this.request("context", { query, ...snake(options) });
  }

  /** The annotated entries of MEMORY.md and USER.md as the files are now (`kind`: "triggers" or "projects";
   * `projects`: the repositories being worked in, entries scoped elsewhere left out before the limit). */
  curated({ kind, limit, projects } = {}) {
    const params = {};
    if (kind !== undefined) params.kind = kind;
    if (limit !== undefined) params.limit = limit;
    if (projects !== undefined) params.projects = projects;
    return this.request("curated", params);
  }

  sync({ wait = false } = {}) {
    return this.request("sync", { wait });
  }

  /** Close the connection; requests still waiting fail with DaemonUnreachable. */
  close() {
    this._drop(new DaemonUnreachable("the client was closed"));
  }

  _connection() {
    if (this._conn) return Promise.resolve(this._conn);
    if (!this._connecting) {
      this._connecting = new Promise((resolve, reject) => {
        const conn = net.createConnection(this.socketPath);
        conn.setEncoding("utf8");
        const failed = (err) => {
          this._connecting = null;
          reject(new DaemonUnreachable(`no clawmem daemon answers on ${this.socketPath}: ${err.message}`));
        };
        conn.once("error", failed);
        conn.once("connect", () => {
          conn.off("error", failed);
          conn.on("error", (err) => this._drop(new DaemonUnreachable(`the connection to clawmem failed: ${err.message}`)));
          conn.on("close", () => this._drop(new DaemonUnreachable("clawmem closed the connection")));
          conn.on("data", (chunk) => this._receive(chunk));
          this._conn = conn;
          this._connecting = null;
          resolve(conn);
        });
      });
    }
    return this._connecting;
  }

  _receive(chunk) {
    this._buffer += chunk;
    let end;
    while ((end = this._buffer.indexOf("\n")) >= 0) {
      const line = this._buffer.slice(0, end);
      this._buffer = this._buffer.slice(end + 1);
      let message;
      try {
        message = JSON.parse(line);
      } catch {
        this._drop(new ProtocolError("clawmem sent a line that is not JSON"));
        return;
      }
      const waiting = this._pending.get(message?.id);
      if (!waiting) continue; // an answer to a request that timed out
      this._pending.delete(message.id);
      clearTimeout(waiting.timer);
      if (message.error) waiting.reject(errorFrom(message.error));
      else waiting.resolve(message.result);
    }
  }

  _drop(error) {
    const conn = this._conn;
    this._conn = null;
    this._buffer = "";
    if (conn) {
      conn.removeAllListeners("close");
      conn.destroy();
    }
    for (const [id, waiting] of this._pending) {
      clearTimeout(waiting.timer);
      waiting.reject(error);
      this._pending.delete(id);
    }
  }
}
