"""The socket client, and the CLI's use of it: same answers, same errors, same exit codes as in-process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from daemon_helpers import daemon_settings, refusing_daemon, running_daemon, short_dir, wait_until

from clawmem_index import errors
from clawmem_index.cli import cli
from clawmem_index.config import Settings, load_settings
from clawmem_index.errors import ClawmemError, IndexUnavailable, ProtocolError, QueryError
from clawmem_index.search.ranking import SearchRequest
from clawmem_index.service.client import DaemonClient, error_for, find_daemon
from clawmem_index.service.server import RpcServer, bind_unix_socket

pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")

@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


class ScriptedBackend:
    """Records what arrives and answers what the test scripts (or raises it)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.raise_next: Exception | None = None

    def _answer(self, name: str, args: Any, result: dict[str, object]) -> dict[str, object]:
        self.calls.append((name, args))
        if self.raise_next is not None:
            exc, self.raise_next = self.raise_next, None
            raise exc
        return result

    def search(self, request: SearchRequest) -> dict[str, object]:
        return self._answer("search", request, {"results": [], "provider": "none", "model": "", "mode": "bm25",
                                                "index": {"pending_files": 0, "pending_embeddings": 0}})

    def get(self, path: str, start: int | None, lines: int | None, max_bytes: int | None = None) -> dict[str, object]:
        return self._answer("get", (path, start, lines), {"path": path, "text": "t", "from": start or 1, "lines": 1})

    def context(self, request: SearchRequest, budget: int | None = None) -> dict[str, object]:
        return self._answer("context", (request, budget), {"text": "", "tokens": 0, "sections": []})

    def status(self) -> dict[str, object]:
        return self._answer("status", None, {"version": "x"})

    def sync(self, wait: bool) -> dict[str, object]:
        return self._answer("sync", wait, {"queued": True})

    def reindex(self, wait: bool) -> dict[str, object]:
        return self._answer("reindex", wait, {"queued": True})


@pytest.fixture
def scripted(sock_dir: Path) -> Iterator[tuple[ScriptedBackend, Path]]:
    backend = ScriptedBackend()
    path = sock_dir / "c.sock"
    server = RpcServer(backend, bind_unix_socket(path), path=path)
    server.start()
    yield backend, path
    server.close()


def test_methods_send_the_documented_params(scripted: tuple[ScriptedBackend, Path]) -> None:
    backend, path = scripted
    with DaemonClient(path) as client:
        client.search(SearchRequest("zebra", max_results=3, mode="bm25", source="memory", since="2026-01-01",
                                    before="2026-02-01"))
        client.search(SearchRequest("plain"))
        assert client.get("MEMORY.md", 2, 5)["from"] == 2
        client.get("MEMORY.md")
        assert client.status() == {"version": "x"}
        assert client.sync() == {"queued": True}
        client.reindex(wait=True)
    (_, full), (_, plain) = backend.calls[0], backend.calls[1]
    assert (full.query, full.max_results, full.mode, full.min_score) == ("zebra", 3, "bm25", None)
    assert (full.source, full.since, full.before) == ("memory", "2026-01-01", "2026-02-01")
    assert plain == SearchRequest("plain")
    assert backend.calls[2:] == [("get", ("MEMORY.md", 2, 5)), ("get", ("MEMORY.md", None, None)),
                                 ("status", None), ("sync", False), ("reindex", True)]


def test_search_and_context_send_every_field_of_the_request(scripted: tuple[ScriptedBackend, Path]) -> None:
    """explain, workspaces, repositories and `now` reach the daemon as asked (a search through a running daemon
    lost explain and workspaces, a context its workspaces)."""
    backend, path = scripted
    asked = SearchRequest("zebra", max_results=2, mode="hybrid", explain=True, workspaces=("alpha", "beta"),
                          now="2026-11-30", projects=("github.com/acme/app",))
    in_context = replace(asked, explain=False, projects=())  # what a context takes
    with DaemonClient(path) as client:
        client.search(asked)
        client.context(in_context, 120)
    assert backend.calls == [("search", asked), ("context", (in_context, 120))]


@pytest.mark.parametrize("raised", [
    errors.PathError("no such memory file: 'x.md'"),
    errors.QueryError("the query is empty"),
    errors.ConfigError("invalid setting 'x'"),
    errors.IndexUnavailable("no index yet"),
    errors.IndexBusy("another clawmem process is writing"),
    errors.ProviderError("provider down"),
    errors.RateLimited("429 after retries"),
    errors.AuthError("bad key"),
    errors.ProtocolError("bad request"),
])
def test_daemon_errors_come_back_as_the_same_class(scripted: tuple[ScriptedBackend, Path],
                                                   raised: ClawmemError) -> None:
    backend, path = scripted
    backend.raise_next = raised
    with DaemonClient(path) as client:
        with pytest.raises(type(raised)) as caught:
            client.status()
        assert type(caught.value) is type(raised)
        assert str(caught.value) == str(raised)
        assert caught.value.exit_code == raised.exit_code
        assert client.status() == {"version": "x"}  # the connection survives an error


@pytest.mark.parametrize("error, cls", [
    ({"code": -32602, "message": "invalid params"}, QueryError),
    ({"code": -32601, "message": "no such method"}, ProtocolError),
    ({"code": -32700, "message": "parse error"}, ProtocolError),
    ({"code": -32030, "message": "busy"}, IndexUnavailable),
    ({"code": -32011, "message": "path", "data": {"type": "NotOurs"}}, errors.PathError),
    ({"code": -32099, "message": "unknown"}, ClawmemError),
    ({"message": "no code"}, ClawmemError),
])
def test_error_codes_map_to_classes(error: dict[str, Any], cls: type[ClawmemError]) -> None:
    exc = error_for(error)
    assert type(exc) is cls and str(exc) == error["message"]


def test_nothing_listening_is_index_unavailable(sock_dir: Path) -> None:
    with pytest.raises(IndexUnavailable, match="no clawmem daemon is listening"):
        DaemonClient(sock_dir / "none.sock").status()
    stale = sock_dir / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(stale))
    dead.close()
    with pytest.raises(IndexUnavailable):
        DaemonClient(stale).connect()


def test_a_daemon_that_hangs_up_mid_call_is_index_unavailable(sock_dir: Path) -> None:
    path = sock_dir / "rude.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def hang_up() -> None:
        conn, _ = listener.accept()
        conn.recv(4096)
        conn.close()

    t = threading.Thread(target=hang_up)
    t.start()
    with pytest.raises(IndexUnavailable, match="closed the connection"):
        DaemonClient(path).status()
    t.join(5)
    listener.close()


def test_a_daemon_that_never_answers_times_out(sock_dir: Path) -> None:
    path = sock_dir / "mute.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    client = DaemonClient(path, timeout=0.2)
    try:
        with pytest.raises(IndexUnavailable, match="did not answer"):
            client.status()
    finally:
        client.close()
        listener.close()


def test_find_daemon(sock_dir: Path, tmp_path: Path, scripted: tuple[ScriptedBackend, Path]) -> None:
    _, live = scripted
    ws = tmp_path / "w"
    ws.mkdir()
    assert find_daemon(load_settings(workspace=ws, overrides={"socket": str(sock_dir / "absent.sock")})) is None
    client = find_daemon(load_settings(workspace=ws, overrides={"socket": str(live)}))
    assert client is not None
    with client:
        assert client.status() == {"version": "x"}


# -- the CLI through the daemon ---------------------------------------------------------------


@pytest.fixture
def live(workspace: Path, tmp_path: Path, sock_dir: Path) -> Iterator[Settings]:
    (workspace / "MEMORY.md").write_text("# Memory\nThe ocelot plan.\n")
    settings = daemon_settings(workspace, tmp_path, sock_dir)
    with running_daemon(settings) as daemon:
        wait_until(lambda: daemon.writer.counts["sync"] >= 1, message="the start-up sync")
        yield settings


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_cli_queries_go_to_the_daemon(live: Settings, tmp_path: Path) -> None:
    # The daemon's own provider named, no index named: the daemon answers (naming another is tested in test_api.py).
    flags = ["--workspace", str(live.workspace), "--socket", str(live.socket_path), "--provider", "none"]
    out = run_cli("search", *flags, "--json", "--mode", "bm25", "ocelot")
    assert out.exit_code == 0, out.output
    assert [r["path"] for r in json.loads(out.stdout)["results"]] == ["MEMORY.md"]
    out = run_cli("get", *flags, "MEMORY.md", "--lines", "1")
    assert (out.exit_code, out.stdout) == (0, "# Memory\n")
    out = run_cli("status", *flags, "--json")
    assert json.loads(out.stdout)["daemon"]["socket"] == str(live.socket_path)
    out = run_cli("get", *flags, "../secret.md")
    assert out.exit_code == 1 and "'..' is refused" in out.stderr
    assert not (tmp_path / "elsewhere.sqlite").exists()


def test_cli_index_asks_the_running_daemon(live: Settings) -> None:
    (live.workspace / "memory" / "x.md").write_text("# X\nserval\n")
    flags = ["--workspace", str(live.workspace), "--socket", str(live.socket_path), "--index", str(live.index_path)]
    out = run_cli("index", *flags)
    assert out.exit_code == 0 and "the daemon synced the index" in out.stderr
    out = run_cli("reindex", *flags)
    assert out.exit_code == 0 and "the daemon rebuilt the index" in out.stderr
    out = run_cli("search", *flags, "--json", "--mode", "bm25", "serval")
    assert json.loads(out.stdout)["results"][0]["path"] == "memory/x.md"


def test_cli_falls_back_to_the_index_when_no_daemon_answers(workspace: Path, tmp_path: Path, sock_dir: Path) -> None:
    (workspace / "MEMORY.md").write_text("# Memory\nThe margay plan.\n")
    stale = sock_dir / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(stale))
    dead.close()
    flags = ["--workspace", str(workspace), "--socket", str(stale), "--index", str(tmp_path / "i.sqlite"),
             "--provider", "none"]
    assert run_cli("index", *flags).exit_code == 0
    out = run_cli("search", *flags, "--json", "--mode", "bm25", "margay")
    assert out.exit_code == 0 and json.loads(out.stdout)["results"][0]["path"] == "MEMORY.md"
    assert "daemon" not in json.loads(run_cli("status", *flags, "--json").stdout)


def test_cli_search_through_the_daemon_starts_light(live: Settings) -> None:
    """`clawmem search` must not pay for the daemon's modules (structlog, watchdog) when it is a client."""
    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print(sorted(m for m in ('structlog', 'watchdog', 'clawmem_index.engine.core')"
             " if m in sys.modules), file=sys.stderr))\n"
             "from clawmem_index.cli import main\nmain()\n")
    out = subprocess.run([sys.executable, "-c", probe, "search", "--workspace", str(live.workspace), "--socket",
                          str(live.socket_path), "--json", "--mode", "bm25", "ocelot"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "CLAWMEM_PROVIDER": "none"},
                         check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["results"]
    assert out.stderr.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("answer", [
    b'{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"too many connections: try again later"}}\n',
    None,
], ids=["busy", "hangs-up"])
def test_cli_answers_in_process_when_the_daemon_turns_it_away(workspace: Path, tmp_path: Path, sock_dir: Path,
                                                              answer: bytes | None) -> None:
    (workspace / "MEMORY.md").write_text("# Memory\nThe jaguarundi plan.\n")
    flags = ["--workspace", str(workspace), "--socket", str(sock_dir / "busy.sock"),
             "--index", str(tmp_path / "i.sqlite"), "--provider", "none"]
    assert run_cli("index", *flags).exit_code == 0  # before the socket exists: in-process
    listener, thread = refusing_daemon(sock_dir / "busy.sock", answer)
    try:
        out = run_cli("search", *flags, "--json", "--mode", "bm25", "jaguarundi")
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["results"][0]["path"] == "MEMORY.md"
        out = run_cli("get", *flags, "MEMORY.md", "--lines", "1")
        assert (out.exit_code, out.stdout) == (0, "# Memory\n")
        out = run_cli("status", *flags, "--json")
        assert out.exit_code == 0 and json.loads(out.stdout)["files_indexed"] == 1
    finally:
        listener.close()
        thread.join(5)


def test_the_busy_code_is_its_own_class() -> None:
    error = error_for({"code": -32001, "message": "too many connections"})
    assert isinstance(error, errors.ServerBusy) and error.exit_code == 3


def test_a_non_utf8_argument_through_the_daemon_is_a_clean_answer(live: Settings) -> None:
    """A shell passes undecodable bytes through; they must not become a traceback."""
    args = [sys.executable, "-m", "clawmem_index", "search", "--workspace", str(live.workspace), "--socket",
            str(live.socket_path), "--json", "--mode", "bm25"]
    out = subprocess.run([*args, b"ocelot\xff"], capture_output=True, timeout=60, check=False,
                         env={**os.environ, "CLAWMEM_PROVIDER": "none"})
    assert out.returncode == 0, out.stderr
    assert b"Traceback" not in out.stderr
    assert json.loads(out.stdout)["results"][0]["path"] == "MEMORY.md"
    out = subprocess.run([sys.executable, "-m", "clawmem_index", "get", "--workspace", str(live.workspace), "--socket",
                          str(live.socket_path), b"memory/nope\xff.md"], capture_output=True, timeout=60, check=False,
                         env={**os.environ, "CLAWMEM_PROVIDER": "none"})
    assert out.returncode == 1 and b"Traceback" not in out.stderr
    assert b"no such memory file: 'memory/nope\\xff.md'" in out.stderr


class GatedBackend(ScriptedBackend):
    """A search answers only once `n` searches are being answered at once (else it fails after a while)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.gate = threading.Barrier(n, timeout=10)

    def search(self, request: SearchRequest) -> dict[str, object]:
        self.gate.wait()
        return super().search(request)


def test_calls_from_many_threads_each_have_a_connection(sock_dir: Path) -> None:
    """`clawmem mcp`'s tool threads share a client: four calls at once are four requests at once at the daemon, not
    four in a row on one connection; past max_connections a call waits for one."""
    backend = GatedBackend(4)
    path = sock_dir / "g.sock"
    server = RpcServer(backend, bind_unix_socket(path), path=path)
    server.start()
    client = DaemonClient(path, timeout=20)
    try:
        answers: list[Any] = []
        threads = [threading.Thread(target=lambda q=q: answers.append(client.search(SearchRequest(q))))
                   for q in "abcd"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(answers) == 4 and all(a["mode"] == "bm25" for a in answers)
        assert sorted(call[1].query for call in backend.calls) == list("abcd")
        few = DaemonClient(path, timeout=20, max_connections=2)
        backend.gate = threading.Barrier(2, timeout=10)
        threads = [threading.Thread(target=lambda q=q: answers.append(few.search(SearchRequest(q)))) for q in "efgh"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(answers) == 8 and few._open <= 2
        few.close()
    finally:
        client.close()
        server.close()


def test_an_idle_connection_the_daemon_closed_meanwhile_is_replaced_not_reported(sock_dir: Path) -> None:
    """The daemon closes an idle connection at its idle limit or to make room: the next call goes on a new one."""
    path = sock_dir / "once.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)
    listener.settimeout(10)

    def answer_once_each() -> None:
        for _ in range(3):
            conn, _ = listener.accept()
            with conn, conn.makefile("rwb") as f:
                request = json.loads(f.readline())
                f.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {"n": request["id"]}}).encode()
                        + b"\n")
                f.flush()

    server = threading.Thread(target=answer_once_each, daemon=True)
    server.start()
    client = DaemonClient(path, timeout=10)
    try:
        assert [client.status()["n"] for _ in range(3)] == [1, 2, 3]
    finally:
        client.close()
        server.join(10)
        listener.close()
