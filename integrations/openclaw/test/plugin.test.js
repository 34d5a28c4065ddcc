// The plugin against a fake `clawmem` command (fixtures/fake-clawmem.js) that serves, fails or hangs on purpose.
// The real daemon is test/daemon.test.js, and a real OpenClaw Gateway is the Python suite's end-to-end test.
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { after, afterEach, test } from "node:test";

import { DaemonUnreachable, defaultSocketPath, workspaceKey } from "clawmem-client";

import plugin from "../index.js";
import { freshnessOf, providerStatus, searchParams, toHit } from "../lib/answers.js";
import { DaemonPool, NotInstalled, WrongWorkspace, socketFor } from "../lib/daemons.js";
import { ClawmemManager } from "../lib/manager.js";
import { ClawmemMemory } from "../lib/runtime.js";
import { DEFAULTS, SettingsError, readSettings } from "../lib/settings.js";

const FAKE = fileURLToPath(new URL("../fixtures/fake-clawmem.js", import.meta.url));
const root = mkdtempSync(path.join(tmpdir(), "omc-"));
after(() => rmSync(root, { recursive: true, force: true }));
let serial = 0;
const pools = [];
const PIDS = path.join(root, "pids");

afterEach(() => {
  for (const pool of pools.splice(0)) pool.closeAll();
  let pids = [];
  try {
    pids = readFileSync(PIDS, "utf8").trim().split("\n").map(Number);
  } catch {
    return; // none started
  }
  rmSync(PIDS);
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGTERM");
    } catch {
      // gone already
    }
  }
});

/** A fresh workspace and an environment whose default sockets and logs are inside the test's folder. */
function fresh(fake = "serve") {
  const dir = path.join(root, `t${serial++}`);
  const workspace = path.join(dir, "ws");
  mkdirSync(path.join(workspace, "memory"), { recursive: true });
  const env = {
    PATH: process.env.PATH,
    XDG_RUNTIME_DIR: path.join(dir, "run"),
    XDG_CACHE_HOME: path.join(dir, "cache"),
    XDG_CONFIG_HOME: path.join(dir, "config"),
    FAKE_CLAWMEM: fake,
    FAKE_CLAWMEM_LOG: path.join(dir, "searches.jsonl"),
    FAKE_CLAWMEM_PIDS: PIDS,
  };
  return { dir, workspace, env };
}

function poolFor(env, overrides = {}) {
  const pool = new DaemonPool({ ...DEFAULTS, command: FAKE, env, startTimeoutMs: 5_000, timeoutMs: 5_000, ...overrides });
  pools.push(pool);
  return pool;
}

test("settings: defaults, and a wrong key or value is one line naming it", () => {
  assert.deepEqual(readSettings(undefined), { ...DEFAULTS });
  assert.equal(readSettings({ socket: "/s.sock", autoStart: false }).autoStart, false);
  assert.throws(() => readSettings({ sockett: "x" }), (e) => e instanceof SettingsError && /unknown setting 'sockett'/.test(e.message));
  assert.throws(() => readSettings({ timeoutMs: -1 }), /'timeoutMs' must be a positive number/);
  assert.throws(() => readSettings({ command: "" }), /'command' must be a non-empty string/);
  assert.throws(() => readSettings([]), /must be an object/);
  assert.throws(() => readSettings({ exitWhenIdleSeconds: 0.5 }), /'exitWhenIdleSeconds' must be 0 \(never\) or at least 1 second/);
  assert.equal(readSettings({ exitWhenIdleSeconds: 0 }).exitWhenIdleSeconds, 0);
});

test("the socket: the plugin's setting, then CLAWMEM_SOCKET, then clawmem.toml, then clawmem's default", () => {
  const { dir, workspace, env } = fresh();
  assert.equal(socketFor(workspace, { env }), defaultSocketPath(workspace, env));
  mkdirSync(path.join(env.XDG_CONFIG_HOME, "clawmem"), { recursive: true });
  writeFileSync(path.join(env.XDG_CONFIG_HOME, "clawmem", "config.toml"), 'socket = "user.sock"\n');
  assert.equal(socketFor(workspace, { env }), path.join(env.XDG_CONFIG_HOME, "clawmem", "user.sock"));
  // The workspace's own file wins over the user's; a relative path is from the file's folder, as in clawmem.
  writeFileSync(path.join(workspace, "clawmem.toml"), '# mine\nsocket = "run/own.sock"\n[search]\nmax_results = 3\n');
  assert.equal(socketFor(workspace, { env }), path.join(workspace, "run", "own.sock"));
  assert.equal(socketFor(workspace, { env: { ...env, CLAWMEM_SOCKET: "/e.sock" } }), "/e.sock");
  assert.equal(socketFor(workspace, { env, socket: path.join(dir, "p.sock") }), path.join(dir, "p.sock"));
  // A section's `socket` is not the top-level key; a broken file falls back to the default.
  writeFileSync(path.join(workspace, "clawmem.toml"), '[search]\nsocket = "no.sock"\n');
  assert.equal(socketFor(workspace, { env }), defaultSocketPath(workspace, env));
  writeFileSync(path.join(workspace, "clawmem.toml"), 'socket = "unclosed\n');
  assert.equal(socketFor(workspace, { env }), defaultSocketPath(workspace, env));
});

test("no daemon: the plugin starts `clawmem serve` for the workspace, once for concurrent requests", async () => {
  const { dir, workspace, env } = fresh();
  env.FAKE_CLAWMEM_ARGS = path.join(dir, "args.jsonl");
  const pool = poolFor(env);
  const [a, b] = await Promise.all([pool.daemonFor(workspace), pool.daemonFor(workspace)]);
  // one daemon, which exits when nothing has asked it for half an hour (the next request starts one again)
  assert.deepEqual(readFileSync(env.FAKE_CLAWMEM_ARGS, "utf8").trim().split("\n").map((l) => JSON.parse(l)),
    [["serve", "--workspace", workspace, "idle=1800"]]);
  assert.equal(a, b);
  assert.equal(a.started, true);
  assert.equal(a.socketPath, defaultSocketPath(workspace, env));
  assert.equal(a.status.workspace, workspace);
  // A second pool (another Gateway process) finds the running daemon instead of starting one.
  const other = await poolFor(env).daemonFor(workspace);
  assert.equal(other.started, false);
  assert.equal(other.status.daemon.pid, a.status.daemon.pid);
});

test("a daemon serving another folder is refused, never searched", async () => {
  const { dir, workspace, env } = fresh(`other:${path.join(root, "someone-else")}`);
  const pool = poolFor(env);
  await assert.rejects(pool.daemonFor(workspace), (e) => e instanceof WrongWorkspace && e.message.includes("not this agent's workspace"));
  const manager = new ClawmemManager({ pool, workspace, timeoutMs: 5_000, statusTtlMs: 5_000 });
  await assert.rejects(manager.search("x"), WrongWorkspace);
  assert.throws(() => readFileSync(path.join(dir, "searches.jsonl")), /ENOENT/);
});

test("clawmem not installed: an error naming the command to install it", async () => {
  const { workspace, env } = fresh();
  const pool = poolFor(env, { command: path.join(root, "no-such-clawmem") });
  await assert.rejects(pool.daemonFor(workspace), (e) => e instanceof NotInstalled && /pipx install 'clawmem-index\[local\]'/.test(e.message));
});

test("a daemon that stops at once: its own last line; one that never answers: the start deadline", async () => {
  const stopped = fresh("exit");
  await assert.rejects(poolFor(stopped.env).daemonFor(stopped.workspace),
    (e) => e instanceof DaemonUnreachable && /stopped at once \(exit 1\): clawmem: error: invalid setting 'embedding.provider'/.test(e.message));
  const silent = fresh("silent");
  const began = Date.now();
  await assert.rejects(poolFor(silent.env, { startTimeoutMs: 600 }).daemonFor(silent.workspace), /did not answer within 600 ms/);
  assert.ok(Date.now() - began < 5_000);
  // The started daemon's output goes to a private log beside clawmem's cache, never to the Gateway's.
  const logs = path.join(silent.env.XDG_CACHE_HOME, "clawmem", "openclaw");
  assert.equal(statSync(logs).mode & 0o777, 0o700);
  assert.deepEqual(readdirSync(logs), [`${workspaceKey(silent.workspace)}.log`]);
});

test("autoStart off: an error with the command that starts a daemon", async () => {
  const { workspace, env } = fresh();
  await assert.rejects(poolFor(env, { autoStart: false }).daemonFor(workspace),
    (e) => e instanceof DaemonUnreachable && e.message.includes(`clawmem serve --workspace ${workspace}`));
});

test("search: lexicalOnly is keyword mode, one source is a filter, and the hits take OpenClaw's shape", async () => {
  const { workspace, env } = fresh();
  const manager = new ClawmemManager({ pool: poolFor(env), workspace, timeoutMs: 5_000, statusTtlMs: 5_000 });
  const debug = [];
  const hits = await manager.search("platypus", { maxResults: 3, minScore: 0.2, lexicalOnly: true, sources: ["memory"], onDebug: (d) => debug.push(d) });
  // a keyword-only search (OpenClaw's trigger lane) gives a hit that is a curated entry that entry's triggers
  assert.deepEqual(hits, [{ path: "memory/a.md", startLine: 2, endLine: 4, score: 0.9, snippet: "about platypus", source: "memory",
    citation: "memory/a.md#L2-L4", textScore: 0.9, triggers: "platypus",
    provenance: { originClass: "untrusted", sessionKind: "unknown", observedAt: 0 } }]); // no such file here: untrusted
  assert.equal(debug[0].backend, "clawmem");
  await manager.search("both", { sources: ["memory", "sessions"] });
  const sent = readFileSync(env.FAKE_CLAWMEM_LOG, "utf8").trim().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(sent, [
    { query: "platypus", max_results: 3, min_score: 0.2, mode: "bm25", source: "memory" },
    { query: "both" },
  ]);
});

test("readFile: a missing file is not_found, a read is ok; status() is synchronous and says clawmem answered", async () => {
  const { workspace, env } = fresh();
  const manager = new ClawmemManager({ pool: poolFor(env), workspace, timeoutMs: 5_000, statusTtlMs: 60_000 });
  assert.equal(manager.status().dirty, true); // nothing asked yet: not claimed fresh
  assert.deepEqual(await manager.readFile({ relPath: "memory/gone.md" }), { status: "not_found", text: "", path: "memory/gone.md" });
  assert.deepEqual(await manager.readFile({ relPath: "memory/a.md", lines: 1 }), { status: "ok", text: "line one", path: "memory/a.md", from: 1, lines: 1 });
  const status = manager.status();
  assert.equal(status.backend, "clawmem");
  assert.equal(status.custom.backend, "clawmem");
  assert.equal(status.dirty, false);
  assert.deepEqual([status.files, status.chunks, status.provider], [2, 3, "none"]);
  assert.equal(await manager.probeVectorAvailability(), false);
});

test("a daemon that stopped between two requests is started again within the same request", async () => {
  const { workspace, env } = fresh();
  const pool = poolFor(env);
  const manager = new ClawmemManager({ pool, workspace, timeoutMs: 5_000, statusTtlMs: 5_000 });
  await manager.search("one");
  const first = manager.daemon.status.daemon.pid;
  process.kill(first, "SIGTERM");
  await waitFor(() => !alive(first));
  const hits = await manager.search("two");
  assert.equal(hits[0].snippet, "about two");
  assert.notEqual(manager.daemon.status.daemon.pid, first);
});

test("the search deadline holds whatever the daemon does", async () => {
  const { workspace, env } = fresh("silent");
  const manager = new ClawmemManager({ pool: poolFor(env, { startTimeoutMs: 60_000 }), workspace, timeoutMs: 400, statusTtlMs: 5_000 });
  const began = Date.now();
  await assert.rejects(manager.search("x"), /did not answer search within 400 ms/);
  assert.ok(Date.now() - began < 3_000);
  assert.equal(manager.status().lastSyncError, "clawmem did not answer search within 400 ms");
});

test("register: a memory capability and both tools, and nothing started (OpenClaw registers several times)", async () => {
  const { workspace, env } = fresh();
  const registered = { tools: [], capability: null };
  const api = {
    pluginConfig: { command: FAKE },
    config: {},
    runtime: { agent: { resolveAgentWorkspaceDir: (_cfg, agentId) => (agentId === "alpha" ? workspace : "/nowhere") } },
    registerMemoryCapability: (c) => (registered.capability = c),
    registerTool: (factory, opts) => registered.tools.push({ factory, opts }),
  };
  plugin.register(api);
  plugin.register(api);
  assert.equal(plugin.kind, "memory");
  assert.deepEqual(registered.tools.map((t) => t.opts.names[0]), ["memory_search", "memory_get", "memory_search", "memory_get"]);
  assert.equal(typeof registered.capability.runtime.getMemorySearchManager, "function");
  // The manifest declares exactly the tools registered, each under the name its factory's tool carries.
  const manifest = JSON.parse(readFileSync(new URL("../openclaw.plugin.json", import.meta.url), "utf8"));
  const names = [...new Set(registered.tools.map((t) => t.opts.names[0]))];
  assert.deepEqual([manifest.id, manifest.kind, manifest.contracts.tools], [plugin.id, "memory", names]);
  for (const { factory, opts } of registered.tools) {
    assert.deepEqual([factory({ agentId: "alpha", workspaceDir: workspace }).name], opts.names);
  }
  assert.deepEqual(Object.keys(manifest.toolMetadata).filter((name) => !names.includes(name)), []);
  // The runtime resolves the agent's workspace through OpenClaw; sandboxed callers never see transcripts.
  const runtime = registered.capability.runtime;
  const hits = [{ source: "memory" }, { source: "sessions" }];
  assert.deepEqual(await runtime.authorizeSearchHits({ sandboxed: true, hits }), [{ source: "memory" }]);
  assert.deepEqual(await runtime.authorizeSearchHits({ sandboxed: false, hits }), hits);
  const memory = new ClawmemMemory({ settings: { ...DEFAULTS, command: FAKE }, workspaceOf: api.runtime.agent.resolveAgentWorkspaceDir, env });
  const { manager } = await memory.runtime().getMemorySearchManager({ cfg: {}, agentId: "alpha", purpose: "status" });
  pools.push(memory.pool);
  assert.equal(manager.workspace, workspace);
  assert.equal(manager.status().files, 2);
});

test("in the Gateway, a service reaches or starts every agent's daemon at start; elsewhere none is registered", async () => {
  const one = fresh();
  const two = path.join(one.dir, "ws-two");
  mkdirSync(path.join(two, "memory"), { recursive: true });
  const services = [];
  const api = (registrationMode) => ({
    registrationMode,
    pluginConfig: { command: FAKE },
    config: {},
    runtime: { agent: { resolveAgentWorkspaceDir: (_cfg, agentId) => (agentId === "alpha" ? one.workspace : two) } },
    registerMemoryCapability: () => {},
    registerTool: () => {},
    registerService: (service) => services.push(service),
  });
  plugin.register(api("discovery"));
  plugin.register(api("tool-discovery"));
  assert.equal(services.length, 0);
  plugin.register(api("full"));
  assert.deepEqual(services.map((s) => s.id), ["clawmem-daemons"]);
  // The service's own pool uses the Gateway's environment: point it at this test's folders for the check.
  const saved = { ...process.env };
  Object.assign(process.env, one.env);
  try {
    const began = Date.now();
    services[0].start({ config: { agents: { entries: { alpha: {}, beta: {} } } } });
    assert.ok(Date.now() - began < 1_000, "start returns at once");
    const check = poolFor(one.env, { autoStart: false });
    for (const workspace of [one.workspace, two]) {
      await waitFor(async () => (await check.daemonFor(workspace).catch(() => null)) !== null, 10_000);
    }
    await services[0].stop();
  } finally {
    for (const key of Object.keys(one.env)) {
      if (key in saved) process.env[key] = saved[key];
      else delete process.env[key];
    }
  }
});

test("tools: memory_search's payload, memory_get's statuses, and failures as results with clawmem's message", async () => {
  const { workspace, env } = fresh();
  const memory = new ClawmemMemory({ settings: { ...DEFAULTS, command: FAKE }, workspaceOf: () => workspace, env });
  pools.push(memory.pool);
  const { createTools } = await import("../lib/tools.js");
  const [search, get] = createTools({ managerFor: () => memory.manager(workspace), config: {}, agentId: "alpha" });
  const found = (await search.execute("c1", { query: "otters" })).details;
  assert.equal(found.debug.backend, "clawmem");
  assert.equal(found.results[0].citation, "memory/a.md#L2-L4");
  assert.match(found.results[0].snippet, /Source: memory\/a.md#L2-L4$/);
  assert.equal(readFileSync(env.FAKE_CLAWMEM_LOG, "utf8").includes('"max_results":6'), true);
  assert.equal((await get.execute("c2", { path: "memory/gone.md" })).details.status, "not_found");
  // OpenClaw's own result count for the agent is the default, as memory-core honours it.
  const counted = { memory: { search: { query: { maxResults: 4 } } }, agents: { entries: { beta: { memory: { search: { query: { maxResults: 2 } } } } } } };
  await createTools({ managerFor: () => memory.manager(workspace), config: counted, agentId: "alpha" })[0].execute("c6", { query: "a" });
  await createTools({ managerFor: () => memory.manager(workspace), config: counted, agentId: "beta" })[0].execute("c7", { query: "b" });
  const sent = readFileSync(env.FAKE_CLAWMEM_LOG, "utf8").trim().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(sent.slice(-2).map((p) => p.max_results), [4, 2]);
  const [offSearch] = createTools({ managerFor: () => memory.manager(workspace), config: { memory: { citations: "off" } } });
  assert.equal((await offSearch.execute("c3", { query: "x" })).details.results[0].citation, undefined);
  // No daemon can start: a result saying so, not a throw into the Gateway.
  const broken = new ClawmemMemory({ settings: { ...DEFAULTS, command: path.join(root, "nope") }, workspaceOf: () => workspace, env: fresh().env });
  const [badSearch, badGet] = createTools({ managerFor: () => broken.manager(fresh().workspace), config: {} });
  const failed = (await badSearch.execute("c4", { query: "x" })).details;
  assert.deepEqual([failed.disabled, failed.unavailable, failed.results], [true, true, []]);
  assert.match(failed.error, /clawmem is not installed/);
  assert.match(failed.action, /Install clawmem/);
  assert.equal((await badGet.execute("c5", { path: "MEMORY.md" })).details.status, "error");
});

test("answers: status before any daemon is dirty, and hits keep clawmem's scores", () => {
  assert.deepEqual(searchParams({ maxResults: 0, minScore: Number.NaN, sources: ["wiki"] }), {});
  // Repository keys clawmem could not take (a lone surrogate is no valid Unicode) are left out, not sent.
  assert.deepEqual(searchParams({ activeProjectKeys: ["\ud800", "", 7, "x".repeat(1001), "github.com/acme/app"] }),
    { projects: ["github.com/acme/app"] });
  assert.equal(toHit({ path: "p", start_line: 1, end_line: 1, score: 1, snippet: "s", source: "sessions", vector_score: 0.5 }).vectorScore, 0.5);
  assert.deepEqual(freshnessOf({ index: { pending_files: 0, pending_embeddings: 0 } }), []);
  assert.deepEqual(freshnessOf({ index: { pending_files: 2, pending_embeddings: 5 }, warning: "provider slow" }), [
    "2 changed file(s) not yet indexed",
    "5 chunk(s) still waiting for vectors: keyword matches answer for them",
    "provider slow",
  ]);
  const none = providerStatus(null, { workspace: "/w", error: "down" });
  assert.deepEqual([none.dirty, none.lastSyncError, none.custom.reachable], [true, "down", false]);
});

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function waitFor(predicate, ms = 5_000) {
  const deadline = Date.now() + ms;
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 20));
  }
}
