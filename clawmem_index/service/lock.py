"""The daemon's instance lock: one daemon per workspace, socket and index, and who holds it when refused.

flock, so the kernel releases it when a holder dies: a stale lock from a killed daemon is simply
free, and its leftover socket file is known to be stale and replaced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Sequence
from pathlib import Path

from clawmem_index.errors import IndexBusy, IndexUnavailable
from clawmem_index.index.connection import make_private_dirs

__all__ = ["InstanceLock"]


class InstanceLock:
    """Exclusive flocks: on the workspace folder itself, and on a few files (socket, index, workspace key).

    A second daemon for any of them is refused. The folder's lock is seen by every daemon of that
    workspace whatever its environment (another XDG_CACHE_HOME or XDG_RUNTIME_DIR, a systemd
    sandbox): it is taken on the folder's inode, and nothing is written into the workspace. Its
    holder is found in /proc/locks. Each lock file holds the holder's pid and socket, so a refusal
    there says where the first one answers.
    """

    def __init__(self, paths: Sequence[Path], socket_path: Path | None = None, *,
                 directory: Path | None = None) -> None:
        self.paths = list(paths)
        self.socket_path = socket_path
        self.directory = directory
        self._fds: list[int] = []

    def acquire(self) -> None:
        try:
            for path in self.paths:
                make_private_dirs(path.parent)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    holder, where = _read_holder(fd)
                    os.close(fd)
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise IndexUnavailable(f"cannot lock {path}: {exc.strerror}") from None
                    who = f"pid {holder}" if holder else "another process"
                    at = f", socket {where}" if where else ""
                    raise IndexBusy(f"another clawmem daemon ({who}{at}) is already running for this workspace"
                                    f" (lock {path}); stop it first, or query it with `clawmem status`") from None
                self._fds.append(fd)
                with contextlib.suppress(OSError):  # a note for a refused second daemon: the lock holds without it
                    os.ftruncate(fd, 0)  # (on a full disk the daemon still serves what is indexed)
                    os.write(fd, f"{os.getpid()}\n{self.socket_path or ''}\n".encode())
            if self.directory is not None:  # last: a lock file above names the holder's socket when it can
                self._lock_directory(self.directory)
        except BaseException:
            self.release()
            raise

    def _lock_directory(self, directory: Path) -> None:
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise IndexUnavailable(f"cannot open the workspace {directory}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            st = os.fstat(fd)
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise IndexUnavailable(f"cannot lock the workspace {directory}: {exc.strerror}") from None
            holder = _flock_holder(st.st_dev, st.st_ino)
            who = f"pid {holder}" if holder else "another process"
            raise IndexBusy(f"another clawmem daemon ({who}) is already running for the workspace {directory}"
                            " (it holds a lock on the folder, whatever its cache or runtime folders);"
                            " stop it first, or query it with `clawmem status`") from None
        self._fds.append(fd)

    def release(self) -> None:
        # The files stay: unlinking a lock file races with the next daemon taking it.
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def _flock_holder(device: int, inode: int) -> int | None:
    """The pid holding an flock on the file (device, inode), from /proc/locks (Linux); None if not found."""
    wanted = f"{os.major(device):02x}:{os.minor(device):02x}:{inode}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            for line in locks:
                fields = line.split()
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == wanted and fields[4].isdigit():
                    return int(fields[4])
    except OSError:
        pass
    return None


def _read_holder(fd: int) -> tuple[int | None, str]:
    """(pid, socket) written by the lock's holder; (None, "") when unreadable."""
    try:
        lines = os.pread(fd, 4096, 0).decode("utf-8", "replace").splitlines()
        return (int(lines[0]) if lines and lines[0].strip() else None), (lines[1] if len(lines) > 1 else "")
    except (OSError, ValueError):
        return None, ""
