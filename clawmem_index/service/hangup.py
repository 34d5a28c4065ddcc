"""A call run for a client, stopped when the client leaves: abandoned work must not compute on.

While a pooled call runs, the connection's thread watches the client's socket. A full close (POLLHUP or
POLLERR) means nobody waits for the answer: the backend is then asked, until the call ends, to end the statement
the call's thread runs (`interrupt`). A half-close (socat, `nc -N`: done writing, still reading) is no departure.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any

__all__ = ["HANGUP_POLL", "Call", "result_unless_gone"]

HANGUP_POLL = 0.05  # how often a call's client is looked at while the call runs (an answer is not delayed by it)


class Call:
    """A pooled call: the thread running it, and whether it is over (`gate` orders the two with an interrupt,
    so an ask never reaches the next call that thread runs)."""

    def __init__(self) -> None:
        self.thread = 0
        self.done = False
        self.gate = threading.Lock()

    def started(self) -> None:
        self.thread = threading.get_ident()

    def ended(self) -> None:
        with self.gate:
            self.done = True


def result_unless_gone(future: Future[Any], sock: socket.socket, call: Call,
                       interrupt: Callable[[int], None] | None) -> Any:
    """The call's result; if its client closes its end meanwhile, `interrupt(thread)` is asked until the call ends
    (a statement started after the first ask is ended too)."""
    poller = select.poll()
    poller.register(sock, 0)  # POLLHUP and POLLERR only: a full close of the client's end
    gone = False
    while True:
        try:
            return future.result(timeout=HANGUP_POLL)
        except FuturesTimeout:
            pass
        gone = gone or bool(poller.poll(0))
        if gone and interrupt is not None:
            with call.gate:
                if call.thread and not call.done:
                    interrupt(call.thread)
