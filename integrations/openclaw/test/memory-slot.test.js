// The memory slot's contract beyond the tools, as memory-core fills it: provenance of MEMORY.md and USER.md (what
// OpenClaw's bootstrap injects), the recall section of the system prompt, the pre-compaction flush plan, and the
// curated candidates of the trigger lane and the project block (against the fake clawmem).
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { after, afterEach, test } from "node:test";

import plugin from "../index.js";
import { DaemonPool } from "../lib/daemons.js";
import { ClawmemManager } from "../lib/manager.js";
import { buildFlushPlan, buildPromptSection, byteSize, timeLine } from "../lib/prompt.js";
import { WriteRecords, classifyPath, classifyWorkspaceMemoryPaths, isWorkspaceMemory } from "../lib/provenance.js";
import { DEFAULTS, readSettings } from "../lib/settings.js";
import { createTools } from "../lib/tools.js";

const FAKE = fileURLToPath(new URL("../fixtures/fake-clawmem.js", import.meta.url));
const root = mkdtempSync(path.join(tmpdir(), "oms-"));
const PIDS = path.join(root, "pids");
const pools = [];
after(() => rmSync(root, { recursive: true, force: true }));
afterEach(() => {
  for (const pool of pools.splice(0)) pool.closeAll();
  let pids = [];
  try {
    pids = readFileSync(PIDS, "utf8").trim().split("\n").map(Number);
    rmSync(PIDS);
  } catch {
    return;
  }
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGTERM");
    } catch {
      // gone already
    }
  }
});
let serial = 0;

function workspace() {
  const dir = path.join(root, `w${serial++}`);
  mkdirSync(path.join(dir, "memory"), { recursive: true });
  return dir;
}

function managerFor(ws, extra = {}, logger = undefined) {
  const env = { ...extra, PATH: process.env.PATH, XDG_RUNTIME_DIR: path.join(ws, ".run"), XDG_CACHE_HOME: path.join(ws, ".cache"),
    FAKE_CLAWMEM_LOG: path.join(ws, ".searches.jsonl"), FAKE_CLAWMEM_PIDS: PIDS };
  const pool = new DaemonPool({ ...DEFAULTS, command: FAKE, env, startTimeoutMs: 5_000, timeoutMs: 5_000 });
  pools.push(pool);
  return { manager: new ClawmemManager({ pool, workspace: ws, timeoutMs: 5_000, statusTtlMs: 5_000, logger }), env };
}

const none = async () => null; // no record of OpenClaw's write tools

test("provenance: curated and daily files inside the workspace are agent memory, as memory-core classifies them", async () => {
  const ws = workspace();
  for (const name of ["MEMORY.md", "USER.md", "DREAMS.md", "AGENTS.md", "memory/2026-11-30.md"]) writeFileSync(path.join(ws, name), "x\n");
  mkdirSync(path.join(ws, "users", "dana"), { recursive: true });
  writeFileSync(path.join(ws, "users", "dana", "USER.md"), "x\n");
  const outside = path.join(root, `outside-${serial++}.md`);
  writeFileSync(outside, "secret\n");
  mkdirSync(path.join(ws, "escape"));
  symlinkSync(outside, path.join(ws, "escape", "MEMORY.md"));
  const classes = await classifyWorkspaceMemoryPaths({ workspaceDir: ws,
    relativePaths: ["MEMORY.md", "USER.md", "users/dana/USER.md", "memory/2026-11-30.md", "DREAMS.md", "AGENTS.md",
      "memory/missing.md", "../outside.md"] }, none);
  assert.deepEqual(classes.map((c) => c.originClass),
    ["agent", "agent", "agent", "agent", "system", "untrusted", "untrusted", "untrusted"]);
  // A symlink is classified by where it leads: out of the workspace, untrusted.
  rmSync(path.join(ws, "MEMORY.md"));
  symlinkSync(outside, path.join(ws, "MEMORY.md"));
  assert.equal(await classifyPath({ workspaceDir: ws, relativePath: "MEMORY.md", recorded: none }), "untrusted");
  assert.equal(isWorkspaceMemory("users/-x/USER.md"), false);
});

test("provenance: OpenClaw's record of an untrusted write wins, and a remote read is judged by its canonical path", async () => {
  const ws = workspace();
  writeFileSync(path.join(ws, "USER.md"), "x\n");
  const recorded = async (_dir, rel) => (rel === "USER.md" ? "untrusted" : null);
  assert.equal(await classifyPath({ workspaceDir: ws, relativePath: "USER.md", recorded }), "untrusted");
  const remote = await classifyWorkspaceMemoryPaths({ workspaceDir: "/nowhere", relativePaths: ["MEMORY.md", "USER.md", "a.md"],
    readSources: [{ relativePath: "MEMORY.md", canonicalRelativePath: "MEMORY.md" },
      { relativePath: "USER.md", canonicalRelativePath: "../USER.md" }] }, none);
  assert.deepEqual(remote.map((c) => c.originClass), ["agent", "untrusted", "untrusted"]);
});

test("the recall section is memory-core's, for the tools the turn has", () => {
  const both = buildPromptSection({ availableTools: new Set(["memory_search", "memory_get"]) }, {});
  assert.equal(both[0], "## Memory Recall");
  assert.match(both[1], /^Before answering anything about prior work.*run memory_search; for memory-file hits, use memory_get/);
  assert.ok(both.includes("Session hits are search snippets only; exact session history is unavailable with the enabled tools."));
  assert.match(both.at(-2), /^Citations: include Source: <path#line>/);
  assert.match(buildPromptSection({ availableTools: new Set(["memory_get"]), citationsMode: "off" }, {}).join("\n"),
    /run memory_get to pull only the needed lines[\s\S]*Citations are disabled/);
  assert.deepEqual(buildPromptSection({ availableTools: new Set(["read"]) }, {}), []);
  assert.deepEqual(buildPromptSection({ availableTools: new Set(["memory_search"]) }, { memory: { search: { enabled: false } } }), []);
});

test("the flush plan: memory-core's thresholds and prompts, today's note in the user's timezone", () => {
  const nowMs = Date.parse("2026-12-01T23:30:00Z");
  const plan = buildFlushPlan({ cfg: { agents: { defaults: { userTimezone: "Europe/Berlin" } } }, nowMs });
  assert.deepEqual([plan.softThresholdTokens, plan.forceFlushTranscriptBytes, plan.reserveTokensFloor, plan.relativePath],
    [4000, 2 * 1024 * 1024, 20000, "memory/2026-12-02.md"]);
  assert.match(plan.prompt, /^Pre-compaction memory flush\. Store durable memories only in memory\/2026-12-02\.md/);
  assert.match(plan.prompt, /reply with NO_REPLY\.\nCurrent time: Wednesday, December 2nd, 2026 - 00:30 \(Europe\/Berlin\)\nReference UTC: 2026-12-01 23:30 UTC$/);
  assert.match(plan.systemPrompt, /^Pre-compaction memory flush turn\. .*usually NO_REPLY is correct\.$/);
  const small = buildFlushPlan({ cfg: { agents: { defaults: { compaction: { memoryFlush: { forceFlushTranscriptBytes: "1b",
    softThresholdTokens: 9000, model: " m/x " } } } } }, nowMs, contextWindowTokens: 16000 });
  assert.deepEqual([small.reserveTokensFloor, small.softThresholdTokens, small.forceFlushTranscriptBytes, small.model],
    [4000, 6000, 1, "m/x"]);
  assert.equal(buildFlushPlan({ cfg: { agents: { defaults: { compaction: { memoryFlush: { enabled: false } } } } } }), null);
  assert.deepEqual([byteSize("2mb"), byteSize("512KB"), byteSize(7), byteSize("lots"), byteSize(-1)], [2097152, 524288, 7, null, null]);
  assert.equal(timeLine(new Date("2026-11-11T08:05:00Z"), "UTC").split("\n")[0], "Current time: Wednesday, November 11th, 2026 - 08:05 (UTC)");
});

test("the capability: a runtime that classifies, the recall section, the flush plan, and the trigger lane's tool", () => {
  const registered = [];
  const api = { pluginConfig: { dreaming: { enabled: false } }, logger: {}, config: {}, runtime: { agent: { resolveAgentWorkspaceDir: () => "/w" } },
    registerMemoryCapability: (c) => registered.push(c), registerTool: () => {}, registerCli: () => {} };
  plugin.register(api);
  const [capability] = registered;
  assert.equal(capability.runtime.supportsWorkspaceMemoryReadSources, true);
  assert.equal(typeof capability.runtime.classifyWorkspaceMemoryPaths, "function");
  assert.equal(capability.deterministicRecallToolName, "memory_search");
  assert.equal(capability.supportsPrivateTranscriptRecall, undefined); // not claimed: see the README
  assert.equal(capability.promptBuilder({ availableTools: new Set(["memory_search"]) })[0], "## Memory Recall");
  assert.match(capability.flushPlanResolver({ cfg: {} }).relativePath, /^memory\/\d{4}-\d{2}-\d{2}\.md$/);
  assert.deepEqual(readSettings({ dreaming: { enabled: false } }).dreaming, { enabled: false });
  assert.throws(() => readSettings({ dreaming: true }), /'dreaming' must be an object/);
});

test("curated candidates: trigger entries with their provenance, project entries of MEMORY.md only", async () => {
  const ws = workspace();
  writeFileSync(path.join(ws, "MEMORY.md"), "# M\n\n- Keep the gateway on loopback.\n- Use the release helper.\n");
  const { manager } = managerFor(ws);
  const triggers = await manager.listTriggerCandidates({ activeProjectKeys: [] });
  assert.deepEqual(triggers[0], { path: "MEMORY.md", startLine: 3, endLine: 3, score: 0, snippet: "- Keep the gateway on loopback.",
    source: "memory", citation: "MEMORY.md#L3", importance: 9, triggers: "gateway setup; network safety",
    provenance: { originClass: "agent", sessionKind: "unknown", observedAt: triggers[0].provenance.observedAt } });
  assert.ok(triggers[0].provenance.observedAt > 0);
  assert.deepEqual(await manager.listCuratedProjectCandidates({ activeProjectKeys: [] }), []);
  const projects = await manager.listCuratedProjectCandidates({ activeProjectKeys: ["github.com/acme/app"] });
  assert.deepEqual(projects.map((p) => [p.path, p.startLine, p.projectKey]), [["MEMORY.md", 4, "github.com/acme/app"]]);
});

test("a hit's provenance is kept only while its file is unchanged: a file replaced by a symlink out is untrusted at once", async () => {
  const ws = workspace();
  const outside = path.join(root, `outside${serial++}.md`);
  writeFileSync(outside, "- elsewhere\n");
  const note = path.join(ws, "memory", "2026-11-30.md");
  writeFileSync(note, "- a note\n");
  const { manager } = managerFor(ws);
  const first = await manager._provenance("memory/2026-11-30.md", "memory");
  assert.equal(first.originClass, "agent");
  assert.equal((await manager._provenance("memory/2026-11-30.md", "memory")).originClass, "agent"); // kept
  rmSync(note);
  symlinkSync(outside, note); // the same name, now another file outside the workspace
  assert.equal((await manager._provenance("memory/2026-11-30.md", "memory")).originClass, "untrusted");
  rmSync(note);
  assert.deepEqual(await manager._provenance("memory/2026-11-30.md", "memory"),
    { originClass: "untrusted", sessionKind: "unknown", observedAt: 0 }); // gone: untrusted, nothing kept
});

/** OpenClaw's SDK as WriteRecords reads it: `records` (relative path -> origin) as the state worker holds them. */
function fakeRecords(records, { list = true, failList = false, listed = records } = {}) {
  const calls = { list: 0, read: 0 };
  const sdk = {
    readMemoryArtifactProvenance: async ({ relativePath }) => {
      calls.read++;
      return records.has(relativePath) ? { originClass: records.get(relativePath) } : undefined;
    },
    ...(list ? { listMemoryArtifactProvenance: async () => {
      calls.list++;
      if (failList) throw new Error("the state worker is gone");
      return [...listed].map(([relativePath, originClass]) => ({ relativePath, provenance: { originClass } }));
    } } : {}),
  };
  return { calls, load: async () => sdk };
}

test("write records: listed once a workspace and reused for files unchanged since; a file changed since is looked up", async () => {
  let now = 100_000;
  const records = new Map([["memory/a.md", "untrusted"]]);
  const { calls, load } = fakeRecords(records);
  const wr = new WriteRecords("/w", { load, now: () => now });
  const before = now - 60_000; // the files' change times, well before the listing
  assert.equal(await wr.origin("memory/a.md", before), "untrusted");
  assert.equal(await wr.origin("memory/b.md", before), null);
  assert.equal(await wr.origin("MEMORY.md", before), null);
  assert.deepEqual(calls, { list: 1, read: 0 });
  // OpenClaw records an untrusted write of b.md, then writes it: b.md changed after the listing was asked for.
  records.set("memory/b.md", "untrusted");
  now += 1_000;
  assert.equal(await wr.origin("memory/b.md", now - 10), "untrusted");
  assert.deepEqual(calls, { list: 1, read: 1 });
  assert.equal(await wr.origin("memory/b.md", undefined), "untrusted"); // no change time: looked up
  assert.equal(calls.read, 2);
  now += 5_000; // the listing is old: listed again, and b.md's record is in it
  assert.equal(await wr.origin("memory/b.md", now - 60_000), "untrusted");
  assert.deepEqual(calls, { list: 2, read: 2 });
});

test("write records: without a listing (an older OpenClaw, or one that fails) every file is looked up alone", async () => {
  const records = new Map([["USER.md", "untrusted"]]);
  for (const options of [{ list: false }, { failList: true }]) {
    const { calls, load } = fakeRecords(records, options);
    const wr = new WriteRecords("/w", { load });
    assert.equal(await wr.origin("USER.md", 0), "untrusted");
    assert.equal(await wr.origin("MEMORY.md", 0), null);
    assert.equal(calls.read, 2, JSON.stringify(options));
  }
  const outside = new WriteRecords("/w", { load: async () => null }); // not inside OpenClaw: no records
  assert.equal(await outside.origin("USER.md", 0), null);
});

test("a search's hits read OpenClaw's records in one listing, and a file written since is judged by its own record", async () => {
  const ws = workspace();
  for (const day of ["01", "02", "03"]) writeFileSync(path.join(ws, "memory", `2026-11-${day}.md`), `- note ${day}\n`);
  const records = new Map([["memory/2026-11-02.md", "untrusted"]]);
  const { calls, load } = fakeRecords(records);
  const env = { PATH: process.env.PATH, XDG_RUNTIME_DIR: path.join(ws, ".run"), XDG_CACHE_HOME: path.join(ws, ".cache") };
  const pool = new DaemonPool({ ...DEFAULTS, command: FAKE, env, startTimeoutMs: 5_000, timeoutMs: 5_000 });
  pools.push(pool);
  const changed = statSync(path.join(ws, "memory", "2026-11-03.md")).ctimeMs;
  const manager = new ClawmemManager({ pool, workspace: ws, timeoutMs: 5_000, statusTtlMs: 5_000,
    records: { load, now: () => changed + 2_000 } }); // the listing is asked for 2 s after the files were written
  const classes = await Promise.all(["01", "02", "03"].map(async (d) =>
    (await manager._provenance(`memory/2026-11-${d}.md`, "memory")).originClass));
  assert.deepEqual(classes, ["agent", "untrusted", "agent"]);
  assert.deepEqual(calls, { list: 1, read: 0 });
  // OpenClaw's write tool records 01 as written from untrusted content, then writes it, just after a listing was
  // asked for (the listing holds the records as they were then).
  const stale = fakeRecords(records, { listed: new Map(records) });
  records.set("memory/2026-11-01.md", "untrusted");
  writeFileSync(path.join(ws, "memory", "2026-11-01.md"), "- note 01, rewritten from a web page\n");
  const written = statSync(path.join(ws, "memory", "2026-11-01.md")).ctimeMs;
  const later = new ClawmemManager({ pool, workspace: ws, timeoutMs: 5_000, statusTtlMs: 5_000,
    records: { load: stale.load, now: () => written - 10 } });
  assert.equal((await later._provenance("memory/2026-11-01.md", "memory")).originClass, "untrusted");
  assert.deepEqual(stale.calls, { list: 1, read: 1 });
});

test("memory_search takes snake_case limits and the repositories being worked in", async () => {
  const ws = workspace();
  const { manager, env } = managerFor(ws);
  const [search] = createTools({ managerFor: () => manager, config: {}, agentId: "main", activeProjectKeys: ["github.com/acme/app"] });
  const result = await search.execute("t1", { query: "release", max_results: 2, min_score: 0.5 });
  assert.equal(result.details.results.length, 1);
  const sent = readFileSync(env.FAKE_CLAWMEM_LOG, "utf8").trim().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(sent, [{ query: "release", max_results: 2, min_score: 0.5, source: "memory", projects: ["github.com/acme/app"] }]);
});

test("a sync past its deadline closes its connection and is never sent again", async () => {
  const ws = workspace();
  const { manager, env } = managerFor(ws, { FAKE_CLAWMEM_HANG: "sync" });
  await assert.rejects(manager.sync({ timeoutMs: 200 }), /did not answer sync within 200 ms/);
  const logged = () => {
    try {
      return readFileSync(env.FAKE_CLAWMEM_LOG, "utf8").trim().split("\n").map((l) => JSON.parse(l));
    } catch {
      return [];
    }
  };
  for (const stop = Date.now() + 5_000; !logged().some((e) => e.closed) && Date.now() < stop;) {
    await new Promise((resolve) => setTimeout(resolve, 20)); // a deadline poll: the fake's log is another process's
  }
  await manager.search("after"); // anything sent again would be logged before this
  assert.deepEqual(logged().map((e) => e.method ?? (e.closed ? "closed" : "search")), ["sync", "closed", "search"]);
});

test("a cancelled search stops at once with a message, instead of waiting for the deadline", async () => {
  const ws = workspace();
  const { manager } = managerFor(ws);
  const aborted = AbortSignal.abort();
  await assert.rejects(manager.search("x", { signal: aborted }), /cancelled by OpenClaw/);
});

test("memory-core's tools shadowing this plugin's are named, with the two configurations that settle it", async () => {
  const { shadowedBy, ALONE, BESIDE } = await import("../lib/coexistence.js");
  const slot = { plugins: { slots: { memory: "memory-clawmem" } } };
  assert.match(shadowedBy(slot, "/x/ext/memory-clawmem"), /memory-core runs beside memory-clawmem/);
  assert.ok(shadowedBy(slot, "/x").includes(ALONE) && shadowedBy(slot, "/x").includes(BESIDE));
  const settled = [
    { plugins: { ...slot.plugins, entries: { "memory-clawmem": { config: { dreaming: { enabled: false } } } } } },
    { plugins: { ...slot.plugins, entries: { "memory-core": { enabled: false } } } },
    { plugins: { ...slot.plugins, deny: ["memory-core"] } },
    { ...slot, tools: { deny: ["memory-core"] } },
    { plugins: { ...slot.plugins, load: { paths: ["/src/plugin"] } } },
    { plugins: { slots: { memory: "memory-core" } } },
  ];
  for (const config of settled) assert.equal(shadowedBy(config, "/src/plugin"), null, JSON.stringify(config));
});

test("a daemon of an older clawmem still answers: without repositories or curated entries, and the plugin says so once", async () => {
  const ws = workspace();
  const warned = [];
  const { manager } = managerFor(ws, { FAKE_CLAWMEM_OLD: "1" }, { warn: (m) => warned.push(m) });
  const hits = await manager.search("release", { activeProjectKeys: ["github.com/acme/app"] });
  assert.equal(hits.length, 1);
  assert.deepEqual(await manager.listTriggerCandidates({}), []);
  assert.equal(warned.length, 1);
  assert.match(warned[0], /older than the plugin.*restart it/);
});
