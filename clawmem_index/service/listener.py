"""The daemon's listening socket: handed over by systemd (socket activation) or bound here, and the instance lock
that keeps a second daemon off the same workspace, socket or index while this one holds it."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from clawmem_index.config import Settings
from clawmem_index.errors import ConfigError
from clawmem_index.service.lock import InstanceLock
from clawmem_index.service.server import bind_unix_socket, ensure_private_dir

__all__ = ["listen"]


def listen(settings: Settings, inherited: list[socket.socket],
           log: Any) -> tuple[socket.socket, Path, InstanceLock, bool]:
    """The socket to listen on, its path, the instance lock taken for it, and whether systemd passed it."""
    if inherited:
        listener = inherited[0]
        for extra in inherited[1:]:
            log.warning("extra_listen_fd_ignored", fd=extra.fileno())
            extra.close()
        name = listener.getsockname()
        if listener.family != socket.AF_UNIX or not isinstance(name, str) or not name:
            raise ConfigError("the socket passed by systemd must be a Unix stream socket with a path")
        path = Path(name)
        lock = InstanceLock(_lock_paths(settings, path), path, directory=settings.workspace)
        lock.acquire()
        return listener, path, lock, True
    path = settings.socket_path
    ensure_private_dir(path.parent, enforce=settings.socket is None)
    lock = InstanceLock(_lock_paths(settings, path), path, directory=settings.workspace)
    lock.acquire()
    try:
        return bind_unix_socket(path, private_dir=settings.socket is None), path, lock, False
    except BaseException:
        lock.release()
        raise


def _lock_paths(settings: Settings, socket_path: Path) -> list[Path]:
    index = settings.index_path
    return [settings.daemon_lock_path, socket_path.with_name(socket_path.name + ".lock"),
            index.with_name(index.name + ".daemon.lock")]
