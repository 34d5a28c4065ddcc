"""The watcher alone: real file events in a tmp workspace turned into debounced sync signals."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import shutil
import sys
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
from watchdog.observers.polling import PollingObserver, PollingObserverVFS

from clawmem_index.service.watcher import Debounce, WorkspaceWatcher

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
    assert w.affected(FileModifiedEvent(f"{ws}/USER.md")) == {"USER.md"}
    assert w.affected(FileModifiedEvent(f"{ws}/users/dana/USER.md")) == {"users/dana/USER.md"}
    assert w.affected(FileModifiedEvent(f"{ws}/users/dana/notes.md")) == frozenset()
    assert w.affected(DirCreatedEvent(f"{ws}/users/dana")) is None  # it may hold a USER.md already
    assert w.affected(DirCreatedEvent(f"{ws}/users/dana/sub")) == frozenset()


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
    written = [time.monotonic()]
    for i in range(1000):
        note.write_text(f"line {i}\n")
        written.append(time.monotonic())
    elapsed = written[-1] - written[0]
    # A loaded machine may pause this loop for longer than the debounce: each such pause lets one
    # signal through, as it should.
    pauses = sum(later - earlier >= DEBOUNCE for earlier, later in itertools.pairwise(written))
    first = signals.wait_new(0)
    assert first == "change"
    signals.quiet_for(1, DEBOUNCE * 3)
    # One signal per max_delay (1 s) of writing and per pause at most, plus the trailing one.
    assert 1 <= signals.count() <= int(elapsed / 1.0) + pauses + 2, (signals.count(), elapsed, pauses)


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


# -- only memory is watched -------------------------------------------------------------------


class CountingWatcher(WorkspaceWatcher):
    """Keeps every event the observer delivers, before any filtering."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []
        self._seen_lock = threading.Lock()

    def _on_event(self, event: Any) -> None:
        with self._seen_lock:
            self.seen.extend(os.fsdecode(p) for p in (event.src_path, getattr(event, "dest_path", "")) if p)
        super()._on_event(event)

    def seen_under(self, folder: Path) -> list[str]:
        with self._seen_lock:
            return [p for p in self.seen if p.startswith(f"{folder}{os.sep}")]


def _folders(root: Path, width: int = 15, depth: int = 2) -> int:
    """A tree of width**depth leaf folders (a stand-in for node_modules or .git); returns how many folders."""
    made = 0
    level = [root]
    for _ in range(depth):
        level = [parent / f"d{i}" for parent in level for i in range(width)]
        for folder in level:
            folder.mkdir(parents=True)
            made += 1
    return made


def _inotify_watches() -> int:
    """Inotify watches this process holds, as the kernel counts them (one `inotify wd:` line each)."""
    total = 0
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            text = Path("/proc/self/fdinfo", fd).read_text()
        except OSError:
            continue
        total += sum(line.startswith("inotify wd:") for line in text.splitlines())
    return total


def _scheduled(watcher: WorkspaceWatcher) -> set[tuple[str, bool]]:
    observer = watcher._observer
    assert observer is not None
    return {(str(e.watch.path), e.watch.is_recursive) for e in observer.emitters}


def _signalled_by_event(signals: Signals, note: Path, key: str, attempts: int = 4) -> None:
    """Write `note` until a signal names `key` itself: a full pass would find it anyway, only an event names it.

    A write may coalesce with a full pass already pending (a folder just made): then it is written again.
    """
    start = signals.count()

    def named() -> bool:
        return any(p is not None and key in p for p in signals.paths[start:])

    for i in range(attempts):
        n = signals.count()
        note.write_text(f"revision {i}\n")
        signals.wait_new(n, timeout=DEBOUNCE + 5)  # no signal at all: the write was not seen
        if not named():
            signals.quiet_for(n + 1, DEBOUNCE * 3)  # the write's own signal may follow a pending one
        if named():
            return
    raise AssertionError(f"no signal named {key}: only full passes, so {note.parent} is not watched")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts inotify watches in /proc")
def test_code_trees_in_the_workspace_cost_no_watches_and_no_events(workspace: Path, signals: Signals) -> None:
    folders = _folders(workspace / "node_modules") + _folders(workspace / ".git" / "objects")
    (workspace / "memory" / "projects").mkdir()
    before = _inotify_watches()
    watcher = CountingWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0)
    watcher.start()
    try:
        assert watcher.mode == "inotify"
        ws = str(workspace)
        assert _scheduled(watcher) == {(ws, False), (f"{ws}/memory", True)}
        assert watcher.roots() == {(ws, False), (f"{ws}/memory", True)}
        # The root, memory/ and memory/projects: not one watch per folder of the code trees.
        assert _inotify_watches() - before == 3, f"{folders} folders in the code trees"
        (workspace / "node_modules" / "d3" / "d4" / "index.js").write_text("x\n")
        (workspace / "node_modules" / "d1" / "README.md").write_text("x\n")
        (workspace / ".git" / "objects" / "d2" / "d7" / "ab12").write_bytes(b"x")
        (workspace / "memory" / "projects" / "note.md").write_text("x\n")
        signals.wait_new(0)
        assert signals.paths == [frozenset({"memory/projects/note.md"})]
        assert watcher.seen_under(workspace / "node_modules") == []
        assert watcher.seen_under(workspace / ".git") == []
    finally:
        watcher.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts inotify watches in /proc")
def test_a_symlinked_memory_folder_is_not_followed(workspace: Path, tmp_path: Path, signals: Signals) -> None:
    elsewhere = tmp_path / "elsewhere"
    _folders(elsewhere, width=10, depth=2)
    (workspace / "memory").rmdir()
    (workspace / "memory").symlink_to(elsewhere, target_is_directory=True)
    before = _inotify_watches()
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0)
    watcher.start()
    try:
        assert watcher.roots() == {(str(workspace), False)}
        assert _inotify_watches() - before == 1
        (elsewhere / "d1" / "outside.md").write_text("x\n")
        assert signals.quiet_for(0, DEBOUNCE * 4)
    finally:
        watcher.stop()


def test_memory_created_after_start_is_watched(workspace: Path, signals: Signals) -> None:
    (workspace / "memory").rmdir()
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0)
    watcher.start()
    try:
        assert watcher.roots() == {(str(workspace), False)}
        (workspace / "memory").mkdir()
        signals.wait_new(0)
        assert signals.paths[0] is None  # what the new folder holds is unknown: a full pass
        _signalled_by_event(signals, workspace / "memory" / "note.md", "memory/note.md")
        (workspace / "memory" / "deep").mkdir()
        _signalled_by_event(signals, workspace / "memory" / "deep" / "er.md", "memory/deep/er.md")  # recursive
    finally:
        watcher.stop()


def test_user_profiles_are_watched_as_they_come(workspace: Path, signals: Signals) -> None:
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0)
    watcher.start()
    try:
        _signalled_by_event(signals, workspace / "USER.md", "USER.md")
        (workspace / "users" / "dana").mkdir(parents=True)  # the folder comes after the start
        _signalled_by_event(signals, workspace / "users" / "dana" / "USER.md", "users/dana/USER.md")
        # users/ and each person's folder are watched, not recursively: a code tree below them costs no watch.
        (workspace / "users" / "dana" / "src" / "deep").mkdir(parents=True)
        (workspace / "users" / "not a person").mkdir()
        roots = watcher.roots()
        assert (str(workspace / "users"), False) in roots and (str(workspace / "users" / "dana"), False) in roots
        assert not any(path.startswith(str(workspace / "users" / "dana") + "/") or "not a person" in path
                       for path, _ in roots)
    finally:
        watcher.stop()


def test_memory_renamed_into_place_is_watched(workspace: Path, signals: Signals) -> None:
    (workspace / "memory").rmdir()
    staging = workspace / "staging"
    (staging / "sub").mkdir(parents=True)
    (staging / "sub" / "old.md").write_text("x\n")
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0)
    watcher.start()
    try:
        os.rename(staging, workspace / "memory")
        signals.wait_new(0)
        assert signals.paths[0] is None  # its files were never announced
        _signalled_by_event(signals, workspace / "memory" / "sub" / "old.md", "memory/sub/old.md")
    finally:
        watcher.stop()


def test_memory_removed_and_recreated_is_watched_again(workspace: Path, signals: Signals) -> None:
    (workspace / "memory" / "a" / "b").mkdir(parents=True)
    (workspace / "memory" / "a" / "b" / "x.md").write_text("x\n")
    # Frequent health checks: the emitter watchdog stops with the folder must not look like a dead observer.
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0,
                               health_interval=0.05, log=RecordingLog())
    watcher.start()
    try:
        for _ in range(3):
            n = signals.count()
            shutil.rmtree(workspace / "memory")
            signals.wait_new(n)
            assert signals.paths[-1] is None
            wait_until(lambda: (str(workspace / "memory"), True) not in watcher.roots(), message="memory/ unwatched")
            n = signals.count()
            (workspace / "memory" / "a").mkdir(parents=True)
            signals.wait_new(n)
            _signalled_by_event(signals, workspace / "memory" / "a" / "new.md", "memory/a/new.md")
        assert watcher.mode == "inotify"
    finally:
        watcher.stop()


def test_memory_moved_away_is_no_longer_watched(workspace: Path, watched: WorkspaceWatcher,
                                                signals: Signals) -> None:
    # An inotify watch follows the folder: left in place it would report archive/ files as memory/ ones.
    (workspace / "memory" / "x.md").write_text("x\n")
    signals.wait_new(0)
    n = signals.count()
    os.rename(workspace / "memory", workspace / "archive")
    signals.wait_new(n)
    assert signals.paths[n] is None
    (workspace / "archive" / "x.md").write_text("changed in the archive\n")
    (workspace / "archive" / "y.md").write_text("new in the archive\n")
    _signalled_by_event(signals, workspace / "MEMORY.md", "MEMORY.md")
    assert [p for p in signals.paths[n:] if p is not None and p - {"MEMORY.md"}] == []
    os.rename(workspace / "archive", workspace / "memory")
    _signalled_by_event(signals, workspace / "memory" / "y.md", "memory/y.md")


def test_extra_paths_are_watched_as_their_own_roots(workspace: Path, tmp_path: Path, signals: Signals) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "docs" / "build").mkdir(parents=True)
    watcher = WorkspaceWatcher(workspace, signals, extra_paths=("notes", "docs/guide.md", "later/inbox", str(outside)),
                               debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0)
    watcher.start()
    try:
        ws = str(workspace)
        (workspace / "notes").mkdir()  # an extra folder that appears after start
        signals.wait_new(0)
        assert watcher.roots() == {(ws, False), (f"{ws}/memory", True), (f"{ws}/notes", True),
                                   (f"{ws}/docs", False), (str(outside), True)}
        _signalled_by_event(signals, workspace / "notes" / "a.md", "notes/a.md")
        _signalled_by_event(signals, workspace / "docs" / "guide.md", "docs/guide.md")
        n = signals.count()
        (workspace / "docs" / "build" / "page.md").write_text("x\n")  # the file's folder is not watched below
        (workspace / "docs" / "other.md").write_text("x\n")  # nor any other file in it
        assert signals.quiet_for(n, DEBOUNCE * 4)
        (outside / "b.md").write_text("x\n")
        signals.wait_new(n)
        assert signals.paths[n] is None  # outside the workspace: keyed by absolute path, a full pass
        # A nested extra folder appears below a folder made after start: its parent is scheduled in turn.
        (workspace / "later" / "inbox").mkdir(parents=True)
        wait_until(lambda: (f"{ws}/later/inbox", True) in watcher.roots(), message="later/inbox watched")
        _signalled_by_event(signals, workspace / "later" / "inbox" / "c.md", "later/inbox/c.md")
    finally:
        watcher.stop()


class _CountingFS:
    """lstat and scandir that remember every path they were asked about (what a poll costs)."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self._lock = threading.Lock()

    def lstat(self, path: Any) -> os.stat_result:
        with self._lock:
            self.paths.append(os.fsdecode(path))
        return os.lstat(path)

    def scandir(self, path: Any) -> Any:
        with self._lock:
            self.paths.append(os.fsdecode(path))
        return os.scandir(path)

    def under(self, folder: Path) -> list[str]:
        with self._lock:
            return [p for p in self.paths if p.startswith(f"{folder}{os.sep}")]


def test_the_polling_fallback_only_walks_memory_roots(workspace: Path, signals: Signals) -> None:
    _folders(workspace / "node_modules")
    fs = _CountingFS()
    # A folder deleted and made again between two polls of its parent can come back with the same inode
    # and go unseen by the parent's snapshot; the watcher's periodic check of its roots (30 s by default)
    # then schedules it. Here that check runs often, so either way the new folder is polled in time.
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0,
                               observer_factory=_ExhaustedObserver,
                               polling_factory=lambda: PollingObserverVFS(fs.lstat, fs.scandir, polling_interval=0.05),
                               log=RecordingLog(), health_interval=0.5)
    watcher.start()
    try:
        assert watcher.mode == "polling"
        assert signals.wait_new(0) == "fallback"
        _signalled_by_event(signals, workspace / "memory" / "note.md", "memory/note.md")
        assert str(workspace / "node_modules") in fs.paths  # the root is polled (one stat for the folder)...
        assert fs.under(workspace / "node_modules") == []  # ...but never walked
        # memory/ removed while polling, then made again: the new folder is polled in turn.
        shutil.rmtree(workspace / "memory")
        wait_until(lambda: (str(workspace / "memory"), True) not in watcher.roots(), message="memory/ unwatched")
        (workspace / "memory").mkdir()
        _signalled_by_event(signals, workspace / "memory" / "again.md", "memory/again.md")
        assert fs.under(workspace / "node_modules") == []
        assert watcher.mode == "polling"
    finally:
        watcher.stop()


def test_the_default_polling_fallback_does_not_follow_symlinks(workspace: Path, tmp_path: Path,
                                                               signals: Signals) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (workspace / "memory" / "linked").symlink_to(elsewhere, target_is_directory=True)
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0,
                               observer_factory=_ExhaustedObserver, polling_interval=0.05, log=RecordingLog())
    watcher.start()
    try:
        assert signals.wait_new(0) == "fallback"
        (elsewhere / "outside.md").write_text("x\n")
        _signalled_by_event(signals, workspace / "MEMORY.md", "MEMORY.md")
        assert not any(p is not None and "memory/linked/outside.md" in p for p in signals.paths)
    finally:
        watcher.stop()


def test_the_first_relevant_change_is_announced_once_before_its_sync(workspace: Path, signals: Signals) -> None:
    """The daemon loads the tokenizer then, so that the debounce hides it rather than the first edit's sync."""
    announced: list[float] = []
    watcher = WorkspaceWatcher(workspace, signals, debounce=DEBOUNCE, max_delay=1.0, rescan_interval=0,
                               log=RecordingLog(), on_first_change=lambda: announced.append(time.monotonic()))
    watcher.start()
    try:
        (workspace / "notes.txt").write_text("not memory\n")
        (workspace / "memory" / "a.md").write_text("# a\n")
        signals.wait_new(0)
        assert len(announced) == 1 and announced[0] <= signals.times[0]
        (workspace / "memory" / "b.md").write_text("# b\n")
        signals.wait_new(1)
        assert len(announced) == 1
    finally:
        watcher.stop()
