"""The watchdog side of the watcher: making observers, stopping them, and hearing what they only log.

watchdog >= 7 reports an inotify queue overflow, and a failure to rebuild its watches after one,
only through its logger: `OverflowTap` listens there and turns them into calls.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from watchdog.observers.api import BaseObserver

__all__ = ["WATCHDOG_LOGGER", "WATCH_LIMIT_ERRNOS", "OverflowTap", "default_observer", "ensure_warnings_reach",
           "polling_observer", "stop_quietly"]

# Errors that mean "this kernel will not give us (more) inotify watches": fall back to polling.
WATCH_LIMIT_ERRNOS = frozenset({errno.ENOSPC, errno.EMFILE, errno.ENFILE, errno.ENOMEM})
WATCHDOG_LOGGER = "watchdog.observers"


class OverflowTap(logging.Handler):
    """watchdog >= 7 handles an inotify queue overflow internally and only logs it: listen there."""

    def __init__(self, on_overflow: Callable[[], None], on_watch_failure: Callable[[], None]) -> None:
        super().__init__(logging.WARNING)
        self._on_overflow = on_overflow
        self._on_watch_failure = on_watch_failure

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage().lower()
        if "unable to rebuild" in message:
            self._on_watch_failure()
        elif "overflow" in message:
            self._on_overflow()


def ensure_warnings_reach(logger: logging.Logger) -> None:
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)


def default_observer() -> BaseObserver:
    from watchdog.observers import Observer

    return Observer()


def polling_observer(interval: float) -> BaseObserver:
    """Polls with lstat: `PollingObserver` uses stat and would walk into symlinked folders the scanner skips."""
    from watchdog.observers.polling import PollingObserverVFS

    return PollingObserverVFS(os.lstat, os.scandir, polling_interval=interval)


def stop_quietly(observer: BaseObserver) -> None:
    try:
        observer.stop()
        if observer.is_alive():
            observer.join(timeout=5.0)
    except (RuntimeError, OSError):  # a half-started observer may refuse to stop; it holds nothing we need
        return

