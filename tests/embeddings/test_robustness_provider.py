"""Providers that hang, are down, or cannot start: indexing and answering go on, and say why.

The provider is the real `openai` SDK talking to a server on 127.0.0.1 that accepts each request
and never answers (a hung provider), or to a port nobody listens on (a provider that is down).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import BOUND, RawClient, daemon_settings, running_daemon, short_dir, wait_until
from fake_http import FakeServer, Reply, fake_server, no_proxy, openai_reply

from clawmem_index.cli.reading import freshness_code
from clawmem_index.config import Settings, load_settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.search.ranking import SearchRequest

__all__ = ["fake_server", "no_proxy"]

pytestmark = [pytest.mark.usefixtures("no_proxy"), pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")]

QUERY_TIMEOUT = 0.5
SDK_TIMEOUT = 60.0  # far beyond every bound below: only the deadlines can explain a prompt answer


@pytest.fixture
def hung(fake_server: FakeServer) -> FakeServer:
    """Reads each request, never replies (until the test ends)."""
    fake_server.default = lambda request: Reply(delay=3600)
    return fake_server


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


def openai_settings(url: str, **more: Any) -> dict[str, Any]:
    return {"embedding.provider": "openai", "embedding.base_url": f"{url}/v1", "embedding.api_key": "sk-test",
            "embedding.dimensions": 8, "embedding.timeout": SDK_TIMEOUT, "embedding.max_retries": 0,
            "search.query_timeout": QUERY_TIMEOUT,
            **more}


def notes(workspace: Path) -> None:
    (workspace / "MEMORY.md").write_text("# Memory\nWe deploy to the staging server on Fridays.\n")
    (workspace / "memory" / "2026-11-20.md").write_text("# Log\nThe wombat ate the cables.\n")


def test_a_search_answers_keyword_only_once_the_query_deadline_passes(workspace: Path, tmp_path: Path,
                                                                       fake_server: FakeServer) -> None:
    notes(workspace)
    fake_server.default = openai_reply
    settings = load_settings(workspace=workspace, overrides={"index": str(tmp_path / "i.sqlite"),
                                                             **openai_settings(fake_server.url)})
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.embedded == 2, report
    fake_server.default = lambda request: Reply(delay=3600)  # from now on the provider hangs
    started = time.monotonic()
    answer = index.search(SearchRequest("staging server", min_score=0.0))
    elapsed = time.monotonic() - started
    assert elapsed < SDK_TIMEOUT / 4, "the search waited on the provider instead of its deadline"
    assert answer["results"][0]["path"] == "MEMORY.md" and answer["mode"] == "bm25"
    assert "did not answer within 0.5 s" in str(answer["warning"])
    # Both query slots are now held by hung calls: the next search does not wait at all.
    index.search(SearchRequest("wombat"))
    answer = index.search(SearchRequest("wombat"))
    assert "has not answered earlier queries" in str(answer["warning"])
    index.close()


def test_the_daemon_keeps_indexing_and_answering_while_its_provider_hangs(workspace: Path, tmp_path: Path,
                                                                          sock_dir: Path, hung: FakeServer) -> None:
    notes(workspace)
    settings = daemon_settings(workspace, tmp_path, sock_dir, **openai_settings(hung.url))
    with running_daemon(settings) as daemon:
        wait_until(lambda: daemon.embedder.state()["running"] and len(hung.requests) >= 1,
                   message="the embedding pass to hang on the provider")
        (workspace / "memory" / "2026-11-22.md").write_text("# Today\nThe quokka escaped again.\n")
        with RawClient(settings.socket_path, timeout=BOUND) as client:
            wait_until(lambda: client.call("search", {"query": "quokka", "mode": "bm25"})["result"]["results"],
                       message="the new note, keyword-searchable while the provider hangs")
        # Hybrid searches wait on the hung provider (until their deadline); keyword searches and
        # status on other connections must not queue behind them.
        answers: list[dict[str, Any]] = []

        def hybrid() -> None:
            with RawClient(settings.socket_path, timeout=BOUND) as c:
                answers.append(c.call("search", {"query": "quokka"}))

        waiting = [threading.Thread(target=hybrid) for _ in range(12)]
        for thread in waiting:
            thread.start()
        with RawClient(settings.socket_path, timeout=BOUND) as client:
            for _ in range(5):
                assert client.call("search", {"query": "wombat", "mode": "bm25"})["result"]["results"]
                status = client.call("status")["result"]
                assert status["fresh"] is False and status["pending_embeddings"] >= 3
        for thread in waiting:
            thread.join(BOUND)
        assert len(answers) == 12
        assert all(a["result"]["results"] and "warning" in a["result"] for a in answers)


def test_a_model_of_unknown_size_indexes_keywords_while_its_provider_is_down(workspace: Path, tmp_path: Path,
                                                                              fake_server: FakeServer) -> None:
    """No probe request is needed to build: vectors follow when the provider answers, their size learned then."""
    notes(workspace)
    fake_server.default = lambda request: Reply(status=503, json={"error": {"message": "overloaded"}})
    config = tmp_path / "clawmem.toml"
    config.write_text('[embedding]\nprovider = "openai"\nmodel = "nomic-embed-text"\n'
                      f'base_url = "{fake_server.url}/v1"\n'
                      'api_key = "sk-test"\nmax_retries = 0\n')

    def clawmem(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_")}
        return subprocess.run([sys.executable, "-m", "clawmem_index", *args, "--workspace", str(workspace), "--config",
                               str(config), "--index", str(tmp_path / "i.sqlite")], capture_output=True, text=True,
                              env=env, timeout=120, check=False)

    out = clawmem("index")
    assert out.returncode == 0, out.stderr
    assert "2 chunks wait for a vector" in out.stderr and "HTTP 503" in out.stderr
    out = clawmem("search", "--json", "--mode", "bm25", "wombat")
    assert json.loads(out.stdout)["results"][0]["path"] == "memory/2026-11-20.md"
    status = json.loads(clawmem("status", "--json").stdout)
    assert status["fresh"] is False and status["pending_embeddings"] == 2 and status["dims"] == 0
    fake_server.default = functools.partial(openai_reply, dims=12)  # the provider is back
    out = clawmem("index")
    assert out.returncode == 0, out.stderr
    assert "0 added" in out.stderr and "2 embedded" in out.stderr  # the same index, completed
    status = json.loads(clawmem("status", "--json").stdout)
    assert status["pending_embeddings"] == 0 and status["dims"] == 12 and status["fresh"] is True


def test_a_named_provider_that_cannot_start_stops_index_and_serve_and_keeps_the_vector_index(
        workspace: Path, tmp_path: Path, fake_server: FakeServer, sock_dir: Path) -> None:
    notes(workspace)
    fake_server.default = openai_reply
    index_path = tmp_path / "i.sqlite"
    built = MemoryIndex(load_settings(workspace=workspace, overrides={
        "index": str(index_path), **openai_settings(fake_server.url)}))
    built.sync()
    assert built.status()["provider"] == "openai" and built.status()["pending_embeddings"] == 0
    built.close()

    base = {k: v for k, v in os.environ.items() if not k.startswith("CLAWMEM_")}
    env = {**base, "CLAWMEM_PROVIDER": "openai", "CLAWMEM_INDEX": str(index_path), "CLAWMEM_WORKSPACE": str(workspace)}

    def clawmem(*args: str, **more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "clawmem_index", *args], capture_output=True, text=True,
                              env={**env, **more}, timeout=120, check=False)

    out = clawmem("index")
    assert out.returncode == 1 and "'openai' cannot start" in out.stderr and "OPENAI_API_KEY" in out.stderr
    out = clawmem("serve", "--socket", str(sock_dir / "s.sock"))
    assert out.returncode == 1 and "OPENAI_API_KEY" in out.stderr
    status = json.loads(clawmem("status", "--json").stdout)
    assert status["provider"] == "openai" and status["chunks_indexed"] == 2  # the vector index is untouched
    assert status["fresh"] is False and any("OPENAI_API_KEY" in r for r in status["stale_reasons"])

    out = clawmem("index", CLAWMEM_FALLBACK="none")
    assert out.returncode == 0, out.stderr
    answer = json.loads(clawmem("search", "--json", "wombat", CLAWMEM_FALLBACK="none").stdout)
    assert answer["fallback"] is True and "OPENAI_API_KEY" in answer["fallback_reason"]
    assert answer["results"][0]["path"] == "memory/2026-11-20.md"


def test_a_five_megabyte_line_is_indexed_searchable_and_readable(workspace: Path, settings: Settings) -> None:
    words = ("alpha bravo charlie delta echo foxtrot golf hotel " * 110_000)[:5_000_000]
    (workspace / "memory" / "dump.md").write_text(words + " zebracorn\n")
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.added == 1 and report.chunks_added > 1000
    hit = index.search(SearchRequest("zebracorn", mode="bm25"))["results"][0]
    assert (hit["path"], hit["start_line"], hit["end_line"]) == ("memory/dump.md", 1, 1)
    got = index.get("memory/dump.md")
    assert got["truncated"] is True and len(str(got["text"]).encode()) <= 256 * 1024
    index.close()


def test_answers_missing_vectors_say_the_provider_refused_the_key_until_it_answers(
        workspace: Path, tmp_path: Path, fake_server: FakeServer) -> None:
    """A refused key makes no vector ever: an answer must say so, not that vectors are 'still being made'; once the
    provider answers and the vectors are made, the reason is gone. The same through a daemon's socket."""
    notes(workspace)
    refused = {"error": {"message": "Incorrect API key provided: sk-t****", "type": "invalid_request_error"}}
    fake_server.default = lambda request: Reply(status=401, json=refused)
    settings = load_settings(workspace=workspace, overrides={"index": str(tmp_path / "i.sqlite"),
                                                             **openai_settings(fake_server.url)})
    index = MemoryIndex(settings)
    report = index.sync()
    assert report.embedded == 0 and "401" in str(report.embed_error)
    answer = index.search(SearchRequest("staging server", min_score=0.0))
    assert answer["mode"] == "bm25" and "401" in str(answer["embedding_error"])
    assert "the embedding provider failed" in str(answer["warning"]) and "still being made" not in answer["warning"]
    assert "embedding_error" not in index.search(SearchRequest("staging server", mode="bm25"))  # keywords asked
    status = index.status()
    assert "401" in status["embedding_error"] and any("embedding failed" in r for r in status["stale_reasons"])
    assert freshness_code(status) == 5  # cannot catch up by itself: as a daemon's `status --check` says
    index.close()

    fake_server.default = openai_reply  # the key is fixed
    index = MemoryIndex(settings)
    assert index.sync().embedded == 2
    answer = index.search(SearchRequest("staging server", min_score=0.0))
    assert "embedding_error" not in answer and "warning" not in answer
    assert "embedding_error" not in index.status() and freshness_code(index.status()) == 0
    index.close()


def test_a_daemons_answers_say_why_vectors_are_missing(workspace: Path, tmp_path: Path, sock_dir: Path,
                                                      fake_server: FakeServer) -> None:
    notes(workspace)
    fake_server.default = lambda request: Reply(status=401, json={"error": {"message": "Incorrect API key"}})
    settings = daemon_settings(workspace, tmp_path, sock_dir, **openai_settings(fake_server.url))
    with running_daemon(settings) as daemon:
        wait_until(lambda: daemon.embedder.state()["last_error"], message="the embedding pass to fail")
        with RawClient(settings.socket_path, timeout=BOUND) as client:
            answer = client.call("search", {"query": "wombat"})["result"]
        assert "401" in answer["embedding_error"] and "the embedding provider failed" in answer["warning"]


def test_sigterm_ends_the_daemon_while_searches_wait_on_a_hung_provider(workspace: Path, tmp_path: Path, sock_dir: Path,
                                                                        fake_server: FakeServer) -> None:
    """The query threads wait (here up to 600 s) for a provider that never answers: SIGTERM still ends the daemon
    within its stop deadline, exit 0, instead of waiting for them (the index is only read by them)."""
    import signal

    from daemon_helpers import spawn_daemon, stop_process, wait_listening

    notes(workspace)
    fake_server.default = openai_reply
    (workspace / "clawmem.toml").write_text(
        f'[embedding]\nprovider = "openai"\nbase_url = "{fake_server.url}/v1"\napi_key = "sk-test"\ndimensions = 8\n'
        'max_retries = 0\n[search]\nquery_timeout = 600\nfirst_query_timeout = 600\n'
        '[daemon]\ndebounce = 0.05\nmax_delay = 0.5\nrescan_interval = 0\n')
    socket_path = sock_dir / "d.sock"
    proc = spawn_daemon(workspace, socket_path, tmp_path / "idx" / "index.sqlite",
                        env={"CLAWMEM_PROVIDER": "openai", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"})
    waiting: list[threading.Thread] = []
    try:
        wait_listening(socket_path, proc)
        with RawClient(socket_path, timeout=BOUND) as client:
            def made() -> bool:
                status = client.call("status")["result"]
                return status.get("chunks_indexed") == 2 and status.get("pending_embeddings") == 0
            wait_until(lambda: len(fake_server.requests) >= 1 and made(), timeout=BOUND, message="the vectors made")
        fake_server.default = lambda request: Reply(delay=3600)  # from now on the provider hangs
        asked = len(fake_server.requests)

        def search(query: str) -> None:
            # the daemon ends these connections as it stops: no answer, a closed connection
            with contextlib.suppress(OSError, AssertionError), RawClient(socket_path, timeout=BOUND) as c:
                c.call("search", {"query": query, "mode": "vector"})

        waiting = [threading.Thread(target=search, args=(q,), daemon=True) for q in ("wombat", "staging server")]
        for thread in waiting:
            thread.start()
        wait_until(lambda: len(fake_server.requests) >= asked + 2, timeout=BOUND,
                   message="both query vectors asked for")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0  # TimeoutExpired (a failure) when the daemon waits on its query threads
    finally:
        stop_process(proc)
        for thread in waiting:
            thread.join(BOUND)
