"""A provider run in a child process, so that the daemon stays small and a model crash is survivable.

The local GGUF model and llama.cpp's buffers are 85-110 MB of a daemon's memory; in a child
process they are not in the daemon's RSS, the daemon's own memory is what its clients can make it
grow (bounded by the socket's budget), and a crash in native code ends the child, not the service.
The daemon talks to the child over a socket pair with `multiprocessing.connection`'s framed pickles:
one request at a time, under a first-come first-served lock, and documents are sent a few at a time
(CALL_CHARS), so a search's query vector waits for at most one small call of an indexing batch.
A child that dies is restarted once per call; a second death in the same call is a ProviderError,
and the next call starts a new child. The child exits when
its end of the pair closes, so a killed daemon leaves no model process behind.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from clawmem_index.embeddings.base import EmbeddingProvider, ProviderBase, ProviderInfo
from clawmem_index.errors import ClawmemError, ProviderError, ProviderReleased

__all__ = ["IsolatedProvider"]

Factory = Callable[[], EmbeddingProvider]
CALL_CHARS = 2000  # texts per call to the child, by length: about one 400-token chunk


class _FairLock:
    """A lock taken in the order it was asked for (threading.Lock lets the releasing thread retake it)."""

    def __init__(self) -> None:
        self._turns = threading.Condition()
        self._next = 0
        self._serving = 0

    def __enter__(self) -> None:
        with self._turns:
            ticket = self._next
            self._next += 1
            self._turns.wait_for(lambda: self._serving == ticket)

    def __exit__(self, *exc: object) -> None:
        with self._turns:
            self._serving += 1
            self._turns.notify_all()


class IsolatedProvider(ProviderBase):
    """An `EmbeddingProvider` whose model runs in a child process built by `factory` (picklable)."""

    def __init__(self, info: ProviderInfo, factory: Factory, *, preferred_batch: int | None = None) -> None:
        self._info = info
        self._factory = factory
        self._preferred_batch = preferred_batch
        self._lock = _FairLock()
        self._child: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._closed = False
        self.restarts = 0

    @property
    def info(self) -> ProviderInfo:
        return self._info

    @property
    def preferred_batch(self) -> int | None:
        return self._preferred_batch

    @property
    def closed(self) -> bool:
        """Released for good (`close`): a holder should take the current provider."""
        return self._closed

    @property
    def pid(self) -> int | None:
        """The model process's pid, None while none runs."""
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    def warm(self) -> None:
        self._call("warm")

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for group in _groups(texts, CALL_CHARS):
            vectors.extend(self._call("embed_documents", group))
        return vectors

    def embed_query(self, text: str) -> list[float]:
        return self._call("embed_query", text)  # type: ignore[no-any-return]

    def close(self) -> None:
        """End the model process for good: a caller still holding this provider (a search or an
        indexing pass that began before a reload) gets a ProviderError, never a second process."""
        with self._lock:
            self._closed = True
            self._stop()

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:
            if self._closed:
                raise ProviderReleased(f"the {self._info.provider} model process was released (the daemon reloaded "
                                       "its configuration or is stopping)")
            for attempt in (1, 2):
                conn = self._conn if self._conn is not None else self._start()
                try:
                    conn.send((method, args))
                    status, value = conn.recv()
                except (EOFError, OSError) as exc:
                    code = self._stop()
                    if attempt == 2:
                        raise ProviderError(f"the {self._info.provider} model process ended ({_ended(code)}) "
                                            f"twice in one call: {type(exc).__name__}") from None
                    self.restarts += 1
                    continue
                if status == "ok":
                    return value
                raise ProviderError(str(value))
        raise AssertionError("unreachable")

    def _start(self) -> Connection:
        ours, theirs = socket.socketpair()
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send(self._factory)
        return self._conn

    def _stop(self) -> int | None:
        """End the child (if any); its exit code, negative for a signal."""
        conn, child = self._conn, self._child
        self._conn = self._child = None
        if conn is not None:
            conn.close()
        if child is None:
            return None
        try:
            return child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            return child.wait()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._stop()


def _groups(texts: Sequence[str], chars: int) -> list[list[str]]:
    """Consecutive texts in groups of about `chars` characters (a longer text alone)."""
    groups: list[list[str]] = []
    size = 0
    for text in texts:
        if not groups or size + len(text) > chars:
            groups.append([])
            size = 0
        groups[-1].append(text)
        size += len(text)
    return groups


def _ended(code: int | None) -> str:
    if code is None:
        return "not started"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


def serve(conn: Connection) -> None:
    """The child's loop: build the provider, then answer calls until the daemon's end closes."""
    try:
        factory = conn.recv()
    except EOFError:
        return
    provider: EmbeddingProvider | None = None
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            return
        try:
            if provider is None:
                provider = factory()
            value: Any = getattr(provider, method)(*args)
            if method == "embed_documents":
                value = [list(map(float, vector)) for vector in value]
            elif method == "embed_query":
                value = list(map(float, value))
            reply: tuple[str, Any] = ("ok", value)
        except ClawmemError as exc:
            reply = ("error", str(exc))
        except Exception as exc:  # noqa: BLE001 - the daemon is told, and the child keeps serving
            reply = ("error", f"{type(exc).__name__}: {exc}")
        conn.send(reply)


def main(argv: Sequence[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C for the daemon's group is the daemon's to handle
    serve(Connection(int(argv[0])))


if __name__ == "__main__":
    main(sys.argv[1:])
