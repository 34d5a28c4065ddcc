"""The daemon's single writer thread: coalesced keyword syncs and rebuilds.

Every keyword write to the index happens on this one thread, so "only one sync at a time" holds by
construction, and requests that arrive during a run coalesce into one follow-up run. Syncs run
with `embed=False`: a new note is keyword-searchable as soon as its rows land, and its vectors
come from the embedding thread (`clawmem_index.service.embedder`), which never holds this one up. A failed run
is retried with backoff as a full pass.

Stopping is cooperative: the engine reports progress after each file's transaction commits, and the
progress callback is where a stop request ends a run, so SIGTERM finishes the transaction in flight
and no more.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from clawmem_index.errors import ClawmemError, IndexUnavailable
from clawmem_index.service.worker import Backoff, IndexSource, Run, Worker

# Run is the worker's: importable from here as it always was.
__all__ = ["Backoff", "IndexSource", "Run", "Writer"]


class _Cancelled(Exception):
    """Raised from the progress callback between two file transactions when the daemon stops."""


class Writer(Worker):
    """Runs keyword syncs and rebuilds for the daemon, one at a time, on its own thread."""

    def __init__(self, index: IndexSource, *, log: Any, on_run: Callable[[Run], None] | None = None,
                 on_progress: Callable[[int, int], None] | None = None,
                 retry_delay: float = 5.0, max_retry_delay: float = 300.0) -> None:
        """`on_progress(done, total)`: after each file of a run (its transaction committed, for a first index)."""
        super().__init__("clawmem-writer", log=log, on_run=on_run)
        self._index = index
        self._on_progress = on_progress
        self._retry = Backoff(retry_delay, max_retry_delay)
        self._sync_wanted = False
        self._sync_reason: set[str] = set()
        self._sync_paths: set[str] = set()
        self._sync_full = False
        self._inflight: frozenset[str] | None = frozenset()
        self._sync_not_before = 0.0
        self._reindex_wanted = False
        self._reindex_reason: set[str] = set()
        self._sync_seq = self._sync_done = 0
        self._reindex_seq = self._reindex_done = 0
        self._running: str | None = None
        self._last: dict[str, Run] = {}
        self.counts = {"sync": 0, "reindex": 0, "failed": 0}

    # -- requests (any thread) ---------------------------------------------------------------

    def request_sync(self, reason: str, paths: frozenset[str] | None = None) -> int:
        """Queue a sync (coalescing with any already queued); returns a ticket for `wait_sync`.

        `paths` limits it to those index keys (what the watcher saw change); None means a full pass.
        """
        with self._cond:
            self._sync_wanted = True
            self._sync_reason.add(reason)
            if paths is None:
                self._sync_full = True
            else:
                self._sync_paths.update(paths)
            self._sync_not_before = 0.0
            self._sync_seq += 1
            self._cond.notify_all()
            return self._sync_seq

    def request_reindex(self, reason: str) -> int:
        with self._cond:
            self._reindex_wanted = True
            self._reindex_reason.add(reason)
            self._reindex_seq += 1
            self._cond.notify_all()
            return self._reindex_seq

    def wait_sync(self, ticket: int, timeout: float | None = None) -> Run:
        """Block until a sync (or rebuild) that started after `ticket` was issued has finished."""
        return self._wait(lambda: self._sync_done >= ticket, ("sync", "reindex"), timeout)

    def wait_reindex(self, ticket: int, timeout: float | None = None) -> Run:
        return self._wait(lambda: self._reindex_done >= ticket, ("reindex",), timeout)

    def _wait(self, done: Callable[[], bool], kinds: tuple[str, ...], timeout: float | None) -> Run:
        with self._cond:
            if not self._cond.wait_for(lambda: done() or self._stopping, timeout):
                raise IndexUnavailable(f"the sync did not finish within {timeout:g}s; it continues in the background")
            if not done():
                raise IndexUnavailable("the daemon is shutting down")
            runs = [self._last[k] for k in kinds if k in self._last]
            return max(runs, key=lambda r: r.started_at)

    def pending(self) -> frozenset[str] | None:
        """Index keys queued or being synced; None while a full pass is queued or running."""
        with self._cond:
            if self._sync_full or self._reindex_wanted or self._inflight is None:
                return None
            return frozenset(self._sync_paths | self._inflight)

    def state(self) -> dict[str, object]:
        with self._cond:
            latest = max(self._last.values(), key=lambda r: r.started_at, default=None)
            failed = latest is not None and latest.error is not None
            return {
                "running": self._running,
                "queued": {"sync": self._sync_wanted, "reindex": self._reindex_wanted},
                "runs": dict(self.counts),
                "last": {kind: run.as_dict() for kind, run in self._last.items()},
                "last_error": f"{latest.kind}: {latest.error}" if failed and latest is not None else None,
            }

    # -- the thread --------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                job = self._next_job()
                if job is None:
                    return
                kind, reason, paths, sync_upto, reindex_upto = job
                self._running = kind
                self._inflight = paths
            run = self._execute(kind, reason, paths)
            with self._cond:
                self._running = None
                self._inflight = frozenset()
                self._last[kind] = run
                self.counts[kind] += 1
                if run.error is not None:
                    self.counts["failed"] += 1
                self._after(run, sync_upto, reindex_upto)
                self._cond.notify_all()
            self._report(run)

    def _next_job(self) -> tuple[str, str, frozenset[str] | None, int, int] | None:
        """Wait (under the lock) for runnable work: rebuild, then sync."""
        while not self._stopping:
            now = time.monotonic()
            if self._reindex_wanted:
                reason = "+".join(sorted(self._reindex_reason))
                self._reindex_wanted = self._sync_wanted = False
                self._reindex_reason.clear()
                self._take_sync_paths()
                return "reindex", reason, None, self._sync_seq, self._reindex_seq
            if self._sync_wanted and now >= self._sync_not_before:
                reason = "+".join(sorted(self._sync_reason)) or "retry"
                self._sync_wanted = False
                return "sync", reason, self._take_sync_paths(), self._sync_seq, self._reindex_done
            self._cond.wait(max(0.0, self._sync_not_before - now) if self._sync_wanted else None)
        return None

    def _take_sync_paths(self) -> frozenset[str] | None:
        paths = None if self._sync_full else frozenset(self._sync_paths)
        self._sync_reason.clear()
        self._sync_paths.clear()
        self._sync_full = False
        return paths

    def _after(self, run: Run, sync_upto: int, reindex_upto: int) -> None:
        if run.cancelled:
            return  # stopped half-way: its waiters hear "shutting down", not "done"
        self._sync_done = max(self._sync_done, sync_upto)
        if run.kind == "reindex":
            self._reindex_done = max(self._reindex_done, reindex_upto)
        if run.error is not None:
            self._sync_wanted = True
            self._sync_full = True  # whatever the failed run was to do, a full pass redoes it
            self._sync_reason.add("retry")
            self._sync_not_before = time.monotonic() + self._retry.next()
        else:
            self._retry.reset()

    def _execute(self, kind: str, reason: str, paths: frozenset[str] | None) -> Run:
        run = Run(kind, reason, targeted=None if paths is None else len(paths))
        started = time.perf_counter()
        try:
            index = self._index()
            if kind == "sync":
                run.report = index.sync(embed=False, progress=self._check_stop, paths=paths)
            else:
                run.report = index.reindex(embed=False, progress=self._check_stop)
        except _Cancelled:
            run.cancelled = True
        except ClawmemError as exc:
            run.error = exc
        except Exception as exc:  # a bug or an I/O failure: log it whole, keep the daemon serving
            self._log.exception("writer_failed", kind=kind)
            run.error = ClawmemError(f"{kind} failed: {type(exc).__name__}: {exc}")
        run.duration = time.perf_counter() - started
        self._log_run(run)
        return run

    def _check_stop(self, done: int, total: int) -> None:
        if self._stopping:
            raise _Cancelled
        if self._on_progress is not None:
            self._on_progress(done, total)

    def _log_run(self, run: Run) -> None:
        fields: dict[str, object] = {"reason": run.reason, "duration": round(run.duration, 4)}
        if run.kind == "sync":
            fields["paths"] = "all" if run.targeted is None else run.targeted
        if run.report is not None:
            fields.update(run.report.as_dict())
            fields["duration"] = round(run.duration, 4)
        if run.cancelled:
            fields["cancelled"] = True
        if run.error is not None:
            self._log.warning(run.kind, error=str(run.error), error_type=type(run.error).__name__, **fields)
        else:
            self._log.info(run.kind, **fields)
