"""The daemon's embedding thread: vectors for pending chunks, made beside the keyword writer.

Keyword rows land first, on the writer thread, so a new note is searchable as soon as its file is
synced. This thread gives the new chunks their vectors afterwards. Provider calls happen outside
every transaction and outside the writer's lock, so a slow, failing or hung provider delays
vectors and nothing else: keyword syncs, searches and `status` never wait for it. Each batch is
written in a short transaction that checks the index and the chunk are still the ones the vector
was made for. After a failure the pass is retried with backoff; pending chunks stay in the index
(across restarts too) until they get their vector.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from clawmem_index.errors import ClawmemError, ProviderError, ProviderReleased
from clawmem_index.service.worker import Backoff, IndexSource, Run, Worker

if TYPE_CHECKING:
    from clawmem_index.engine.core import MemoryIndex

__all__ = ["Embedder", "progress_report"]


def progress_report(done: int, total: int, started: float, stored_at: float, now: float) -> dict[str, object]:
    """How far an embedding pass is, its rate so far and when it should end at that rate.

    A first index or a new model can keep a local model busy for hours (20,000 notes: ~3 h on two
    cores); `status` says how long, not only how many chunks wait. The rate is taken at the last
    stored batch (`stored_at`), so it does not sink while the next batch is being made.
    """
    rate = done / (stored_at - started) if done and stored_at > started else None
    eta = max(0.0, (total - done) / rate - (now - stored_at)) if rate else None
    return {"embedded": done, "of": total, "per_second": round(rate, 1) if rate else None,
            "eta_seconds": round(eta) if eta is not None else None}


class Embedder(Worker):
    """Runs embedding passes on its own thread whenever `wake` says chunks may be waiting."""

    def __init__(self, index: IndexSource, *, log: Any, on_run: Callable[[Run], None] | None = None,
                 retry_delay: float = 30.0, max_retry_delay: float = 900.0) -> None:
        super().__init__("clawmem-embedder", log=log, on_run=on_run)
        self._index = index
        self._retry = Backoff(retry_delay, max_retry_delay)
        self._wanted = False
        self._not_before = 0.0  # a failed pass's backoff: a wake does not cut it short
        self._poll_at: float | None = None  # batch jobs are out: look at them then, if nothing wakes us sooner
        self._running = False
        self._last: Run | None = None
        self._last_failure: Run | None = None
        self.counts = {"embed": 0, "failed": 0}
        self._progress: tuple[int, int, float, float] | None = None  # (embedded, of, started, last stored at)

    def wake(self) -> None:
        """Chunks may wait for vectors (a sync added some): run a pass, now or when a failure's backoff ends.

        An edit does not cut a backoff short: a rate-limited provider is not asked again sooner.
        """
        with self._cond:
            self._wanted = True
            self._cond.notify_all()

    def state(self) -> dict[str, object]:
        with self._cond:
            failure = self._last_failure
            return {
                "running": self._running,
                "queued": self._wanted,
                "runs": dict(self.counts),
                "last": self._last.as_dict() if self._last is not None else None,
                "last_error": str(failure.error) if failure is not None and failure.error is not None else None,
                "retry_in": round(max(0.0, self._not_before - time.monotonic()), 1) if self._wanted else None,
                "progress": self._progress_report() if self._running else None,
            }

    def _progress_report(self) -> dict[str, object] | None:
        return None if self._progress is None else progress_report(*self._progress, time.monotonic())

    def _note_progress(self, done: int, total: int) -> None:
        with self._cond:
            started = self._progress[2] if self._progress is not None else time.monotonic()
            self._progress = (done, total, started, time.monotonic())

    # -- the thread --------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._due():
                    deadlines = [t for t in (self._not_before if self._wanted else None, self._poll_at)
                                 if t is not None]
                    delay = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
                    self._cond.wait(delay)
                if self._stopping:
                    return
                self._wanted = False
                self._poll_at = None
                self._running = True
            run = self._pass()
            with self._cond:
                self._running = False
                self._progress = None
                self._last = run
                self.counts["embed"] += 1
                if run.error is not None:
                    self.counts["failed"] += 1
                    self._last_failure = run
                    self._wanted = True
                    self._not_before = time.monotonic() + self._retry.next()
                else:
                    self._last_failure = None
                    self._retry.reset()
                    if run.poll_in is not None:
                        self._poll_at = time.monotonic() + run.poll_in
            self._log_run(run)
            self._report(run)

    def _due(self) -> bool:
        now = time.monotonic()
        return (self._wanted and now >= self._not_before) or (self._poll_at is not None and now >= self._poll_at)

    def _pass(self) -> Run:
        run = Run("embed", "pending")
        started = time.perf_counter()
        try:
            self._embed(self._index(), run)
        except ProviderReleased:  # a reload replaced the provider under this pass: go again now, with the new one
            run.poll_in = 0.0
        except ClawmemError as exc:
            run.error = exc
        except Exception as exc:  # a bug or an I/O failure: log it whole, keep the daemon serving
            self._log.exception("embedder_failed")
            run.error = ClawmemError(f"embedding failed: {type(exc).__name__}: {exc}")
        run.duration = time.perf_counter() - started
        return run

    def _embed(self, index: MemoryIndex, run: Run) -> None:
        from clawmem_index.engine.backfill import advance, covered
        from clawmem_index.engine.embed import embed_pending

        provider = index.provider
        if provider is None or not index.backend.exists():
            return
        fingerprint = index.fingerprint_json()
        store = index.open_writer()
        if store is None:
            return
        try:
            if store.meta.get("fingerprint") != fingerprint:
                return  # built for another model: the writer rebuilds it first, then wakes this thread
            provider.warm()  # load the model / SDK here, not inside the first query's deadline
            jobs = advance(store, provider, index.settings.batch, due_only=True)
            for note in jobs.failed:
                self._log.warning("batch_job", problem=note)
            if jobs.submitted:
                self._log.info("batch_job", submitted=jobs.submitted, chunks=jobs.waiting_chunks)
            with self._cond:
                now = time.monotonic()
                self._progress = (0, store.pending_embeddings(), now, now)
            run.embedded, error = embed_pending(
                store, provider, cache_max_entries=index.settings.embedding.cache_max_entries,
                fingerprint=fingerprint, should_stop=lambda: self._stopping, exclude=covered(store, provider),
                precision=index.precision, progress=self._note_progress)
            run.pending_embeddings = store.pending_embeddings()
            if jobs.busy:
                run.poll_in = index.settings.batch.poll_interval
        finally:
            store.close()
        if error is not None:
            if provider.closed:  # a reload released it under this pass: go again, with the new one
                run.poll_in = 0.0
            else:
                run.error = ProviderError(error)

    def _log_run(self, run: Run) -> None:
        fields = {"embedded": run.embedded, "pending_embeddings": run.pending_embeddings,
                  "duration": round(run.duration, 4)}
        if run.error is not None:
            self._log.warning("embed", error=str(run.error), error_type=type(run.error).__name__, **fields)
        elif run.embedded:
            self._log.info("embed", **fields)
