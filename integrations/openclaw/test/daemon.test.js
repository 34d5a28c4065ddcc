// With the real `clawmem` command: run by the Python suite (tests/integrations/test_openclaw_plugin.py), which
// passes the command and a workspace; skipped when run alone. The plugin starts the daemon itself.
import assert from "node:assert/strict";
import { appendFileSync } from "node:fs";
import { test } from "node:test";

import { DEFAULTS } from "../lib/settings.js";
import { ClawmemMemory } from "../lib/runtime.js";
import { createTools } from "../lib/tools.js";

const { CLAWMEM_TEST_COMMAND: command, CLAWMEM_TEST_WORKSPACE: workspace } = process.env;

test("a real clawmem: started for the workspace, a note written after it started found by a stemmed query",
  { skip: !command && "no clawmem command given" }, async () => {
    const memory = new ClawmemMemory({ settings: { ...DEFAULTS, command, timeoutMs: 60_000, startTimeoutMs: 60_000 }, workspaceOf: () => workspace });
    const [search, get] = createTools({ managerFor: () => memory.manager(workspace), config: {} });
    try {
      // The first answer may come while the first index is built: partial, and saying so (stale, a warning).
      let first = (await search.execute("1", { query: "platypus plans", minScore: 0 })).details;
      assert.equal(first.debug.backend, "clawmem");
      for (const until = Date.now() + 30_000; first.results.length < 2 && Date.now() < until;) {
        assert.equal(first.stale, true, JSON.stringify(first));
        assert.match(first.warning, /still being built|not yet indexed/);
        await new Promise((r) => setTimeout(r, 50));
        first = (await search.execute("1", { query: "platypus plans", minScore: 0 })).details;
      }
      assert.deepEqual(first.results.map((r) => r.path).sort(), ["MEMORY.md", "memory/ideas.md"]);
      appendFileSync(`${workspace}/memory/ideas.md`, "\nThe otters were counted on Tuesday.\n");
      const deadline = Date.now() + 30_000;
      let found = [];
      while (Date.now() < deadline) {
        found = (await search.execute("2", { query: "otter counting" })).details.results;
        if (found.length > 0) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.equal(found[0]?.path, "memory/ideas.md");
      const read = (await get.execute("3", { path: "memory/ideas.md", from: found[0].startLine, lines: 50 })).details;
      assert.equal(read.status, "ok");
      assert.match(read.text, /otters were counted/);
      assert.equal((await get.execute("4", { path: "memory/none.md" })).details.status, "not_found");
      assert.equal((await get.execute("5", { path: "../x.md" })).details.status, "error");
      const { manager } = await memory.runtime().getMemorySearchManager({ cfg: {}, agentId: "main", purpose: "status" });
      const status = manager.status();
      assert.deepEqual([status.backend, status.files, status.custom.fresh], ["clawmem", 3, true]);
      // OpenClaw's trigger lane: USER.md's annotated entry, and a keyword search whose hit is that entry carries it.
      const candidates = await manager.listTriggerCandidates({});
      assert.deepEqual(candidates.map((c) => [c.path, c.startLine, c.triggers, c.importance, c.provenance.originClass]),
        [["USER.md", 1, "haiku; poem", 7, "agent"]]);
      assert.equal(candidates[0].snippet, "- Answer in haiku.");
      const lane = await manager.search("poem haiku", { lexicalOnly: true, maxResults: 24, minScore: 0, sources: ["memory"] });
      assert.deepEqual(lane.map((h) => [h.path, h.triggers]), [["USER.md", "haiku; poem"]]);
      assert.ok(!lane[0].snippet.includes("<!--"));
      process.kill(manager.daemon.status.daemon.pid, "SIGTERM");
    } finally {
      memory.pool.closeAll();
    }
  });

// The hostile-input corpus (tests/hostile.py, written to a JSON file by the Python suite): every text as a query
// and as a path, through the tools, against a workspace holding every hostile file. Each answer is a result in
// OpenClaw's shape, never a throw, and the daemon answers normally afterwards.
const { CLAWMEM_TEST_HOSTILE: hostileFile } = process.env;

test("the hostile corpus through the tools: every answer a result, and the workspace still searched",
  { skip: !hostileFile && "no hostile corpus given" }, async () => {
    const { readFileSync } = await import("node:fs");
    const corpus = JSON.parse(readFileSync(hostileFile, "utf8"));
    const memory = new ClawmemMemory({ settings: { ...DEFAULTS, command, timeoutMs: 60_000, startTimeoutMs: 60_000 }, workspaceOf: () => corpus.workspace });
    const [search, get] = createTools({ managerFor: () => memory.manager(corpus.workspace), config: {} });
    try {
      for (const [name, text] of Object.entries(corpus.texts)) {
        for (const corpusName of ["memory", "sessions", "all"]) {
          const found = (await search.execute("h", { query: text, corpus: corpusName })).details;
          assert.ok(Array.isArray(found.results), `${name}: ${JSON.stringify(found).slice(0, 200)}`);
          assert.ok(found.debug?.backend === "clawmem", name);
          JSON.stringify(found); // sendable as it is
        }
        const read = (await get.execute("h", { path: text, from: 1, lines: 5 })).details;
        assert.ok(["ok", "not_found", "error"].includes(read.status), `${name}: ${JSON.stringify(read).slice(0, 200)}`);
      }
      let found = (await search.execute("s", { query: corpus.sentinel, corpus: "all" })).details;
      for (const until = Date.now() + 60_000; /still being built/.test(found.warning ?? "") && Date.now() < until;) {
        await new Promise((r) => setTimeout(r, 100)); // the first index of this large workspace is not whole yet
        found = (await search.execute("s", { query: corpus.sentinel, corpus: "all" })).details;
      }
      assert.deepEqual(found.results.map((r) => r.path).sort(), ["MEMORY.md", "sessions/hostile.jsonl"]);
      for (const hit of (await search.execute("n", { query: "hostile name", maxResults: 50 })).details.results) {
        const read = (await get.execute("g", { path: hit.path, from: hit.startLine, lines: 1 })).details;
        assert.equal(read.status, "ok", `${hit.path}: ${JSON.stringify(read)}`);
      }
      // `openclaw memory search <text>` with OpenClaw's own commander (given by the Python suite): every text is
      // an answer or one line on stderr with exit code 1, never a throw out of the command.
      if (process.env.CLAWMEM_TEST_COMMANDER) {
        const { Command } = await import(process.env.CLAWMEM_TEST_COMMANDER);
        const { registerMemoryCli } = await import("../lib/cli.js");
        let answered = 0;
        for (const [name, text] of Object.entries(corpus.texts)) {
          for (const json of [["--json"], []]) {
            const out = [], err = [];
            const program = new Command().exitOverride().configureOutput({ writeOut: () => {}, writeErr: () => {} });
            registerMemoryCli({ program, config: {} }, memory, { write: (t) => out.push(t) }, { write: (t) => err.push(t) });
            process.exitCode = undefined;
            try {
              await program.parseAsync(["memory", "search", "--query", text, ...json], { from: "user" });
            } catch (error) {
              assert.match(String(error.code), /^commander\./, `${name}: ${error}`); // a usage error, as commander says
              continue;
            }
            if (process.exitCode === 1) assert.match(err.join(""), /^memory-clawmem: /, name);
            else {
              if (json.length) JSON.parse(out.join(""));
              answered++;
            }
            process.exitCode = undefined;
          }
        }
        assert.ok(answered > Object.keys(corpus.texts).length, `only ${answered} answers`);
      }
      // The annotations of USER.md (every case as a trigger, a project, an importance): candidates, never a throw.
      const manager = memory.manager(corpus.workspace);
      for (const listed of [await manager.listTriggerCandidates({}), await manager.listCuratedProjectCandidates({
        activeProjectKeys: Object.values(corpus.texts).filter((t) => t.length > 0 && t.length <= 1000).slice(0, 64) })]) {
        assert.ok(Array.isArray(listed));
        JSON.stringify(listed);
      }
      await manager.refreshStatus();
      process.kill(manager.daemon.status.daemon.pid, "SIGTERM");
    } finally {
      memory.pool.closeAll();
    }
  });
