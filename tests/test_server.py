"""The socket API: JSON-RPC 2.0 framing and validation (no sockets), then the real Unix socket server."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from daemon_helpers import RawClient, RecordingLog, short_dir, wait_until

from clawmem.config import Settings
from clawmem.engine import MemoryIndex
from clawmem.errors import ConfigError
from clawmem.search import SearchRequest
from clawmem.server import Dispatcher, RpcServer, bind_unix_socket


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


class IndexBackend:
    """The engine behind the socket, with sync/reindex run inline (the daemon queues them instead)."""

    def __init__(self, index: MemoryIndex) -> None:
        self.index = index
        self.syncs = 0

    def search(self, request: SearchRequest) -> dict[str, object]:
        return self.index.search(request)

    def get(self, path: str, start: int | None, lines: int | None) -> dict[str, object]:
        return self.index.get(path, start, lines)

    def status(self) -> dict[str, object]:
        return self.index.status()

    def sync(self, wait: bool) -> dict[str, object]:
        self.syncs += 1
        return {"report": self.index.sync().as_dict()} if wait else {"queued": True}

    def reindex(self, wait: bool) -> dict[str, object]:
        return {"report": self.index.reindex().as_dict()} if wait else {"queued": True}


@pytest.fixture
def index(settings: Settings, write: Any) -> Iterator[MemoryIndex]:
    write("MEMORY.md", "# Long-term\nWe chose SQLite for the index.\n")
    write("memory/2026-01-02.md", "# Jan 2\nThe zebra project started.\nLine three.\nLine four.\n")
    memory = MemoryIndex(settings)
    memory.sync()
    yield memory
    memory.close()


@pytest.fixture
def backend(index: MemoryIndex) -> IndexBackend:
    return IndexBackend(index)


@pytest.fixture
def dispatcher(backend: IndexBackend) -> Dispatcher:
    return Dispatcher(backend, log=RecordingLog())


def ask(dispatcher: Dispatcher, message: Any) -> Any:
    raw = message if isinstance(message, bytes) else json.dumps(message).encode()
    answer = dispatcher.handle(raw)
    return None if answer is None else json.loads(answer)


def req(method: str, params: Any = None, rid: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        message["params"] = params
    return message


# -- the protocol, without sockets ------------------------------------------------------------


def test_search_get_status_answers(dispatcher: Dispatcher) -> None:
    answer = ask(dispatcher, req("search", {"query": "zebra", "mode": "bm25", "min_score": 0}, rid="a"))
    assert answer["jsonrpc"] == "2.0" and answer["id"] == "a"
    result = answer["result"]
    assert [r["path"] for r in result["results"]] == ["memory/2026-01-02.md"]
    assert set(result) >= {"results", "provider", "model", "mode", "index"}
    got = ask(dispatcher, req("get", {"path": "memory/2026-01-02.md", "from": 2, "lines": 2}))["result"]
    assert got == {"path": "memory/2026-01-02.md", "text": "The zebra project started.\nLine three.", "from": 2,
                   "lines": 2}
    status = ask(dispatcher, req("status"))["result"]
    assert status["files_indexed"] == 2


@pytest.mark.parametrize("line, code", [
    (b"not json", -32700),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "status"', -32700),
    (b"\xff\xfe{}", -32700),
    (b"[" * 100_000 + b"]" * 100_000, -32700),
    (b"42", -32600),
    (b'"status"', -32600),
    (b"[]", -32600),
    (b'{"id": 1, "method": "status"}', -32600),
    (b'{"jsonrpc": "1.0", "id": 1, "method": "status"}', -32600),
    (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "status"}', -32600),
    (b'{"jsonrpc": "2.0", "id": true, "method": "status"}', -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": 7}', -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "drop_tables"}', -32601),
])
def test_malformed_requests_get_their_error_codes(dispatcher: Dispatcher, line: bytes, code: int) -> None:
    answer = ask(dispatcher, line)
    assert answer["error"]["code"] == code
    assert answer["error"]["message"]
    assert "result" not in answer


def test_the_id_is_echoed_when_it_can_be(dispatcher: Dispatcher) -> None:
    assert ask(dispatcher, b'{"jsonrpc": "1.0", "id": 9, "method": "status"}')["id"] == 9
    assert ask(dispatcher, req("nope", rid="x"))["id"] == "x"
    assert ask(dispatcher, b"{oops")["id"] is None


@pytest.mark.parametrize("method, params, fragment", [
    ("search", {}, "needs 'query'"),
    ("search", {"query": 5}, "'query' must be a string"),
    ("search", {"query": "x", "max_results": "5"}, "'max_results' must be an integer"),
    ("search", {"query": "x", "max_results": True}, "'max_results' must be an integer"),
    ("search", {"query": "x", "max_results": 2.5}, "'max_results' must be an integer"),
    ("search", {"query": "x", "max_results": 0}, "between 1 and 1000"),
    ("search", {"query": "x", "max_results": 1001}, "between 1 and 1000"),
    ("search", {"query": "x", "min_score": "high"}, "'min_score' must be a number"),
    ("search", {"query": "x", "min_score": 1.5}, "between 0 and 1"),
    ("search", {"query": "x", "mode": "fuzzy"}, "'mode' must be one of"),
    ("search", {"query": "x", "mode": 1}, "'mode' must be a string"),
    ("search", {"query": "x", "path_prefix": ["memory"]}, "'path_prefix' must be a string"),
    ("search", {"query": "x", "max_result": 3}, "unknown parameter 'max_result'"),
    ("search", ["zebra"], "named parameters"),
    ("search", "zebra", "named parameters"),
    ("get", {}, "needs 'path'"),
    ("get", {"path": "MEMORY.md", "from": "2"}, "'from' must be an integer"),
    ("get", {"path": "MEMORY.md", "from": 0}, "'from' must be >= 1"),
    ("get", {"path": "MEMORY.md", "lines": -3}, "'lines' must be >= 1"),
    ("status", {"verbose": True}, "unknown parameter 'verbose'"),
    ("sync", {"wait": "yes"}, "'wait' must be true or false"),
    ("reindex", {"wait": 1}, "'wait' must be true or false"),
])
def test_wrong_params_are_invalid_params(dispatcher: Dispatcher, backend: IndexBackend, method: str, params: Any,
                                         fragment: str) -> None:
    answer = ask(dispatcher, req(method, params))
    assert answer["error"]["code"] == -32602, answer
    assert fragment in answer["error"]["message"]
    assert backend.syncs == 0


def test_nan_min_score_is_invalid(dispatcher: Dispatcher) -> None:
    answer = ask(dispatcher, b'{"jsonrpc": "2.0", "id": 1, "method": "search", "params": {"query": "x", "min_score": NaN}}')
    assert answer["error"]["code"] == -32602


def test_null_optional_params_mean_the_default(dispatcher: Dispatcher) -> None:
    answer = ask(dispatcher, req("search", {"query": "zebra", "max_results": None, "mode": None, "min_score": 0}))
    assert answer["result"]["results"]


@pytest.mark.parametrize("params, code, kind", [
    ({"path": "../etc/passwd"}, -32011, "PathError"),
    ({"path": "/etc/passwd"}, -32011, "PathError"),
    ({"path": "memory/missing.md"}, -32011, "PathError"),
    ({"path": "notes.txt"}, -32011, "PathError"),
])
def test_refused_paths_carry_the_error_class_code(dispatcher: Dispatcher, params: Any, code: int, kind: str) -> None:
    error = ask(dispatcher, req("get", params))["error"]
    assert (error["code"], error["data"]["type"]) == (code, kind)
    assert params["path"] in error["message"] or "missing" in error["message"]


def test_an_empty_query_is_a_query_error(dispatcher: Dispatcher) -> None:
    error = ask(dispatcher, req("search", {"query": "   "}))["error"]
    assert (error["code"], error["data"]["type"]) == (-32012, "QueryError")


def test_notifications_are_run_but_not_answered(dispatcher: Dispatcher, backend: IndexBackend) -> None:
    assert dispatcher.handle(b'{"jsonrpc": "2.0", "method": "sync", "params": {"wait": false}}') is None
    assert backend.syncs == 1
    assert dispatcher.handle(b'{"jsonrpc": "2.0", "method": "get", "params": {"path": "../x"}}') is None


def test_batches(dispatcher: Dispatcher) -> None:
    answer = ask(dispatcher, [req("status", rid=1), {"jsonrpc": "2.0", "method": "status"}, req("nope", rid=2), 5])
    assert [a.get("id") for a in answer] == [1, 2, None]
    assert "result" in answer[0] and answer[1]["error"]["code"] == -32601 and answer[2]["error"]["code"] == -32600
    assert dispatcher.handle(b'[{"jsonrpc": "2.0", "method": "status"}]') is None


def test_unexpected_failures_are_internal_errors(index: MemoryIndex) -> None:
    class Broken(IndexBackend):
        def status(self) -> dict[str, object]:
            raise RuntimeError("disk on fire")

    log = RecordingLog()
    answer = ask(Dispatcher(Broken(index), log=log), req("status"))
    assert answer["error"]["code"] == -32603
    assert "disk on fire" in answer["error"]["message"]
    assert log.events("request_failed")


# -- the socket -------------------------------------------------------------------------------


@pytest.fixture
def serve(backend: IndexBackend, sock_dir: Path) -> Iterator[Any]:
    servers: list[RpcServer] = []

    def start(**kwargs: Any) -> RpcServer:
        path = sock_dir / f"s{len(servers)}.sock"
        server = RpcServer(backend, bind_unix_socket(path), path=path, log=RecordingLog(), **kwargs)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def test_many_requests_on_one_connection(serve: Any) -> None:
    server = serve()
    with RawClient(server.path) as client:
        for i in range(50):
            assert client.call("search", {"query": "zebra", "min_score": 0})["result"]["results"]
            assert client.call("get", {"path": "MEMORY.md"})["result"]["lines"] == 2
        assert "result" in client.call("sync", {"wait": True})
        # Pipelined: several lines in one write, answered in order.
        client.send(b"".join(json.dumps(req("status", rid=i)).encode() + b"\n" for i in range(100, 105)))
        assert [client.line()["id"] for _ in range(5)] == list(range(100, 105))


def test_a_malformed_line_keeps_the_connection_usable(serve: Any) -> None:
    server = serve()
    with RawClient(server.path) as client:
        for bad, code in ((b"{nope\n", -32700), (b'{"jsonrpc":"2.0","id":1,"method":"x"}\n', -32601),
                          (b'{"jsonrpc":"2.0","id":2,"method":"search","params":{"query":1}}\n', -32602)):
            client.send(bad)
            assert client.line()["error"]["code"] == code
        client.send(b"\n   \n")  # blank lines are skipped
        assert client.call("status")["result"]["files_indexed"] == 2


def test_an_oversized_line_is_refused_and_that_connection_closed(serve: Any) -> None:
    server = serve()
    other = RawClient(server.path)
    client = RawClient(server.path)

    def flood() -> None:
        try:
            client.send(b'{"jsonrpc":"2.0","id":1,"method":"search","params":{"query":"' + b"a" * (2 << 20))
        except OSError:
            pass  # the server stops reading and closes: that is the point

    sender = threading.Thread(target=flood)
    sender.start()
    answer = client.line()
    assert answer["error"]["code"] == -32600
    assert "longer than 1048576 bytes" in answer["error"]["message"]
    assert client.line() is None  # then the connection is closed
    sender.join(10)
    client.close()
    assert other.call("status")["result"]  # everyone else is still served
    other.close()


def test_a_line_of_exactly_the_limit_is_accepted(backend: IndexBackend, sock_dir: Path) -> None:
    path = sock_dir / "l.sock"
    server = RpcServer(backend, bind_unix_socket(path), path=path, max_line=4096)
    server.start()
    try:
        line = json.dumps(req("status", rid="x" * (4096 - len(json.dumps(req("status", rid="")))))).encode()
        assert len(line) == 4096
        with RawClient(path) as client:
            client.send(line + b"\n")
            assert "result" in client.line()
    finally:
        server.close()


def test_idle_clients_time_out_and_the_server_keeps_serving(serve: Any) -> None:
    server = serve(idle_timeout=0.3)
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle.connect(str(server.path))
    idle.settimeout(5.0)
    started = time.monotonic()
    assert idle.recv(1) == b""  # the server hung up on us, with nothing sent
    assert 0.25 <= time.monotonic() - started < 3.0
    idle.close()
    with RawClient(server.path) as client:
        assert "result" in client.call("status")


def test_slow_clients_time_out_too(serve: Any) -> None:
    """A client trickling bytes without ever finishing its line is dropped like an idle one."""
    server = serve(idle_timeout=0.5)
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.connect(str(server.path))
    started = time.monotonic()

    def hung_up() -> bool:
        try:
            slow.sendall(b" ")
        except OSError:
            return True
        return False

    wait_until(hung_up, timeout=3.0, interval=0.05, message="the server to drop a client that never ends its line")
    assert time.monotonic() - started >= 0.45
    slow.close()


def test_a_last_line_without_newline_is_answered(serve: Any) -> None:
    server = serve()
    with RawClient(server.path) as client:
        client.send(json.dumps(req("status", rid=7)).encode())
        client.sock.shutdown(socket.SHUT_WR)
        assert client.line()["id"] == 7
        assert client.line() is None


def test_socket_is_0600_in_a_0700_directory_and_removed_on_close(backend: IndexBackend, sock_dir: Path) -> None:
    path = sock_dir / "run" / "clawmem" / "x.sock"
    server = RpcServer(backend, bind_unix_socket(path), path=path)
    server.start()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    server.close()
    assert not path.exists()


def test_a_stale_socket_file_is_replaced(backend: IndexBackend, sock_dir: Path) -> None:
    path = sock_dir / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays behind, as after a SIGKILL
    listener = bind_unix_socket(path)
    server = RpcServer(backend, listener, path=path)
    server.start()
    try:
        with RawClient(path) as client:
            assert "result" in client.call("status")
    finally:
        server.close()


def test_a_regular_file_at_the_socket_path_is_not_replaced(sock_dir: Path) -> None:
    path = sock_dir / "precious.sock"
    path.write_text("not a socket")
    with pytest.raises(ConfigError, match="not a socket"):
        bind_unix_socket(path)
    assert path.read_text() == "not a socket"


def test_a_too_long_socket_path_is_a_clear_error(sock_dir: Path) -> None:
    with pytest.raises(ConfigError, match="too long for a Unix socket"):
        bind_unix_socket(sock_dir / ("x" * 120) / "s.sock")


def test_too_many_connections_get_a_busy_error(serve: Any) -> None:
    server = serve(max_connections=2)
    first, second = RawClient(server.path), RawClient(server.path)
    try:
        assert "result" in first.call("status") and "result" in second.call("status")
        with RawClient(server.path) as third:
            answer = third.line()
            assert answer["error"]["code"] == -32001
            assert third.line() is None
    finally:
        first.close()
        second.close()


def test_searches_never_wait_for_a_writer(serve: Any, index: MemoryIndex, write: Any) -> None:
    """A long write transaction holds the database: queries on the socket still answer at once."""
    server = serve()
    writer = apsw.Connection(str(index.path))
    writer.set_busy_timeout(10_000)
    write("memory/new.md", "fresh words\n")
    with index.write_lock():
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT OR REPLACE INTO meta VALUES('busy', 'yes')")
        try:
            with RawClient(server.path) as client:
                started = time.monotonic()
                for _ in range(5):
                    assert client.call("search", {"query": "zebra", "min_score": 0})["result"]["results"]
                    assert "result" in client.call("status")
                assert time.monotonic() - started < 2.0
        finally:
            writer.execute("ROLLBACK")
            writer.close()


def test_read_connections_stay_bounded_however_many_clients_come_and_go(serve: Any, index: MemoryIndex) -> None:
    server = serve(workers=3)

    def open_index_fds() -> int:
        count = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                count += os.readlink(f"/proc/self/fd/{fd}") == str(index.path)
            except OSError:
                pass
        return count

    before = open_index_fds()
    for _ in range(40):
        with RawClient(server.path) as client:
            assert "result" in client.call("search", {"query": "zebra"})
    assert open_index_fds() - before <= 3


def test_concurrent_clients(serve: Any) -> None:
    server = serve()
    failures: list[str] = []

    def worker(n: int) -> None:
        try:
            with RawClient(server.path) as client:
                for i in range(40):
                    answer = client.call(*(("search", {"query": "zebra sqlite"}) if i % 2 else ("status", None)))
                    if "result" not in answer:
                        failures.append(repr(answer))
        except Exception as exc:
            failures.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
