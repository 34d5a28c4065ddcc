"""The socket client the CLI uses to talk to a running daemon (SPEC §7).

Standard library only (plus the error classes), so `clawmem search` stays fast when a daemon
answers: no SQLite, no structlog, no watchdog. JSON-RPC errors come back as the `clawmem_index.errors`
class the daemon raised (by the `data.type` name when it is one of ours, else by code), so the CLI
prints the same message and exits with the same code as it would in-process.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from clawmem_index import errors
from clawmem_index.errors import ClawmemError, DaemonUnreachable, ProtocolError, QueryError

if TYPE_CHECKING:
    from clawmem_index.config import Settings
    from clawmem_index.search.ranking import SearchRequest

__all__ = ["DaemonClient", "error_for", "find_daemon"]

CONNECT_TIMEOUT = 2.0
CALL_TIMEOUT = 60.0

_BY_CODE: dict[int, type[ClawmemError]] = {
    -32700: ProtocolError,
    -32600: ProtocolError,
    -32601: ProtocolError,
    -32602: QueryError,
    -32002: QueryError,  # the reply would be too large: ask for less
}
for _cls in (errors.ConfigError, errors.PathError, errors.QueryError, errors.ProviderError,
             errors.IndexUnavailable, errors.ServerBusy, errors.ProtocolError):
    _BY_CODE.setdefault(_cls.rpc_code, _cls)
_BY_NAME: dict[str, type[ClawmemError]] = {
    name: cls for name in errors.__all__
    if isinstance(cls := getattr(errors, name), type) and issubclass(cls, ClawmemError)
}


def error_for(error: dict[str, Any]) -> ClawmemError:
    """The exception matching a JSON-RPC error object."""
    message = str(error.get("message", "unknown error"))
    data = error.get("data")
    named = _BY_NAME.get(data.get("type", "")) if isinstance(data, dict) else None
    code = error.get("code")
    cls = named or (_BY_CODE.get(code, ClawmemError) if isinstance(code, int) else ClawmemError)
    return cls(message)


MAX_CONNECTIONS = 4  # calls in flight at once per client (the daemon answers a connection's calls one at a time)


class _Connection:
    """One socket and its reader: carries one call at a time."""

    def __init__(self, sock: socket.socket, generation: int) -> None:
        self.sock = sock
        self.file: Any = sock.makefile("rb")
        self.generation = generation  # the client's close() count when it was made
        self.reused = False  # taken from the idle ones

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
        with contextlib.suppress(OSError):
            self.sock.close()


class DaemonClient:
    """Connections to a daemon, reused for many calls. Thread-safe: each call in flight has a connection of its own
    (at most `max_connections`; more wait for one), since the daemon answers a connection's calls in order and
    `clawmem mcp`'s tool threads share one client."""

    def __init__(self, path: str | os.PathLike[str], *, timeout: float | None = CALL_TIMEOUT,
                 connect_timeout: float = CONNECT_TIMEOUT, max_connections: int = MAX_CONNECTIONS) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_connections = max(1, max_connections)
        self._ids = itertools.count(1)
        self._idle: list[_Connection] = []
        self._open = 0  # connections idle or carrying a call
        self._closes = 0  # close() calls so far: a connection made before the last one is not kept
        self._free = threading.Condition()

    def _dial(self) -> _Connection:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.connect_timeout)
        try:
            sock.connect(str(self.path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise DaemonUnreachable(f"no clawmem daemon is listening on {self.path} ({exc.strerror})") from None
        except OSError as exc:
            sock.close()
            raise DaemonUnreachable(f"cannot connect to the clawmem daemon at {self.path}: {exc}") from None
        return _Connection(sock, self._closes)

    def connect(self) -> Self:
        """Make sure a daemon answers the socket (a connection is opened and kept for the next call)."""
        with self._free:
            if self._idle:
                return self
        conn = self._take()
        self._give_back(conn)
        return self

    def _take(self, *, fresh: bool = False) -> _Connection:
        """An idle connection, a new one while fewer than max_connections are open, else the next one freed
        (`fresh`: a new one in any case, its place taken from an idle one if need be)."""
        stale = None
        with self._free:
            while not self._idle and self._open >= self.max_connections:
                self._free.wait()
            if self._idle and not fresh:
                conn = self._idle.pop()
                conn.reused = True
                return conn
            if self._idle and self._open >= self.max_connections:
                stale = self._idle.pop()  # its place goes to the new one
            else:
                self._open += 1
        if stale is not None:
            stale.close()
        try:
            return self._dial()
        except BaseException:
            self._drop(None)
            raise

    def _give_back(self, conn: _Connection) -> None:
        with self._free:
            if conn.generation == self._closes:
                self._idle.append(conn)
                self._free.notify()
                return
        self._drop(conn)  # its client was closed while it carried a call

    def _drop(self, conn: _Connection | None) -> None:
        """A connection that failed (or was never made): closed, and its place freed."""
        if conn is not None:
            conn.close()
        with self._free:
            self._open -= 1
            self._free.notify()

    def close(self) -> None:
        """Close the idle connections (one carrying a call is closed when its call ends)."""
        with self._free:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._closes += 1
            self._free.notify_all()
        for conn in idle:
            conn.close()

    def __enter__(self) -> Self:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             timeout: float | None = CALL_TIMEOUT) -> Any:
        """Send one request and return its result, or raise the error the daemon answered with."""
        request = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params or {}}
        try:
            # ASCII escapes: a lone surrogate (from a non-UTF-8 argument) reaches the daemon's
            # parameter check as such, instead of failing to encode here.
            payload = json.dumps(request, allow_nan=False).encode("ascii") + b"\n"
        except ValueError as exc:
            raise QueryError(f"cannot send {method!r}: {exc}") from None
        conn = self._take()
        for attempt in (1, 2):
            try:
                conn.sock.settimeout(timeout)
                conn.sock.sendall(payload)
                line = conn.file.readline()
            except TimeoutError:
                self._drop(conn)
                raise DaemonUnreachable(f"the clawmem daemon did not answer {method!r} within {timeout:g}s") from None
            except OSError as exc:
                line, failure = b"", f"lost the connection to the clawmem daemon: {exc}"
            else:
                failure = "the clawmem daemon closed the connection"
            if line:
                break
            self._drop(conn)
            if not conn.reused or attempt == 2:
                raise DaemonUnreachable(failure)
            # An idle connection the daemon closed meanwhile (its idle limit, or making room): nothing of an
            # answer came, so the call goes once more, on a new connection.
            conn = self._take(fresh=True)
        try:
            answer = json.loads(line)
        except json.JSONDecodeError as exc:
            self._drop(conn)
            raise ProtocolError(f"the daemon sent a line that is not JSON: {exc}") from None
        if isinstance(answer, dict) and answer.get("id") is None and isinstance(answer.get("error"), dict):
            self._drop(conn)  # an answer to no request: the daemon turned this connection away
            raise error_for(answer["error"])
        if not isinstance(answer, dict) or answer.get("id") != request["id"]:
            self._drop(conn)
            raise ProtocolError("the daemon's answer does not match the request")
        self._give_back(conn)
        if "error" in answer:
            raise error_for(answer["error"] if isinstance(answer["error"], dict) else {})
        return answer.get("result")

    # -- the methods, shaped like MemoryIndex's ----------------------------------------------

    def search(self, request: SearchRequest) -> dict[str, Any]:
        result: dict[str, Any] = self.call("search", request_params(request), timeout=self.timeout)
        return result

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"path": path}
        if start is not None:
            params["from"] = start
        if lines is not None:
            params["lines"] = lines
        if max_bytes is not None:
            params["max_bytes"] = max_bytes
        result: dict[str, Any] = self.call("get", params, timeout=self.timeout)
        return result

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("status", timeout=self.timeout)
        return result

    def context(self, request: SearchRequest, budget: int | None = None) -> dict[str, Any]:
        params = request_params(request, for_context=True)
        if budget is not None:
            params["budget"] = budget
        result: dict[str, Any] = self.call("context", params, timeout=self.timeout)
        return result

    def sync(self, wait: bool = False) -> dict[str, Any]:
        result: dict[str, Any] = self.call("sync", {"wait": wait}, timeout=None if wait else self.timeout)
        return result

    def reindex(self, wait: bool = False) -> dict[str, Any]:
        result: dict[str, Any] = self.call("reindex", {"wait": wait}, timeout=None if wait else self.timeout)
        return result


def find_daemon(settings: Settings, *, timeout: float | None = CALL_TIMEOUT) -> DaemonClient | None:
    """A connected client if a daemon answers on the settings' socket, else None (nothing listens)."""
    path = settings.socket_path
    if not path.exists():
        return None
    try:
        return DaemonClient(path, timeout=timeout).connect()
    except DaemonUnreachable:
        return None


def request_params(request: SearchRequest, for_context: bool = False) -> dict[str, Any]:
    """The socket params of a search request: every field the daemon reads back into the same request (a context
    takes neither explain nor repositories)."""
    params: dict[str, Any] = {"query": request.query}
    for name in ("max_results", "min_score", "mode", "path_prefix", "source", "since", "before", "now"):
        value = getattr(request, name)
        if value is not None:
            params[name] = value
    if request.explain and not for_context:
        params["explain"] = True
    if request.workspaces:
        params["workspaces"] = list(request.workspaces)
    if request.projects and not for_context:
        params["projects"] = list(request.projects)
    return params
