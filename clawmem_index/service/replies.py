"""What goes back to a client: the JSON-RPC error codes and objects, encoded lines, and the bytes they hold.

Reply bytes are accounted as they are made: a `Reply` knows the exact length of its line and holds
its share of the `MemoryBudget` shared by every connection (the first FREE_BYTES of each reply are
not counted, so small answers such as `status` always go out), and it is sent in chunks of about
SEND_CHUNK, never joined into a second copy. Encoding never raises and never makes text that is not
JSON (`allow_nan=False`); what cannot be encoded becomes a fixed internal error.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

__all__ = [
    "BUSY_MESSAGE",
    "BUSY_PART",
    "FREE_BYTES",
    "INTERNAL_ERROR",
    "INTERNAL_PART",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_REPLY_BYTES",
    "MEMORY_BUDGET",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "REPLY_TOO_LARGE",
    "SERVER_BUSY",
    "MemoryBudget",
    "Reply",
    "RpcError",
    "dumps",
    "encode_line",
    "encode_part",
    "error_object",
    "fixed_reply",
]

MAX_REPLY_BYTES = 4 << 20
MEMORY_BUDGET = 32 << 20
FREE_BYTES = 64 << 10  # 256 connections x 64 KiB = 16 MiB at most outside the budget
SEND_CHUNK = 64 << 10

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_BUSY = -32001
REPLY_TOO_LARGE = -32002

BUSY_MESSAGE = "server busy: too many large replies being sent, try again"


class RpcError(Exception):
    """A JSON-RPC error to send back as is."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


class MemoryBudget:
    """Reply bytes held in memory across all connections, built or waiting for a reader.

    Slow or absent readers would otherwise pin one full reply each. The first `free` bytes of
    every reply are not counted, so small answers never wait on large ones; a connection holds
    one reply at a time, so those stay bounded by the connection cap.
    """

    def __init__(self, limit: int, free: int = FREE_BYTES) -> None:
        self.limit = limit
        self.free = free
        self.held = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.held -= n


class Reply:
    """One response line, kept as its encoded answers (never joined into a second copy).

    `size` is the exact length of the line (brackets, commas and newline included), so the
    reply cap is checked before an answer is added, and the bytes beyond the budget's free
    allowance are reserved in the shared budget until `release`.
    """

    def __init__(self, batch: bool, budget: MemoryBudget | None) -> None:
        self.batch = batch
        self.budget = budget
        self.parts: list[bytes] = []
        self.size = 2 if batch else 0
        self.reserved = 0
        self.advance = 0  # part of `reserved` taken for an answer not made yet

    def cost(self, part: bytes) -> int:
        return len(part) + 1  # its comma or closing bracket, or the newline of a single answer

    def reserve(self, size: int, *, advance: bool = False) -> bool:
        """Hold room in the budget for `size` more bytes, settling any advance; False if it does not fit.

        With `advance`, the room is taken before the answer is made (one whose largest size is known
        beforehand), so work whose answer could not be held is never done; the next call settles it
        against the real size (`reserve(0)` gives it back). On False nothing changes.
        """
        if self.budget is None:
            return True
        free = self.budget.free
        need = max(0, self.size + size - free) - max(0, self.size - free)
        extra = need - self.advance
        if extra > 0 and not self.budget.take(extra):
            return False
        if extra < 0:
            self.budget.give(-extra)
        self.reserved += extra
        self.advance = need if advance else 0
        return True

    def hold(self, part: bytes) -> bool:
        return self.reserve(self.cost(part))

    def add(self, part: bytes) -> None:
        self.parts.append(part)
        self.size += self.cost(part)

    def release(self) -> None:
        if self.budget is not None and self.reserved:
            self.budget.give(self.reserved)
        self.reserved = self.advance = 0

    def chunks(self) -> Iterator[bytes]:
        """The line in pieces of about SEND_CHUNK: small answers coalesced, large ones as they are."""
        pending = bytearray(b"[" if self.batch else b"")
        for i, part in enumerate(self.parts):
            if i:
                pending += b","
            if len(part) >= SEND_CHUNK:
                if pending:
                    yield bytes(pending)
                    pending.clear()
                yield part
                continue
            pending += part
            if len(pending) >= SEND_CHUNK:
                yield bytes(pending)
                pending.clear()
        pending += b"]\n" if self.batch else b"\n"
        yield bytes(pending)

    def data(self) -> bytes:
        return b"".join(self.chunks())


def error_object(rid: object, code: int, message: str, data: object = None) -> dict[str, object]:
    error: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": rid, "error": error}


def dumps(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def encode_part(obj: object) -> bytes:
    """`obj` as JSON without the newline; never raises (falls back to an internal error with id null)."""
    try:
        return dumps(obj)
    except Exception:
        return INTERNAL_PART


def encode_line(obj: object) -> bytes:
    """`obj` as one response line; never raises."""
    return encode_part(obj) + b"\n"


def fixed_reply(part: bytes) -> Reply:
    """A small constant answer, outside any budget."""
    reply = Reply(False, None)
    reply.add(part)
    return reply


INTERNAL_PART = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"internal error"}}'
BUSY_PART = dumps(error_object(None, SERVER_BUSY, BUSY_MESSAGE))
