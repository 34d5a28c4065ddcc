"""The context block: exact token budgets, whole lines, grouping and merging, through every front door."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from daemon_helpers import RawClient, daemon_settings, held_first_build, running_daemon, short_dir, wait_until
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from clawmem_index.api import Client
from clawmem_index.config import Settings, load_settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import ConfigError, IndexUnavailable, QueryError
from clawmem_index.search.context import Hit, build_context, citation
from clawmem_index.search.ranking import SearchRequest
from clawmem_index.service.client import DaemonClient
from clawmem_index.text.tokens import get_encoding

pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")

ENCODING = get_encoding("cl100k_base")  # tiktoken's own, its file seeded offline
assert isinstance(ENCODING, tiktoken.Encoding)
LABEL = re.compile(r"^### (?P<path>.+?)#L(?P<first>\d+)(?:-L(?P<last>\d+))?$")


def tokens(text: str) -> int:
    return len(ENCODING.encode_ordinary(text))


def parse(text: str) -> list[tuple[str, int, int, list[str]]]:
    """The block's sections as (path, first, last, lines), read back from the text alone."""
    sections: list[tuple[str, int, int, list[str]]] = []
    for part in text.split("\n\n### "):
        head, *body = (part if part.startswith("### ") else "### " + part).split("\n")
        m = LABEL.match(head)
        assert m, f"not a label: {head!r}"
        first = int(m["first"])
        sections.append((m["path"], first, int(m["last"] or first), body))
    return sections


# -- the pure block -----------------------------------------------------------------------------

FILES = {
    "MEMORY.md": ["# Memory", "", "- Dana prefers short answers.", "- SQLite was chosen: one file.", ""],
    "memory/2026-11-22.md": ["# 2026-11-22", "", "## Decisions", "- sqlite-vec for KNN.", "- FTS5 porter.",
                             "", "## Todo", "- write the README", "- ship it"],
}


def reader(files: dict[str, list[str]], others: dict[tuple[str, str], list[str]] | None = None) -> Any:
    """Lines of this workspace's `files`, and of `others` keyed by (workspace, path)."""
    calls: list[tuple[str | None, str, int, int]] = []

    def read(workspace: str | None, path: str, first: int, last: int) -> list[str]:
        calls.append((workspace, path, first, last))
        return (files[path] if workspace is None else (others or {})[workspace, path])[first - 1:last]

    read.calls = calls  # type: ignore[attr-defined]
    return read


def test_files_in_the_order_of_their_best_hit_ranges_in_line_order_overlaps_merged() -> None:
    hits = [Hit("memory/2026-11-22.md", 3, 5, 0.9), Hit("MEMORY.md", 1, 4, 0.8),
            Hit("memory/2026-11-22.md", 7, 9, 0.7), Hit("memory/2026-11-22.md", 4, 6, 0.6)]
    read = reader(FILES)
    block = build_context(hits, read, tokens, 10_000)
    assert [(s.path, s.start_line, s.end_line) for s in block.sections] == [
        ("memory/2026-11-22.md", 3, 9), ("MEMORY.md", 1, 4)]
    assert block.text == ("### memory/2026-11-22.md#L3-L9\n## Decisions\n- sqlite-vec for KNN.\n- FTS5 porter.\n\n"
                          "## Todo\n- write the README\n- ship it\n\n"
                          "### MEMORY.md#L1-L4\n# Memory\n\n"
                          "- Dana prefers short answers.\n- SQLite was chosen: one file.")
    assert block.tokens == tokens(block.text) and not block.truncated
    assert read.calls == [(None, "memory/2026-11-22.md", 3, 9), (None, "MEMORY.md", 1, 4)], \
        "each merged range read once"
    assert [s.score for s in block.sections] == [0.9, 0.8]


BETA = {("beta", "MEMORY.md"): ["# Beta", "", "- Beta runs the failover.", "- Beta keeps the runbook.",
                               "- Beta rotates keys."]}


def test_another_workspaces_file_is_its_own_file_labelled_with_its_workspace() -> None:
    hits = [Hit("MEMORY.md", 1, 4, 0.9), Hit("MEMORY.md", 3, 4, 0.8, "beta"), Hit("MEMORY.md", 2, 3, 0.7),
            Hit("MEMORY.md", 4, 5, 0.6, "beta")]
    read = reader(FILES, BETA)
    block = build_context(hits, read, tokens, 10_000)
    assert block.text == ("### MEMORY.md#L1-L4\n# Memory\n\n- Dana prefers short answers.\n"
                          "- SQLite was chosen: one file.\n\n"
                          "### beta:MEMORY.md#L3-L5\n- Beta runs the failover.\n- Beta keeps the runbook.\n"
                          "- Beta rotates keys.")
    assert read.calls == [(None, "MEMORY.md", 1, 4), ("beta", "MEMORY.md", 3, 5)], "merged per (workspace, path)"
    assert [s.as_dict() for s in block.sections] == [
        {"path": "MEMORY.md", "start_line": 1, "end_line": 4, "score": 0.9, "citation": "MEMORY.md#L1-L4"},
        {"path": "MEMORY.md", "start_line": 3, "end_line": 5, "score": 0.8, "citation": "beta:MEMORY.md#L3-L5",
         "workspace": "beta"}]
    assert [(p, a, b) for p, a, b, _ in parse(block.text)] == [("MEMORY.md", 1, 4), ("beta:MEMORY.md", 3, 5)]
    only_beta = build_context([Hit("MEMORY.md", 1, 3, 0.5, "beta")], reader(FILES, BETA), tokens, 10_000)
    assert only_beta.text == "### beta:MEMORY.md#L1-L3\n# Beta\n\n- Beta runs the failover."


def test_separate_ranges_of_one_file_keep_their_own_labels_and_blank_edges_are_trimmed() -> None:
    hits = [Hit("memory/2026-11-22.md", 1, 2, 0.9), Hit("memory/2026-11-22.md", 6, 8, 0.5)]
    block = build_context(hits, reader(FILES), tokens, 10_000)
    assert [s.citation for s in block.sections] == ["memory/2026-11-22.md#L1", "memory/2026-11-22.md#L7-L8"]
    assert block.text.count("### ") == 2


def test_a_budget_too_small_for_anything_is_an_empty_block_that_says_what_it_left_out() -> None:
    hits = [Hit("MEMORY.md", 1, 4, 0.8)]
    for budget in (0, 1, 5):
        block = build_context(hits, reader(FILES), tokens, budget)
        assert (block.text, block.tokens, block.sections) == ("", 0, ())
        assert block.hits == 1 and block.truncated and block.omitted_lines == 3
    empty = build_context([], reader(FILES), tokens, 100)
    assert (empty.text, empty.hits, empty.truncated) == ("", 0, False)


def test_the_best_hit_keeps_its_top_lines_when_the_budget_runs_out() -> None:
    hits = [Hit("memory/2026-11-22.md", 1, 9, 0.9), Hit("MEMORY.md", 1, 4, 0.5)]
    whole = build_context(hits, reader(FILES), tokens, 10_000)
    for budget in range(whole.tokens):
        block = build_context(hits, reader(FILES), tokens, budget)
        assert block.tokens == tokens(block.text) <= budget
        for path, first, last, lines in parse(block.text) if block.text else []:
            assert lines == FILES[path][first - 1:last]
            if path == "memory/2026-11-22.md":
                assert first == 1, "a hit is taken from its top"
    assert whole.tokens == tokens(whole.text)


def test_lines_the_reader_cannot_give_are_left_out() -> None:
    shorter = {"MEMORY.md": FILES["MEMORY.md"][:2], "memory/2026-11-22.md": []}
    hits = [Hit("memory/2026-11-22.md", 1, 3, 0.9), Hit("MEMORY.md", 1, 4, 0.8)]
    block = build_context(hits, reader(shorter), tokens, 1000)
    assert block.text == "### MEMORY.md#L1\n# Memory"
    too_long = {"MEMORY.md": ["# Memory", None, "- after"]}
    block = build_context([Hit("MEMORY.md", 1, 3, 0.9)], reader(too_long), tokens, 1000)  # type: ignore[arg-type]
    assert block.text == "### MEMORY.md#L1\n# Memory" and block.omitted_lines == 2, \
        "a hit stops at a line it cannot show"


def test_citations() -> None:
    assert citation("memory/2026-11-22.md", 12, 18) == "memory/2026-11-22.md#L12-L18"
    assert citation("MEMORY.md", 3, 3) == "MEMORY.md#L3"
    assert citation("MEMORY.md", 3, 7, "beta") == "beta:MEMORY.md#L3-L7"
    assert citation("memory/a.md", 2, 2, None) == "memory/a.md#L2"


lines_st = st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"),
                            max_size=40), min_size=1, max_size=30)


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=st.dictionaries(st.sampled_from(["MEMORY.md", "memory/a.md", "memory/日本.md", "memory/x y.md"]),
                             lines_st, min_size=1),
       data=st.data(), budget=st.integers(0, 400))
def test_any_block_fits_its_budget_exactly_with_whole_lines_only(files: dict[str, list[str]], data: Any,
                                                                 budget: int) -> None:
    others = {("beta", path): lines[::-1] for path, lines in files.items()}  # another workspace, other lines

    def lines_of(workspace: str | None, path: str) -> list[str]:
        return files[path] if workspace is None else others[workspace, path]

    hits = []
    for _ in range(data.draw(st.integers(0, 8))):
        path = data.draw(st.sampled_from(sorted(files)))
        first = data.draw(st.integers(1, len(files[path]) + 2))
        last = data.draw(st.integers(first, first + 12))
        hits.append(Hit(path, first, last, data.draw(st.floats(0, 1)), data.draw(st.sampled_from([None, "beta"]))))
    block = build_context(hits, reader(files, others), tokens, budget)
    assert block.tokens == tokens(block.text) <= budget
    assert block.text == "\n\n".join(f"### {citation(s.path, s.start_line, s.end_line, s.workspace)}\n"
                                     + "\n".join(lines_of(s.workspace, s.path)[s.start_line - 1:s.end_line])
                                     for s in block.sections), "every line whole and where its label says"
    seen: dict[tuple[str | None, str], list[tuple[int, int]]] = {}
    for s in block.sections:
        key, first, last, lines = (s.workspace, s.path), s.start_line, s.end_line, list(s.lines)
        assert lines[0].strip() and lines[-1].strip()
        assert all(any((h.workspace, h.path) == key and h.start_line <= n <= h.end_line for h in hits)
                   for n in range(first, last + 1)), "only lines under the hits"
        for a, b in seen.get(key, []):
            assert last < a - 1 or first > b + 1, "ranges of one file neither overlap nor touch"
        seen.setdefault(key, []).append((first, last))
    best: dict[tuple[str | None, str], int] = {}
    for h in sorted(hits, key=lambda h: -h.score):
        best.setdefault((h.workspace, h.path), len(best))
    order = [best[key] for key in dict.fromkeys((s.workspace, s.path) for s in block.sections)]
    assert order == sorted(order), "files in the order of their best hit"


# -- the index and its front doors ----------------------------------------------------------------


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


def long_note(topic: str, n: int) -> str:
    return "\n".join([f"# Notes on {topic}", ""] + [f"- {topic} fact {i}: the {topic} decision {i} was made for"
                                                    f" reason {i * 7} after a long talk." for i in range(n)]) + "\n"


@pytest.fixture
def built(workspace: Path, settings: Settings) -> Settings:
    (workspace / "MEMORY.md").write_text("# Memory\n\n- The walrus plan is durable.\n")
    (workspace / "memory" / "2026-11-22.md").write_text(long_note("walrus", 60))
    (workspace / "memory" / "2026-11-23.md").write_text(long_note("walrus and otter", 15))
    index = MemoryIndex(settings)
    index.sync()
    index.close()
    return settings


def test_the_index_answers_within_many_budgets_by_tiktoken(built: Settings) -> None:
    index = MemoryIndex(built, read_only=True)
    request = SearchRequest("walrus decision", mode="bm25", max_results=10, min_score=0.0)
    full = index.context(request, 100_000)
    assert full["hits"] >= 3 and not full["truncated"]
    assert full["tokenizer"] == "cl100k_base" and full["mode"] == "bm25"
    files = {p: (built.workspace / p).read_text().split("\n") for p in
             ("MEMORY.md", "memory/2026-11-22.md", "memory/2026-11-23.md")}
    for budget in [0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1500, 2584, full["tokens"]]:
        block = index.context(request, budget)
        assert block["tokens"] == tokens(block["text"]) <= budget
        assert block["budget"] == budget
        for path, first, last, lines in parse(block["text"]) if block["text"] else []:
            assert lines == files[path][first - 1:last]
        if budget < full["tokens"]:
            assert block["truncated"]
    assert index.context(request)["budget"] == 1500, "the setting's default"
    index.close()


def test_nothing_matching_is_an_empty_block(built: Settings) -> None:
    index = MemoryIndex(built, read_only=True)
    block = index.context(SearchRequest("zeppelin", mode="bm25"))
    assert (block["text"], block["tokens"], block["hits"], block["sections"]) == ("", 0, 0, [])


def test_a_file_gone_since_the_sync_is_left_out(built: Settings) -> None:
    (built.workspace / "memory" / "2026-11-23.md").unlink()
    index = MemoryIndex(built, read_only=True)
    block = index.context(SearchRequest("otter", mode="bm25", min_score=0.0))
    assert "2026-11-23" not in block["text"]


def test_transcripts_are_not_context(built: Settings) -> None:
    with pytest.raises(QueryError, match="memory files"):
        MemoryIndex(built, read_only=True).context(SearchRequest("walrus", source="sessions"))


def test_the_daemon_answers_context_like_the_index(built: Settings, workspace: Path, tmp_path: Path,
                                                   sock_dir: Path) -> None:
    settings = daemon_settings(workspace, tmp_path, sock_dir, index=str(built.index_path))
    local = MemoryIndex(built, read_only=True).context(SearchRequest("walrus decision", mode="bm25"), 300)
    with running_daemon(settings) as daemon:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        with DaemonClient(settings.socket_path) as client:
            remote = client.context(SearchRequest("walrus decision", mode="bm25"), 300)
            assert remote["text"] == local["text"] and remote["tokens"] == local["tokens"] <= 300
            with pytest.raises(QueryError, match="'budget' must be between 0 and 100000"):
                client.context(SearchRequest("walrus"), -1)
        with RawClient(settings.socket_path) as raw:
            answer = raw.call("context", {"query": "walrus", "budget": "many"})
            assert answer["error"]["code"] == -32602 and "'budget' must be an integer" in answer["error"]["message"]
            answer = raw.call("context", {"query": "walrus", "source": "sessions"})
            assert answer["error"]["code"] == QueryError.rpc_code
            answer = raw.call("context", {"query": "walrus", "mode": "bm25", "budget": 50})
            assert answer["result"]["tokens"] <= 50


def test_a_new_daemon_holds_context_until_its_first_build(workspace: Path, tmp_path: Path, sock_dir: Path) -> None:
    (workspace / "MEMORY.md").write_text("# Memory\nThe tapir.\n")
    settings = daemon_settings(workspace, tmp_path, sock_dir, **{"daemon.first_build_wait": 0.2})
    daemon, gate = held_first_build(settings)
    daemon.start()
    try:
        wait_until(lambda: daemon.writer.state()["running"] == "sync", message="the first build")
        with DaemonClient(settings.socket_path) as client:
            with pytest.raises(IndexUnavailable, match="still building"):
                client.context(SearchRequest("tapir", mode="bm25"))
            gate.set()
            wait_until(lambda: "The tapir." in client.context(SearchRequest("tapir", mode="bm25"))["text"],
                       message="a context block from the built index")
    finally:
        gate.set()
        daemon.stop()


def test_the_public_client_gives_the_same_block_with_and_without_a_daemon(built: Settings, workspace: Path,
                                                                          tmp_path: Path, sock_dir: Path) -> None:
    socket_path = sock_dir / "d.sock"
    with Client(workspace, index=built.index_path, socket=socket_path, provider="none") as client:
        alone = client.context("walrus decision", budget=200, mode="bm25")
        assert client.served_by == "index"
    settings = daemon_settings(workspace, tmp_path, sock_dir, index=str(built.index_path))
    with running_daemon(settings) as daemon:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        with Client(workspace, index=built.index_path, socket=socket_path, provider="none") as client:
            served = client.context("walrus decision", budget=200, mode="bm25")
            assert client.served_by == "daemon"
    assert served["text"] == alone["text"] and served["tokens"] <= 200


def clawmem(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clawmem_index", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CLAWMEM_PROVIDER": "none", **(env or {})}, stdin=subprocess.DEVNULL,
                          check=False)


def test_the_cli_prints_the_block_and_its_json(built: Settings) -> None:
    flags = ["--workspace", str(built.workspace), "--index", str(built.index_path)]
    out = clawmem("context", *flags, "--mode", "bm25", "--budget", "120", "walrus", "decision")
    assert out.returncode == 0, out.stderr
    text = out.stdout.removesuffix("\n")
    assert text.startswith("### memory/2026-11-22.md#L") and tokens(text) <= 120
    out = clawmem("context", *flags, "--mode", "bm25", "--budget", "120", "--json", "walrus", "decision")
    answer = json.loads(out.stdout)
    assert answer["text"] == text and answer["tokens"] == tokens(text) and answer["budget"] == 120
    out = clawmem("context", *flags, "--mode", "bm25", "--budget", "0", "walrus")
    assert (out.returncode, out.stdout) == (0, "") and "nothing fits in 0 tokens" in out.stderr
    out = clawmem("context", *flags, "--mode", "bm25", "zeppelin")
    assert (out.returncode, out.stdout) == (0, "") and "no results" in out.stderr
    out = clawmem("context", *flags, "--budget", "-3", "walrus")
    assert out.returncode == 2


def test_the_budget_setting(tmp_path: Path) -> None:
    (tmp_path / "clawmem.toml").write_text("[search]\ncontext_budget = 400\n")
    assert load_settings(workspace=tmp_path, environ={}).search.context_budget == 400
    (tmp_path / "clawmem.toml").write_text("[search]\ncontext_budget = -1\n")
    with pytest.raises(ConfigError, match="search.context_budget"):
        load_settings(workspace=tmp_path, environ={})


@pytest.mark.parametrize("size", [30_000, (1 << 20) + 50_000], ids=["over-budget", "over-the-read"])
def test_a_line_longer_than_the_budget_is_left_out_never_cut(workspace: Path, settings: Settings, size: int) -> None:
    long_line = "pangolin " * (size // 9)
    (workspace / "memory" / "long.md").write_text(f"# Long\n{long_line}\n")
    (workspace / "MEMORY.md").write_text("# Memory\n- one pangolin.\n")
    MemoryIndex(settings).sync()
    index = MemoryIndex(settings, read_only=True)
    request = SearchRequest("pangolin", mode="bm25", max_results=20, min_score=0.0, path_prefix="memory/")
    block = index.context(request, 2000)
    assert (block["text"], block["tokens"]) == ("", 0)
    assert block["hits"] == 1 and block["truncated"] and block["omitted_lines"] == 1, \
        "the one long line (one citation), left out"
    both = index.context(SearchRequest("one pangolin", mode="bm25", max_results=30, min_score=0.0), 2000)
    assert both["text"] == "### MEMORY.md#L2\n- one pangolin." and both["truncated"]  # an entry is a chunk
