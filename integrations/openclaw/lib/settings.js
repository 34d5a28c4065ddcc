// The plugin's own settings (plugins.entries.memory-clawmem.config), checked once when OpenClaw loads it.
// Everything about the index itself (provider, model, sources) lives in the workspace's clawmem.toml.

/** A setting the plugin cannot use; the message names the key and what to do. */
export class SettingsError extends Error {}

export const DEFAULTS = Object.freeze({
  command: "clawmem",
  autoStart: true,
  timeoutMs: 20_000,
  startTimeoutMs: 15_000,
  statusTtlMs: 5_000,
  exitWhenIdleSeconds: 1800,
});

const KEYS = {
  // OpenClaw reads `dreaming` from the memory slot's own entry: `dreaming.enabled: false` keeps memory-core (the
  // dreaming engine) from running beside this plugin, where its memory tools would shadow these (see README).
  dreaming: "object",
  workspace: "string",
  socket: "string",
  command: "string",
  autoStart: "boolean",
  timeoutMs: "number",
  startTimeoutMs: "number",
  statusTtlMs: "number",
  exitWhenIdleSeconds: "number",
};

/**
 * The plugin's settings from OpenClaw's plugin config (undefined: every default).
 * @returns {{workspace?: string, socket?: string, command: string, autoStart: boolean, timeoutMs: number,
 *   startTimeoutMs: number, statusTtlMs: number, exitWhenIdleSeconds: number, dreaming?: object}}
 */
export function readSettings(raw) {
  if (raw === undefined || raw === null) return { ...DEFAULTS };
  if (typeof raw !== "object" || Array.isArray(raw)) {
    throw new SettingsError("memory-clawmem: the plugin config must be an object");
  }
  const out = { ...DEFAULTS };
  for (const [key, value] of Object.entries(raw)) {
    const kind = KEYS[key];
    if (!kind) {
      throw new SettingsError(`memory-clawmem: unknown setting '${key}' (known: ${Object.keys(KEYS).join(", ")})`);
    }
    if (value === undefined) continue;
    if (kind === "object") {
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        throw new SettingsError(`memory-clawmem: '${key}' must be an object`);
      }
      out[key] = value;
      continue;
    }
    if (typeof value !== kind || (kind === "string" && value.trim() === "")) {
      throw new SettingsError(`memory-clawmem: '${key}' must be a non-empty ${kind}`);
    }
    if (key === "exitWhenIdleSeconds") {
      if (!(Number.isFinite(value) && (value === 0 || value >= 1))) {
        throw new SettingsError("memory-clawmem: 'exitWhenIdleSeconds' must be 0 (never) or at least 1 second");
      }
    } else if (kind === "number" && !(Number.isFinite(value) && value > 0)) {
      throw new SettingsError(`memory-clawmem: '${key}' must be a positive number of milliseconds`);
    }
    out[key] = value;
  }
  return out;
}
