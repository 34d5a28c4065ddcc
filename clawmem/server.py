"""The socket API (SPEC §7): newline-delimited JSON-RPC 2.0 on a Unix stream socket.

One request object per line, one response per line, many requests per connection, many
connections at once. Two layers, so the protocol can be tested without sockets:

- `Dispatcher` turns one line into one response line: framing rules of JSON-RPC 2.0 (parse error,
  invalid request, unknown method, invalid params, notifications, batches), parameter
  validation, and the mapping of `clawmem.errors` classes to their `rpc_code`.
- `RpcServer` owns the socket: an accept thread (woken by a pipe to stop, never by polling), a
  thread per connection reading with a bounded buffer (a line over 1 MiB is refused and the
  connection closed; memory stays bounded whatever the client sends) and an idle deadline, and a
  small fixed pool of query threads. Queries run on that pool so the number of SQLite read
  connections stays bounded however many clients come and go; each pool thread has its own read
  connection, so a search never waits for the writer thread.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import socket
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from clawmem.errors import ClawmemError, ConfigError, IndexUnavailable
from clawmem.search import SearchRequest

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_LINE",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "Backend",
    "Dispatcher",
    "RpcServer",
    "bind_unix_socket",
    "ensure_private_dir",
]

MAX_LINE = 1 << 20
MAX_CONNECTIONS = 256
LINGER_SECONDS = 2.0
LINGER_BYTES = 16 << 20
UNIX_PATH_MAX = 107

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_BUSY = -32001

SEARCH_MODES = ("hybrid", "bm25", "vector")


class Backend(Protocol):
    """What the socket serves: the daemon (or, in tests, anything with these methods)."""

    def search(self, request: SearchRequest) -> dict[str, object]: ...

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, object]: ...

    def status(self) -> dict[str, object]: ...

    def sync(self, wait: bool) -> dict[str, object]: ...

    def reindex(self, wait: bool) -> dict[str, object]: ...


class RpcError(Exception):
    """A JSON-RPC error to send back as is."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


# -- parameters ------------------------------------------------------------------------------

# name -> (kind, required); kinds: "str", "int", "number", "bool"
PARAMS: dict[str, dict[str, tuple[str, bool]]] = {
    "search": {"query": ("str", True), "max_results": ("int", False), "min_score": ("number", False),
               "mode": ("str", False), "path_prefix": ("str", False)},
    "get": {"path": ("str", True), "from": ("int", False), "lines": ("int", False)},
    "status": {},
    "sync": {"wait": ("bool", False)},
    "reindex": {"wait": ("bool", False)},
}
# Methods answered on the query pool (bounded read connections); sync/reindex only wait on the writer.
POOLED = frozenset({"search", "get", "status"})

_KIND_NAMES = {"str": "a string", "int": "an integer", "number": "a number", "bool": "true or false"}


def validate_params(method: str, params: object) -> dict[str, Any]:
    """The request's params checked against the method's signature, or an RpcError(-32602) saying why."""
    spec = PARAMS[method]
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, f"invalid params: {method} takes named parameters (a JSON object)")
    unknown = sorted(set(params) - set(spec))
    if unknown:
        expected = ", ".join(spec) or "none"
        raise RpcError(INVALID_PARAMS, f"invalid params: unknown parameter {unknown[0]!r} for {method}"
                                       f" (expected: {expected})")
    clean: dict[str, Any] = {}
    for name, (kind, required) in spec.items():
        value = params.get(name)
        if value is None:
            if required:
                raise RpcError(INVALID_PARAMS, f"invalid params: {method} needs {name!r} ({_KIND_NAMES[kind]})")
            continue
        if not _is_kind(value, kind):
            raise RpcError(INVALID_PARAMS, f"invalid params: {name!r} must be {_KIND_NAMES[kind]},"
                                           f" not {type(value).__name__ if not isinstance(value, bool) else 'a boolean'}")
        clean[name] = value
    _check_ranges(method, clean)
    return clean


def _is_kind(value: object, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int)
    return isinstance(value, int | float) and math.isfinite(value)


def _check_ranges(method: str, p: dict[str, Any]) -> None:
    def bad(message: str) -> RpcError:
        return RpcError(INVALID_PARAMS, f"invalid params: {message}")

    if method == "search":
        if "max_results" in p and not 1 <= p["max_results"] <= 1000:
            raise bad("'max_results' must be between 1 and 1000")
        if "min_score" in p and not 0.0 <= p["min_score"] <= 1.0:
            raise bad("'min_score' must be between 0 and 1")
        if "mode" in p and p["mode"] not in SEARCH_MODES:
            raise bad(f"'mode' must be one of {', '.join(SEARCH_MODES)}")
    elif method == "get":
        for name in ("from", "lines"):
            if name in p and p[name] < 1:
                raise bad(f"{name!r} must be >= 1")


# -- the protocol ----------------------------------------------------------------------------


class Dispatcher:
    """One request line in, one response line (or None for notifications) out."""

    def __init__(self, backend: Backend, *, run_pooled: Callable[[Callable[[], Any]], Any] | None = None,
                 log: Any = None) -> None:
        self.backend = backend
        self._run_pooled = run_pooled or (lambda fn: fn())
        self._log = log

    def handle(self, line: bytes) -> bytes | None:
        try:
            message = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return _encode(_error(None, PARSE_ERROR, f"parse error: not valid JSON ({exc})"))
        except RecursionError:
            return _encode(_error(None, PARSE_ERROR, "parse error: JSON nested too deeply"))
        if isinstance(message, list):
            if not message:
                return _encode(_error(None, INVALID_REQUEST, "invalid request: empty batch"))
            answers = [a for a in (self._one(m) for m in message) if a is not None]
            return _encode(answers) if answers else None
        answer = self._one(message)
        return None if answer is None else _encode(answer)

    def _one(self, message: object) -> dict[str, object] | None:
        if not isinstance(message, dict):
            return _error(None, INVALID_REQUEST, "invalid request: expected a JSON object")
        has_id = "id" in message
        rid = message.get("id")
        if has_id and not (rid is None or isinstance(rid, str) or (isinstance(rid, int | float)
                                                                  and not isinstance(rid, bool))):
            return _error(None, INVALID_REQUEST, "invalid request: 'id' must be a string, a number or null")
        if message.get("jsonrpc") != "2.0":
            return _error(rid, INVALID_REQUEST, 'invalid request: missing "jsonrpc": "2.0"')
        method = message.get("method")
        if not isinstance(method, str):
            return _error(rid, INVALID_REQUEST, "invalid request: 'method' must be a string")
        try:
            result = self._call(method, message.get("params"))
        except RpcError as exc:
            return _error(rid, exc.code, exc.message, exc.data) if has_id else None
        except ClawmemError as exc:
            return _error(rid, exc.rpc_code, str(exc), {"type": type(exc).__name__}) if has_id else None
        except Exception as exc:
            if self._log is not None:
                self._log.exception("request_failed", method=method)
            return _error(rid, INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}") if has_id else None
        if not has_id:
            return None  # a notification: done, and JSON-RPC 2.0 forbids an answer
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    def _call(self, method: str, raw_params: object) -> object:
        if method not in PARAMS:
            raise RpcError(METHOD_NOT_FOUND, f"method not found: {method!r} (methods: {', '.join(PARAMS)})")
        p = validate_params(method, raw_params)
        backend = self.backend
        call: Callable[[], object]
        if method == "search":
            request = SearchRequest(p["query"], p.get("max_results"), p.get("min_score"), p.get("mode"),
                                    p.get("path_prefix"))
            call = lambda: backend.search(request)
        elif method == "get":
            call = lambda: backend.get(p["path"], p.get("from"), p.get("lines"))
        elif method == "status":
            call = backend.status
        elif method == "sync":
            call = lambda: backend.sync(p.get("wait", False))
        else:
            call = lambda: backend.reindex(p.get("wait", False))
        return self._run_pooled(call) if method in POOLED else call()


def _error(rid: object, code: int, message: str, data: object = None) -> dict[str, object]:
    error: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": rid, "error": error}


def _encode(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


# -- the socket ------------------------------------------------------------------------------


def ensure_private_dir(directory: Path, *, enforce: bool) -> None:
    """Create the socket's directory 0700; when `enforce`, also tighten an existing one we own."""
    if not directory.exists():
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        return
    st = os.stat(directory)
    if enforce and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(directory, 0o700)


def bind_unix_socket(path: Path, *, private_dir: bool = True, backlog: int = 128) -> socket.socket:
    """A listening socket at `path`, mode 0600 in a 0700 directory; a stale socket file is replaced.

    The caller must hold the instance lock for `path`: only then is an existing socket file known
    to be stale (left by a killed daemon) rather than live.
    """
    encoded = os.fsencode(path)
    if len(encoded) > UNIX_PATH_MAX:
        raise ConfigError(f"socket path is too long for a Unix socket ({len(encoded)} bytes, at most"
                          f" {UNIX_PATH_MAX}): {path}; set --socket or CLAWMEM_SOCKET to a shorter path")
    ensure_private_dir(path.parent, enforce=private_dir)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"{path} exists and is not a socket: refusing to replace it")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        # The directory is 0700 already, so nobody else can reach the socket before this chmod.
        os.chmod(path, 0o600)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


class RpcServer:
    """Serves a Dispatcher on a listening Unix socket, one thread per connection."""

    def __init__(self, backend: Backend, listener: socket.socket, *, path: Path | None = None,
                 idle_timeout: float = 300.0, max_line: int = MAX_LINE, workers: int = 8,
                 max_connections: int = MAX_CONNECTIONS, log: Any = None) -> None:
        self.listener = listener
        self.path = path  # set when we bound it: then close() removes it
        self.idle_timeout = idle_timeout
        self.max_line = max_line
        self.max_connections = max_connections
        self._log = log
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="clawmem-query")
        self.dispatcher = Dispatcher(backend, run_pooled=self._run_pooled, log=log)
        self._wake_r, self._wake_w = os.pipe()
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._accept_thread: threading.Thread | None = None
        self._closed = False
        self.served = 0

    def _run_pooled(self, fn: Callable[[], Any]) -> Any:
        try:
            return self._pool.submit(fn).result()
        except (CancelledError, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and "shutdown" not in str(exc):
                raise
            raise IndexUnavailable("the daemon is shutting down") from None

    def start(self) -> None:
        self.listener.setblocking(False)
        self._accept_thread = threading.Thread(target=self._accept_loop, name="clawmem-accept", daemon=True)
        self._accept_thread.start()

    def alive(self) -> bool:
        return self._accept_thread is not None and self._accept_thread.is_alive()

    def stop_listening(self) -> None:
        """Stop accepting and remove the socket file (existing connections keep being served)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        os.write(self._wake_w, b"x")
        if self._accept_thread is not None:
            self._accept_thread.join()
        self.listener.close()
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def close(self, timeout: float = 5.0) -> None:
        """Stop listening, end every connection (after its request in flight) and the query pool."""
        self.stop_listening()
        with self._lock:
            connections = list(self._connections.items())
        for conn, _ in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for _, thread in connections:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- threads -----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wake_r in ready:
                    return
                try:
                    conn, _ = self.listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    if self._log is not None:
                        self._log.error("accept_failed", error=str(exc))
                    time.sleep(0.1)  # e.g. EMFILE: give in-flight connections a moment to end
                    continue
                self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        thread = threading.Thread(target=self._serve, args=(conn,), name="clawmem-conn", daemon=True)
        with self._lock:
            admitted = len(self._connections) < self.max_connections
            if admitted:
                self._connections[conn] = thread
        if admitted:
            thread.start()
            return
        with contextlib.suppress(OSError):
            conn.settimeout(1.0)
            conn.sendall(_encode(_error(None, SERVER_BUSY, "too many connections: try again later")))
        conn.close()

    def _serve(self, conn: socket.socket) -> None:
        reader = LineReader(conn, self.max_line, self.idle_timeout)
        try:
            while True:
                try:
                    line = reader.readline()
                except LineTooLong:
                    conn.settimeout(self.idle_timeout)
                    conn.sendall(_encode(_error(None, INVALID_REQUEST,
                                                f"invalid request: line longer than {self.max_line} bytes;"
                                                " closing the connection")))
                    _linger(conn, min(self.idle_timeout, LINGER_SECONDS))
                    return
                if line is None:
                    return
                if not line.strip():
                    continue
                response = self.dispatcher.handle(line)
                self.served += 1
                if response is not None:
                    conn.settimeout(self.idle_timeout)
                    conn.sendall(response)
        except (TimeoutError, OSError):
            return  # idle, too slow, or gone: nothing to answer
        finally:
            with self._lock:
                self._connections.pop(conn, None)
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


def _linger(conn: socket.socket, seconds: float) -> None:
    """Half-close, then discard what the client is still sending for a bounded time.

    Closing a Unix socket with unread input resets the connection, and the client may then never
    read the error we just sent; reading a little more (into a fixed buffer) lets it see it.
    """
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + seconds
        budget = LINGER_BYTES
        while budget > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            conn.settimeout(remaining)
            chunk = conn.recv(min(65536, budget))
            if not chunk:
                return
            budget -= len(chunk)


class LineTooLong(Exception):
    """The client sent more than the line limit without a newline."""


class LineReader:
    """Lines from a stream socket with a hard size limit and a deadline per line.

    The buffer never holds more than the limit plus one read, whatever the client sends; a line
    must be complete within `timeout` seconds of starting to wait for it (idle and slow clients
    alike). A last line without a newline before EOF still counts.
    """

    def __init__(self, sock: socket.socket, limit: int, timeout: float) -> None:
        self._sock = sock
        self._limit = limit
        self._timeout = timeout
        self._buf = bytearray()

    def readline(self) -> bytes | None:
        deadline = time.monotonic() + self._timeout
        scanned = 0
        while True:
            end = self._buf.find(b"\n", scanned)
            if end >= 0:
                line = bytes(self._buf[:end])
                del self._buf[:end + 1]
                if len(line) > self._limit:
                    raise LineTooLong
                return line
            if len(self._buf) > self._limit:
                raise LineTooLong
            scanned = len(self._buf)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("client idle")
            self._sock.settimeout(remaining)
            chunk = self._sock.recv(min(65536, self._limit + 1 - len(self._buf)))
            if not chunk:
                if self._buf:
                    line = bytes(self._buf)
                    self._buf.clear()
                    return line
                return None
            self._buf += chunk
