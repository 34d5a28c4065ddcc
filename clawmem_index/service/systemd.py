"""systemd integration without libsystemd: the sd_notify datagram protocol and socket activation.

Both protocols are a few lines over the standard library (see sd_notify(3), sd_listen_fds(3)),
so the daemon does not need a C binding; outside systemd every call here is a cheap no-op.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Mapping, MutableMapping

__all__ = ["LISTEN_FDS_START", "Notifier", "listen_fds"]

LISTEN_FDS_START = 3


class Notifier:
    """Sends sd_notify messages (READY=1, STATUS=..., WATCHDOG=1...) when NOTIFY_SOCKET is set."""

    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        address = environ.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]  # abstract namespace
        self._address = address if address.startswith(("/", "\0")) else ""
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self.watchdog_interval = _watchdog_interval(environ)

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def send(self, *assignments: str) -> bool:
        """One datagram of newline-separated assignments; False when not under systemd or it failed."""
        if not self._address:
            return False
        payload = "\n".join(a.replace("\n", " ") if a.startswith("STATUS=") else a for a in assignments)
        with self._lock:
            try:
                if self._socket is None:
                    self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._socket.sendto(payload.encode("utf-8", "replace"), self._address)
                return True
            except OSError:
                return False

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def reloading(self) -> bool:
        return self.send("RELOADING=1", "STATUS=reloading configuration")

    def stopping(self) -> bool:
        return self.send("STOPPING=1", "STATUS=stopping")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def close(self) -> None:
        with self._lock:
            if self._socket is not None:
                self._socket.close()
                self._socket = None


def _watchdog_interval(environ: Mapping[str, str]) -> float | None:
    """Half of WATCHDOG_USEC (as sd_watchdog_enabled(3) advises), if the watchdog is meant for us."""
    pid = environ.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(environ.get("WATCHDOG_USEC", "0"))
    except ValueError:
        return None
    return usec / 2 / 1_000_000 if usec > 0 else None


def listen_fds(environ: MutableMapping[str, str] = os.environ, *, unset: bool = True) -> list[socket.socket]:
    """Listening sockets passed by systemd socket activation (LISTEN_PID/LISTEN_FDS), as socket objects.

    The variables are removed afterwards (unless `unset` is False) so that child processes do not
    believe the descriptors are meant for them. Anything that is not a socket is refused.
    """
    try:
        mine = int(environ.get("LISTEN_PID", "0")) == os.getpid()
        count = int(environ.get("LISTEN_FDS", "0")) if mine else 0
    except ValueError:
        count = 0
    if unset:
        for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            environ.pop(key, None)
    sockets: list[socket.socket] = []
    for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + max(0, count)):
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise OSError(f"file descriptor {fd} passed by systemd is not a socket")
        os.set_inheritable(fd, False)
        sockets.append(socket.socket(fileno=fd))
    return sockets
