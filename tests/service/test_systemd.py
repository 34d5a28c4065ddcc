"""sd_notify datagrams and socket-activation variables, without systemd."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import short_dir

from clawmem_index.service.systemd import Notifier, listen_fds


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


@pytest.fixture
def receiver(sock_dir: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(sock_dir / "notify")
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def test_messages_arrive_as_one_datagram_each(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("serving /ws")
    assert sock.recv(4096).decode().split("\n") == ["READY=1", "STATUS=serving /ws", f"MAINPID={os.getpid()}"]
    assert notifier.status("two\nlines")
    assert sock.recv(4096) == b"STATUS=two lines"  # a newline would start a new assignment
    notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    notifier.reloading()
    assert sock.recv(4096).startswith(b"RELOADING=1\n")
    notifier.stopping()
    assert sock.recv(4096).startswith(b"STOPPING=1\n")
    notifier.close()


def test_abstract_namespace_address() -> None:
    name = f"clawmem-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.watchdog()
        assert sock.recv(100) == b"WATCHDOG=1"
        notifier.close()
    finally:
        sock.close()


def test_without_systemd_everything_is_a_no_op() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert not notifier.ready("x") and not notifier.watchdog()
    assert notifier.watchdog_interval is None
    assert not Notifier({"NOTIFY_SOCKET": "relative/path"}).enabled


def test_a_vanished_notify_socket_is_not_an_error(sock_dir: Path) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(sock_dir / "gone")})
    assert notifier.send("STATUS=x") is False
    notifier.close()


@pytest.mark.parametrize("env, interval", [
    ({"WATCHDOG_USEC": "30000000"}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({}, None),
])
def test_watchdog_interval_is_half_of_watchdog_usec(env: dict[str, str], interval: float | None) -> None:
    assert Notifier(env).watchdog_interval == interval


def test_listen_fds_for_another_process_are_ignored_and_cleared() -> None:
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "x", "OTHER": "kept"}
    assert listen_fds(env) == []
    assert env == {"OTHER": "kept"}
    env = {"LISTEN_PID": "garbage", "LISTEN_FDS": "1"}
    assert listen_fds(env) == []
    assert listen_fds({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0"}) == []
