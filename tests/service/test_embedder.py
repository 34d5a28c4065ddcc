"""The daemon's embedding thread: vectors after keyword rows, retries, and never in the writer's way."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from daemon_helpers import RecordingLog, wait_until

from clawmem_index.config import Settings
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import ProviderError
from clawmem_index.service.embedder import Embedder, progress_report
from clawmem_index.service.writer import Run, Writer


@contextmanager
def threads(index: MemoryIndex, **embedder_options: Any) -> Iterator[tuple[Writer, Embedder, RecordingLog]]:
    """A writer and an embedder wired as the daemon wires them: every good keyword run wakes the embedder."""
    log = RecordingLog()
    embedder = Embedder(lambda: index, log=log, **embedder_options)

    def on_run(run: Run) -> None:
        if run.error is None:
            embedder.wake()

    writer = Writer(lambda: index, log=log, on_run=on_run)
    writer.start()
    embedder.start()
    try:
        yield writer, embedder, log
    finally:
        writer.stop(5)
        embedder.stop(5)
        index.close()


def test_embeddings_follow_the_keyword_rows_and_are_retried_after_a_failure(settings: Settings, write: Any) -> None:
    write("memory/a.md", "# A\nalpha beta\n")
    write("memory/b.md", "# B\ngamma delta\n")
    provider = FakeProvider(dims=16, fail=True)
    index = MemoryIndex(settings, provider=provider)
    with threads(index, retry_delay=0.1, max_retry_delay=0.2) as (writer, embedder, log):
        run = writer.wait_sync(writer.request_sync("startup"), timeout=10)
        assert run.error is None and run.report is not None and run.report.added == 2
        assert index.status()["pending_embeddings"] == 2  # keyword rows first
        wait_until(lambda: embedder.counts["failed"] >= 1, message="the failing embedding pass")
        assert "fake provider is down" in str(embedder.state()["last_error"])
        assert index.status()["pending_embeddings"] == 2  # nothing lost
        provider.fail = False
        wait_until(lambda: index.status()["pending_embeddings"] == 0 and embedder.state()["last_error"] is None,
                   message="the retried embedding pass")
        assert provider.documents_embedded == 2
        assert any(e.get("embedded") == 2 for e in log.events("embed"))


class StuckProvider(FakeProvider):
    """A provider that accepts a batch and does not answer until the test lets it."""

    def __init__(self) -> None:
        super().__init__(dims=16)
        self.release = threading.Event()
        self.entered = threading.Event()

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        self.entered.set()
        if not self.release.wait(30):
            raise ProviderError("never released")
        return super().embed_documents(texts)


def test_keyword_syncs_never_wait_for_a_stuck_provider(settings: Settings, write: Any) -> None:
    write("memory/a.md", "# A\nalpha\n")
    provider = StuckProvider()
    index = MemoryIndex(settings, provider=provider)
    with threads(index) as (writer, embedder, _):
        writer.wait_sync(writer.request_sync("startup"), timeout=10)
        wait_until(provider.entered.is_set, message="the provider call")
        for n in range(3):  # edits while the provider holds the embedding thread
            write(f"memory/new{n}.md", f"# New\nnote number {n}\n")
            run = writer.wait_sync(writer.request_sync("change"), timeout=10)
            assert run.error is None and run.report is not None and run.report.added == 1
        assert index.status()["pending_embeddings"] == 4 and embedder.state()["running"]
        provider.release.set()
        wait_until(lambda: index.status()["pending_embeddings"] == 0, message="the vectors after the release")


def test_a_reindex_keeps_every_vector_and_asks_the_provider_for_none(settings: Settings, write: Any) -> None:
    write("memory/a.md", "# A\nalpha beta\n")
    write("memory/b.md", "# B\ngamma delta\n")
    provider = FakeProvider(dims=16)
    MemoryIndex(settings, provider=provider).sync()
    calls = provider.document_calls
    index = MemoryIndex(settings, provider=provider)
    at_swap: list[object] = []
    with threads(index) as (writer, _, _):
        run = writer.wait_reindex(writer.request_reindex("client"), timeout=20)
        at_swap.append(index.status()["pending_embeddings"])
        assert run.error is None and run.report is not None and (run.report.embedded, run.report.from_cache) == (0, 2)
    assert at_swap == [0] and provider.document_calls == calls


def test_a_model_change_rebuilds_without_waiting_for_the_new_model(settings: Settings, write: Any) -> None:
    """The swap takes only cached vectors; the new model's vectors follow, and going back embeds nothing."""
    write("memory/a.md", "# A\nalpha beta\n")
    old = FakeProvider(dims=16, model="old")
    MemoryIndex(settings, provider=old).sync()
    new = StuckProvider()
    index = MemoryIndex(settings, provider=new)
    with threads(index) as (writer, _, _):
        run = writer.wait_sync(writer.request_sync("reload"), timeout=20)
        assert run.error is None
        status = index.status()
        assert status["model"] == "fake-1" and status["pending_embeddings"] == 1  # live, vectors to come
        new.release.set()
        wait_until(lambda: index.status()["pending_embeddings"] == 0, message="the new model's vectors")
    calls = old.document_calls
    back = MemoryIndex(settings, provider=old)
    report = back.sync()
    assert back.status()["model"] == "old" and back.status()["pending_embeddings"] == 0
    assert old.document_calls == calls and (report.embedded, report.from_cache) == (0, 1)  # the cache carried over
    back.close()


def test_no_provider_means_no_embedding_work(settings: Settings, write: Any) -> None:
    write("memory/a.md", "# A\nalpha\n")
    index = MemoryIndex(settings)
    with threads(index) as (writer, embedder, log):
        writer.wait_sync(writer.request_sync("startup"), timeout=10)
        wait_until(lambda: embedder.counts["embed"] >= 1 and not embedder.state()["running"],
                   message="the embedder to look")
        assert embedder.counts["failed"] == 0 and log.events("embed") == []


class ColdProvider(FakeProvider):
    """A provider with something to load before its first call, as the local model and the remote SDKs have."""

    def __init__(self) -> None:
        super().__init__(dims=16)
        self.warmed = threading.Event()

    def warm(self) -> None:
        self.warmed.set()


def test_the_embedding_thread_warms_the_provider_off_the_query_path(settings: Settings, write: Any) -> None:
    write("memory/a.md", "# A\nalpha beta\n")
    provider = ColdProvider()
    index = MemoryIndex(settings, provider=provider)
    with threads(index) as (writer, _embedder, _log):
        writer.wait_sync(writer.request_sync("startup"), timeout=10)
        wait_until(lambda: index.status()["pending_embeddings"] == 0, message="the embedding pass")
        writer.wait_sync(writer.request_sync("again"), timeout=10)  # nothing to embed: still warmed
        assert provider.warmed.wait(10)
        assert provider.query_calls == 0


class ReleasedProvider(FakeProvider):
    """A provider a reload released while a pass held it (as IsolatedProvider.close does)."""

    closed = True

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        raise ProviderError("the local model process was released")


def test_a_pass_whose_provider_a_reload_released_goes_again_at_once_with_the_new_index(settings: Settings,
                                                                                    write: Any) -> None:
    write("memory/a.md", "# A\nalpha beta\n")
    released = MemoryIndex(settings, provider=ReleasedProvider(dims=16))
    released.sync()
    current = MemoryIndex(settings, provider=FakeProvider(dims=16))
    indexes = iter([released])  # the first pass sees the old index, every later one the new

    log = RecordingLog()
    embedder = Embedder(lambda: next(indexes, current), log=log, retry_delay=60, max_retry_delay=60)
    embedder.start()
    try:
        embedder.wake()
        wait_until(lambda: current.status()["pending_embeddings"] == 0, timeout=20,
                   message="the new index's vectors, without a failure's 60 s backoff")
        assert embedder.counts["failed"] == 0 and embedder.state()["last_error"] is None
    finally:
        embedder.stop(5)
        released.close()
        current.close()


class GatedProvider(FakeProvider):
    """Answers its first call at once and holds every later one until the test lets it."""

    def __init__(self) -> None:
        super().__init__(dims=16)
        self.release = threading.Event()

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        if self.document_calls >= 1 and not self.release.wait(30):
            raise ProviderError("never released")
        return super().embed_documents(texts)


def test_a_running_pass_reports_how_far_it_is_and_when_it_should_end(settings: Settings, write: Any) -> None:
    from clawmem_index.engine.embed import EMBED_BATCH, FIRST_BATCH

    for n in range(EMBED_BATCH + 6):
        write(f"memory/note-{n}.md", f"# Note {n}\nthe word number{n} alone\n")
    provider = GatedProvider()
    index = MemoryIndex(settings, provider=provider)
    with threads(index) as (writer, embedder, _):
        writer.wait_sync(writer.request_sync("startup"), timeout=10)
        wait_until(lambda: (embedder.state()["progress"] or {}).get("embedded") == FIRST_BATCH,
                   message="the first (small) batch stored")
        progress = embedder.state()["progress"]
        assert isinstance(progress, dict) and progress["of"] == EMBED_BATCH + 6
        assert progress["per_second"] > 0 and progress["eta_seconds"] >= 0
        provider.release.set()
        wait_until(lambda: index.status()["pending_embeddings"] == 0 and not embedder.state()["running"],
                   message="the rest of the pass")
        assert embedder.state()["progress"] is None  # nothing running, nothing to report


def test_the_rate_is_the_last_stored_batchs_and_the_eta_counts_down_between_batches() -> None:
    """64 of 128 stored 10 s into the pass: 6.4 a second; 2 s later 8 s are left, not a rate that sinks."""
    assert progress_report(64, 128, 100.0, 110.0, 110.0) == {"embedded": 64, "of": 128, "per_second": 6.4,
                                                               "eta_seconds": 10}
    assert progress_report(64, 128, 100.0, 110.0, 112.0)["eta_seconds"] == 8
    assert progress_report(64, 128, 100.0, 110.0, 125.0)["eta_seconds"] == 0  # late: never negative
    assert progress_report(0, 128, 100.0, 100.0, 130.0) == {"embedded": 0, "of": 128, "per_second": None,
                                                             "eta_seconds": None}  # no batch yet: no guess
