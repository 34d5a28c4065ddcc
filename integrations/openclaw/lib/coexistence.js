// memory-core beside this plugin. OpenClaw runs memory-core as the "dreaming engine" of whatever plugin holds the
// memory slot unless dreaming is off in that plugin's own entry, and then memory-core's whole plugin registers,
// its memory_search and memory_get too. Of two tools with one name OpenClaw keeps the first plugin's in the order
// it finds plugins (plugins.load.paths, then bundled ones, then installed ones): an installed memory-clawmem loses
// its tools to memory-core, silently. This says so, with the two configurations that settle it.
import path from "node:path";

export const PLUGIN_ID = "memory-clawmem";
export const ALONE = "openclaw config set plugins.entries.memory-clawmem.config.dreaming.enabled false --strict-json";
export const BESIDE = "openclaw config set tools.deny '[\"memory-core\"]' --strict-json";

/** Why memory-core's memory tools answer instead of this plugin's (null: they do not), as one line saying what to run. */
export function shadowedBy(config, rootDir) {
  const plugins = config?.plugins ?? {};
  if (plugins.slots?.memory !== PLUGIN_ID) return null;
  if (plugins.entries?.[PLUGIN_ID]?.config?.dreaming?.enabled === false) return null; // memory-core is not loaded
  const core = plugins.entries?.["memory-core"];
  const denied = (list) => Array.isArray(list) && list.includes("memory-core");
  if (core?.enabled === false || denied(plugins.deny) || plugins.enabled === false) return null;
  if (denied(config?.tools?.deny)) return null; // its tools are taken out before names are compared
  const own = rootDir ? path.resolve(rootDir) : null;
  const paths = Array.isArray(plugins.load?.paths) ? plugins.load.paths : [];
  const inside = (folder) => own === folder || own.startsWith(folder.endsWith(path.sep) ? folder : folder + path.sep);
  if (own && paths.some((p) => typeof p === "string" && inside(path.resolve(p)))) return null; // found first
  return "memory-core runs beside memory-clawmem as OpenClaw's dreaming engine and its memory_search and memory_get " +
    "answer instead of clawmem's (OpenClaw keeps the first plugin's tool of a name). Run `" + ALONE + "` to use " +
    "clawmem alone, or `" + BESIDE + "` to keep memory-core's dreaming beside it, then restart the Gateway.";
}
