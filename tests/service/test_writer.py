"""The single writer thread: coalescing, waiting, cooperative stop, retries."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import RecordingLog, wait_until

from clawmem_index.engine.sync import SyncReport
from clawmem_index.errors import IndexBusy, IndexUnavailable
from clawmem_index.service.writer import Writer


class StubIndex:
    """Stands in for MemoryIndex: a sync walks `files` "files", reporting progress after each one.

    `gate` (when set) holds every sync at its start until the test lets it go.
    """

    def __init__(self, files: int = 3, per_file: float = 0.0) -> None:
        self.files = files
        self.per_file = per_file
        self.gate: threading.Event | None = None
        self.started = threading.Event()
        self.syncs = 0
        self.reindexes = 0
        self.committed = 0
        self.fail_with: Exception | None = None
        self.provider = None
        self.path = Path("/nonexistent/clawmem-stub/index.sqlite")
        self.paths: list[frozenset[str] | None] = []

    def _walk(self, progress: Any) -> SyncReport:
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail_with is not None:
            raise self.fail_with
        report = SyncReport(files_seen=self.files)
        progress(0, self.files)
        for i in range(self.files):
            time.sleep(self.per_file)
            self.committed += 1  # "one file's transaction committed"
            progress(i + 1, self.files)
        return report

    def sync(self, *, embed: bool, progress: Any, paths: frozenset[str] | None = None) -> SyncReport:
        assert embed is False, "the daemon embeds in a separate pass"
        self.syncs += 1
        self.paths.append(paths)
        return self._walk(progress)

    def reindex(self, *, embed: bool, progress: Any) -> SyncReport:
        self.reindexes += 1
        return self._walk(progress)


@pytest.fixture
def stub() -> StubIndex:
    return StubIndex()


@pytest.fixture
def writer(stub: StubIndex) -> Iterator[Writer]:
    w = Writer(lambda: stub, log=RecordingLog(), retry_delay=0.1, max_retry_delay=0.4)  # type: ignore[arg-type,return-value]
    w.start()
    yield w
    w.stop(5)


def test_requests_during_a_sync_coalesce_into_one_follow_up(writer: Writer, stub: StubIndex) -> None:
    stub.gate = threading.Event()
    first = writer.request_sync("startup")
    assert stub.started.wait(5)
    tickets = [writer.request_sync("change") for _ in range(10)]
    stub.gate.set()
    run = writer.wait_sync(tickets[-1], timeout=10)
    assert run.error is None and run.reason == "change"
    assert writer.wait_sync(first, timeout=1).kind == "sync"
    assert stub.syncs == 2  # the one in flight, then one for all ten requests
    assert writer.counts["sync"] == 2


def test_targeted_requests_merge_and_a_full_one_wins(writer: Writer, stub: StubIndex) -> None:
    stub.gate = threading.Event()
    writer.request_sync("startup")
    assert stub.started.wait(5)
    assert writer.pending() is None  # a full pass is running: nobody knows what is pending
    writer.request_sync("change", frozenset({"memory/a.md"}))
    ticket = writer.request_sync("change", frozenset({"memory/b.md", "MEMORY.md"}))
    stub.gate.set()
    writer.wait_sync(ticket, timeout=5)
    assert stub.paths == [None, {"memory/a.md", "memory/b.md", "MEMORY.md"}]
    assert writer.pending() == frozenset()

    stub.gate.clear()
    stub.started.clear()
    writer.request_sync("change", frozenset({"memory/c.md"}))
    assert stub.started.wait(5)
    assert writer.pending() == {"memory/c.md"}  # in flight still counts as pending
    writer.request_sync("change", frozenset({"memory/d.md"}))
    ticket = writer.request_sync("client")
    assert writer.pending() is None
    stub.gate.set()
    writer.wait_sync(ticket, timeout=5)
    assert stub.paths[2:] == [{"memory/c.md"}, None]


def test_a_waiter_gets_a_run_that_started_after_its_request(writer: Writer, stub: StubIndex) -> None:
    stub.gate = threading.Event()
    writer.request_sync("startup")
    assert stub.started.wait(5)
    ticket = writer.request_sync("client")
    stub.gate.set()
    run = writer.wait_sync(ticket, timeout=10)
    assert run.reason == "client"
    assert stub.syncs == 2


def test_stop_ends_after_the_transaction_in_flight(stub: StubIndex) -> None:
    stub.files, stub.per_file = 1000, 0.01
    writer = Writer(lambda: stub, log=RecordingLog())  # type: ignore[arg-type,return-value]
    writer.start()
    ticket = writer.request_sync("startup")
    wait_until(lambda: stub.committed >= 5, message="the sync to be under way")
    started = time.monotonic()
    waiter_error: list[Exception] = []

    def waiter() -> None:
        try:
            writer.wait_sync(ticket, timeout=10)
        except IndexUnavailable as exc:
            waiter_error.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    assert writer.stop(5)
    t.join(5)
    assert time.monotonic() - started < 4.0  # not the remaining ~10 s of the sync (room for a loaded machine)
    assert 5 <= stub.committed < 1000
    last = writer.state()["last"]["sync"]  # type: ignore[index]
    assert last["cancelled"] is True
    assert waiter_error and "shutting down" in str(waiter_error[0])


def test_a_failed_sync_is_reported_and_retried(writer: Writer, stub: StubIndex) -> None:
    stub.fail_with = IndexBusy("another clawmem process is writing")
    ticket = writer.request_sync("startup")
    run = writer.wait_sync(ticket, timeout=5)
    assert isinstance(run.error, IndexBusy)
    assert writer.state()["last_error"] == "sync: another clawmem process is writing"
    stub.fail_with = None
    wait_until(lambda: writer.counts["sync"] >= 2 and writer.state()["last_error"] is None,
               message="the automatic retry")
    assert writer.state()["last"]["sync"]["reason"] == "retry"  # type: ignore[index]


def test_an_unexpected_exception_does_not_kill_the_writer(writer: Writer, stub: StubIndex) -> None:
    stub.fail_with = RuntimeError("bug")
    run = writer.wait_sync(writer.request_sync("startup"), timeout=5)
    assert run.error is not None and "RuntimeError: bug" in str(run.error)
    stub.fail_with = None
    assert writer.wait_sync(writer.request_sync("client"), timeout=5).error is None
    assert writer.alive()


def test_a_reindex_supersedes_queued_syncs(writer: Writer, stub: StubIndex) -> None:
    stub.gate = threading.Event()
    writer.request_sync("startup")
    assert stub.started.wait(5)
    sync_ticket = writer.request_sync("change")
    reindex_ticket = writer.request_reindex("client")
    stub.gate.set()
    assert writer.wait_reindex(reindex_ticket, timeout=5).kind == "reindex"
    assert writer.wait_sync(sync_ticket, timeout=5).kind == "reindex"  # the rebuild covered it
    assert (stub.syncs, stub.reindexes) == (1, 1)


def test_wait_with_a_timeout(writer: Writer, stub: StubIndex) -> None:
    stub.gate = threading.Event()
    ticket = writer.request_sync("startup")
    with pytest.raises(IndexUnavailable, match="did not finish within"):
        writer.wait_sync(ticket, timeout=0.1)
    stub.gate.set()
