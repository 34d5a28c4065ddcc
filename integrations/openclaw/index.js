// memory-clawmem: OpenClaw's memory slot answered by clawmem (the Python distribution clawmem-index).
// register() only wires objects: OpenClaw calls it several times per process, and nothing may start there.
import { registerMemoryCli } from "./lib/cli.js";
import { shadowedBy } from "./lib/coexistence.js";
import { buildFlushPlan, buildPromptSection } from "./lib/prompt.js";
import { ClawmemMemory } from "./lib/runtime.js";
import { readSettings } from "./lib/settings.js";
import { createTools } from "./lib/tools.js";

export { PLUGIN_ID } from "./lib/coexistence.js";

function register(api) {
  const settings = readSettings(api.pluginConfig);
  const memory = new ClawmemMemory({
    settings,
    workspaceOf: (cfg, agentId) => api.runtime.agent.resolveAgentWorkspaceDir(cfg, agentId),
    logger: api.logger,
  });
  const liveConfig = () => api.runtime?.config?.current?.() ?? api.config;
  api.registerMemoryCapability({
    runtime: memory.runtime(),
    promptBuilder: (params) => buildPromptSection(params, liveConfig()),
    flushPlanResolver: (params) => buildFlushPlan(params),
    // OpenClaw's trigger lane (Active Memory) runs when this tool is the turn's: it asks the manager, not the tool.
    deterministicRecallToolName: "memory_search",
  });
  const toolsFor = (ctx) => {
    const config = ctx.getRuntimeConfig?.() ?? ctx.runtimeConfig ?? ctx.config ?? api.config;
    const agentId = ctx.agentId ?? "main";
    const workspace = settings.workspace ?? ctx.workspaceDir ?? memory.workspaceFor(config, agentId);
    return createTools({
      managerFor: () => memory.manager(workspace),
      config,
      sessionKey: ctx.sessionKey,
      sandboxed: ctx.sandboxed === true,
      agentId,
      activeProjectKeys: Array.isArray(ctx.activeProjectKeys) ? ctx.activeProjectKeys : [],
    });
  };
  api.registerTool((ctx) => toolsFor(ctx)[0], { names: ["memory_search"] });
  api.registerTool((ctx) => toolsFor(ctx)[1], { names: ["memory_get"] });
  if (typeof api.registerCli === "function") {
    api.registerCli((ctx) => registerMemoryCli(ctx, memory), {
      descriptors: [{ name: "memory", description: "Search, inspect and reindex memory (answered by clawmem)",
        hasSubcommands: true }],
    });
  }
  // In the Gateway itself (not discovery or the CLI): reach or start each agent's daemon when the Gateway starts,
  // so that a new workspace's first index is built before the first search, not during it.
  if (api.registrationMode === "full" && typeof api.registerService === "function") {
    api.registerService({
      id: "clawmem-daemons",
      start: (ctx) => {
        const config = ctx.config ?? api.config;
        const shadowed = shadowedBy(config, api.rootDir);
        if (shadowed) api.logger?.warn?.(`memory-clawmem: ${shadowed}`);
        memory.warmUp(config);
      },
      stop: () => memory.close(),
    });
  }
}

export default {
  id: "memory-clawmem",
  name: "clawmem memory",
  description: "OpenClaw's memory search answered by clawmem: a watched, incremental, hybrid index of the workspace's Markdown",
  kind: "memory",
  register,
};
