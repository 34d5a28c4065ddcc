"""Every source and front door against the hostile-input corpus (tests/hostile.py).

The invariant, everywhere: the service keeps answering, the other files are indexed, and an error
is a defined one (a ClawmemError, a JSON-RPC error object, a non-zero exit with a one-line
message), never a traceback, a crash or a dropped connection. MCP stdio and HTTP have theirs in
tests/mcp/test_mcp_server.py and tests/mcp/test_mcp_http.py.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import RawClient, daemon_settings, running_daemon, short_dir, wait_until
from hostile import (
    FIXED_BYTES,
    FIXED_JSON,
    FIXED_NAMES,
    FIXED_TEXTS,
    SENTINEL,
    hostile_bytes,
    hostile_name,
    hostile_text,
    hostile_workspace,
)
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings

from clawmem_index.api import Client
from clawmem_index.config import Settings, load_settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import ClawmemError
from clawmem_index.search.ranking import SearchRequest


@pytest.fixture
def hostile(workspace: Path, tmp_path: Path) -> Settings:
    hostile_workspace(workspace)
    return load_settings(workspace=workspace, overrides={"index": str(tmp_path / "index" / "i.sqlite"),
                                                         "embedding.provider": "none",
                                                         "sources": ["memory", "sessions"]})


def paths_with(index: MemoryIndex, query: str) -> set[str]:
    answer = index.search(SearchRequest(query, max_results=50, min_score=0.0, mode="bm25"))
    return {r["path"] for r in answer["results"]}  # type: ignore[union-attr]


def test_every_source_survives_the_corpus(hostile: Settings) -> None:
    index = MemoryIndex(hostile)
    report = index.sync()
    assert report.errors == []
    assert paths_with(index, SENTINEL) == {"MEMORY.md", "sessions/hostile.jsonl"}
    assert report.files_seen >= len(FIXED_TEXTS) + len(FIXED_BYTES) + len(FIXED_NAMES)
    status = index.status()
    assert status["files_indexed"] == report.files_seen and status["fresh"], status["stale_reasons"]
    assert index.sync().changed is False  # nothing unstable: a second pass finds nothing to do


def test_every_indexed_file_reads_back_through_get(hostile: Settings) -> None:
    index = MemoryIndex(hostile)
    index.sync()
    paths = [row[0] for row in index.reader().execute("SELECT path FROM files WHERE source = 'memory'")]
    for path in paths:
        answer = index.get(path, max_bytes=4096)
        assert answer["path"] == path
        json.dumps(answer, ensure_ascii=False).encode("utf-8")  # every answer is sendable as it is


def test_hostile_queries_and_paths_through_the_client(hostile: Settings) -> None:
    MemoryIndex(hostile).sync()
    with Client(hostile.workspace, index=hostile.index_path, socket=hostile.workspace / "none.sock",
                provider="none") as client:
        for text in FIXED_TEXTS.values():
            for call in (functools.partial(client.search, text), functools.partial(client.get, text),
                         functools.partial(client.context, text)):
                try:
                    json.dumps(call(), ensure_ascii=False).encode("utf-8")
                except ClawmemError:
                    pass  # a defined refusal (an empty query, a path that is not a memory file)
        assert {r["path"] for r in client.search(SENTINEL)["results"]} >= {"MEMORY.md"}
        # The annotations carrying every case: listed, sendable, and the entries' texts without them.
        for kind in (None, "triggers", "projects"):
            listed = client.curated(kind)
            json.dumps(listed, ensure_ascii=False).encode("utf-8")
            assert all("<!--" not in e["text"] or "-->" not in e["text"] for e in listed["entries"])
        for text in FIXED_TEXTS.values():  # any text as the repositories being worked in
            try:
                json.dumps(client.search(SENTINEL, projects=[text]), ensure_ascii=False).encode("utf-8")
            except ClawmemError:
                pass


@hypothesis_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=hostile_text(), path=hostile_text())
def test_any_text_as_a_query_or_a_path_is_answered_or_refused(indexed_small: MemoryIndex, query: str,
                                                             path: str) -> None:
    for call in (lambda: indexed_small.search(SearchRequest(query, mode="bm25")),
                 lambda: indexed_small.get(path),
                 lambda: indexed_small.context(SearchRequest(query, mode="bm25"), budget=200)):
        try:
            json.dumps(call(), ensure_ascii=False).encode("utf-8")
        except ClawmemError:
            pass


@pytest.fixture
def indexed_small(settings: Settings, write: Any) -> MemoryIndex:
    write("MEMORY.md", f"# Memory\nThe {SENTINEL} decision.\n")
    write("memory/2026-11-22.md", "# Log\n- deployed \u65e5\u672c service\n")
    index = MemoryIndex(settings)
    index.sync()
    return index


@hypothesis_settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(contents=hostile_bytes(), name=hostile_name())
def test_any_file_content_or_name_leaves_the_others_indexed(tmp_path_factory: pytest.TempPathFactory,
                                                            contents: bytes, name: bytes) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    workspace = root / "ws"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text(f"# Memory\nthe {SENTINEL}\n")
    with open(os.path.join(os.fsencode(workspace / "memory"), name), "wb") as fh:
        fh.write(contents)
    index = MemoryIndex(load_settings(workspace=workspace, overrides={"index": str(root / "i.sqlite"),
                                                                      "embedding.provider": "none"}))
    report = index.sync()
    assert report.errors == []
    assert "MEMORY.md" in paths_with(index, SENTINEL)
    index.close()


# -- the socket --------------------------------------------------------------------------------


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


def test_the_socket_answers_every_hostile_line_and_keeps_serving(hostile: Settings, tmp_path: Path,
                                                                  sock_dir: Path) -> None:
    settings = daemon_settings(hostile.workspace, tmp_path, sock_dir, index=str(hostile.index_path),
                               sources=["memory", "sessions"])
    with running_daemon(settings) as daemon, RawClient(settings.socket_path, timeout=60) as raw:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, timeout=60, message="the start-up sync")
        for name, body in FIXED_JSON.items():
            raw.send(body.encode() + b"\n")
            answer = raw.line()
            assert isinstance(answer, dict) and "error" in answer, name
        for name, text in FIXED_TEXTS.items():
            for method, params in (("search", {"query": text}), ("get", {"path": text}),
                                   ("context", {"query": text, "budget": 200})):
                line = json.dumps({"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
                raw.send(line.encode() + b"\n")
                answer = raw.line()
                assert answer is not None and answer["id"] == 7 and ("result" in answer or "error" in answer), name
        found = raw.call("search", {"query": SENTINEL, "mode": "bm25"})["result"]["results"]
        assert {r["path"] for r in found} == {"MEMORY.md", "sessions/hostile.jsonl"}
        assert raw.call("status")["result"]["fresh"]


# -- the command line ----------------------------------------------------------------------------


def test_the_cli_answers_hostile_arguments_with_an_exit_code_and_one_line(hostile: Settings, tmp_path: Path) -> None:
    MemoryIndex(hostile).sync()
    env = {**os.environ, "CLAWMEM_PROVIDER": "none", "CLAWMEM_SOURCES": "memory,sessions"}
    base = [sys.executable, "-m", "clawmem_index"]
    where = ["--workspace", str(hostile.workspace), "--index", str(hostile.index_path), "--socket",
             str(tmp_path / "none.sock")]
    # argv is bytes: lone surrogates arrive as the invalid UTF-8 a terminal could pass; NUL cannot be passed
    arguments = [text.encode("utf-8", "surrogatepass") for text in FIXED_TEXTS.values() if len(text) < 100_000]
    arguments += list(FIXED_BYTES.values())
    for arg in (a for a in arguments if b"\x00" not in a):
        for command in (["search", arg], ["get", arg], ["context", arg]):
            out = subprocess.run([*base, command[0], *where, "--", command[1]], env=env, capture_output=True,
                                 timeout=120, stdin=subprocess.DEVNULL)
            assert out.returncode in (0, 1), (command, out.stderr)
            assert b"Traceback" not in out.stderr, (command, out.stderr)
            if out.returncode:
                assert out.stderr.startswith(b"clawmem: ") and out.stderr.count(b"\n") <= 2, out.stderr
