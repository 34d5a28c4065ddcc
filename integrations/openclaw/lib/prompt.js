// What the memory slot adds to an OpenClaw turn besides its tools: the "## Memory Recall" section of the system
// prompt (MemoryPluginCapability.promptBuilder) and the pre-compaction memory flush (flushPlanResolver). Both are
// memory-core's, word for word and number for number, so a prompt tuned for OpenClaw's memory reads the same and
// a long session flushes at the same point into the same daily note. The flush is written by the model with
// OpenClaw's own append-only write tool; the plugin only says where and when, and clawmem indexes the note.

/** memory-core's recall guidance, for the tools this turn has (memory.search.enabled = false: none). */
export function buildPromptSection({ availableTools, citationsMode }, config) {
  const hasSearch = availableTools?.has?.("memory_search") === true;
  const hasGet = availableTools?.has?.("memory_get") === true;
  if ((!hasSearch && !hasGet) || config?.memory?.search?.enabled === false) return [];
  const guidance = hasSearch
    ? "Before answering anything about prior work, decisions, dates, people, preferences, or todos: run " +
      `memory_search${hasGet ? "; for memory-file hits, use memory_get to pull only the needed lines" : ""}. ` +
      "If low confidence after search, say you checked."
    : "Before answering anything about prior work, decisions, dates, people, preferences, or todos that point to " +
      "a specific memory file: run memory_get to pull only the needed lines. If low confidence after reading, say " +
      "you checked.";
  const sessions = !hasSearch ? [] : [
    availableTools.has("sessions_search")
      ? "For session hits, use sessions_search with distinctive snippet text (and sessionKey set to the transcript " +
        `ID when known)${availableTools.has("sessions_history")
          ? ", then sessions_history with the returned sessionKey, messageId, and sessionId for a bounded sanitized excerpt"
          : "; exact session history is unavailable with the enabled tools"}.`
      : availableTools.has("sessions_history")
        ? "For session hits, use sessions_history with a known session key or transcript ID and a small limit; " +
          "paginate its returned history metadata to locate the excerpt."
        : "Session hits are search snippets only; exact session history is unavailable with the enabled tools.",
    "Session search line numbers are not history offsets. Never read raw transcript files to expand session hits.",
  ];
  const citations = citationsMode === "off"
    ? "Citations are disabled: do not mention file paths or line numbers in replies unless the user explicitly asks."
    : "Citations: include Source: <path#line> when it helps the user verify memory snippets.";
  return ["## Memory Recall", guidance, ...sessions,
    "Report partial, unavailable, or stale recall to the user, including returned warning and action guidance.",
    citations, ""];
}

const SOFT_TOKENS = 4000;
const FORCE_TRANSCRIPT_BYTES = 2 * 1024 * 1024;
const RESERVE_TOKENS_FLOOR = 20000;
const MAX_RESERVE_RATIO = 0.25;
const TARGET = "Store durable memories only in memory/YYYY-MM-DD.md (create memory/ if needed).";
const APPEND_ONLY = "If memory/YYYY-MM-DD.md already exists, APPEND new content only and do not overwrite existing entries.";
const READ_ONLY = "Treat workspace bootstrap/reference files such as MEMORY.md, DREAMS.md, SOUL.md, and AGENTS.md as " +
  "read-only during this flush; never overwrite, replace, or edit them.";
const PROMPT = ["Pre-compaction memory flush.", TARGET, READ_ONLY, APPEND_ONLY,
  "Do NOT create timestamped variant files (e.g., YYYY-MM-DD-HHMM.md); always use the canonical YYYY-MM-DD.md filename.",
  "If nothing to store, reply with NO_REPLY."].join(" ");
const SYSTEM_PROMPT = ["Pre-compaction memory flush turn.",
  "The session is near auto-compaction; capture durable memories to disk.", TARGET, READ_ONLY, APPEND_ONLY,
  "You may reply, but usually NO_REPLY is correct."].join(" ");
const BYTE_UNITS = { b: 1, k: 1024, kb: 1024, m: 1024 ** 2, mb: 1024 ** 2, g: 1024 ** 3, gb: 1024 ** 3, t: 1024 ** 4,
  tb: 1024 ** 4 };

function nonNegativeInt(value) {
  return typeof value === "number" && Number.isFinite(value) && value >= 0 ? Math.floor(value) : null;
}

/** OpenClaw's byte sizes: a number, or "512kb", "2mb", "1gb" (null: not one). */
export function byteSize(value) {
  if (typeof value === "number") return Number.isSafeInteger(Math.floor(value)) && value >= 0 ? Math.floor(value) : null;
  const match = typeof value === "string" ? /^(\d+(?:\.\d+)?)([a-z]+)?$/.exec(value.trim().toLowerCase()) : null;
  const unit = match ? BYTE_UNITS[match[2] ?? "b"] : undefined;
  if (!unit) return null;
  const bytes = Math.round(Number(match[1]) * unit);
  return Number.isSafeInteger(bytes) ? bytes : null;
}

/** The user's timezone as OpenClaw resolves it (agents.defaults.userTimezone, else this host's). */
export function userTimezone(config) {
  const configured = config?.agents?.defaults?.userTimezone?.trim?.();
  if (configured) {
    try {
      new Intl.DateTimeFormat("en-US", { timeZone: configured });
      return configured;
    } catch {
      // an unknown zone: the host's, as OpenClaw does
    }
  }
  return Intl.DateTimeFormat().resolvedOptions().timeZone?.trim() || "UTC";
}

function parts(date, options) {
  return Object.fromEntries(new Intl.DateTimeFormat("en-US", options).formatToParts(date)
    .filter((part) => part.type !== "literal").map((part) => [part.type, part.value]));
}

/** YYYY-MM-DD of `date` in `timeZone`. */
export function dateStamp(date, timeZone) {
  const { year, month, day } = parts(date, { timeZone, year: "numeric", month: "2-digit", day: "2-digit" });
  return year && month && day ? `${year}-${month}-${day}` : date.toISOString().slice(0, 10);
}

/** "Current time: Tuesday, December 1st, 2026 - 21:05 (Europe/Berlin)" and the UTC reference, as OpenClaw writes it. */
export function timeLine(date, timeZone) {
  const p = parts(date, { timeZone, weekday: "long", year: "numeric", month: "long", day: "numeric", hour: "2-digit",
    minute: "2-digit", hourCycle: "h23" });
  const day = Number.parseInt(p.day, 10);
  const suffix = day >= 11 && day <= 13 ? "th" : ({ 1: "st", 2: "nd", 3: "rd" })[day % 10] ?? "th";
  const formatted = p.weekday ? `${p.weekday}, ${p.month} ${day}${suffix}, ${p.year} - ${p.hour}:${p.minute}`
    : date.toISOString();
  return `Current time: ${formatted} (${timeZone})\nReference UTC: ${date.toISOString().replace("T", " ").slice(0, 16)} UTC`;
}

/** memory-core's MemoryFlushPlan: when a long session writes what it learnt to today's daily note before it compacts. */
export function buildFlushPlan({ cfg, nowMs, contextWindowTokens } = {}) {
  const flush = cfg?.agents?.defaults?.compaction?.memoryFlush;
  if (flush?.enabled === false) return null;
  let softThresholdTokens = nonNegativeInt(flush?.softThresholdTokens) ?? SOFT_TOKENS;
  const forceFlushTranscriptBytes = byteSize(flush?.forceFlushTranscriptBytes) ?? FORCE_TRANSCRIPT_BYTES;
  let reserveTokensFloor = RESERVE_TOKENS_FLOOR;
  const window = nonNegativeInt(contextWindowTokens);
  if (window) {
    reserveTokensFloor = Math.min(RESERVE_TOKENS_FLOOR, Math.floor(Math.max(1, window) * MAX_RESERVE_RATIO));
    softThresholdTokens = Math.min(softThresholdTokens, Math.floor((window - reserveTokensFloor) / 2));
  }
  const now = new Date(Number.isFinite(nowMs) ? nowMs : Date.now());
  const zone = userTimezone(cfg);
  const day = dateStamp(now, zone);
  return {
    softThresholdTokens,
    forceFlushTranscriptBytes,
    reserveTokensFloor,
    model: typeof flush?.model === "string" && flush.model.trim() ? flush.model.trim() : undefined,
    prompt: `${PROMPT.replaceAll("YYYY-MM-DD", day)}\n${timeLine(now, zone)}`,
    systemPrompt: SYSTEM_PROMPT.replaceAll("YYYY-MM-DD", day),
    relativePath: `memory/${day}.md`,
  };
}
