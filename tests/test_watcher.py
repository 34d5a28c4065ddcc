"""The watcher alone: real file events in a tmp workspace turned into debounced sync signals."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import RecordingLog, wait_until
from watchdog.events import (
    DirCreatedEvent,
    DirModifiedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileClosedNoWriteEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileOpenedEvent,
)
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from clawmem.watcher import Debounce, WorkspaceWatcher

DEBOUNCE = 0.2
# watchdog warns from its reader thread when nested folders appear faster than it adds watches;
# under this suite's warnings-as-errors that would kill the thread (`clawmem serve` ignores it too).
pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")


class Signals:
    """Collects on_sync calls; `wait_new` polls (with a deadline) for the next one."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.paths: list[frozenset[str] | None] = []
        self.times: list[float] = []
        self._lock = threading.Lock()
        self._event = threading.Event()

    def __call__(self, reason: str, paths: frozenset[str] | None) -> None:
        with self._lock:
            self.reasons.append(reason)
            self.paths.append(paths)
            self.times.append(time.monotonic())
        self._event.set()

    def count(self) -> int:
        with self._lock:
            return len(self.reasons)

    def wait_new(self, after: int, timeout: float = 5.0) -> str:
        wait_until(lambda: self.count() > after, timeout=timeout, message=f"sync signal #{after + 1}")
        return self.reasons[after]

    def quiet_for(self, after: int, seconds: float) -> bool:
        """True if no new signal came within `seconds` (a negative check needs a bounded wait)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.count() > after:
                return False
            time.sleep(0.02)
        return True


@pytest.fixture
def signals() -> Signals:
    return Signals()


@pytest.fixture
def watched(workspace: Path, signals: Signals) -> Iterator[WorkspaceWatcher]:
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0,
                               log=RecordingLog())
    watcher.start()
    yield watcher
    watcher.stop()


# -- the timing rule --------------------------------------------------------------------------


def test_debounce_is_trailing_with_a_ceiling() -> None:
    d = Debounce(delay=1.0, max_delay=3.0)
    assert d.due() is None
    d.poke(10.0)
    assert d.due() == 11.0
    d.poke(10.5)
    assert d.due() == 11.5  # trailing: each event pushes the deadline
    for t in (11.0, 11.5, 12.0, 12.5):
        d.poke(t)
    assert d.due() == 13.0  # but never later than first + max_delay
    d.reset()
    assert d.due() is None


# -- which events count -----------------------------------------------------------------------


def test_relevance_follows_the_memory_rules(workspace: Path, signals: Signals) -> None:
    w = WorkspaceWatcher(workspace, signals, extra_paths=("notes", str(workspace.parent / "outside")))
    ws = str(workspace)
    counted = [
        FileCreatedEvent(f"{ws}/MEMORY.md"),
        FileModifiedEvent(f"{ws}/memory/2026-01-01.md"),
        FileClosedEvent(f"{ws}/memory/deep/er/x.md"),
        FileDeletedEvent(f"{ws}/memory/gone.md"),
        FileMovedEvent(f"{ws}/memory/.x.md.swp", f"{ws}/memory/x.md"),  # editor saves by rename
        FileMovedEvent(f"{ws}/memory/x.md", f"{ws}/trash/x.md"),  # moved away: it left the index
        DirCreatedEvent(f"{ws}/memory/new"),
        DirMovedEvent(f"{ws}/incoming", f"{ws}/memory/incoming"),
        DirCreatedEvent(f"{ws}/memory"),
        FileCreatedEvent(f"{ws}/notes/a.md"),
        FileCreatedEvent(f"{workspace.parent}/outside/b.md"),
        FileMovedEvent(f"{ws}/memory/a.md", f"{ws}/memory/a.md~"),  # the source left the index
    ]
    ignored = [
        FileOpenedEvent(f"{ws}/memory/a.md"),  # our own sync reads files: opening must not count
        FileClosedNoWriteEvent(f"{ws}/memory/a.md"),
        DirModifiedEvent(f"{ws}/memory"),
        FileCreatedEvent(f"{ws}/memory/a.txt"),
        FileCreatedEvent(f"{ws}/memory/.hidden.md"),
        FileCreatedEvent(f"{ws}/memory/.git/x.md"),
        FileCreatedEvent(f"{ws}/memory/node_modules/x.md"),
        FileCreatedEvent(f"{ws}/README.md"),
        FileCreatedEvent(f"{ws}/other/x.md"),
        DirCreatedEvent(f"{ws}/other"),
        FileCreatedEvent(f"{workspace.parent}/elsewhere/c.md"),
    ]
    assert [e for e in counted if not w.relevant(e)] == []
    assert [e for e in ignored if w.relevant(e)] == []


def test_events_name_the_index_keys_they_change(workspace: Path, signals: Signals) -> None:
    w = WorkspaceWatcher(workspace, signals, extra_paths=("notes", str(workspace.parent / "outside")))
    ws = str(workspace)
    assert w.affected(FileMovedEvent(f"{ws}/memory/.x.md.swp", f"{ws}/memory/x.md")) == {"memory/x.md"}
    assert w.affected(FileMovedEvent(f"{ws}/memory/a.md", f"{ws}/memory/b.md")) == {"memory/a.md", "memory/b.md"}
    assert w.affected(FileCreatedEvent(f"{ws}/notes/a.md")) == {"notes/a.md"}
    assert w.affected(FileCreatedEvent(f"{ws}/README.md")) == frozenset()
    assert w.affected(DirCreatedEvent(f"{ws}/memory/new")) is None  # what is inside is unknown
    assert w.affected(FileCreatedEvent(f"{workspace.parent}/outside/b.md")) is None  # keyed by absolute path


# -- real events ------------------------------------------------------------------------------


def test_each_kind_of_edit_signals_once_debounced(workspace: Path, watched: WorkspaceWatcher,
                                                  signals: Signals) -> None:
    note = workspace / "memory" / "note.md"
    n = signals.count()
    started = time.monotonic()
    note.write_text("created\n")
    assert signals.wait_new(n, timeout=DEBOUNCE + 3) == "change"
    assert signals.times[n] - started >= DEBOUNCE * 0.9  # trailing: not before the debounce
    assert signals.paths[n] == {"memory/note.md"}  # just that file needs syncing

    def append() -> None:
        with note.open("a") as fh:
            fh.write("more\n")

    def atomic_rename() -> None:
        tmp = workspace / "memory" / ".note.md.tmp"
        tmp.write_text("renamed\n")
        os.replace(tmp, note)

    def nested_folder() -> None:
        (workspace / "memory" / "a" / "b").mkdir(parents=True)
        (workspace / "memory" / "a" / "b" / "deep.md").write_text("deep\n")

    steps: list[tuple[str, Any, frozenset[str] | None]] = [
        ("modify in place", lambda: note.write_text("modified\n"), {"memory/note.md"}),
        ("append", append, {"memory/note.md"}),
        ("atomic rename", atomic_rename, {"memory/note.md"}),  # the hidden temp file is not memory
        ("delete", note.unlink, {"memory/note.md"}),
        ("nested folder", nested_folder, None),  # files may be in it unannounced: a full pass
        ("MEMORY.md", lambda: (workspace / "MEMORY.md").write_text("# top\n"), {"MEMORY.md"}),
    ]
    for label, action, paths in steps:
        n = signals.count()
        action()
        assert signals.wait_new(n, timeout=DEBOUNCE + 3), label
        assert signals.paths[n] == paths, label


def test_a_folder_moved_into_memory_counts(workspace: Path, watched: WorkspaceWatcher, signals: Signals) -> None:
    staging = workspace / "staging"
    staging.mkdir()
    (staging / "x.md").write_text("x\n")
    n = signals.count()
    os.rename(staging, workspace / "memory" / "imported")
    signals.wait_new(n)
    assert signals.paths[n] is None


def test_irrelevant_writes_and_reads_do_not_signal(workspace: Path, watched: WorkspaceWatcher,
                                                   signals: Signals) -> None:
    (workspace / "memory" / "a.md").write_text("a\n")
    n = signals.wait_new(0) and signals.count()
    (workspace / "README.md").write_text("not memory\n")
    (workspace / "memory" / "a.txt").write_text("not markdown\n")
    (workspace / "memory" / ".draft.md").write_text("hidden\n")
    (workspace / "memory" / "a.md").read_text()  # a sync reads files: that must not loop
    assert signals.quiet_for(n, DEBOUNCE * 4)


def test_a_thousand_rapid_writes_give_few_signals(workspace: Path, watched: WorkspaceWatcher,
                                                  signals: Signals) -> None:
    note = workspace / "memory" / "busy.md"
    started = time.monotonic()
    for i in range(1000):
        note.write_text(f"line {i}\n")
    elapsed = time.monotonic() - started
    first = signals.wait_new(0)
    assert first == "change"
    signals.quiet_for(1, DEBOUNCE * 3)
    # One signal per max_delay (1 s) of writing at most, plus the trailing one.
    assert 1 <= signals.count() <= int(elapsed / 1.0) + 2


def test_a_continuous_stream_still_signals_within_max_delay(workspace: Path, signals: Signals) -> None:
    watcher = WorkspaceWatcher(workspace, signals, debounce=0.3, max_delay=0.6, rescan_interval=0)
    watcher.start()
    try:
        note = workspace / "memory" / "stream.md"
        started = time.monotonic()
        while signals.count() == 0 and time.monotonic() - started < 5.0:
            note.write_text(f"{time.monotonic()}\n")  # a write every 50 ms never lets the debounce expire
            time.sleep(0.05)
        assert signals.count() >= 1
        assert signals.times[0] - started < 0.6 + 1.0
    finally:
        watcher.stop()


def test_periodic_rescan_without_events(workspace: Path, signals: Signals) -> None:
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0.3)
    watcher.start()
    try:
        assert signals.wait_new(0, timeout=3.0) == "rescan"
        assert signals.wait_new(1, timeout=3.0) == "rescan"
        assert signals.paths[:2] == [None, None]
    finally:
        watcher.stop()


def test_no_signals_after_stop(workspace: Path, signals: Signals) -> None:
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0)
    watcher.start()
    watcher.stop()
    assert watcher.mode == "stopped"
    (workspace / "memory" / "late.md").write_text("late\n")
    assert signals.quiet_for(0, DEBOUNCE * 3)
    assert not any(t.name == "clawmem-watcher" for t in threading.enumerate())


# -- when inotify fails -----------------------------------------------------------------------


class _ExhaustedObserver(Observer):  # type: ignore[misc,valid-type]
    """An inotify observer on a machine out of watches (what schedule() raises at the limit)."""

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "inotify watch limit reached")


def test_watch_limit_falls_back_to_polling_and_rescans(workspace: Path, signals: Signals) -> None:
    log = RecordingLog()
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0,
                               observer_factory=_ExhaustedObserver,
                               polling_factory=lambda: PollingObserver(timeout=0.1), log=log)
    watcher.start()
    try:
        assert watcher.mode == "polling"
        assert log.events("watch_limit"), "the fallback must be logged"
        assert signals.wait_new(0) == "fallback"  # a full rescan: events may have been missed
        assert signals.paths[0] is None
        n = signals.count()
        (workspace / "memory" / "seen-by-polling.md").write_text("x\n")
        assert signals.wait_new(n) == "change"
    finally:
        watcher.stop()


def test_other_start_errors_are_not_hidden(workspace: Path, signals: Signals) -> None:
    class Broken(Observer):  # type: ignore[misc,valid-type]
        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            raise OSError(errno.EACCES, "permission denied")

    watcher = WorkspaceWatcher(workspace, signals, observer_factory=Broken)
    with pytest.raises(OSError):
        watcher.start()


def test_an_overflow_reported_by_watchdog_asks_for_a_rescan(workspace: Path, watched: WorkspaceWatcher,
                                                            signals: Signals) -> None:
    # watchdog >= 7 handles IN_Q_OVERFLOW itself and reports it only with this log line.
    logging.getLogger("watchdog.observers.inotify_c").warning("Inotify queue overflowed; filesystem events were lost")
    assert signals.wait_new(0) == "overflow"
    assert signals.paths[0] is None  # events were lost: only a full pass can tell
    assert watched.mode == "inotify"  # watchdog rebuilt its watches: keep inotify


def test_watches_that_cannot_be_rebuilt_switch_to_polling(workspace: Path, signals: Signals) -> None:
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0,
                               polling_factory=lambda: PollingObserver(timeout=0.1), log=RecordingLog())
    watcher.start()
    try:
        logging.getLogger("watchdog.observers.inotify").error("Unable to rebuild recursive inotify watches below x")
        assert signals.wait_new(0) == "fallback"
        assert watcher.mode == "polling"
        n = signals.count()
        (workspace / "memory" / "after.md").write_text("x\n")
        assert signals.wait_new(n) == "change"
    finally:
        watcher.stop()


def test_a_dead_observer_is_replaced_by_polling(workspace: Path, signals: Signals) -> None:
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0,
                               polling_factory=lambda: PollingObserver(timeout=0.1), health_interval=0.1,
                               log=RecordingLog())
    watcher.start()
    try:
        observer = watcher._observer
        assert observer is not None
        observer.stop()  # as if its thread had died
        observer.join()
        assert signals.wait_new(0) == "fallback"
        assert watcher.mode == "polling"
    finally:
        watcher.stop()
