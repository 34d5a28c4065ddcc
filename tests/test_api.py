"""The public Python client: same answers and errors with a daemon and without, settings found like the CLI's."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import daemon_settings, refusing_daemon, running_daemon, short_dir, wait_until

import clawmem_index
from clawmem_index import api
from clawmem_index.api import Client
from clawmem_index.config import Settings
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import ConfigError, IndexUnavailable, PathError, QueryError
from clawmem_index.index.store import MIGRATIONS, Store
from clawmem_index.search.ranking import SearchRequest

pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


@pytest.fixture
def indexed(workspace: Path, settings: Settings) -> Settings:
    (workspace / "MEMORY.md").write_text("# Memory\n\n- We chose SQLite: one file, no server.\n")
    (workspace / "memory" / "2026-11-22.md").write_text("# 2026-11-22\n\n- Dana asked why sqlite won.\n- ocelot\n")
    MemoryIndex(settings).sync()
    return settings


def offline(settings: Settings, sock_dir: Path, **kwargs: object) -> Client:
    """A client whose socket has no daemon: it answers from the index file."""
    return Client(settings.workspace, index=settings.index_path, socket=sock_dir / "none.sock", provider="none",
                  **kwargs)  # type: ignore[arg-type]


def files_of(index: Path) -> dict[str, str]:
    """The index's bytes (and its WAL's): a reader may create an empty WAL and the shared-memory file, no more."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in index.parent.iterdir()
            if p.name.startswith(index.name) and not p.name.endswith("-shm") and p.stat().st_size}


def test_without_a_daemon_it_answers_from_the_index(indexed: Settings, sock_dir: Path) -> None:
    with offline(indexed, sock_dir) as client:
        found = client.search("why sqlite", max_results=3, mode="bm25")
        assert client.served_by == "index"
        assert found["results"][0]["path"] in ("MEMORY.md", "memory/2026-11-22.md")
        assert {"results", "provider", "model", "mode", "index"} <= found.keys()
        assert all(isinstance(r, dict) and {"path", "start_line", "end_line", "score", "snippet", "source"} <= r.keys()
                   for r in found["results"])
        assert client.get("MEMORY.md", start=3, lines=1)["text"] == "- We chose SQLite: one file, no server."
        assert client.get(Path("memory/2026-11-22.md"))["lines"] == 4
        assert client.status()["files_indexed"] == 2
        block = client.context("ocelot", budget=100, mode="bm25")
        assert block["text"] == "### memory/2026-11-22.md#L1-L4\n# 2026-11-22\n\n- Dana asked why sqlite won.\n- ocelot"


def test_the_in_process_index_is_read_only(indexed: Settings, sock_dir: Path) -> None:
    before = files_of(indexed.index_path)
    with offline(indexed, sock_dir) as client:
        client.search("sqlite", mode="bm25")
        client.context("sqlite", mode="bm25")
        client.status()
        local = client._index
        assert local is not None and local.read_only
        with pytest.raises(IndexUnavailable, match="read-only"):
            local.sync()
    assert files_of(indexed.index_path) == before


def test_a_vector_query_in_process_writes_nothing(workspace: Path, settings: Settings) -> None:
    """The query vector is made and used, never cached: a reader stays a reader with a provider too."""
    (workspace / "MEMORY.md").write_text("# Memory\nThe capybara plan.\n")
    writer = MemoryIndex(settings, provider=FakeProvider())
    writer.sync()
    writer.close()
    before = files_of(settings.index_path)
    reader = MemoryIndex(settings, provider=FakeProvider(), read_only=True)
    answer = reader.search(SearchRequest("capybara plan", mode="hybrid", min_score=0.0))
    assert answer["mode"] == "hybrid" and answer["results"][0].get("vector_score") is not None
    reader.context(SearchRequest("capybara plan", mode="vector"))
    reader.close()
    assert files_of(settings.index_path) == before


def test_an_index_that_needs_a_migration_is_refused_not_migrated(indexed: Settings, sock_dir: Path) -> None:
    store = Store(indexed.index_path)
    store.conn.execute("DELETE FROM migrations WHERE name = ?", (MIGRATIONS[-1][0],))
    store.close()
    before = files_of(indexed.index_path)
    with offline(indexed, sock_dir) as client, pytest.raises(IndexUnavailable, match="run `clawmem index`"):
        client.search("sqlite")
    assert files_of(indexed.index_path) == before


def test_errors_are_clawmems_and_the_same_with_a_daemon(indexed: Settings, workspace: Path, tmp_path: Path,
                                                       sock_dir: Path) -> None:
    def failures(client: Client) -> list[tuple[type, str]]:
        seen = []
        for ask in (lambda: client.get("../etc/passwd"), lambda: client.get("memory/nope.md"),
                    lambda: client.search("   "), lambda: client.search("x", max_results=0),
                    lambda: client.search("x", mode="psychic"), lambda: client.context("x", budget=-1),
                    lambda: client.search("x", since="yesterday"), lambda: client.get("MEMORY.md", lines=0)):
            with pytest.raises((PathError, QueryError)) as caught:
                ask()
            seen.append((type(caught.value), str(caught.value)))
        return seen

    with offline(indexed, sock_dir) as client:
        alone = failures(client)
    settings = daemon_settings(workspace, tmp_path, sock_dir, index=str(indexed.index_path))
    with running_daemon(settings) as daemon:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        with Client(workspace, index=indexed.index_path, socket=settings.socket_path, provider="none") as client:
            served = failures(client)
            client.status()
            assert client.served_by == "daemon"
    assert served == alone
    assert [cls for cls, _ in alone] == [PathError, PathError, *[QueryError] * 6]


def test_with_a_daemon_it_asks_the_daemon(indexed: Settings, workspace: Path, tmp_path: Path, sock_dir: Path) -> None:
    settings = daemon_settings(workspace, tmp_path, sock_dir, index=str(indexed.index_path))
    with offline(indexed, sock_dir) as client:
        alone = client.search("ocelot", mode="bm25")
    # Alone, the client's pending count is bounded in time and may say it is a lower bound on a loaded
    # machine; the daemon's watcher knows it exactly. Everything else is the same answer.
    alone["index"].pop("pending_files_complete", None)
    with running_daemon(settings) as daemon:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        with Client(workspace, socket=settings.socket_path) as client:
            assert client.search("ocelot", mode="bm25") == alone
            assert client.status()["daemon"]["socket"] == str(settings.socket_path)
            assert client.served_by == "daemon" and client.daemon_differs is None


def test_a_daemon_serving_another_index_or_provider_than_asked_is_not_asked(
        indexed: Settings, workspace: Path, tmp_path: Path, sock_dir: Path) -> None:
    """Its answer would be about its own settings, silently: the client answers from what was asked for, and says so."""
    settings = daemon_settings(workspace, tmp_path, sock_dir, index=str(indexed.index_path))
    with running_daemon(settings) as daemon:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        with Client(workspace, index=tmp_path / "elsewhere.sqlite", socket=settings.socket_path,
                    provider="none") as client:
            with pytest.raises(IndexUnavailable, match="no index"):
                client.search("ocelot", mode="bm25")
            assert client.served_by is None
            assert f"its index is {indexed.index_path}" in str(client.daemon_differs)
        with Client(workspace, index=indexed.index_path, socket=settings.socket_path, provider="openai") as client:
            status = client.status()
            assert client.served_by == "index" and "daemon" not in status
            assert status["configured_provider"] == "unavailable" and not status["fresh"]
            assert "it uses provider none, not openai" in str(client.daemon_differs)
        with Client(workspace, index=indexed.index_path, socket=settings.socket_path, provider="none") as client:
            client.status()
            assert client.served_by == "daemon" and client.daemon_differs is None  # asked for what it serves
    assert not (tmp_path / "elsewhere.sqlite").exists()


@pytest.mark.parametrize("answer", [
    b'{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"too many connections: try again later"}}\n',
    None,
], ids=["busy", "hangs-up"])
def test_a_daemon_that_turns_it_away_is_answered_in_process(indexed: Settings, sock_dir: Path,
                                                            answer: bytes | None) -> None:
    listener, thread = refusing_daemon(sock_dir / "busy.sock", answer)
    try:
        with Client(indexed.workspace, index=indexed.index_path, socket=sock_dir / "busy.sock",
                    provider="none") as client:
            assert client.search("ocelot", mode="bm25")["results"][0]["path"] == "memory/2026-11-22.md"
            assert client.served_by == "index"
            assert client.get("MEMORY.md", lines=1)["text"] == "# Memory"
    finally:
        listener.close()
        thread.join(5)


def test_a_daemon_started_later_is_found(indexed: Settings, workspace: Path, tmp_path: Path, sock_dir: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "DAEMON_RETRY", 0.0)
    settings = daemon_settings(workspace, tmp_path, sock_dir, index=str(indexed.index_path))
    with Client(workspace, index=indexed.index_path, socket=settings.socket_path, provider="none") as client:
        client.status()
        assert client.served_by == "index"
        with running_daemon(settings) as daemon:
            wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
            client.status()
            assert client.served_by == "daemon"
        assert client.search("ocelot", mode="bm25")["results"], "the daemon gone: the index answers again"
        assert client.served_by == "index"


def test_settings_come_from_the_workspace_config_and_environment_like_the_cli(
        indexed: Settings, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (workspace / "clawmem.toml").write_text(f'index = "{indexed.index_path}"\n[embedding]\nprovider = "none"\n')
    monkeypatch.setenv("CLAWMEM_WORKSPACE", str(workspace))
    with Client() as client:
        assert client.workspace == workspace.resolve() and client.index_path == indexed.index_path
        assert client.search("ocelot", mode="bm25")["results"]
    elsewhere = tmp_path / "other.toml"
    elsewhere.write_text('socket = "/nonexistent/s.sock"\n')
    with Client(workspace, config=elsewhere) as client:
        assert client.socket_path == Path("/nonexistent/s.sock")
    monkeypatch.chdir(workspace)
    monkeypatch.delenv("CLAWMEM_WORKSPACE")
    assert Client().workspace == workspace.resolve()
    with pytest.raises(ConfigError, match="does not exist"):
        Client(tmp_path / "typo")
    with pytest.raises(ConfigError, match="embedding.provider"):
        Client(workspace, provider="skynet")


def test_no_index_yet_is_index_unavailable(workspace: Path, tmp_path: Path, sock_dir: Path) -> None:
    with Client(workspace, index=tmp_path / "none.sqlite", socket=sock_dir / "s.sock", provider="none") as client:
        with pytest.raises(IndexUnavailable, match="no index"):
            client.search("anything")
        assert client.status()["index_exists"] is False


def test_the_signature_is_plain_python() -> None:
    for name in ("__init__", "search", "get", "status", "context", "close"):
        signature = str(inspect.signature(getattr(Client, name)))
        assert "Settings" not in signature and "SearchRequest" not in signature and "MemoryIndex" not in signature
    assert clawmem_index.Client is Client
    assert "Client" in clawmem_index.__all__


def test_import_clawmem_stays_light() -> None:
    probe = ("import sys, clawmem_index\n"
             "print(sorted(m for m in ('clawmem_index.api', 'clawmem_index.engine.core', 'apsw', 'tiktoken')"
             " if m in sys.modules))\n"
             "from clawmem_index import Client\n"
             "print(sorted(m for m in ('clawmem_index.engine.core', 'apsw', 'tiktoken') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True,
                         env={**os.environ})
    assert out.stdout.splitlines() == ["[]", "[]"]


def test_the_answers_are_json(indexed: Settings, sock_dir: Path) -> None:
    with offline(indexed, sock_dir) as client:
        for answer in (client.search("sqlite"), client.get("MEMORY.md"), client.status(), client.context("sqlite")):
            assert json.loads(json.dumps(answer)) == answer


def test_explain_goes_through_the_daemon_and_is_checked(indexed: Settings, workspace: Path, tmp_path: Path,
                                                        sock_dir: Path) -> None:
    from daemon_helpers import RawClient

    settings = daemon_settings(workspace, tmp_path, sock_dir, index=str(indexed.index_path))
    with running_daemon(settings) as daemon:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        with Client(workspace, socket=settings.socket_path) as client:
            found = client.search("ocelot", mode="bm25", explain=True)
            assert client.served_by == "daemon" and found["results"][0]["explain"]["keyword_rank"] == 1
            assert "explain" not in client.search("ocelot", mode="bm25")["results"][0]
        with RawClient(settings.socket_path) as raw:
            refused = raw.call("search", {"query": "ocelot", "explain": "yes"})
            assert refused["error"]["code"] == -32602 and "explain" in refused["error"]["message"]


def test_coverage_notes_say_what_an_answer_does_not_cover_yet() -> None:
    from clawmem_index.api import coverage_notes

    assert coverage_notes({"mode": "hybrid", "index": {"pending_files": 0, "pending_embeddings": 0}}) == []
    assert coverage_notes({"mode": "hybrid", "index": {"pending_files": 3, "pending_files_complete": False,
                                                       "pending_embeddings": 76}}) == [
        "at least 3 file(s) changed since the last sync: not in this answer yet",
        "76 chunk(s) wait for a vector: meaning search does not cover them yet (keyword search does)"]
    assert coverage_notes({"mode": "vector", "index": {"pending_embeddings": 2}}) == [
        "2 chunk(s) wait for a vector: meaning search does not cover them yet"]
    assert coverage_notes({"mode": "bm25", "index": {"pending_embeddings": 2}}) == []  # keywords asked: all there


@pytest.mark.slow
def test_a_program_whose_query_vector_missed_its_deadline_exits_0(workspace: Path, tmp_path: Path,
                                                                 local_model: Path) -> None:
    """Without a daemon the local model runs in the program: it crashed in exit() (139) under the decode of a
    query vector past its deadline, about 2 runs in 5 (see test_cli for why this deadline and query)."""
    (workspace / "MEMORY.md").write_text("# Memory\n\n- The staging server is kiln; deploys go through zephyr.\n")
    env = {**os.environ, "CLAWMEM_PROVIDER": "local", "CLAWMEM_LOCAL_MODEL": str(local_model),
           "CLAWMEM_INDEX": str(tmp_path / "index.sqlite")}
    subprocess.run([sys.executable, "-m", "clawmem_index", "index", "-w", str(workspace)], env=env, check=True,
                   capture_output=True, timeout=120)
    config = tmp_path / "clawmem.toml"
    config.write_text("[search]\nquery_timeout = 0.1\n")
    program = ("import json, sys\n"
               "from clawmem_index import Client\n"
               "with Client(sys.argv[1], config=sys.argv[2]) as memory:\n"
               "    answer = memory.search('staging server deploy zephyr ' * 3000)\n"
               "print(json.dumps([answer.get('warning', ''), [r['path'] for r in answer['results']]]))\n")
    for _ in range(6):
        out = subprocess.run([sys.executable, "-c", program, str(workspace), str(config)], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        warning, paths = json.loads(out.stdout)
        assert "did not answer within 0.1 s" in warning and paths == ["MEMORY.md"]
