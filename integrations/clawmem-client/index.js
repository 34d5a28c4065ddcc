// clawmem's socket API from Node: newline-delimited JSON-RPC 2.0 over the workspace daemon's Unix socket.
//
// Each request in flight has a connection of its own (a few per client, kept for the next requests and
// not holding the process open while idle); each request has a deadline, and a request given up on closes
// its connection only; the daemon's errors arrive as ClawmemError subclasses carrying its message and
// JSON-RPC code. No dependencies.

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
export class IndexBusy extends IndexUnavailable {}
export class IndexCorrupt extends IndexUnavailable {}
export class DiskFull extends IndexUnavailable {}
export class DaemonUnreachable extends IndexUnavailable {}
/** A request past its deadline (its connection was closed, so the daemon stops on it). */
export class RequestTimeout extends DaemonUnreachable {}
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

// The daemon's error classes by the name it sends in `data.type` (a subclass its code alone does not tell).
const BY_TYPE = new Map(Object.entries({
  ConfigError, PathError, QueryError, ProviderError, IndexUnavailable, ServerBusy, IndexBusy, IndexCorrupt, DiskFull,
  DaemonUnreachable, ProtocolError,
}));

/** The error a JSON-RPC error object stands for: by the class the daemon names, else by its code. */
export function errorFrom(error) {
  const code = typeof error?.code === "number" ? error.code : null;
  const message = typeof error?.message === "string" ? error.message : "clawmem answered an error without a message";
  const type = error?.data?.type;
  const Kind = (typeof type === "string" && BY_TYPE.get(type)) || BY_CODE.get(code) || ClawmemError;
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

const MAX_REPLY_BYTES = 4 * 1024 * 1024 + 64 * 1024; // the daemon's replies are at most 4 MiB, and a little framing
const MAX_CONNECTIONS = 4; // requests in flight at once per client; more wait for one to finish

/**
 * One socket carrying one request at a time: the daemon answers a connection's requests in order, so requests
 * that share one wait for each other, and a request given up on would leave its answer in the next one's way.
 * Reply lines are read without a copy of what came before (only new data is scanned for the newline) and no
 * longer than MAX_REPLY_BYTES. An idle connection does not keep the process alive.
 */
class Connection {
  /**
   * @param {string} socketPath
   * @param {(conn: Connection) => void} [onClosed] told once the connection is closed
   */
  constructor(socketPath, onClosed = () => {}) {
    this.socketPath = socketPath;
    this.onClosed = onClosed;
    this.socket = null;
    this.closed = false;
    this.reused = false; // taken from the idle ones for this request
    this.heard = false; // some of this request's answer came
    this._chunks = [];
    this._length = 0;
    this._waiting = null; // { id, resolve, reject }
  }

  open() {
    return new Promise((resolve, reject) => {
      const socket = net.createConnection(this.socketPath);
      const failed = (err) => reject(new DaemonUnreachable(`no clawmem daemon answers on ${this.socketPath}: ${err.message}`));
      socket.once("error", failed);
      socket.once("connect", () => {
        socket.off("error", failed);
        socket.on("error", (err) => this.destroy(new DaemonUnreachable(`the connection to clawmem failed: ${err.message}`)));
        socket.on("close", () => this.destroy(new DaemonUnreachable("clawmem closed the connection")));
        socket.on("data", (chunk) => this._receive(chunk));
        this.socket = socket;
        resolve(this);
      });
    });
  }

  /** Send one request and wait for its answer (the caller bounds the wait: see ClawmemClient.request). */
  send(id, method, params) {
    return new Promise((resolve, reject) => {
      if (this.closed) {
        reject(new DaemonUnreachable("clawmem closed the connection"));
        return;
      }
      this._waiting = { id, resolve, reject };
      this.heard = false;
      this.socket.ref();
      this.socket.write(JSON.stringify({ jsonrpc: "2.0", id, method, ...(params === undefined ? {} : { params }) }) + "\n");
    });
  }

  /** Kept for the next request: it no longer holds the process open. */
  idle() {
    this.socket?.unref();
  }

  destroy(error = new DaemonUnreachable("the client was closed")) {
    if (this.closed) return;
    this.closed = true;
    this.socket?.removeAllListeners("close");
    this.socket?.destroy();
    this._chunks = [];
    const waiting = this._waiting;
    this._waiting = null;
    waiting?.reject(error);
    this.onClosed(this);
  }

  _receive(chunk) {
    if (chunk.length > 0) this.heard = true;
    let end = chunk.indexOf(0x0a);
    while (end >= 0) {
      this._chunks.push(chunk.subarray(0, end));
      const line = Buffer.concat(this._chunks).toString("utf8");
      this._chunks = [];
      this._length = 0;
      this._answer(line);
      if (this.closed) return;
      chunk = chunk.subarray(end + 1);
      end = chunk.indexOf(0x0a);
    }
    this._length += chunk.length;
    if (this._length > MAX_REPLY_BYTES) {
      this.destroy(new ProtocolError(`clawmem sent a line longer than ${MAX_REPLY_BYTES} bytes: not one of its answers`));
      return;
    }
    if (chunk.length > 0) this._chunks.push(chunk);
  }

  _answer(line) {
    let message;
    try {
      message = JSON.parse(line);
    } catch {
      this.destroy(new ProtocolError("clawmem sent a line that is not JSON"));
      return;
    }
    const waiting = this._waiting;
    if (message?.id === null && message.error) {
      // Said to the connection rather than to a request: the daemon turning it away (busy), then closing it.
      this.destroy(errorFrom(message.error));
      return;
    }
    if (!waiting || message?.id !== waiting.id) return; // not an answer this connection is waiting for
    this._waiting = null;
    if (message.error) waiting.reject(errorFrom(message.error));
    else waiting.resolve(message.result);
  }
}

export class ClawmemClient {
  /**
   * @param {{socketPath?: string, workspace?: string, timeoutMs?: number, maxConnections?: number}} [options]
   * `socketPath`, else the socket of `workspace` (default: the current folder) by the CLI's rules.
   */
  constructor({ socketPath, workspace = process.cwd(), timeoutMs = 30_000, maxConnections = MAX_CONNECTIONS } = {}) {
    this.socketPath = socketPath ?? defaultSocketPath(workspace);
    this.timeoutMs = timeoutMs;
    this.maxConnections = Math.max(1, maxConnections);
    this._idle = [];
    this._open = new Set(); // every connection, idle or carrying a request
    this._queue = []; // requests waiting for a connection: { take, fail }
    this._nextId = 1;
    this._closed = false;
  }

  /**
   * One JSON-RPC call on a connection of its own: its result, or the daemon's error as a ClawmemError. Past
   * `timeoutMs` (waiting for a connection included) or when `signal` aborts, it fails with RequestTimeout (or
   * DaemonUnreachable) and its connection is closed, which tells the daemon; other requests are not touched.
   */
  /**
   * @param {string} method
   * @param {Record<string, unknown>} [params]
   * @param {{ timeoutMs?: number, signal?: AbortSignal }} [call]
   */
  async request(method, params = undefined, { timeoutMs = this.timeoutMs, signal } = {}) {
    if (this._closed) throw new DaemonUnreachable("the client was closed");
    if (signal?.aborted) throw new DaemonUnreachable(`${method} was cancelled`);
    const id = this._nextId++;
    let conn = null;
    let over = false;
    let timer;
    let onAbort;
    let stopWaiting = () => {};
    const givenUp = new Promise((_, reject) => {
      const giveUp = (error) => {
        over = true;
        stopWaiting();
        conn?.destroy(error);
        reject(error);
      };
      timer = setTimeout(() => giveUp(new RequestTimeout(`clawmem did not answer ${method} within ${timeoutMs} ms`)),
        timeoutMs);
      if (signal) {
        onAbort = () => giveUp(new DaemonUnreachable(`${method} was cancelled`));
        signal.addEventListener("abort", onAbort, { once: true });
      }
    });
    const work = (async () => {
      for (let attempt = 1; ; attempt++) {
        const got = await this._acquire((cancel) => {
          stopWaiting = cancel;
        });
        if (over) { // given up while connecting: nothing is sent, and the connection serves the next request
          this._release(got);
          throw new DaemonUnreachable(`${method} was given up`);
        }
        conn = got;
        try {
          return await conn.send(id, method, params);
        } catch (error) {
          // An idle connection the daemon had closed meanwhile (its idle limit, or making room) fails before any
          // answer: the request never reached a daemon that would answer it there, so it goes once more, anew.
          const stale = got.reused && !got.heard && !over && error instanceof DaemonUnreachable;
          if (!stale || attempt > 1) throw error;
          conn = null;
        }
      }
    })();
    work.catch(() => {}); // settled through the race below
    try {
      return await Promise.race([work, givenUp]);
    } finally {
      clearTimeout(timer);
      if (onAbort) signal.removeEventListener("abort", onAbort);
      if (conn) this._release(conn);
    }
  }

  // Each method's last argument, `call`, is request()'s options: { timeoutMs, signal }.
  search(query, options = {}, call = {}) {
    return this.request("search", { query, ...snake(options) }, call);
  }

  /**
   * @param {string} filePath
   * @param {{ from?: number, lines?: number, maxBytes?: number }} [options]
   * @param {{ timeoutMs?: number, signal?: AbortSignal }} [call]
   */
  get(filePath, { from, lines, maxBytes } = {}, call = {}) {
    /** @type {Record<string, unknown>} */
    const params = { path: filePath };
    if (from !== undefined) params.from = from;
    if (lines !== undefined) params.lines = lines;
    if (maxBytes !== undefined) params.max_bytes = maxBytes;
    return this.request("get", params, call);
  }

  status(call = {}) {
    return this.request("status", undefined, call);
  }

  context(query, options = {}, call = {}) {
    return this.request("context", { query, ...snake(options) }, call);
  }

  /** The annotated entries of MEMORY.md and USER.md as the files are now (`kind`: "triggers" or "projects";
   * `projects`: the repositories being worked in, entries scoped elsewhere left out before the limit). */
  /**
   * @param {{ kind?: string, limit?: number, projects?: string[] }} [options]
   * @param {{ timeoutMs?: number, signal?: AbortSignal }} [call]
   */
  curated({ kind, limit, projects } = {}, call = {}) {
    /** @type {Record<string, unknown>} */
    const params = {};
    if (kind !== undefined) params.kind = kind;
    if (limit !== undefined) params.limit = limit;
    if (projects !== undefined) params.projects = projects;
    return this.request("curated", params, call);
  }

  sync({ wait = false } = {}, call = {}) {
    return this.request("sync", { wait }, call);
  }

  /** Close every connection; requests still waiting fail with DaemonUnreachable. */
  close() {
    this._closed = true;
    for (const waiter of this._queue.splice(0)) waiter.fail(new DaemonUnreachable("the client was closed"));
    for (const conn of [...this._open]) conn.destroy(new DaemonUnreachable("the client was closed"));
    this._open.clear();
    this._idle = [];
  }

  /** An idle connection, a new one while fewer than maxConnections are open, else the next one released. */
  async _acquire(onQueued) {
    while (this._idle.length > 0) {
      const conn = this._idle.pop();
      if (!conn.closed) {
        conn.reused = true;
        return conn;
      }
    }
    if (this._open.size < this.maxConnections) {
      const conn = new Connection(this.socketPath, (closed) => this._forget(closed)); // reused: false
      this._open.add(conn);
      try {
        return await conn.open();
      } catch (error) {
        this._open.delete(conn);
        throw error;
      }
    }
    return new Promise((resolve, reject) => {
      const waiter = { take: resolve, fail: reject };
      this._queue.push(waiter);
      onQueued(() => {
        const at = this._queue.indexOf(waiter);
        if (at >= 0) this._queue.splice(at, 1);
      });
    });
  }

  /** A connection that closed (the daemon's side, an error, a request given up): its place goes to a waiting request. */
  _forget(conn) {
    this._open.delete(conn);
    const at = this._idle.indexOf(conn);
    if (at >= 0) this._idle.splice(at, 1);
    const waiter = this._closed ? undefined : this._queue.shift();
    if (waiter) this._acquire(() => {}).then(waiter.take, waiter.fail);
  }

  /** A connection whose request is over: to the next waiting request, else kept idle (or dropped when closed). */
  _release(conn) {
    if (conn.closed) return; // already forgotten
    if (this._closed) {
      conn.destroy();
      return;
    }
    const waiter = this._queue.shift();
    if (waiter) {
      conn.reused = true;
      waiter.take(conn);
      return;
    }
    conn.idle();
    this._idle.push(conn);
  }
}
