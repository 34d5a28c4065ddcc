"""Helpers for the daemon's tests: short socket paths, polling with a deadline, raw and real daemons.

AF_UNIX paths are limited to 107 bytes, so sockets live in short `/tmp/cm...` directories rather
than under pytest's (long) tmp_path. Nothing here sleeps for a fixed time: `wait_until` polls a
condition until a deadline and fails with a message saying what never happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self, TypeVar

from clawmem_index.config import Settings, load_settings

T = TypeVar("T")

DEBOUNCE = 0.2
MAX_DELAY = 1.0
# Edits must be searchable within the debounce plus this bound (sync + scheduling on a busy CI box).
BOUND = 5.0


def short_dir() -> Iterator[Path]:
    """A fresh directory with a short path for sockets (use as a fixture body: `yield from short_dir()`)."""
    path = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def wait_until(predicate: Callable[[], T], timeout: float = BOUND, interval: float = 0.02,
               message: str = "condition") -> T:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # e.g. connection refused while starting
            last_error = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {message}"
                                 + (f" (last error: {last_error!r})" if last_error else ""))
        time.sleep(interval)


def daemon_settings(workspace: Path, tmp_path: Path, sock_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "index": str(tmp_path / "index" / "index.sqlite"),
        "socket": str(sock_dir / "d.sock"),
        "embedding.provider": "none",
        "daemon.debounce": DEBOUNCE,
        "daemon.max_delay": MAX_DELAY,
        "daemon.rescan_interval": 0,
    }
    values.update(overrides)
    return load_settings(workspace=workspace, overrides=values)


class RecordingLog:
    """A structlog-shaped logger that keeps (level, event, fields) so tests can read what was logged."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def _add(self, level: str, event: str, **fields: Any) -> None:
        with self._lock:
            self.records.append((level, event, fields))

    def debug(self, event: str, **fields: Any) -> None:
        self._add("debug", event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._add("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._add("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._add("error", event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._add("exception", event, **fields)

    def events(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [fields for _, event, fields in self.records if event == name]


class RawClient:
    """A bare newline-JSON client: send any bytes, read one line at a time."""

    def __init__(self, path: Path, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(path))
        except OSError:
            self.sock.close()
            raise
        self.file = self.sock.makefile("rb")
        self._ids = 0

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> Any:
        raw = self.file.readline()
        return None if not raw else json.loads(raw)

    def call(self, method: str, params: Any = None) -> dict[str, Any]:
        self._ids += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._ids, "method": method}
        if params is not None:
            message["params"] = params
        self.send(json.dumps(message).encode() + b"\n")
        answer = self.line()
        assert answer is not None, "connection closed"
        assert answer["id"] == self._ids
        return dict(answer)

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def running_daemon(settings: Settings, **kwargs: Any) -> Iterator[Any]:
    """An in-process daemon (no signal handling), stopped on exit."""
    from clawmem_index.service.daemon import Daemon

    kwargs.setdefault("log", RecordingLog())
    daemon = Daemon(settings, environ={}, **kwargs)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


def search_paths(client: Any, query: str, **params: Any) -> list[str]:
    from clawmem_index.search.ranking import SearchRequest

    answer = client.search(SearchRequest(query, min_score=0.0, mode=params.pop("mode", "bm25"), **params))
    return [r["path"] for r in answer["results"]]


CLAWMEM = [sys.executable, "-m", "clawmem_index"]


def spawn_daemon(workspace: Path, socket_path: Path, index: Path, *extra: str, env: dict[str, str] | None = None,
                 stderr: Any = None, **popen: Any) -> subprocess.Popen[bytes]:
    """`clawmem serve` as a real process (keyword-only, short debounce)."""
    full_env = dict(os.environ)
    full_env.update({"CLAWMEM_PROVIDER": "none", "CLAWMEM_LOG_LEVEL": "info"})
    full_env.update(env or {})
    config = workspace / "clawmem.toml"
    if not config.exists():
        config.write_text(f"[daemon]\ndebounce = {DEBOUNCE}\nmax_delay = {MAX_DELAY}\nrescan_interval = 0\n")
    args = [*CLAWMEM, "serve", "--workspace", str(workspace), "--socket", str(socket_path), "--index", str(index),
            *extra]
    return subprocess.Popen(args, env=full_env, stdout=subprocess.DEVNULL,
                            stderr=stderr if stderr is not None else subprocess.DEVNULL, **popen)


def wait_listening(path: Path, proc: subprocess.Popen[bytes] | None = None, timeout: float = 15.0) -> None:
    def up() -> bool:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"daemon exited early with status {proc.returncode}")
        with contextlib.suppress(OSError), RawClient(path, timeout=2.0) as client:
            return "result" in client.call("status")
        return False

    wait_until(up, timeout=timeout, message=f"a daemon answering on {path}")


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> int:
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def refusing_daemon(path: Path, answer: bytes | None) -> tuple[socket.socket, threading.Thread]:
    """A socket that turns every client away: with `answer` (a busy daemon) or by hanging up (a dying one)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    listener.settimeout(10)

    def serve() -> None:
        try:
            while True:
                conn, _ = listener.accept()
                with conn:
                    if answer is not None:
                        conn.sendall(answer)
        except OSError:
            return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def held_first_build(settings: Settings) -> tuple[Any, threading.Event]:
    """A daemon whose first build stops at its first progress report until the returned gate opens."""
    from clawmem_index.service.daemon import Daemon

    daemon = Daemon(settings, environ={}, log=RecordingLog())
    gate = threading.Event()
    checked = daemon.writer._check_stop

    def held_progress(done: int, total: int) -> None:
        assert gate.wait(10)
        checked(done, total)

    daemon.writer._check_stop = held_progress  # type: ignore[method-assign]
    return daemon, gate
