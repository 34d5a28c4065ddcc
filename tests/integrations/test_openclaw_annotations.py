"""clawmem reads OpenClaw's annotations exactly as OpenClaw does: its own code (the installed openclaw package's
curated-annotations and markdown-chunks modules, run by Node) and clawmem_index.text.annotations, over the same texts:
hand-picked edge cases, the hostile corpus, and random mixtures of the markers' pieces."""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path

from hostile import FIXED_TEXTS
from openclaw_host import installed_openclaw

from clawmem_index.text.annotations import curated_entries, read_annotations, strip_annotations

PIECES = ["<!--", "-->", " trigger:", "importance:", " project: ", "PROJECT:", "7", "10", "0", "a", "b c", ";", ",",
          "\n", "\n- ", "\n# ", " ", "\t", "\r", "<", ">", "path:/x", "GitHub.com/A/b", "é", "\u2028", "-", "- "]
CASES = [
    "- Keep the gateway on loopback. <!-- trigger: gateway setup, network safety --> <!-- importance: 9 -->",
    "- a <!-- trigger: one\ntwo --> b", "x <!-- IMPORTANCE : 3 --> y", "- x <!-- importance: 010 -->",
    "- x <!-- importance: 11 -->", "- x <!-- project: a<b -->", "- x <!-- project: ; -->", "- x <!-- project: unclosed",
    "- y <!-- importance: 3 -->\n  more <!-- importance: 7 -->\n<!-- trigger: b -->",
    "# M\n\n- one <!-- trigger: a -->\n  continued\n- two <!-- project: x/y -->\ntail\n", "",
    "- t <!-- trigger: a; b, a --> and more words", "- z <!-- project: Host.COM/Path; path:/Src -->",
]

NODE = """
import { readFileSync } from "node:fs";
const [dist, file] = process.argv.slice(2);
const load = async (stem) => {
  const { readdirSync } = await import("node:fs");
  const name = readdirSync(dist).find((f) => f.startsWith(stem + "-") && f.endsWith(".mjs"));
  const mod = await import(`${dist}/${name}`);
  const source = readFileSync(`${dist}/${name}`, "utf8");
  const [, list] = /export \\{([^}]*)\\};?\\s*$/.exec(source);
  const named = {};
  for (const part of list.split(",")) {
    const [real, alias] = part.trim().split(/\\s+as\\s+/);
    named[real] = mod[alias ?? real];
  }
  return named;
};
const notes = await load("curated-annotations");
const chunks = await load("markdown-chunks");
const out = JSON.parse(readFileSync(file, "utf8")).map((text) => {
  const lines = text.split("\\n");
  const meta = (curatedRoot, projectScopeEligible) =>
    notes.extractCuratedEntryRecallMetadata({ sourceLines: lines, curatedRoot, projectScopeEligible });
  return {
    stripped: notes.stripMemoryAnnotationCarriers(text),
    curated: meta(true, true), daily: meta(false, true), profile: meta(true, false),
    entries: chunks.splitCuratedMarkdownEntries(text).map((e) => [e.startLine, e.endLine]),
  };
});
console.log(JSON.stringify(out));
"""


def corpus() -> list[str]:
    rng = random.Random(41)
    made = ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 30))) for _ in range(400)]
    return [*CASES, *(t for t in FIXED_TEXTS.values() if not re.search("[\ud800-\udfff]", t)), *made]


def ours(text: str) -> dict[str, object]:
    lines = text.split("\n")

    def meta(curated: bool, project: bool) -> dict[str, object]:
        notes = read_annotations(lines, curated=curated, project_scoped=project)
        return {"importance": notes.importance, "triggers": notes.triggers, "projectKey": notes.projects}

    return {"stripped": strip_annotations(text), "curated": meta(True, True), "daily": meta(False, True),
            "profile": meta(True, False),
            "entries": [[e.start_line, e.end_line] for e in curated_entries(text, project_scoped=True)]}


def test_clawmem_reads_annotations_as_openclaws_own_code_does(tmp_path: Path) -> None:
    openclaw = installed_openclaw()
    dist = openclaw.cli.parent.parent / "openclaw" / "dist"  # node_modules/.bin/openclaw -> node_modules/openclaw
    texts = corpus()
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    (tmp_path / "read.mjs").write_text(NODE)
    node = openclaw.node_bin / "node"
    out = subprocess.run([str(node), str(tmp_path / "read.mjs"), str(dist), str(tmp_path / "texts.json")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = json.loads(out.stdout)
    differ = [(text, theirs[i], ours(text)) for i, text in enumerate(texts) if theirs[i] != ours(text)]
    assert not differ, json.dumps(differ[:3], indent=1, ensure_ascii=False)
    assert len(texts) > 400

