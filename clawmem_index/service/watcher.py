"""File events → debounced "sync requested" signals for the daemon.

Only what can hold memory is watched, never a whole workspace that is a code repository too: which
roots, and which index keys an event below them names, are the rules of
`clawmem_index.service.watch_paths`. When an event creates, deletes or moves a root or one of its
parents, the worker thread re-schedules the roots before the sync that event asked for can fire; a
periodic check catches what no event told. The watchdog observers themselves (and the fallback to
polling) are made in `clawmem_index.service.observers`.

A signal carries the index keys of the memory files that changed, so the daemon can sync just
those (one edit costs the same in a workspace of any size), or None when the watcher cannot know
(a folder appeared, events were lost, a periodic check): then the daemon runs a full stat pass,
which finds any change (unchanged files are not even opened). That is why losing events is
survivable as long as it is noticed:

- an editor saving by rename shows up as a move whose destination is a memory file: it counts;
- a directory created or moved inside `memory/` counts, since files may already be inside it;
- an inotify queue overflow (watchdog >= 7 reports it only through its logger) asks for a sync;
- running out of inotify watches or instances (at start, for a root that appears later, or when
  watchdog cannot rebuild its watches after an overflow), or a dead observer thread, switches to
  a PollingObserver over the same roots, logged;
- a periodic safety sync (`rescan_interval`) catches anything missed by all of the above.

Timing is a trailing debounce: a signal fires `debounce` seconds after the last relevant event,
but never later than `max_delay` after the first one, so a continuous stream of writes still gets
indexed. The worker thread sleeps on a Condition until the next deadline: no busy polling.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawmem_index.service.observers import (
    WATCH_LIMIT_ERRNOS,
    WATCHDOG_LOGGER,
    OverflowTap,
    default_observer,
    ensure_warnings_reach,
    polling_observer,
    stop_quietly,
)
from clawmem_index.service.watch_paths import RootKey, WatchedPaths, within

if TYPE_CHECKING:
    from watchdog.events import FileSystemEvent, FileSystemEventHandler
    from watchdog.observers.api import BaseObserver, ObservedWatch

__all__ = ["Debounce", "WorkspaceWatcher"]

# on_sync(reason, paths): paths are index keys, or None for "anything may have changed: full pass".
SyncCallback = Callable[[str, frozenset[str] | None], object]
ObserverFactory = Callable[[], "BaseObserver"]

HEALTH_INTERVAL = 30.0


@dataclass
class Debounce:
    """Trailing debounce with a ceiling: the pure timing rule, separate from threads and clocks."""

    delay: float
    max_delay: float
    first: float | None = None
    last: float | None = None

    def poke(self, now: float) -> None:
        if self.first is None:
            self.first = now
        self.last = now

    def due(self) -> float | None:
        """When the pending burst should fire (monotonic seconds), or None when nothing is pending."""
        if self.first is None or self.last is None:
            return None
        return min(self.last + self.delay, self.first + self.max_delay)

    def reset(self) -> None:
        self.first = self.last = None


@dataclass(frozen=True)
class _Root:
    """A scheduled watch and the folder it was scheduled on: a new inode there means a new folder."""

    watch: ObservedWatch
    identity: tuple[int, int]


class WorkspaceWatcher:
    """Watches one workspace and calls `on_sync(reason, paths)` when the index should be brought up to date.

    `on_sync` runs on the watcher's own thread and should only hand the request over (the daemon
    queues it for its writer thread). Reasons: "change", "overflow", "fallback", "rescan", "roots"
    (a watched folder appeared or was replaced without an event saying so), joined with "+" when
    several are pending at once.

    Watches are only ever scheduled or removed on the worker thread (or in `start`/`stop`, when it
    is not running): the event handler runs with the observer's lock held, so scheduling from there
    or under a lock of ours the handler also takes could deadlock.
    """

    def __init__(self, workspace: Path, on_sync: SyncCallback, *, extra_paths: Sequence[str] = (),
                 debounce: float = 1.5, max_delay: float = 10.0, rescan_interval: float = 300.0,
                 polling_interval: float = 2.0, observer_factory: ObserverFactory | None = None,
                 polling_factory: ObserverFactory | None = None, health_interval: float = HEALTH_INTERVAL,
                 log: Any = None, sessions: str | None = None,
                 on_first_change: Callable[[], None] | None = None) -> None:
        """`sessions`: the `sessions_dir` setting when the sessions source is on (None: transcripts are not watched).

        `on_first_change` is called once, from the event thread, at the first change that will ask
        for a sync: what that sync needs can start loading while the debounce waits (keep it quick).
        """
        self.workspace = Path(os.path.abspath(workspace))
        self.on_sync = on_sync
        self._on_first_change = on_first_change
        self.rescan_interval = rescan_interval
        self.polling_interval = polling_interval
        self.health_interval = health_interval
        self._observer_factory = observer_factory or default_observer
        self._polling_factory = polling_factory or (lambda: polling_observer(polling_interval))
        self._log = log or _NullLog()
        self._watched = WatchedPaths(self.workspace, extra_paths, sessions)
        self._debounce = Debounce(debounce, max_delay)
        self._cond = threading.Condition()
        self._reasons: set[str] = set()
        self._paths: set[str] = set()
        self._full = False
        self._stopping = False
        self._fallback_reason: str | None = None
        self._roots_due: frozenset[str] | None = None
        self._last_fire = time.monotonic()
        self._observer: BaseObserver | None = None
        self._handler: FileSystemEventHandler | None = None
        self._scheduled: dict[RootKey, _Root] = {}
        self._unwatchable: set[RootKey] = set()
        self._thread: threading.Thread | None = None
        self._tap = OverflowTap(self._on_overflow, self._on_watch_failure)
        self.mode = "stopped"
        self.signals = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start observing; never raises for watch limits (it falls back to polling instead)."""
        logging.getLogger(WATCHDOG_LOGGER).addHandler(self._tap)
        ensure_warnings_reach(logging.getLogger(WATCHDOG_LOGGER))
        try:
            self._start_observer(self._observer_factory)
            self.mode = "inotify" if "Inotify" in type(self._observer).__name__ else "native"
        except OSError as exc:
            if exc.errno not in WATCH_LIMIT_ERRNOS:
                logging.getLogger(WATCHDOG_LOGGER).removeHandler(self._tap)
                raise
            self._log.warning("watch_limit", error=str(exc), action="polling fallback and full rescan",
                              hint="raise fs.inotify.max_user_watches / max_user_instances")
            self._start_observer(self._polling_factory)
            self.mode = "polling"
            self.request("fallback")
        self._thread = threading.Thread(target=self._run, name="clawmem-watcher", daemon=True)
        self._thread.start()
        self._log.info("watching", workspace=str(self.workspace), mode=self.mode,
                       roots=sorted(path for path, _ in self._scheduled))

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._stop_observer()
        logging.getLogger(WATCHDOG_LOGGER).removeHandler(self._tap)
        self.mode = "stopped"

    def request(self, reason: str, paths: frozenset[str] | None = None) -> None:
        """Ask for a sync through the same debounce as file events (coalesces with them).

        `paths` are the index keys known to have changed; None asks for a full pass.
        """
        with self._cond:
            self._reasons.add(reason)
            if paths is None:
                self._full = True
            else:
                self._paths.update(paths)
            self._debounce.poke(time.monotonic())
            self._cond.notify_all()

    def pending(self) -> frozenset[str] | None:
        """Changes seen but not yet handed over: their index keys, or None if they are not known."""
        with self._cond:
            if self._full or self.mode == "rescan-only":
                return None
            return frozenset(self._paths)

    def roots(self) -> frozenset[RootKey]:
        """The folders watched now, as (path, recursive)."""
        return frozenset(self._scheduled)

    # -- events ------------------------------------------------------------------------------

    def relevant(self, event: FileSystemEvent) -> bool:
        """Whether an event may change what the index should hold."""
        return self.affected(event) != frozenset()

    def affected(self, event: FileSystemEvent) -> frozenset[str] | None:
        """The index keys an event may have changed: empty if none, None if it cannot be known."""
        return self._watched.affected(event)

    def _on_event(self, event: FileSystemEvent) -> None:
        touched = self._watched.touched_roots(event)
        if touched:
            with self._cond:
                self._roots_due = touched | (self._roots_due or frozenset())
                self._cond.notify_all()
        keys = self.affected(event)
        if keys is None or keys:
            with self._cond:
                first, self._on_first_change = self._on_first_change, None
            if first is not None:
                first()
            self.request("change", keys)

    def _on_overflow(self) -> None:
        self._log.warning("inotify_overflow", action="full rescan")
        with self._cond:
            self._roots_due = self._roots_due or frozenset()  # a root may have come or gone unseen
        self.request("overflow", None)

    def _on_watch_failure(self) -> None:
        with self._cond:
            self._fallback_reason = "watchdog could not rebuild its inotify watches"
            self._cond.notify_all()

    # -- the worker --------------------------------------------------------------------------

    def _run(self) -> None:  # noqa: C901
        next_health = time.monotonic() + self.health_interval
        while True:
            fallback: str | None = None
            reason: str | None = None
            paths: frozenset[str] | None = None
            roots: frozenset[str] | None = None
            health = False
            with self._cond:
                while not self._stopping:
                    now = time.monotonic()
                    if self._fallback_reason is not None:
                        fallback, self._fallback_reason = self._fallback_reason, None
                        break
                    if self._roots_due is not None:
                        # Before any sync fires: the pass an event asked for must run on the new watches.
                        roots, self._roots_due = self._roots_due, None
                        break
                    if now >= next_health:
                        next_health = now + self.health_interval
                        health = True
                        break
                    due = self._debounce.due()
                    if due is not None and now >= due:
                        reason = "+".join(sorted(self._reasons)) or "change"
                        paths = None if self._full else frozenset(self._paths)
                        self._reasons.clear()
                        self._paths.clear()
                        self._full = False
                        self._debounce.reset()
                        break
                    rescan = self._last_fire + self.rescan_interval if self.rescan_interval > 0 else None
                    if rescan is not None and now >= rescan:
                        reason = "rescan"  # a full pass: it covers whatever is pending too
                        self._reasons.clear()
                        self._paths.clear()
                        self._full = False
                        self._debounce.reset()
                        break
                    deadlines = [t for t in (due, rescan, next_health) if t is not None]
                    self._cond.wait(max(0.0, min(deadlines) - now))
                if self._stopping:
                    return
                if reason is not None:
                    self._last_fire = time.monotonic()
                    self.signals += 1
            if health:
                fallback = self._health_problem()
                if fallback is None:
                    roots = frozenset()
            if fallback is not None:
                self._fall_back(fallback)
            elif roots is not None:
                self._refresh_roots(roots)
            elif reason is not None:
                try:
                    self.on_sync(reason, paths)
                except Exception as exc:  # the daemon's hand-over must never kill the watcher
                    self._log.error("sync_signal_failed", error=repr(exc))

    def _health_problem(self) -> str | None:
        observer = self._observer
        if observer is None:
            return None
        if not observer.is_alive():
            return "the observer thread died"
        return None

    def _refresh_roots(self, touched: frozenset[str]) -> None:
        """Re-schedule the roots; a new or replaced folder may hold files no event named: a full pass."""
        try:
            changed = self._reconcile(touched)
        except OSError as exc:  # only watch-limit errors get here
            self._fall_back(f"no watch for a memory folder: {exc}")
            return
        if changed:
            self.request("roots", None)

    def _fall_back(self, why: str) -> None:
        self._log.warning("watcher_fallback", reason=why, action="polling fallback and full rescan")
        self._stop_observer()
        try:
            self._start_observer(self._polling_factory)
            self.mode = "polling"
        except OSError as exc:
            self.mode = "rescan-only"
            self._log.error("watcher_failed", error=str(exc), action="periodic rescans only")
        self.request("fallback")

    # -- observers and roots -----------------------------------------------------------------

    def _start_observer(self, factory: ObserverFactory) -> None:
        from watchdog.events import FileSystemEventHandler

        if self._handler is None:
            self._handler = FileSystemEventHandler()
            self._handler.on_any_event = self._on_event  # type: ignore[method-assign]
        os.stat(self.workspace)  # a missing workspace is an error, not a quiet watch on nothing
        observer = factory()
        self._observer = observer
        self._scheduled = {}
        try:
            observer.start()
            self._reconcile(frozenset(), strict=True)
        except BaseException:
            self._stop_observer()
            raise

    def _stop_observer(self) -> None:
        observer, self._observer = self._observer, None
        self._scheduled = {}
        if observer is not None:
            stop_quietly(observer)

    def _reconcile(self, touched: frozenset[str], *, strict: bool = False) -> bool:
        """Make the scheduled watches match the roots on disk; True if any watch was added or removed.

        A root is re-scheduled when its folder is gone or is another folder now (deleted and made
        again, or moved away and another moved in: an inotify watch follows the old inode), when
        its emitter stopped (watchdog stops it when the folder is deleted), or when an event
        touched it or a parent (`touched`), because a reused inode number would hide the swap.
        Watch-limit errors propagate (the caller falls back to polling), as does any error on the
        workspace itself when `strict`; other failures leave that root to the periodic rescans.
        """
        observer, handler = self._observer, self._handler
        if observer is None or handler is None:
            return False
        wanted = self._watched.wanted()
        alive = {emitter.watch for emitter in list(observer.emitters) if emitter.is_alive()}
        scheduled = dict(self._scheduled)  # published whole, so `roots()` may read it from any thread
        changed = False
        try:
            for key, root in list(scheduled.items()):
                if (wanted.get(key) == root.identity and root.watch in alive
                        and not any(within(key[0], path) for path in touched)):
                    continue
                del scheduled[key]
                with contextlib.suppress(KeyError):  # already gone with the observer's own clean-up
                    observer.unschedule(root.watch)
                changed = True
            for key, identity in wanted.items():
                if key in scheduled:
                    continue
                path, recursive = key
                try:
                    watch = observer.schedule(handler, path, recursive=recursive)
                except OSError as exc:
                    if exc.errno in WATCH_LIMIT_ERRNOS or (strict and path == str(self.workspace)):
                        raise
                    if exc.errno not in (errno.ENOENT, errno.ENOTDIR) and key not in self._unwatchable:
                        self._unwatchable.add(key)  # warned once, retried on every check
                        self._log.warning("watch_failed", path=path, error=str(exc), action="periodic rescans")
                    continue
                self._unwatchable.discard(key)
                scheduled[key] = _Root(watch, identity)
                changed = True
        finally:
            self._scheduled = scheduled
        return changed


class _NullLog:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None
