"""The socket API: JSON-RPC 2.0 framing and validation (no sockets), then the real Unix socket server."""

from __future__ import annotations

import json
import math
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

from clawmem_index.config import Settings
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import ConfigError
from clawmem_index.search.ranking import SearchRequest
from clawmem_index.service.protocol import MAX_BATCH, Dispatcher
from clawmem_index.service.replies import MAX_REPLY_BYTES, MemoryBudget, encode_line
from clawmem_index.service.server import RpcServer, bind_unix_socket


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


@pytest.fixture(autouse=True)
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every exception that escapes a thread (it would print a raw traceback): none may."""
    seen: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(f"{args.thread}: {args.exc_value!r}"))
    yield seen
    assert seen == []


class IndexBackend:
    """The engine behind the socket, with sync/reindex run inline (the daemon queues them instead)."""

    def __init__(self, index: MemoryIndex) -> None:
        self.index = index
        self.syncs = 0

    def search(self, request: SearchRequest) -> dict[str, object]:
        return self.index.search(request)

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, object]:
        return self.index.get(path, start, lines, max_bytes)

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
                   "lines": 2, "truncated": False}
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


def test_nan_min_score_is_not_json(dispatcher: Dispatcher) -> None:
    """NaN is refused at parse, so no value anywhere in a request can be NaN."""
    answer = ask(dispatcher, b'{"jsonrpc": "2.0", "id": 1, "method": "search",'
                             b' "params": {"query": "x", "min_score": NaN}}')
    assert answer["error"]["code"] == -32700
    assert answer["id"] is None


def test_null_optional_params_mean_the_default(dispatcher: Dispatcher) -> None:
    answer = ask(dispatcher, req("search", {"query": "zebra", "max_results": None, "mode": None, "min_score": 0}))
    assert answer["result"]["results"]


@pytest.mark.parametrize("params, code, kind, missing", [
    ({"path": "../etc/passwd"}, -32011, "PathError", False),
    ({"path": "/etc/passwd"}, -32011, "PathError", False),
    ({"path": "memory/missing.md"}, -32011, "PathError", True),
    ({"path": "notes.txt"}, -32011, "PathError", False),
])
def test_refused_paths_carry_the_error_class_code(dispatcher: Dispatcher, params: Any, code: int, kind: str,
                                                  missing: bool) -> None:
    """`data.missing` tells a file that is not there from one refused, without parsing the message."""
    error = ask(dispatcher, req("get", params))["error"]
    assert (error["code"], error["data"]["type"]) == (code, kind)
    assert error["data"].get("missing", False) is missing
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
        for _ in range(50):
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


# -- hardening: a fake backend, so the tests measure the socket layer only ---------------------


def strict(raw: bytes) -> Any:
    """Parse an answer line as strict JSON (NaN and Infinity are not JSON)."""
    def refuse(name: str) -> None:
        raise AssertionError(f"the answer holds {name}, which is not JSON: {raw[:200]!r}")

    assert raw.endswith(b"\n") and raw.count(b"\n") == 1, raw[:200]
    return json.loads(raw, parse_constant=refuse)


class FakeBackend:
    """Answers from memory. `get` returns `size` (else max_bytes, else 1000) copies of `fill`;
    `status` waits while `gate` is clear and returns `status_result`."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fill = "x"
        self.size: int | None = None
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = 0
        self.status_result: object = {"ok": True}
        self.fail_with: BaseException | None = None
        self._lock = threading.Lock()

    def search(self, request: SearchRequest) -> dict[str, object]:
        self.calls.append(("search", request.query))
        return {"results": []}

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, object]:
        self.calls.append(("get", path, start, lines, max_bytes))
        size = self.size if self.size is not None else (max_bytes or 1000)
        return {"path": path, "text": self.fill * size, "from": start or 1, "lines": 1, "truncated": False}

    def status(self) -> object:
        self.calls.append(("status",))
        with self._lock:
            self.waiting += 1
        try:
            self.gate.wait(10)
        finally:
            with self._lock:
                self.waiting -= 1
        if self.fail_with is not None:
            raise self.fail_with
        return self.status_result

    def sync(self, wait: bool) -> dict[str, object]:
        self.calls.append(("sync", wait))
        return {"queued": True}

    def reindex(self, wait: bool) -> dict[str, object]:
        self.calls.append(("reindex", wait))
        return {"queued": True}


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def fake_dispatcher(fake: FakeBackend) -> Dispatcher:
    return Dispatcher(fake, log=RecordingLog())


def raw_ask(dispatcher: Dispatcher, line: bytes) -> Any:
    answer = dispatcher.handle(line)
    return None if answer is None else strict(answer)


def get_batch(n: int, max_bytes: int) -> bytes:
    return json.dumps([req("get", {"path": "MEMORY.md", "max_bytes": max_bytes}, rid=i) for i in range(n)]).encode()


def test_get_passes_max_bytes_on(fake_dispatcher: Dispatcher, fake: FakeBackend) -> None:
    got = ask(fake_dispatcher, req("get", {"path": "MEMORY.md", "from": 2, "lines": 3, "max_bytes": 10}))["result"]
    assert got["text"] == "x" * 10
    assert ask(fake_dispatcher, req("get", {"path": "MEMORY.md"}))["result"]["from"] == 1
    assert fake.calls == [("get", "MEMORY.md", 2, 3, 10), ("get", "MEMORY.md", None, None, None)]


@pytest.mark.parametrize("max_bytes, fragment", [
    (0, "between 1 and 524288"),
    (-5, "between 1 and 524288"),
    (524289, "between 1 and 524288"),
    ("10", "must be an integer"),
    (10.0, "must be an integer"),
    (True, "must be an integer"),
])
def test_get_max_bytes_out_of_range_is_invalid_params(fake_dispatcher: Dispatcher, fake: FakeBackend,
                                                      max_bytes: Any, fragment: str) -> None:
    error = ask(fake_dispatcher, req("get", {"path": "MEMORY.md", "max_bytes": max_bytes}))["error"]
    assert error["code"] == -32602 and fragment in error["message"]
    assert fake.calls == []


def test_get_max_bytes_at_its_limit_is_accepted(fake_dispatcher: Dispatcher, fake: FakeBackend) -> None:
    fake.size = 10
    assert "result" in ask(fake_dispatcher, req("get", {"path": "MEMORY.md", "max_bytes": 512 << 10}))
    assert fake.calls == [("get", "MEMORY.md", None, None, 512 << 10)]


BIG = b"9" * 5000  # over Python's 4,300-digit limit for int(): json.loads raises a plain ValueError


@pytest.mark.parametrize("line", [
    b'{"jsonrpc": "2.0", "id": NaN, "method": "status"}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "search", "params": {"query": "x", "min_score": Infinity}}',
    b'{"jsonrpc": "2.0", "id": -Infinity, "method": "status"}',
    b"NaN",
    b'{"jsonrpc": "2.0", "id": 1e999, "method": "status"}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "search", "params": {"query": "x", "min_score": -1e999}}',
    b'{"jsonrpc": "2.0", "id": ' + BIG + b', "method": "status"}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "get", "params": {"path": "MEMORY.md", "from": ' + BIG + b"}}",
    b"[" + BIG + b"]",
    b'{"jsonrpc": "2.0", "id": 1, "method": "status", "params": {"x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}",
    b'{"jsonrpc": "2.0", "id": 1, "method": "status"}\xed\xa0\x80',
    b"\xef\xbb\xbf{}",
    b"",
])
def test_what_json_cannot_carry_is_a_parse_error(fake_dispatcher: Dispatcher, fake: FakeBackend, line: bytes) -> None:
    answer = raw_ask(fake_dispatcher, line)
    assert answer["error"]["code"] == -32700, answer
    assert answer["id"] is None
    assert fake.calls == []


@pytest.mark.parametrize("line, code, rid", [
    (rb'{"jsonrpc": "2.0", "id": "\ud800", "method": "status"}', -32600, None),
    (rb'{"jsonrpc": "2.0", "id": "ok\udfff", "method": "status"}', -32600, None),
    (rb'{"jsonrpc": "2.0", "id": 3, "method": "search", "params": {"query": "\ud800"}}', -32602, 3),
    (rb'{"jsonrpc": "2.0", "id": 3, "method": "search", "params": {"query": "x", "\udc00": 1}}', -32602, 3),
    (rb'{"jsonrpc": "2.0", "id": 3, "method": "search", "params": {"query": "x", "e": [{"k": ["\ud800"]}]}}',
     -32602, 3),
    (rb'{"jsonrpc": "2.0", "id": 3, "method": "get", "params": {"path": "memory/\udfff.md"}}', -32602, 3),
])
def test_lone_surrogates_are_refused_before_anything_runs(fake_dispatcher: Dispatcher, fake: FakeBackend,
                                                          line: bytes, code: int, rid: Any) -> None:
    answer = raw_ask(fake_dispatcher, line)
    assert (answer["error"]["code"], answer["id"]) == (code, rid)
    assert fake.calls == []


def test_a_surrogate_pair_is_ordinary_text(fake_dispatcher: Dispatcher, fake: FakeBackend) -> None:
    answer = raw_ask(fake_dispatcher, rb'{"jsonrpc": "2.0", "id": "\ud83d\ude00", "method": "search",'
                                      rb' "params": {"query": "\ud83d\ude00"}}')
    assert answer["id"] == "\U0001f600" and "result" in answer
    assert fake.calls == [("search", "\U0001f600")]


@pytest.mark.parametrize("params", [
    {"path": "MEMORY.md", "from": 1 << 63},
    {"path": "MEMORY.md", "lines": 10**4000},
    {"path": "MEMORY.md", "from": 1, "lines": (1 << 64) + 1},
])
def test_integers_beyond_64_bits_are_invalid_params(fake_dispatcher: Dispatcher, fake: FakeBackend,
                                                    params: dict[str, Any]) -> None:
    error = ask(fake_dispatcher, req("get", params))["error"]
    assert error["code"] == -32602 and "out of range" in error["message"]
    assert fake.calls == []


@pytest.mark.parametrize("params", [
    {"query": "x", "max_results": -(1 << 63) - 1},
    {"query": "x", "max_results": 10**4000},
    {"query": "x", "min_score": 10**400},
    {"query": "x", "min_score": -(10**4000)},
])
def test_huge_search_numbers_are_invalid_params(fake_dispatcher: Dispatcher, fake: FakeBackend,
                                                params: dict[str, Any]) -> None:
    assert ask(fake_dispatcher, req("search", params))["error"]["code"] == -32602
    assert fake.calls == []


def test_the_largest_64_bit_integer_reaches_the_backend(fake_dispatcher: Dispatcher, fake: FakeBackend) -> None:
    assert "result" in ask(fake_dispatcher, req("get", {"path": "MEMORY.md", "from": (1 << 63) - 1}))
    assert fake.calls[0][2] == (1 << 63) - 1


@pytest.mark.parametrize("result", [{"score": math.nan}, {"score": math.inf}, {"text": "\ud800"}, {"raw": b"x"},
                                    {"ids": {1, 2}}])
def test_an_answer_that_cannot_be_encoded_is_an_internal_error(fake: FakeBackend, result: object) -> None:
    log = RecordingLog()
    fake.status_result = result
    answer = raw_ask(Dispatcher(fake, log=log), json.dumps(req("status", rid="s")).encode())
    assert (answer["id"], answer["error"]["code"]) == ("s", -32603)
    assert log.events("answer_not_encodable")


def test_encode_never_raises() -> None:
    for unencodable in (math.nan, {"x": "\udc80"}, b"bytes", object()):
        line = encode_line(unencodable)
        assert strict(line)["error"]["code"] == -32603 and strict(line)["id"] is None


def test_an_exception_that_cannot_describe_itself_is_still_answered(fake: FakeBackend) -> None:
    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("cannot even describe myself")

    fake.fail_with = Nasty()
    answer = raw_ask(Dispatcher(fake, log=RecordingLog()), json.dumps(req("status", rid=5)).encode())
    assert (answer["id"], answer["error"]["code"]) == (5, -32603)
    assert "Nasty" in answer["error"]["message"]


def test_handle_never_raises(fake_dispatcher: Dispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("a bug in the dispatcher itself")

    monkeypatch.setattr(fake_dispatcher, "_build", broken)
    answer = raw_ask(fake_dispatcher, json.dumps(req("status")).encode())
    assert (answer["id"], answer["error"]["code"]) == (None, -32603)
    assert fake_dispatcher._log.events("dispatch_failed")


def test_a_batch_holds_at_most_64_requests(fake_dispatcher: Dispatcher, fake: FakeBackend) -> None:
    answers = raw_ask(fake_dispatcher, json.dumps([req("status", rid=i) for i in range(MAX_BATCH)]).encode())
    assert [a["id"] for a in answers] == list(range(MAX_BATCH))
    fake.calls.clear()
    answer = raw_ask(fake_dispatcher, json.dumps([req("status", rid=i) for i in range(MAX_BATCH + 1)]).encode())
    assert answer["error"] == {"code": -32600, "message": "invalid request: batch too large (at most 64 requests)"}
    assert answer["id"] is None and fake.calls == []


def test_a_batch_stops_running_once_its_reply_is_full(fake_dispatcher: Dispatcher, fake: FakeBackend) -> None:
    entries = [req("get", {"path": "MEMORY.md", "max_bytes": 100_000}, rid=i) for i in range(63)]
    entries.append({"jsonrpc": "2.0", "method": "sync"})  # a notification after the cut: not run either
    line = fake_dispatcher.handle(json.dumps(entries).encode())
    assert line is not None and len(line) <= MAX_REPLY_BYTES
    answers = strict(line)
    assert [a["id"] for a in answers] == list(range(63))
    served = [a for a in answers if "result" in a]
    refused = answers[len(served):]
    assert 30 < len(served) < 63 and all("result" not in a for a in refused)
    assert {a["error"]["code"] for a in refused} == {-32002}
    assert "ask for less" in refused[0]["error"]["message"] and "max_bytes" in refused[0]["error"]["message"]
    assert len(fake.calls) == len(served) + 1  # the answer that did not fit was made, the rest never ran
    assert ("sync", False) not in fake.calls


def test_a_batch_of_long_ids_still_fits_its_refusals(fake_dispatcher: Dispatcher) -> None:
    entries = [req("get", {"path": "MEMORY.md", "max_bytes": 200_000}, rid="i" * 10_000 + str(i)) for i in range(60)]
    line = fake_dispatcher.handle(json.dumps(entries).encode())
    assert line is not None and len(line) <= MAX_REPLY_BYTES
    assert [a["id"] for a in strict(line)] == [e["id"] for e in entries]


def test_a_single_answer_over_the_cap_is_replaced(fake_dispatcher: Dispatcher, fake: FakeBackend) -> None:
    fake.fill, fake.size = '"', 4 << 20  # each quote is escaped: 4 MiB of text makes an 8 MiB answer
    answer = raw_ask(fake_dispatcher, json.dumps(req("get", {"path": "MEMORY.md"},
                                                     rid="big")).encode())
    assert (answer["id"], answer["error"]["code"]) == ("big", -32002)


def test_the_reply_budget_replaces_what_does_not_fit(fake_dispatcher: Dispatcher) -> None:
    budget = MemoryBudget(150_000, free=0)
    reply = fake_dispatcher.answer(json.dumps(req("get", {"path": "MEMORY.md", "max_bytes": 200_000},
                                                  rid=7)).encode(), budget)
    assert reply is not None
    answer = strict(reply.data())
    assert (answer["id"], answer["error"]["code"]) == (7, -32001)
    assert answer["error"]["message"] == "server busy: too many large replies being sent, try again"
    reply.release()
    assert budget.held == 0
    reply = fake_dispatcher.answer(get_batch(3, 60_000), budget)
    assert reply is not None
    assert [("result" in a, a["id"]) for a in strict(reply.data())] == [(True, 0), (True, 1), (False, 2)]
    assert budget.held == reply.size - 2  # all of it but the brackets, the short refusal too
    reply.release()
    assert budget.held == 0


def test_small_replies_are_not_counted_in_the_budget(fake_dispatcher: Dispatcher) -> None:
    budget = MemoryBudget(0)
    reply = fake_dispatcher.answer(json.dumps(req("status")).encode(), budget)
    assert reply is not None and "result" in strict(reply.data()) and budget.held == 0
    reply = fake_dispatcher.answer(json.dumps(req("get", {"path": "MEMORY.md", "max_bytes": 100_000})).encode(),
                                   budget)
    assert reply is not None and strict(reply.data())["error"]["code"] == -32001


def test_a_get_that_could_not_be_held_is_refused_before_it_reads_anything(fake_dispatcher: Dispatcher,
                                                                          fake: FakeBackend) -> None:
    budget = MemoryBudget(100_000, free=10_000)
    fake.size = 10  # the file is small, but the get may return up to max_bytes: that is what must fit
    reply = fake_dispatcher.answer(json.dumps(req("get", {"path": "MEMORY.md"})).encode(), budget)  # 256 KiB
    assert reply is not None and strict(reply.data())["error"]["code"] == -32001
    reply.release()
    assert fake.calls == [] and budget.held == 0
    reply = fake_dispatcher.answer(json.dumps(req("get", {"path": "MEMORY.md", "max_bytes": 50_000})).encode(),
                                   budget)
    assert reply is not None and "result" in strict(reply.data())
    assert budget.held == 0  # the advance was settled against the real (small) answer
    reply.release()
    assert len(fake.calls) == 1


def test_with_no_budget_at_all_one_short_line_says_busy(fake_dispatcher: Dispatcher) -> None:
    reply = fake_dispatcher.answer(json.dumps(req("status")).encode(), MemoryBudget(0, free=0))
    assert reply is not None
    assert strict(reply.data()) == {"jsonrpc": "2.0", "id": None, "error": {
        "code": -32001, "message": "server busy: too many large replies being sent, try again"}}


# -- hardening over a real socket ---------------------------------------------------------------


@pytest.fixture
def serve_fake(fake: FakeBackend, sock_dir: Path) -> Iterator[Any]:
    servers: list[RpcServer] = []

    def start(**kwargs: Any) -> RpcServer:
        path = sock_dir / f"f{len(servers)}.sock"
        server = RpcServer(fake, bind_unix_socket(path), path=path, log=RecordingLog(), **kwargs)
        server.start()
        servers.append(server)
        return server

    yield start
    fake.gate.set()
    for server in servers:
        server.close()


def raw_line(client: RawClient) -> Any:
    raw = client.file.readline()
    return strict(raw) if raw else None


def status_now(path: Path) -> bool:
    """One status call on a new connection; False when turned away (a -32001 line, or closed)."""
    with RawClient(path, timeout=5.0) as client:
        client.send(json.dumps(req("status", rid="probe")).encode() + b"\n")
        answer = raw_line(client)
    return answer is not None and "result" in answer


@pytest.mark.parametrize("line, code", [
    (b'{"jsonrpc":"2.0","id":' + BIG + b',"method":"status"}', -32700),
    (b'{"jsonrpc":"2.0","id":NaN,"method":"status"}', -32700),
    (b'{"jsonrpc":"2.0","id":1,"method":"search","params":{"query":"x","min_score":Infinity}}', -32700),
    (b'{"jsonrpc":"2.0","id":-Infinity,"method":"status"}', -32700),
    (b'{"jsonrpc":"2.0","id":1e400,"method":"status"}', -32700),
    (b"[" * 200_000, -32700),
    (b"\xff\xfe\x00{", -32700),
    (rb'{"jsonrpc":"2.0","id":"\udbff","method":"status"}', -32600),
    (rb'{"jsonrpc":"2.0","id":1,"method":"search","params":{"query":"\udbff"}}', -32602),
    (rb'{"jsonrpc":"2.0","id":1,"method":"search","params":{"query":"x","\udbff":{}}}', -32602),
    (b'{"jsonrpc":"2.0","id":1,"method":"get","params":{"path":"MEMORY.md","lines":' + b"9" * 4000 + b"}}", -32602),
    (b'{"jsonrpc":"2.0","id":1,"method":"get","params":{"path":"MEMORY.md","max_bytes":0}}', -32602),
    (json.dumps([req("status", rid=i) for i in range(65)]).encode(), -32600),
])
def test_malformed_lines_on_a_socket_get_an_error_and_the_connection_stays_usable(
        serve_fake: Any, line: bytes, code: int) -> None:
    server = serve_fake()
    with RawClient(server.path) as client:
        client.send(line + b"\n")
        answer = raw_line(client)
        assert answer["error"]["code"] == code, answer
        client.send(json.dumps(req("status", rid="after")).encode() + b"\n")
        assert raw_line(client) == {"jsonrpc": "2.0", "id": "after", "result": {"ok": True}}


def test_an_unencodable_answer_on_a_socket_is_an_internal_error(serve_fake: Any, fake: FakeBackend) -> None:
    server = serve_fake()
    fake.status_result = {"score": math.nan}
    with RawClient(server.path) as client:
        client.send(json.dumps(req("status", rid=4)).encode() + b"\n")
        assert raw_line(client)["error"]["code"] == -32603
        fake.status_result = {"ok": True}
        assert client.call("status")["result"] == {"ok": True}


def test_a_connection_thread_never_lets_an_exception_escape(serve_fake: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    server = serve_fake()
    answer = server.dispatcher.answer

    def explode(line: bytes, budget: Any = None) -> Any:
        if b"boom" in line:
            raise RuntimeError("a bug in the socket layer")
        return answer(line, budget)

    monkeypatch.setattr(server.dispatcher, "answer", explode)
    with RawClient(server.path) as client:
        client.send(json.dumps(req("status", rid="boom")).encode() + b"\n")
        assert client.line() is None  # that connection ends...
    wait_until(lambda: server._log.events("connection_failed"), message="the failure to be logged")
    assert status_now(server.path)  # ...and everyone else is served; thread_errors checks the hook


def test_at_the_cap_the_longest_idle_connection_is_evicted(serve_fake: Any, fake: FakeBackend) -> None:
    server = serve_fake(max_connections=3)
    oldest, idle, busy = RawClient(server.path), RawClient(server.path), RawClient(server.path)
    try:
        # A reply reaches the client before the server marks the connection idle again: wait for
        # that mark each time, or `idle` could look idle for longer than `oldest`.
        assert "result" in oldest.call("get", {"path": "MEMORY.md"})
        wait_until(lambda: server.served == 1, message="the first get to be done with")
        assert "result" in idle.call("get", {"path": "MEMORY.md"})
        wait_until(lambda: server.served == 2, message="the second get to be done with")
        fake.gate.clear()
        busy.send(json.dumps(req("status", rid="slow")).encode() + b"\n")
        wait_until(lambda: fake.waiting == 1, message="the busy request to reach the backend")
        with RawClient(server.path) as newcomer:
            assert "result" in newcomer.call("get", {"path": "MEMORY.md"})
            notice = raw_line(oldest)
            assert (notice["id"], notice["error"]["code"]) == (None, -32001)
            assert "idle" in notice["error"]["message"]
            assert raw_line(oldest) is None
            assert "result" in idle.call("get", {"path": "MEMORY.md"})
            fake.gate.set()
            assert raw_line(busy)["id"] == "slow"
        evicted = server._log.events("connection_evicted")
        assert len(evicted) == 1 and evicted[0]["reason"] == "idle"
    finally:
        for client in (oldest, idle, busy):
            client.close()


def test_when_every_connection_is_busy_a_newcomer_is_refused(serve_fake: Any, fake: FakeBackend) -> None:
    """Replaces the old cap test: idle connections are evicted now, so both must be handling a request."""
    server = serve_fake(max_connections=2)
    first, second = RawClient(server.path), RawClient(server.path)
    try:
        fake.gate.clear()
        for n, client in enumerate((first, second)):
            client.send(json.dumps(req("status", rid=n)).encode() + b"\n")
        wait_until(lambda: fake.waiting == 2, message="both requests to reach the backend")
        with RawClient(server.path) as third:
            answer = raw_line(third)
            assert (answer["id"], answer["error"]["code"]) == (None, -32001)
            assert raw_line(third) is None
        fake.gate.set()
        assert raw_line(first)["id"] == 0 and raw_line(second)["id"] == 1
        assert server._log.events("connection_evicted") == []
    finally:
        first.close()
        second.close()


def test_at_the_cap_a_reply_nobody_reads_gives_up_its_slot(serve_fake: Any, fake: FakeBackend,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("clawmem_index.service.server.STALLED_SEND", 0.2)
    server = serve_fake(max_connections=1)
    fake.size = 4_000_000  # more than any socket buffer holds
    with RawClient(server.path) as stuck:
        stuck.send(json.dumps(req("get", {"path": "MEMORY.md"})).encode() + b"\n")
        wait_until(lambda: server.budget.held > 0, message="the large reply to be built")
        wait_until(lambda: status_now(server.path), timeout=10, message="a newcomer to be served")
        evicted = server._log.events("connection_evicted")
        assert [e["reason"] for e in evicted] == ["stalled_reply"] and evicted[0]["seconds"] >= 0.2
        wait_until(lambda: server.budget.held == 0, message="the dropped reply to be released")


def read_to_eof(sock: socket.socket) -> bytes:
    data = bytearray()
    sock.settimeout(10)
    while chunk := sock.recv(1 << 20):
        data += chunk
    return bytes(data)


def test_a_slow_reader_is_dropped_after_the_send_timeout_while_others_are_served(serve_fake: Any,
                                                                                fake: FakeBackend) -> None:
    server = serve_fake(send_timeout=0.5)
    fake.size = 4_000_000  # more than any socket buffer holds
    with RawClient(server.path) as other, RawClient(server.path) as slow:
        started = time.monotonic()
        slow.send(json.dumps(req("get", {"path": "MEMORY.md"})).encode() + b"\n")
        wait_until(lambda: server.budget.held > 0, message="the large reply to be built")
        calls = 0

        def dropped() -> bool:
            nonlocal calls
            assert other.call("status")["result"] == {"ok": True}
            calls += 1
            return bool(server._log.events("slow_reader_dropped"))

        wait_until(dropped, timeout=10, interval=0.05, message="the slow reader to be dropped")
        assert time.monotonic() - started >= 0.45 and calls >= 2
        received = read_to_eof(slow.sock)
        assert len(received) < 4_000_000 and not received.endswith(b"\n")  # the reply was dropped
        wait_until(lambda: server.budget.held == 0 and server.connection_count() == 1,
                   message="the slow connection to be gone")
        assert other.call("status")["result"] == {"ok": True}


def test_unfinished_lines_count_in_the_memory_budget(serve_fake: Any) -> None:
    """Clients each holding most of a 1 MiB line cannot pin unbounded memory between them."""
    server = serve_fake(memory_budget=200_000)
    part = b'{"jsonrpc":"2.0","id":1,"method":"status","params":{"pad":"' + b"x" * 150_000
    with RawClient(server.path) as first, RawClient(server.path) as second, RawClient(server.path) as third:
        first.send(part)
        held = len(part) - server.budget.free
        wait_until(lambda: server.budget.held == held, message="the first line to be held")
        second.send(part)
        wait_until(lambda: server.budget.held == 2 * held, message="the second line to be held")
        third.send(part)  # no room left for a third: told so, and its connection ends
        assert raw_line(third)["error"]["code"] == -32001
        assert read_to_eof(third.sock) == b""
        assert server._log.events("input_over_budget")
        assert status_now(server.path)  # everyone else is still served
        first.send(b'"}}\n')  # the first line completes: an answer, and its bytes are given back
        assert raw_line(first)["error"]["code"] == -32602
        wait_until(lambda: server.budget.held == held, message="the first line's bytes given back")
    wait_until(lambda: server.budget.held == 0, message="every held byte given back")


def test_the_send_timeout_is_never_longer_than_the_idle_timeout(serve_fake: Any, fake: FakeBackend) -> None:
    server = serve_fake(idle_timeout=0.5)
    assert server.send_timeout == 30.0
    fake.size = 4_000_000  # more than any socket buffer holds
    with RawClient(server.path) as slow:
        slow.send(json.dumps(req("get", {"path": "MEMORY.md"})).encode() + b"\n")
        wait_until(lambda: server._log.events("slow_reader_dropped"), timeout=5, message="the slow reader dropped")
        assert server._log.events("slow_reader_dropped")[0]["send_timeout"] == 0.5


def test_the_reply_budget_turns_large_replies_away_while_small_ones_go_out(serve_fake: Any, fake: FakeBackend) -> None:
    server = serve_fake(memory_budget=4 << 20)
    fake.size = 3_000_000
    large = json.dumps(req("get", {"path": "MEMORY.md"}, rid="large")).encode() + b"\n"
    with RawClient(server.path) as hog, RawClient(server.path) as second:
        hog.send(large)  # and never read
        wait_until(lambda: server.budget.held > 2_000_000, message="the first large reply to hold the budget")
        second.send(large)
        answer = raw_line(second)
        assert (answer["id"], answer["error"]["code"]) == ("large", -32001)
        assert answer["error"]["message"] == "server busy: too many large replies being sent, try again"
        assert status_now(server.path)  # small answers are not held back
        hog.close()
        wait_until(lambda: server.budget.held == 0, message="the first reply's budget to be released")
        second.send(large)
        assert len(raw_line(second)["result"]["text"]) == 3_000_000
    wait_until(lambda: server.budget.held == 0, message="every reply to be released")


def test_a_batch_reply_is_capped_on_a_socket(serve_fake: Any) -> None:
    server = serve_fake()
    with RawClient(server.path) as client:
        client.send(get_batch(MAX_BATCH, 100_000) + b"\n")
        raw = client.file.readline()
        assert len(raw) <= MAX_REPLY_BYTES
        answers = strict(raw)
        assert [a["id"] for a in answers] == list(range(MAX_BATCH))
        assert answers[-1]["error"]["code"] == -32002
        assert client.call("status")["result"] == {"ok": True}
    wait_until(lambda: server.budget.held == 0, message="the reply to be released")


class Stoppable(FakeBackend):
    """A search that runs `runs_for` seconds unless the server asks the backend to interrupt its thread meanwhile."""

    runs_for = 20.0

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.interrupted: list[int] = []
        self.search_thread = 0
        self._running: tuple[int, threading.Event] | None = None

    def search(self, request: SearchRequest) -> dict[str, object]:
        stop = threading.Event()
        with self._lock:
            self.search_thread = threading.get_ident()
            self._running = (self.search_thread, stop)
        self.started.set()
        stopped = stop.wait(self.runs_for)
        with self._lock:
            self._running = None
        return {"results": [], "interrupted": stopped}

    def interrupt(self, thread: int) -> None:
        with self._lock:
            self.interrupted.append(thread)
            if self._running is not None and self._running[0] == thread:
                self._running[1].set()


def test_a_query_whose_client_hangs_up_is_interrupted_and_one_that_half_closes_is_answered(sock_dir: Path) -> None:
    """Abandoned work stops: a client that closes its end while its search runs gets the backend asked to end that
    search's statement, on the thread running it. A client that only half-closes (socat, `nc -N`: done writing,
    still reading) is no client gone: it gets its answer."""
    backend = Stoppable()
    path = sock_dir / "s.sock"
    server = RpcServer(backend, bind_unix_socket(path), path=path)
    server.start()
    try:
        gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        gone.connect(str(path))
        gone.sendall(b'{"jsonrpc":"2.0","id":1,"method":"search","params":{"query":"x"}}\n')
        assert backend.started.wait(10)
        gone.close()
        wait_until(lambda: backend.interrupted, message="the backend asked to interrupt the abandoned search")
        assert set(backend.interrupted) == {backend.search_thread}

        backend.started.clear()
        backend.runs_for = 0.5  # ten times the server's look at the client: long enough to be taken for gone
        half = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        half.connect(str(path))
        half.sendall(b'{"jsonrpc":"2.0","id":2,"method":"search","params":{"query":"y"}}\n')
        half.shutdown(socket.SHUT_WR)
        half.settimeout(10)
        answer = json.loads(half.makefile("rb").readline())
        assert answer["id"] == 2 and answer["result"] == {"results": [], "interrupted": False}
        half.close()
    finally:
        backend.interrupt(backend.search_thread)
        server.close()
