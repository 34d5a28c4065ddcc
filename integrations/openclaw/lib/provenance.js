// Where a workspace's memory files came from, as OpenClaw's bootstrap asks before it puts MEMORY.md and USER.md
// into every turn's system prompt (MemoryPluginRuntime.classifyWorkspaceMemoryPaths). The rules are memory-core's
// (memory-path-provenance): a file is "agent" memory when it is a real file inside the workspace by its real
// path, "system" for dreaming's own reports, "untrusted" otherwise; OpenClaw's write tools record a file written
// from untrusted content as such, and that record wins. Only "owner" and "agent" files are injected.
import { realpath } from "node:fs/promises";
import path from "node:path";

const PROFILE_ID = /^[a-zA-Z0-9][a-zA-Z0-9_-]{0,127}$/;
const CURATED = new Set(["MEMORY.md", "memory.md", "USER.md"]);

/** Whether a workspace-relative path (with "/") names memory as memory-core counts it. */
export function isWorkspaceMemory(relative) {
  const parts = relative.split("/");
  if (parts.length === 1) return CURATED.has(parts[0]);
  if (parts.length === 3 && parts[0] === "users" && parts[2] === "USER.md") return PROFILE_ID.test(parts[1]);
  return parts[0] === "memory" && parts.at(-1).endsWith(".md");
}

function isSystem(relative) {
  return relative === "DREAMS.md" || relative === "dreams.md" || relative.startsWith("memory/dreaming/") ||
    relative.startsWith("memory/.dreams/");
}

/** A remote read's canonical path, if it is one a classification may trust (relative, normalised, inside). */
function canonical(value) {
  if (typeof value !== "string" || !value || value === "." || value === ".." || value.startsWith("../")) return null;
  if (path.posix.isAbsolute(value) || path.win32.isAbsolute(value) || /[\\\0]/.test(value)) return null;
  return path.posix.normalize(value) === value ? value : null;
}

/** The file's path relative to the workspace by both real paths, or null when either is missing or it is outside. */
async function realRelative(workspaceDir, relativePath) {
  try {
    const [root, file] = await Promise.all([realpath(workspaceDir), realpath(path.resolve(workspaceDir, relativePath))]);
    const rel = path.relative(root, file);
    if (!rel || rel.startsWith("..") || path.isAbsolute(rel)) return null;
    return rel.split(path.sep).join("/");
  } catch {
    return null;
  }
}

/** OpenClaw's plugin SDK module with the write records, or null when the plugin runs outside OpenClaw. */
async function openclawRecords() {
  try {
    return await import("openclaw/plugin-sdk/memory-core-host-runtime-core");
  } catch {
    return null; // not inside OpenClaw: no records to read
  }
}

function originOf(record) {
  const origin = record?.originClass;
  return origin === "agent" || origin === "untrusted" ? origin : null;
}

/**
 * OpenClaw's record of a file its tools wrote (null: none, or OpenClaw cannot say). Read through OpenClaw's own
 * plugin SDK when the plugin runs inside OpenClaw; elsewhere there is no record to read.
 */
export async function recordedOrigin(workspaceDir, relativePath, load = openclawRecords) {
  const sdk = await load();
  if (typeof sdk?.readMemoryArtifactProvenance !== "function") return null;
  // A record that cannot be read is an error, as for memory-core: OpenClaw then leaves the file out of the prompt.
  return originOf(await sdk.readMemoryArtifactProvenance({ workspaceDir, relativePath }));
}

const RECORDS_TTL_MS = 5_000; // how long one listing of a workspace's write records is used
const CLOCK_SLACK_MS = 1_000; // a file's change time against the listing's: coarse file clocks, a little skew

/**
 * OpenClaw's write records of one workspace, listed in one request (`listMemoryArtifactProvenance`, as OpenClaw's
 * own dreaming reads them) and reused for files that have not changed since: a search's hits then cost no round
 * trip each to OpenClaw's state worker (measured inside a Gateway: ~3 ms of a 6-hit keyword search's 11 ms).
 * Exact because OpenClaw's write tools store a file's record before they write the file: a file whose status
 * changed before the listing was asked for has its record in it. A file changed since (or of unknown change
 * time) is looked up alone, and so is every file when the listing cannot be had.
 */
export class WriteRecords {
  constructor(workspaceDir, { load = openclawRecords, now = Date.now, ttlMs = RECORDS_TTL_MS } = {}) {
    this.workspaceDir = workspaceDir;
    this.load = load;
    this.now = now;
    this.ttlMs = ttlMs;
    this._listing = null; // Promise<{askedAt, byPath} | null>
    this._listedAt = -Infinity;
  }

  /** `changedAtMs`: the file's ctime as stat gave it just now. */
  async origin(relativePath, changedAtMs) {
    if (Number.isFinite(changedAtMs)) {
      const listing = await this._current();
      if (listing && changedAtMs <= listing.askedAt - CLOCK_SLACK_MS) return listing.byPath.get(relativePath) ?? null;
    }
    return recordedOrigin(this.workspaceDir, relativePath, this.load);
  }

  _current() {
    const now = this.now();
    if (this._listing === null || now - this._listedAt >= this.ttlMs) {
      this._listedAt = now;
      this._listing = this._list(now);
    }
    return this._listing;
  }

  async _list(askedAt) {
    try {
      const sdk = await this.load();
      if (typeof sdk?.listMemoryArtifactProvenance !== "function") return null;
      const entries = await sdk.listMemoryArtifactProvenance({ workspaceDir: this.workspaceDir });
      const byPath = new Map();
      for (const entry of entries ?? []) {
        const origin = originOf(entry?.provenance);
        if (typeof entry?.relativePath === "string" && origin) byPath.set(entry.relativePath, origin);
      }
      return { askedAt, byPath };
    } catch {
      return null; // each file is then looked up alone, and a failure there is that file's
    }
  }
}

/** One path's origin class ("agent", "untrusted" or "system"); `readSource`: a remote workspace's read of it. */
export async function classifyPath({ workspaceDir, relativePath, readSource, recorded = recordedOrigin }) {
  const relative = readSource !== undefined ? canonical(readSource?.canonicalRelativePath)
    : await realRelative(workspaceDir, relativePath);
  if (relative === null) return "untrusted";
  if (isSystem(relative)) return "system";
  if (!isWorkspaceMemory(relative)) return "untrusted";
  return (await recorded(workspaceDir, relative)) ?? "agent";
}

/** MemoryPluginRuntime.classifyWorkspaceMemoryPaths: one answer per path asked, in order. */
export async function classifyWorkspaceMemoryPaths({ workspaceDir, relativePaths, readSources }, recorded) {
  return Promise.all((relativePaths ?? []).map(async (relativePath) => ({
    relativePath,
    originClass: await classifyPath({
      workspaceDir,
      relativePath,
      readSource: readSources === undefined ? undefined : readSources.find((s) => s.relativePath === relativePath) ?? {},
      recorded,
    }),
  })));
}
