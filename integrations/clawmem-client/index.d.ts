// Types of clawmem-client (index.js). Results are the socket API's objects as the daemon sends them (README.md
// of clawmem, "Socket API"): snake_case fields, as in every other client.

export class ClawmemError extends Error {
  constructor(message: string, code?: number | null, data?: unknown);
  /** The JSON-RPC error code the daemon sent (null: the client's own, e.g. no daemon). */
  code: number | null;
  data: unknown;
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
/** A request past its deadline; its connection was closed, which tells the daemon. */
export class RequestTimeout extends DaemonUnreachable {}
export class ProtocolError extends ClawmemError {}

export function errorFrom(error: { code?: number; message?: string; data?: unknown }): ClawmemError;
export function workspaceKey(workspace: string): string;
export function defaultSocketPath(workspace: string, env?: Record<string, string | undefined>): string;

export interface SearchOptions {
  maxResults?: number;
  minScore?: number;
  mode?: "hybrid" | "bm25" | "vector";
  pathPrefix?: string;
  source?: "memory" | "sessions";
  since?: string;
  before?: string;
  explain?: boolean;
  workspaces?: string[];
  /** The day relative dates in the query ("yesterday") count from, YYYY-MM-DD (default: the daemon's today). */
  now?: string;
  /** The repositories being worked in (OpenClaw's project keys): entries scoped to them rank higher. */
  projects?: string[];
}

export interface ContextOptions extends Omit<SearchOptions, "explain"> {
  budget?: number;
}

export interface SearchResult {
  path: string;
  start_line: number;
  end_line: number;
  score: number;
  snippet: string;
  source: string;
  [field: string]: unknown;
}

export interface SearchAnswer {
  results: SearchResult[];
  provider: string;
  model: string;
  mode: string;
  index: { pending_files: number; pending_embeddings: number; [field: string]: unknown };
  /** How the query was read, when not as typed: the days it names, the words its typos were read as. */
  query?: { dates?: { text: string; from: string; to: string }[]; corrected?: { word: string; read_as: string[] }[] };
  [field: string]: unknown;
}

/** An entry of MEMORY.md or USER.md with OpenClaw's annotations (`text` without them). */
export interface CuratedEntry {
  path: string;
  start_line: number;
  end_line: number;
  text: string;
  importance?: number;
  /** Trigger phrases, joined with "; ". */
  triggers?: string;
  /** Repository keys, joined with "; ". */
  projects?: string;
  /** The entry's text was cut (at 4,000 characters). */
  text_truncated?: boolean;
}

export interface GetAnswer {
  path: string;
  text: string;
  from: number;
  lines: number;
  truncated: boolean;
  [field: string]: unknown;
}

/** A request's own deadline (default: the client's `timeoutMs`) and cancellation. */
export interface CallOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
}

export class ClawmemClient {
  /** `maxConnections`: requests in flight at once (each on a connection of its own), 4 by default. */
  constructor(options?: { socketPath?: string; workspace?: string; timeoutMs?: number; maxConnections?: number });
  readonly socketPath: string;
  timeoutMs: number;
  readonly maxConnections: number;
  request(method: string, params?: Record<string, unknown>, options?: CallOptions): Promise<unknown>;
  search(query: string, options?: SearchOptions, call?: CallOptions): Promise<SearchAnswer>;
  get(path: string, options?: { from?: number; lines?: number; maxBytes?: number }, call?: CallOptions): Promise<GetAnswer>;
  status(call?: CallOptions): Promise<Record<string, unknown>>;
  context(query: string, options?: ContextOptions, call?: CallOptions): Promise<{ text: string; tokens: number; [field: string]: unknown }>;
  curated(options?: { kind?: "triggers" | "projects"; limit?: number; projects?: string[] }, call?: CallOptions): Promise<{ entries: CuratedEntry[]; truncated?: string[] }>;
  sync(options?: { wait?: boolean }, call?: CallOptions): Promise<Record<string, unknown>>;
  /** Close every connection (requests still waiting fail); an idle client does not keep the process alive anyway. */
  close(): void;
}
