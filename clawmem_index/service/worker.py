"""What the daemon's two work threads (the keyword writer, the embedder) share: a thread that runs one pass
at a time, stops after the one in flight, reports each run (a report that fails never stops it), and
backs off after failures; and the record of a run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clawmem_index.errors import ClawmemError
from clawmem_index.text.timefmt import iso_time, seconds

if TYPE_CHECKING:
    from clawmem_index.engine.core import MemoryIndex
    from clawmem_index.engine.sync import SyncReport

__all__ = ["Backoff", "IndexSource", "Run", "Worker"]

IndexSource = Callable[[], "MemoryIndex"]


@dataclass
class Run:
    """One unit of writer work and what came of it."""

    kind: str  # "sync", "reindex" or "embed"
    reason: str
    started_at: float = field(default_factory=time.time)
    duration: float = 0.0
    report: SyncReport | None = None
    embedded: int = 0
    pending_embeddings: int | None = None
    error: ClawmemError | None = None
    cancelled: bool = False
    targeted: int | None = None  # how many paths a targeted sync covered; None: a full pass
    poll_in: float | None = None  # an embedding pass left batch jobs running: seconds until it looks again

    def as_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"kind": self.kind, "reason": self.reason, "started_at": iso_time(self.started_at),
                                   "duration": seconds(self.duration)}
        if self.report is not None:
            data["report"] = self.report.as_dict()
        if self.kind == "sync":
            data["paths"] = "all" if self.targeted is None else self.targeted
        if self.kind == "embed":
            data["embedded"] = self.embedded
            data["pending_embeddings"] = self.pending_embeddings
        if self.error is not None:
            data["error"] = str(self.error)
            data["error_type"] = type(self.error).__name__
        if self.cancelled:
            data["cancelled"] = True
        return data


class Worker:
    """One daemon thread (`name`) running `_loop`, with the condition its requests and state share."""

    def __init__(self, name: str, *, log: Any, on_run: Callable[[Run], None] | None) -> None:
        self._name = name
        self._log = log
        self._on_run = on_run
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop after the work in flight; False if the thread did not end in time (a provider call may hold it:
        it is a daemon thread)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        raise NotImplementedError

    def _report(self, run: Run) -> None:
        """Hand `run` to `on_run`: reporting must never stop the thread."""
        if self._on_run is not None:
            try:
                self._on_run(run)
            except Exception as exc:
                self._log.error("run_report_failed", error=repr(exc))


class Backoff:
    """Doubling delays from `base` up to `ceiling`, for retries after failures."""

    def __init__(self, base: float, ceiling: float) -> None:
        self.base, self.ceiling, self.current = base, ceiling, 0.0

    def next(self) -> float:
        self.current = self.base if self.current == 0.0 else min(self.ceiling, self.current * 2)
        return self.current

    def reset(self) -> None:
        self.current = 0.0
