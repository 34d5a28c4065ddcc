"""The JSON-RPC 2.0 protocol of the socket API (SPEC §7), without the socket.

`Dispatcher` turns one request line into one response line: framing rules of JSON-RPC 2.0 (parse
error, invalid request, unknown method, invalid params, notifications, batches), parameter
validation, and the mapping of `clawmem_index.errors` classes to their `rpc_code`. It never raises and
never answers with text that is not JSON: NaN, Infinity and numbers out of a double's range are
refused at parse (-32700), lone surrogates in an id (-32600) or in params (-32602) and integers
beyond 64 bits (-32602) are refused before anything runs, and answers are encoded with
`allow_nan=False`; an answer that still cannot be encoded (a backend bug) becomes -32603.

What one client can make the daemon hold is bounded here:

- a batch holds at most MAX_BATCH (64) requests, and a reply line is at most MAX_REPLY_BYTES
  (4 MiB): answers are measured as they are made, and once a batch's reply is full its remaining
  requests are not run and get -32002 (REPLY_TOO_LARGE: ask for less); a single answer that is too
  large is replaced the same way;
- bytes held for clients (replies being built or waiting for a slow reader, unfinished request
  lines) count against one `MemoryBudget` shared by every connection (32 MiB by default: eight full replies; the
  first FREE_BYTES of each are not counted, so small answers such as `status` always go out): a
  reply that does not fit is replaced by a small -32001 "server busy" error. A `get` holds room
  for its `max_bytes` (default 256 KiB) before it runs, so once the budget is spent it is refused
  without reading the file.
"""


from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from clawmem_index.config import MAX_CONTEXT_BUDGET
from clawmem_index.errors import ClawmemError
from clawmem_index.sources.files import GET_MAX_BYTES

if TYPE_CHECKING:
    from clawmem_index.search.ranking import SearchRequest

__all__ = [
    "FREE_BYTES",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_BATCH",
    "MAX_GET_BYTES",
    "MAX_REPLY_BYTES",
    "MEMORY_BUDGET",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "REPLY_TOO_LARGE",
    "SERVER_BUSY",
    "Backend",
    "Dispatcher",
    "MemoryBudget",
    "Reply",
    "encode_line",
    "error_object",
    "parse_line",
    "safe_log",
    "search_request",
    "validate_params",
]

MAX_BATCH = 64
MAX_REPLY_BYTES = 4 << 20
# The largest `get` text: JSON escapes a control character to 6 bytes (\u00XX), so even a text of
# nothing else, with its envelope, fits one reply line.
MAX_GET_BYTES = 512 << 10
MEMORY_BUDGET = 32 << 20
FREE_BYTES = 64 << 10  # 256 connections x 64 KiB = 16 MiB at most outside the budget
SEND_CHUNK = 64 << 10
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
ECHO_CHARS = 80  # how much of a client's name (method, parameter) an error message repeats

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_BUSY = -32001
REPLY_TOO_LARGE = -32002

SEARCH_MODES = ("hybrid", "bm25", "vector")
BUSY_MESSAGE = "server busy: too many large replies being sent, try again"
_SURROGATE = re.compile("[\ud800-\udfff]")


class Backend(Protocol):
    """What the socket serves: the daemon (or, in tests, anything with these methods)."""

    def search(self, request: SearchRequest) -> dict[str, object]: ...

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, object]: ...

    def status(self) -> dict[str, object]: ...

    def context(self, request: SearchRequest, budget: int | None = None) -> dict[str, object]: ...

    def sync(self, wait: bool) -> dict[str, object]: ...

    def reindex(self, wait: bool) -> dict[str, object]: ...


class RpcError(Exception):
    """A JSON-RPC error to send back as is."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


# -- parsing ---------------------------------------------------------------------------------


class _NotJson(ValueError):
    """A number JSON cannot carry: NaN, Infinity, or beyond a double's range."""


def _no_constant(name: str) -> object:
    raise _NotJson(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(f"the number {text[:ECHO_CHARS]} is out of range")
    return value


def parse_line(line: bytes) -> object:
    """The JSON value of one request line, or RpcError(-32700) for anything that is not strict JSON.

    Strict: UTF-8 only, no NaN/Infinity, no number that would become an infinity, so nothing
    parsed can make an answer that is not JSON.
    """
    try:
        return json.loads(line.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite_float)
    except _NotJson as exc:
        raise RpcError(PARSE_ERROR, f"parse error: {exc}") from None
    except RecursionError:
        raise RpcError(PARSE_ERROR, "parse error: JSON nested too deeply") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RpcError(PARSE_ERROR, f"parse error: not valid JSON ({exc})") from None
    except ValueError as exc:
        # int() refuses integers over sys.get_int_max_str_digits() (4,300) digits with a plain ValueError.
        reason = "an integer has too many digits" if "digits" in str(exc) else "not valid JSON"
        raise RpcError(PARSE_ERROR, f"parse error: {reason}") from None
    except Exception as exc:
        raise RpcError(PARSE_ERROR, f"parse error: not valid JSON ({type(exc).__name__})") from None


def has_lone_surrogate(value: object) -> bool:
    """Whether a string anywhere in `value` (keys too) holds a lone surrogate, which UTF-8 cannot encode.

    Iterative, so a deeply nested value cannot exhaust the stack.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _quote(name: str) -> str:
    """A client's name for an error message: escaped (repr) and cut short."""
    return repr(name[:ECHO_CHARS]) + ("..." if len(name) > ECHO_CHARS else "")


# -- parameters ------------------------------------------------------------------------------

# name -> (kind, required); kinds: "str", "int", "number", "bool", "names" (a list of 1-64 short strings)
PARAMS: dict[str, dict[str, tuple[str, bool]]] = {
    "search": {"query": ("str", True), "max_results": ("int", False), "min_score": ("number", False),
               "mode": ("str", False), "path_prefix": ("str", False), "source": ("str", False),
               "since": ("str", False), "before": ("str", False), "explain": ("bool", False),
               "workspaces": ("names", False)},
    "get": {"path": ("str", True), "from": ("int", False), "lines": ("int", False), "max_bytes": ("int", False)},
    "status": {},
    "context": {"query": ("str", True), "budget": ("int", False), "max_results": ("int", False),
                "min_score": ("number", False), "mode": ("str", False), "path_prefix": ("str", False),
                "source": ("str", False), "since": ("str", False), "before": ("str", False),
                "workspaces": ("names", False)},
    "sync": {"wait": ("bool", False)},
    "reindex": {"wait": ("bool", False)},
}
# Methods answered on the query pool (bounded read connections); sync/reindex only wait on the writer.
POOLED = frozenset({"search", "get", "status", "context"})

_KIND_NAMES = {"str": "a string", "int": "an integer", "number": "a number", "bool": "true or false",
               "names": "a list of 1 to 64 workspace names"}
MAX_WORKSPACES = 64


def validate_params(method: str, params: object) -> dict[str, Any]:
    """The request's params checked against the method's signature, or an RpcError(-32602) saying why."""
    spec = PARAMS[method]
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, f"invalid params: {method} takes named parameters (a JSON object)")
    if has_lone_surrogate(params):
        raise RpcError(INVALID_PARAMS, "invalid params: a string holds a lone surrogate (not valid Unicode)")
    unknown = sorted(set(params) - set(spec))
    if unknown:
        expected = ", ".join(spec) or "none"
        raise RpcError(INVALID_PARAMS, f"invalid params: unknown parameter {_quote(unknown[0])} for {method}"
                                       f" (expected: {expected})")
    clean: dict[str, Any] = {}
    for name, (kind, required) in spec.items():
        value = params.get(name)
        if value is None:
            if required:
                raise RpcError(INVALID_PARAMS, f"invalid params: {method} needs {name!r} ({_KIND_NAMES[kind]})")
            continue
        if not _is_kind(value, kind):
            got = "a boolean" if isinstance(value, bool) else type(value).__name__
            raise RpcError(INVALID_PARAMS, f"invalid params: {name!r} must be {_KIND_NAMES[kind]}, not {got}")
        clean[name] = value
    _check_ranges(method, clean)
    for name, value in clean.items():
        if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            raise RpcError(INVALID_PARAMS, f"invalid params: {name!r} is out of range (beyond a 64-bit integer)")
    return clean


def _is_kind(value: object, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "names":
        return (isinstance(value, list) and 1 <= len(value) <= MAX_WORKSPACES
                and all(isinstance(v, str) and 0 < len(v) <= 200 for v in value))
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int)
    # An int is a number whatever its size (math.isfinite would overflow on a huge one).
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _check_ranges(method: str, p: dict[str, Any]) -> None:
    def bad(message: str) -> RpcError:
        return RpcError(INVALID_PARAMS, f"invalid params: {message}")

    if method in ("search", "context"):
        if "max_results" in p and not 1 <= p["max_results"] <= 1000:
            raise bad("'max_results' must be between 1 and 1000")
        if "min_score" in p and not 0.0 <= p["min_score"] <= 1.0:
            raise bad("'min_score' must be between 0 and 1")
        if "mode" in p and p["mode"] not in SEARCH_MODES:
            raise bad(f"'mode' must be one of {', '.join(SEARCH_MODES)}")
        if "budget" in p and not 0 <= p["budget"] <= MAX_CONTEXT_BUDGET:
            raise bad(f"'budget' must be between 0 and {MAX_CONTEXT_BUDGET} tokens")
    elif method == "get":
        for name in ("from", "lines"):
            if name in p and p[name] < 1:
                raise bad(f"{name!r} must be >= 1")
        if "max_bytes" in p and not 1 <= p["max_bytes"] <= MAX_GET_BYTES:
            raise bad(f"'max_bytes' must be between 1 and {MAX_GET_BYTES}")


# -- replies ---------------------------------------------------------------------------------


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


# -- the protocol ----------------------------------------------------------------------------


class Dispatcher:
    """One request line in, one response line (or None for notifications) out; never raises."""

    def __init__(self, backend: Backend, *, run_pooled: Callable[[Callable[[], Any]], Any] | None = None,
                 log: Any = None, max_reply: int = MAX_REPLY_BYTES) -> None:
        self.backend = backend
        self._run_pooled = run_pooled or (lambda fn: fn())
        self._log = log
        self.max_reply = max_reply

    def handle(self, line: bytes) -> bytes | None:
        """The whole response line (for callers without a shared budget: tests, tools)."""
        reply = self.answer(line)
        return None if reply is None else reply.data()

    def answer(self, line: bytes, budget: MemoryBudget | None = None) -> Reply | None:
        """The response to `line` as a Reply holding its share of `budget` (the caller releases it)."""
        try:
            entries, batch = _entries(line)
            return self._build(entries, batch, budget)
        except Exception:
            safe_log(self._log, "exception", "dispatch_failed")
            return _fixed_reply(_INTERNAL_PART)

    def _build(self, entries: list[object], batch: bool, budget: MemoryBudget | None) -> Reply | None:
        """Run the entries in order, measuring each answer against the reply cap and the shared budget.

        Room is kept for a short refusal for every entry still to come, so once an answer does not
        fit, it and the rest are refused (not run) and the line still stays within the cap.
        """
        reply = Reply(batch, budget)
        to_come = sum(self._refusal_cost(e) for e in entries)
        if reply.size + to_come > self.max_reply:
            return _fixed_reply(_encode_part(error_object(None, REPLY_TOO_LARGE, self._too_large_message())))
        stop: int | None = None
        for entry in entries:
            to_come -= self._refusal_cost(entry)
            try:
                part, stop = self._place(reply, entry, stop, to_come)
            except _OutOfBudget:
                reply.release()
                return _fixed_reply(_BUSY_PART)
            if part is not None:
                reply.add(part)
        return reply if reply.parts else None

    def _place(self, reply: Reply, entry: object, stop: int | None, to_come: int) -> tuple[bytes | None, int | None]:
        """One entry's answer, encoded and held in the budget; queries do all of it on the pool.

        On the pool, an answer that does not fit is dropped by the worker that made it, so answers
        outside the budget exist only on the few pool threads, never on every connection at once.
        """
        step = functools.partial(self._step, reply, entry, stop, to_come)
        method = entry.get("method") if isinstance(entry, dict) else None
        if stop is not None or not (isinstance(method, str) and method in POOLED):
            return step()
        try:
            result: tuple[bytes | None, int | None] = self._run_pooled(step)
            return result
        except ClawmemError as exc:  # the pool is shutting down
            refused = None if _is_notification(entry) else error_object(
                _valid_id(entry), exc.rpc_code, _describe(exc), {"type": type(exc).__name__})
            return self._step(reply, _Ready(refused), stop, to_come)

    def _step(self, reply: Reply, entry: object, stop: int | None, to_come: int) -> tuple[bytes | None, int | None]:
        """Run the entry (unless the reply is full already) and fit its answer: (part or None, stop code)."""
        if stop is None and not reply.reserve(_largest_answer(entry), advance=True):
            stop = SERVER_BUSY  # refused before it runs: its answer could not be held
        answer = self._run(entry) if stop is None else self._refusal(entry, stop)
        if answer is None:
            reply.reserve(0)
            return None, stop
        rid = answer.get("id")
        part = self._encode_answer(answer)
        del answer  # its text lives on in `part`: do not hold it twice
        if stop is None and reply.size + reply.cost(part) + to_come > self.max_reply:
            stop = REPLY_TOO_LARGE
            part = self._encode_answer(error_object(rid, stop, self._too_large_message()))
        if not reply.hold(part):
            stop = stop or SERVER_BUSY
            part = self._encode_answer(error_object(rid, SERVER_BUSY, BUSY_MESSAGE))
            if not reply.hold(part):
                reply.reserve(0)
                raise _OutOfBudget
        return part, stop

    def _run(self, entry: object) -> dict[str, object] | None:
        return entry.answer if isinstance(entry, _Ready) else self._one(entry)

    def _refusal(self, entry: object, code: int) -> dict[str, object] | None:
        """The error for an entry not run because the reply is full; None for a notification."""
        if _is_notification(entry):
            return None
        message = self._too_large_message() if code == REPLY_TOO_LARGE else BUSY_MESSAGE
        return error_object(_valid_id(entry), code, message)

    def _refusal_cost(self, entry: object) -> int:
        """Room to keep for refusing `entry` later (its echoed id and the longer refusal message)."""
        if _is_notification(entry):
            return 0
        longest = max(self._too_large_message(), BUSY_MESSAGE, key=len)
        return len(_encode_part(error_object(_valid_id(entry), REPLY_TOO_LARGE, longest))) + 1

    def _too_large_message(self) -> str:
        return (f"reply too large: the answers would exceed {self.max_reply} bytes; ask for less"
                " (fewer requests per batch, smaller 'lines' or 'max_bytes')")

    def _encode_answer(self, answer: dict[str, object] | None) -> bytes:
        """The answer as JSON; one that cannot be encoded (a backend bug) becomes an internal error."""
        try:
            return _dumps(answer)
        except Exception as exc:
            safe_log(self._log, "exception", "answer_not_encodable")
            rid = answer.get("id") if isinstance(answer, dict) else None
            message = f"internal error: the answer could not be encoded as JSON ({type(exc).__name__})"
            return _encode_part(error_object(rid, INTERNAL_ERROR, message))

    def _one(self, message: object) -> dict[str, object] | None:
        if not isinstance(message, dict):
            return error_object(None, INVALID_REQUEST, "invalid request: expected a JSON object")
        has_id = "id" in message
        rid = message.get("id")
        if not _id_ok(rid):
            return error_object(None, INVALID_REQUEST, "invalid request: 'id' must be a string (valid Unicode),"
                                                 " a number or null")
        if message.get("jsonrpc") != "2.0":
            return error_object(rid, INVALID_REQUEST, 'invalid request: missing "jsonrpc": "2.0"')
        method = message.get("method")
        if not isinstance(method, str):
            return error_object(rid, INVALID_REQUEST, "invalid request: 'method' must be a string")
        try:
            result = self._call(method, message.get("params"))
        except RpcError as exc:
            return error_object(rid, exc.code, exc.message, exc.data) if has_id else None
        except ClawmemError as exc:
            return error_object(rid, exc.rpc_code, _describe(exc), {"type": type(exc).__name__}) if has_id else None
        except Exception as exc:
            safe_log(self._log, "exception", "request_failed", method=method)
            message = f"internal error: {type(exc).__name__}: {_describe(exc)}"
            return error_object(rid, INTERNAL_ERROR, message) if has_id else None
        if not has_id:
            return None  # a notification: done, and JSON-RPC 2.0 forbids an answer
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    def _call(self, method: str, raw_params: object) -> object:
        if method not in PARAMS:
            raise RpcError(METHOD_NOT_FOUND, f"method not found: {_quote(method)} (methods: {', '.join(PARAMS)})")
        p = validate_params(method, raw_params)
        backend = self.backend
        call: Callable[[], object]
        if method in ("search", "context"):
            request = search_request(p)
            call = (lambda: backend.search(request)) if method == "search" else (
                lambda: backend.context(request, p.get("budget")))
        elif method == "get":
            call = lambda: backend.get(p["path"], p.get("from"), p.get("lines"), p.get("max_bytes"))
        elif method == "status":
            call = backend.status
        elif method == "sync":
            call = lambda: backend.sync(p.get("wait", False))
        else:
            call = lambda: backend.reindex(p.get("wait", False))
        return call()


def search_request(params: dict[str, Any]) -> SearchRequest:
    """The SearchRequest of validated `search` (or `context`) params."""
    from clawmem_index.search.ranking import SearchRequest

    return SearchRequest(params["query"], params.get("max_results"), params.get("min_score"), params.get("mode"),
                         params.get("path_prefix"), params.get("source"), params.get("since"), params.get("before"),
                         bool(params.get("explain", False)),
                         tuple(params["workspaces"]) if params.get("workspaces") else None)


@dataclass(frozen=True)
class _Ready:
    """An answer settled before anything runs (a parse error, a refused batch); None: no answer."""

    answer: dict[str, object] | None


class _OutOfBudget(Exception):
    """Not even a short refusal fits in the reply budget: the whole reply becomes one busy line."""


def _entries(line: bytes) -> tuple[list[object], bool]:
    """The requests of one line and whether it is a batch; framing errors come as one _Ready answer."""
    try:
        message = parse_line(line)
    except RpcError as exc:
        return [_Ready(error_object(None, exc.code, exc.message))], False
    if not isinstance(message, list):
        return [message], False
    if not message:
        return [_Ready(error_object(None, INVALID_REQUEST, "invalid request: empty batch"))], False
    if len(message) > MAX_BATCH:
        return [_Ready(error_object(None, INVALID_REQUEST,
                              f"invalid request: batch too large (at most {MAX_BATCH} requests)"))], False
    return message, True


def _largest_answer(entry: object) -> int:
    """The most text an entry's answer can carry, when the request says so up front (a `get`), else 0."""
    if not isinstance(entry, dict) or entry.get("method") != "get":
        return 0
    params = entry.get("params")
    value = params.get("max_bytes") if isinstance(params, dict) else None
    if value is None:
        return GET_MAX_BYTES
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_GET_BYTES:
        return value
    return 0  # refused by validation: a short error


def _is_notification(entry: object) -> bool:
    """A well-formed request without an id: never answered, whatever happens to it."""
    return (isinstance(entry, dict) and "id" not in entry and entry.get("jsonrpc") == "2.0"
            and isinstance(entry.get("method"), str))


def _id_ok(rid: object) -> bool:
    """Whether an answer may echo `rid`: null, a finite number (parse_line saw to that), valid Unicode text."""
    if isinstance(rid, str):
        return rid.isascii() or not _SURROGATE.search(rid)
    return rid is None or (isinstance(rid, int | float) and not isinstance(rid, bool))


def _valid_id(entry: object) -> object:
    """The entry's id if an answer may echo it, else None."""
    rid = entry.get("id") if isinstance(entry, dict) else None
    return rid if _id_ok(rid) else None


def error_object(rid: object, code: int, message: str, data: object = None) -> dict[str, object]:
    error: dict[str, object] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": rid, "error": error}


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def _encode_part(obj: object) -> bytes:
    """`obj` as JSON without the newline; never raises (falls back to an internal error with id null)."""
    try:
        return _dumps(obj)
    except Exception:
        return _INTERNAL_PART


def encode_line(obj: object) -> bytes:
    """`obj` as one response line; never raises."""
    return _encode_part(obj) + b"\n"


def _fixed_reply(part: bytes) -> Reply:
    """A small constant answer, outside any budget."""
    reply = Reply(False, None)
    reply.add(part)
    return reply


def _describe(exc: BaseException) -> str:
    """The exception's message, or its class name when even that fails (a broken __str__)."""
    try:
        return str(exc)
    except Exception:
        return type(exc).__name__


def safe_log(log: Any, level: str, event: str, **fields: Any) -> None:
    """Log if there is a log; a failing log must not take a connection or the accept thread down."""
    if log is None:
        return
    with contextlib.suppress(Exception):
        getattr(log, level)(event, **fields)


_INTERNAL_PART = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"internal error"}}'
_BUSY_PART = _dumps(error_object(None, SERVER_BUSY, BUSY_MESSAGE))


