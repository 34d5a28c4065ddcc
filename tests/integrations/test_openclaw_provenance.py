"""The plugin reads OpenClaw's write records as OpenClaw stores them: records written by OpenClaw's own code (the
installed openclaw package's memory-artifact-provenance module, run by Node, into a state folder of the test's),
read back by the plugin's WriteRecords through OpenClaw's real plugin SDK, listed once rather than a lookup a file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from openclaw_host import installed_openclaw

PLUGIN = Path(__file__).resolve().parents[2] / "integrations" / "openclaw"

NODE = """
import { readdirSync, readFileSync } from "node:fs";
const [dist, plugin, workspace] = process.argv.slice(2);
const name = readdirSync(dist).find((f) => f.startsWith("memory-artifact-provenance-") && f.endsWith(".mjs"));
const mod = await import(`${dist}/${name}`);
const [, list] = /export \\{([^}]*)\\};?\\s*$/.exec(readFileSync(`${dist}/${name}`, "utf8"));
const own = {};
for (const part of list.split(",")) {
  const [real, alias] = part.trim().split(/\\s+as\\s+/);
  own[real] = mod[alias ?? real];
}
const write = (relativePath, originClass) => own.recordMemoryArtifactWriteProvenance({ workspaceDir: workspace,
  relativePath, contentBefore: "", contentAfter: `written ${originClass}`, originClass, observedAt: Date.now() });
await write("memory/2026-11-01.md", "untrusted");
await write("memory/2026-11-02.md", "agent");
await write("USER.md", "untrusted");

const sdk = await import(`${dist}/plugin-sdk/memory-core-host-runtime-core.js`);
const calls = { list: 0, read: 0 };
const counted = {
  listMemoryArtifactProvenance: (p) => { calls.list++; return sdk.listMemoryArtifactProvenance(p); },
  readMemoryArtifactProvenance: (p) => { calls.read++; return sdk.readMemoryArtifactProvenance(p); },
};
const { WriteRecords, recordedOrigin } = await import(`${plugin}/lib/provenance.js`);
const records = new WriteRecords(workspace, { load: async () => counted });
const long_ago = Date.now() - 60_000;
const listed = {};
for (const rel of ["memory/2026-11-01.md", "memory/2026-11-02.md", "USER.md", "MEMORY.md"]) {
  listed[rel] = await records.origin(rel, long_ago);
}
const afterListing = { ...calls };
const alone = await recordedOrigin(workspace, "memory/2026-11-01.md", async () => counted);
console.log(JSON.stringify({ listed, afterListing, alone, calls }));
process.exit(0);
"""


def test_write_records_are_read_as_openclaw_stores_them_in_one_listing(tmp_path: Path) -> None:
    openclaw = installed_openclaw()
    dist = openclaw.cli.parent.parent / "openclaw" / "dist"
    workspace = tmp_path / "ws"
    (workspace / "memory").mkdir(parents=True)
    (tmp_path / "read.mjs").write_text(NODE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCLAW_")}
    env.update(HOME=str(tmp_path), OPENCLAW_STATE_DIR=str(tmp_path / "state"))
    out = subprocess.run([str(openclaw.node_bin / "node"), str(tmp_path / "read.mjs"), str(dist), str(PLUGIN),
                          str(workspace)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["listed"] == {"memory/2026-11-01.md": "untrusted", "memory/2026-11-02.md": "agent",
                              "USER.md": "untrusted", "MEMORY.md": None}
    assert seen["afterListing"] == {"list": 1, "read": 0}
    assert seen["alone"] == "untrusted" and seen["calls"] == {"list": 1, "read": 1}
