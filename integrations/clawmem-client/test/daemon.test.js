// Against a real clawmem daemon: run by the Python suite (tests/integrations/test_node_client.py), which
// starts one on a workspace and passes where it is; skipped when run alone.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ClawmemClient, PathError, QueryError, defaultSocketPath } from "../index.js";

const { CLAWMEM_TEST_SOCKET: socketPath, CLAWMEM_TEST_WORKSPACE: workspace, CLAWMEM_TEST_DERIVED: derived } = process.env;

test("a real daemon: search, get, status, context and its errors", { skip: !socketPath && "no daemon given" }, async () => {
  const client = new ClawmemClient({ socketPath });
  const found = await client.search("platypus plans", { mode: "bm25", minScore: 0 });
  assert.deepEqual(found.results.map((r) => r.path).sort(), ["MEMORY.md", "memory/ideas.md"]);
  assert.equal(found.results[0].path, "MEMORY.md");
  const got = await client.get("MEMORY.md", { from: 2, lines: 1 });
  assert.equal(got.text, "Prefer the platypus plan.");
  const status = await client.status();
  assert.equal(status.files_indexed, 3); // MEMORY.md, USER.md and a note
  const context = await client.context("platypus", { budget: 50 });
  assert.ok(context.tokens <= 50 && context.text.includes("platypus"));
  await assert.rejects(client.get("../etc/passwd"), (e) => e instanceof PathError && e.message.includes(".."));
  const curated = await client.curated({ kind: "triggers" });
  assert.deepEqual(curated.entries, [
    { path: "USER.md", start_line: 2, end_line: 2, text: "- Answer in haiku.", triggers: "poem; verse", importance: 7 },
  ]);
  const scoped = await client.search("detector", { mode: "bm25", minScore: 0, projects: ["github.com/acme/app"] });
  assert.equal(scoped.results[0].projects, "github.com/acme/app");
  await assert.rejects(client.curated({ kind: "dreams" }), (e) => e instanceof QueryError || e.code === -32602);
  client.close();
});

test("the derived socket path is the one the daemon uses", { skip: !derived && "no workspace given" }, () => {
  assert.equal(defaultSocketPath(workspace, { XDG_RUNTIME_DIR: process.env.XDG_RUNTIME_DIR }), derived);
});
