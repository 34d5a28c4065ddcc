"""The daemon's process: the memory it holds, when one started on demand exits, and how it ends.

A daemon exits after `daemon.exit_when_idle` seconds without a request, a connection or work, as socket
activation would: the OpenClaw plugin starts a daemon for a workspace it is asked about, and the next
request after the daemon left starts one again, so daemons do not pile up across workspaces nor outlive their use.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["IdleWatch", "end_now", "resident_bytes"]


def resident_bytes() -> int | None:
    """The process's resident memory now (Linux; None elsewhere): what users and monitoring watch."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def end_now(status: int) -> None:
    """End the process with `status` without joining its threads: the interpreter's exit would wait for query
    threads still blocked on a provider that does not answer, past any stop deadline (they only read)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class IdleWatch:
    """Calls `stop` once `busy_marker()` has not changed and `busy()` has been false for `limit` seconds.

    `busy_marker` is something that moves with every request (the count served); each check looks again, so a
    request just before the limit keeps the daemon serving."""

    def __init__(self, limit: float, busy: Callable[[], bool], marker: Callable[[], object],
                 stop: Callable[[], None], stopped: threading.Event) -> None:
        self.limit, self._busy, self._marker, self._stop, self._stopped = limit, busy, marker, stop, stopped

    def start(self) -> None:
        threading.Thread(target=self._loop, name="clawmem-idle", daemon=True).start()

    def _loop(self) -> None:
        seen: object = object()
        since = time.monotonic()
        while not self._stopped.wait(min(self.limit / 4, 30.0)):
            marker = self._marker()
            if self._busy() or marker != seen:
                seen, since = marker, time.monotonic()
            elif time.monotonic() - since >= self.limit:
                self._stop()
                return
