"""The socket of the API: newline-delimited JSON-RPC 2.0 (`clawmem_index.service.protocol`) on a Unix stream socket.

One request object per line, one response per line, many requests per connection, many
connections at once. `RpcServer` owns the socket: an accept thread (woken by a pipe to stop, never
by polling), a thread per connection reading with a bounded buffer (a line over 1 MiB is refused
and the connection closed) and an idle deadline, and a small fixed pool of query threads. Queries
run on that pool so the number of SQLite read connections stays bounded however many clients come
and go; each pool thread has its own read connection, so a search never waits for the writer.

So that no client can stop the daemon serving everyone else:

- a reply must be written within `send_timeout` (SEND_TIMEOUT, 30 s, never more than the idle
  timeout), else that connection is closed and its reply dropped;
- replies and unfinished request lines are held against the protocol's shared `MemoryBudget`:
  a client whose unfinished line no longer fits is told the server is busy and disconnected;
- at the connection cap (MAX_CONNECTIONS) a newcomer evicts the connection idle the longest (it
  is told so by a -32001 line, if its socket takes one at once), or, when none is idle, the one
  stuck the longest writing a reply nobody reads (after STALLED_SEND seconds); it is refused with
  -32001 only when every connection is busy handling a request.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawmem_index.errors import ConfigError, IndexUnavailable
from clawmem_index.service.hangup import Call, result_unless_gone
from clawmem_index.service.protocol import Backend, Dispatcher, safe_log
from clawmem_index.service.replies import (
    INVALID_REQUEST,
    MAX_REPLY_BYTES,
    MEMORY_BUDGET,
    SERVER_BUSY,
    MemoryBudget,
    Reply,
    encode_line,
    error_object,
)

__all__ = ["MAX_CONNECTIONS", "MAX_LINE", "SEND_TIMEOUT", "LineReader", "RpcServer", "bind_unix_socket",
           "ensure_private_dir"]

MAX_LINE = 1 << 20
MAX_CONNECTIONS = 256
SEND_TIMEOUT = 30.0
STALLED_SEND = 2.0  # a local reader takes milliseconds for 4 MiB: longer means it is not reading
LINGER_SECONDS = 2.0
LINGER_BYTES = 16 << 20
UNIX_PATH_MAX = 107


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


@dataclass(eq=False)
class _Connection:
    """One client's state, read and written under RpcServer._lock (eviction decides by it)."""

    sock: socket.socket
    thread: threading.Thread
    last_active: float = field(default_factory=time.monotonic)
    busy: bool = False  # a request is being handled or its answer sent
    sending_since: float | None = None
    evicted: bool = False


class RpcServer:
    """Serves a Dispatcher on a listening Unix socket, one thread per connection."""

    def __init__(self, backend: Backend, listener: socket.socket, *, path: Path | None = None,
                 idle_timeout: float = 300.0, max_line: int = MAX_LINE, workers: int = 8,
                 max_connections: int = MAX_CONNECTIONS, send_timeout: float = SEND_TIMEOUT,
                 memory_budget: int = MEMORY_BUDGET, max_reply: int = MAX_REPLY_BYTES, log: Any = None) -> None:
        self.listener = listener
        self.path = path  # set when we bound it: then close() removes it
        self.idle_timeout = idle_timeout
        self.send_timeout = send_timeout
        self.max_line = max_line
        self.max_connections = max_connections
        self._log = log
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="clawmem-query")
        self.dispatcher = Dispatcher(backend, run_pooled=self._run_pooled, log=log, max_reply=max_reply)
        self.budget = MemoryBudget(memory_budget)
        self._wake_r, self._wake_w = os.pipe()
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, _Connection] = {}
        self._accept_thread: threading.Thread | None = None
        self._closed = False
        self._running = 0  # pooled calls under way
        self._quiet = threading.Condition()
        self._here = threading.local()  # the connection thread's socket (see _run_pooled)
        self.served = 0
        self.evictions = 0

    def _run_pooled(self, fn: Callable[[], Any]) -> Any:
        call = Call()

        def counted() -> Any:
            call.started()
            with self._quiet:
                self._running += 1
            try:
                return fn()
            finally:
                call.ended()  # from here on its thread may run another call: it is not interrupted
                with self._quiet:
                    self._running -= 1
                    self._quiet.notify_all()

        try:
            future = self._pool.submit(counted)
            sock = getattr(self._here, "sock", None)
            if sock is None:
                return future.result()
            return result_unless_gone(future, sock, call, getattr(self.dispatcher.backend, "interrupt", None))
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

    def close(self, timeout: float = 5.0) -> bool:
        """Stop listening, end every connection (after its request in flight) and the query pool, within `timeout`.

        False when calls were still running then (a query waiting on a provider that does not answer): they are
        left to the process's exit, which must not wait for them (`run_daemon`)."""
        self.stop_listening()
        with self._lock:
            connections = list(self._connections.values())
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for conn in connections:
            conn.thread.join(max(0.0, deadline - time.monotonic()))
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._quiet:
            return self._quiet.wait_for(lambda: self._running == 0, max(0.0, deadline - time.monotonic()))

    def connection_count(self) -> int:
        """Connections being served (evicted ones on their way out are not counted)."""
        with self._lock:
            return sum(not c.evicted for c in self._connections.values())

    # -- admission -----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wake_r in ready:
                    return
                try:
                    sock, _ = self.listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    safe_log(self._log, "error", "accept_failed", error=str(exc))
                    time.sleep(0.1)  # e.g. EMFILE: give in-flight connections a moment to end
                    continue
                try:
                    self._admit(sock)
                except Exception:  # the accept thread must outlive any one connection
                    safe_log(self._log, "exception", "admit_failed")
                    sock.close()

    def _admit(self, sock: socket.socket) -> None:
        conn = _Connection(sock, threading.Thread(target=self._serve, args=(sock,), name="clawmem-conn",
                                                  daemon=True))
        with self._lock:
            if sum(not c.evicted for c in self._connections.values()) >= self.max_connections:
                self._evict_one()
            admitted = sum(not c.evicted for c in self._connections.values()) < self.max_connections
            if admitted:
                self._connections[sock] = conn
        if admitted:
            try:
                conn.thread.start()
                return
            except RuntimeError:  # no thread to be had (resource limits): turn this one away
                with self._lock:
                    self._connections.pop(sock, None)
        _send_now(sock, encode_line(error_object(None, SERVER_BUSY, "too many connections: try again later")))
        sock.close()

    def _evict_one(self) -> None:
        """Make room at the cap (under the lock) by ending one connection, if one may be ended."""
        now = time.monotonic()
        picked = self._victim(now)
        if picked is None:
            return
        victim, reason, since = picked
        victim.evicted = True
        self.evictions += 1
        if reason == "idle":
            _send_now(victim.sock, encode_line(error_object(None, SERVER_BUSY, "connection closed: it was idle while"
                                                            " the server was at its connection limit; reconnect")))
        with contextlib.suppress(OSError):
            victim.sock.shutdown(socket.SHUT_RDWR)  # its thread sees EOF (or a failed send) and ends
        safe_log(self._log, "warning", "connection_evicted", reason=reason, seconds=round(now - since, 3),
                  connections=self.max_connections)

    def _victim(self, now: float) -> tuple[_Connection, str, float] | None:
        """The connection idle the longest, else the reply stalled the longest: (it, why, since when).

        A stalled reply has been written for STALLED_SEND seconds or more: its reader is not
        reading, and it would keep the slot until send_timeout. Connections handling a request are kept.
        """
        live = [c for c in self._connections.values() if not c.evicted]
        idle = [c for c in live if not c.busy]
        if idle:
            victim = min(idle, key=lambda c: c.last_active)
            return victim, "idle", victim.last_active
        stall = min(STALLED_SEND, self._send_timeout())
        stalled = [(c.sending_since, c) for c in live if c.sending_since is not None and now - c.sending_since >= stall]
        if not stalled:
            return None
        since, victim = min(stalled, key=lambda pair: pair[0])
        return victim, "stalled_reply", since

    # -- one connection --------------------------------------------------------------------------

    def _send_timeout(self) -> float:
        return min(self.send_timeout, self.idle_timeout)  # idle_timeout may change on reload

    def _serve(self, sock: socket.socket) -> None:
        try:
            self._converse(sock)
        except (TimeoutError, OSError):
            pass  # idle, too slow, evicted or gone: nothing to answer
        except Exception:
            safe_log(self._log, "exception", "connection_failed")
        finally:
            with self._lock:
                self._connections.pop(sock, None)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _converse(self, sock: socket.socket) -> None:
        with self._lock:
            conn = self._connections[sock]
        self._here.sock = sock
        reader = LineReader(sock, self.max_line, self.idle_timeout, self.budget)
        try:
            while True:
                try:
                    line = reader.readline()
                except LineTooLong:
                    self._refuse_line(sock, f"invalid request: line longer than {self.max_line} bytes;"
                                            " closing the connection", INVALID_REQUEST)
                    return
                except InputOverBudget:
                    safe_log(self._log, "warning", "input_over_budget")
                    self._refuse_line(sock, "server busy: too much unfinished input held for clients;"
                                            " closing the connection", SERVER_BUSY)
                    return
                if line is None:
                    return
                if not line.strip():
                    continue
                if not self._begin(conn):
                    return
                try:
                    self._respond(conn, line)
                finally:
                    self._end(conn)
        finally:
            reader.release()

    def _begin(self, conn: _Connection) -> bool:
        """Mark the connection busy; False when it was evicted while its line arrived."""
        with self._lock:
            if conn.evicted:
                return False
            conn.busy = True
            return True

    def _end(self, conn: _Connection) -> None:
        with self._lock:
            conn.busy = False
            conn.sending_since = None
            conn.last_active = time.monotonic()
            self.served += 1

    def _respond(self, conn: _Connection, line: bytes) -> None:
        reply = self.dispatcher.answer(line, self.budget)
        if reply is None:
            return
        try:
            with self._lock:
                conn.sending_since = time.monotonic()
            self._send(conn.sock, reply)
        finally:
            reply.release()

    def _send(self, sock: socket.socket, reply: Reply) -> None:
        """Write the whole reply within the send timeout, else give up on this connection."""
        limit = self._send_timeout()
        deadline = time.monotonic() + limit
        try:
            for chunk in reply.chunks():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("reply not read in time")
                sock.settimeout(remaining)
                sock.sendall(chunk)
        except TimeoutError:
            safe_log(self._log, "warning", "slow_reader_dropped", reply_bytes=reply.size, send_timeout=limit)
            raise

    def _refuse_line(self, sock: socket.socket, message: str, code: int) -> None:
        """Say why this connection ends (a line too long or too much held), then close it gently."""
        sock.settimeout(self._send_timeout())
        sock.sendall(encode_line(error_object(None, code, message)))
        _linger(sock, min(self.idle_timeout, LINGER_SECONDS))


def _send_now(sock: socket.socket, data: bytes) -> None:
    """Send a short line only if the socket takes it at once (never blocks the accept thread).

    A duplicate descriptor is used so the connection's own timeout mode is left alone (a socket
    with a timeout waits for room before sending, whatever the flags).
    """
    with contextlib.suppress(OSError):
        with socket.socket(fileno=os.dup(sock.fileno())) as dup:
            dup.setblocking(False)
            dup.send(data)


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


class InputOverBudget(Exception):
    """An unfinished line no longer fits in the memory budget shared by every connection."""


class LineReader:
    """Lines from a stream socket with a hard size limit and a deadline per line.

    The buffer never holds more than the limit plus one read, whatever the client sends; a line
    must be complete within `timeout` seconds of starting to wait for it (idle and slow clients
    alike). A last line without a newline before EOF still counts. With a `budget`, what the
    buffer holds beyond the budget's free allowance is counted in it (many clients each sending
    most of a 1 MiB line would otherwise pin that much each): past it, InputOverBudget.
    """

    def __init__(self, sock: socket.socket, limit: int, timeout: float, budget: MemoryBudget | None = None) -> None:
        self._sock = sock
        self._limit = limit
        self._timeout = timeout
        self._budget = budget
        self._held = 0
        self._buf = bytearray()

    def release(self) -> None:
        """Give back what the buffer holds in the budget (the connection is ending)."""
        self._buf.clear()
        self._account()

    def _account(self) -> None:
        if self._budget is None:
            return
        wanted = max(0, len(self._buf) - self._budget.free)
        if wanted > self._held:
            if not self._budget.take(wanted - self._held):
                raise InputOverBudget
        elif wanted < self._held:
            self._budget.give(self._held - wanted)
        self._held = wanted

    def readline(self) -> bytes | None:
        deadline = time.monotonic() + self._timeout
        scanned = 0
        while True:
            end = self._buf.find(b"\n", scanned)
            if end >= 0:
                line = bytes(self._buf[:end])
                del self._buf[:end + 1]
                self._account()
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
                    self._account()
                    return line
                return None
            self._buf += chunk
            self._account()
