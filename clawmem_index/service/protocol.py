"""The JSON-RPC 2.0 protocol of the socket API (SPEC §7), without the socket.

`Dispatcher` turns one request line into one response line: framing rules of JSON-RPC 2.0 (parse
error, invalid request, unknown method, invalid params, notifications, batches), parameter
validation, and the mapping of `clawmem_index.errors` classes to their `rpc_code`. It never raises and
never answers with text that is not JSON: NaN, Infinity and numbers out of a double's range are
refused at parse (-32700), lone surrogates in an id (-32600) or in params (-32602) and integers
beyond 64 bits (-32602) are refused before anything runs, and answers are encoded with
`allow_nan=False`; an answer that still cannot be encoded (a backend bug) becomes -32603. The
methods' parameters are checked by `clawmem_index.service.params`; error codes, encoding and the
bytes a reply holds are `clawmem_index.service.replies`.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from clawmem_index.errors import ClawmemError
from clawmem_index.service.params import (
    ECHO_CHARS,
    MAX_GET_BYTES,
    PARAMS,
    POOLED,
    SURROGATE,
    quote_name,
    search_request,
    validate_params,
)
from clawmem_index.service.replies import (
    BUSY_MESSAGE,
    BUSY_PART,
    INTERNAL_ERROR,
    INTERNAL_PART,
    INVALID_REQUEST,
    MAX_REPLY_BYTES,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    REPLY_TOO_LARGE,
    SERVER_BUSY,
    MemoryBudget,
    Reply,
    RpcError,
    dumps,
    encode_part,
    error_object,
    fixed_reply,
)
from clawmem_index.sources.files import GET_MAX_BYTES, refusal_of

if TYPE_CHECKING:
    from clawmem_index.search.ranking import SearchRequest

__all__ = [
    "MAX_BATCH",
    "PARAMS",  # the socket's methods and their parameters (`params`), read here to refuse unknown methods
    "Backend",
    "Dispatcher",
    "parse_line",
    "safe_log",
]

MAX_BATCH = 64


class Backend(Protocol):
    """What the socket serves: the daemon (or, in tests, anything with these methods)."""

    def search(self, request: SearchRequest) -> dict[str, object]: ...

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, object]: ...

    def status(self) -> dict[str, object]: ...

    def context(self, request: SearchRequest, budget: int | None = None) -> dict[str, object]: ...

    def curated(self, kind: str | None = None, limit: int = 512,
                projects: Sequence[str] | None = None) -> dict[str, object]: ...

    def sync(self, wait: bool) -> dict[str, object]: ...

    def reindex(self, wait: bool) -> dict[str, object]: ...


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
            return fixed_reply(INTERNAL_PART)

    def _build(self, entries: list[object], batch: bool, budget: MemoryBudget | None) -> Reply | None:
        """Run the entries in order, measuring each answer against the reply cap and the shared budget.

        Room is kept for a short refusal for every entry still to come, so once an answer does not
        fit, it and the rest are refused (not run) and the line still stays within the cap.
        """
        reply = Reply(batch, budget)
        to_come = sum(self._refusal_cost(e) for e in entries)
        if reply.size + to_come > self.max_reply:
            return fixed_reply(encode_part(error_object(None, REPLY_TOO_LARGE, self._too_large_message())))
        stop: int | None = None
        for entry in entries:
            to_come -= self._refusal_cost(entry)
            try:
                part, stop = self._place(reply, entry, stop, to_come)
            except _OutOfBudget:
                reply.release()
                return fixed_reply(BUSY_PART)
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
                _valid_id(entry), exc.rpc_code, _describe(exc), error_data(exc))
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
        return len(encode_part(error_object(_valid_id(entry), REPLY_TOO_LARGE, longest))) + 1

    def _too_large_message(self) -> str:
        return (f"reply too large: the answers would exceed {self.max_reply} bytes; ask for less"
                " (fewer requests per batch, smaller 'lines' or 'max_bytes')")

    def _encode_answer(self, answer: dict[str, object] | None) -> bytes:
        """The answer as JSON; one that cannot be encoded (a backend bug) becomes an internal error."""
        try:
            return dumps(answer)
        except Exception as exc:
            safe_log(self._log, "exception", "answer_not_encodable")
            rid = answer.get("id") if isinstance(answer, dict) else None
            message = f"internal error: the answer could not be encoded as JSON ({type(exc).__name__})"
            return encode_part(error_object(rid, INTERNAL_ERROR, message))

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
            return error_object(rid, exc.rpc_code, _describe(exc), error_data(exc)) if has_id else None
        except Exception as exc:
            safe_log(self._log, "exception", "request_failed", method=method)
            message = f"internal error: {type(exc).__name__}: {_describe(exc)}"
            return error_object(rid, INTERNAL_ERROR, message) if has_id else None
        if not has_id:
            return None  # a notification: done, and JSON-RPC 2.0 forbids an answer
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    def _call(self, method: str, raw_params: object) -> object:
        if method not in PARAMS:
            raise RpcError(METHOD_NOT_FOUND, f"method not found: {quote_name(method)} (methods: {', '.join(PARAMS)})")
        p = validate_params(method, raw_params)
        backend = self.backend
        call: Callable[[], object]
        if method in ("search", "context"):
            request = search_request(p)
            call = functools.partial(backend.search, request) if method == "search" else functools.partial(
                backend.context, request, p.get("budget"))
        elif method == "get":
            call = functools.partial(backend.get, p["path"], p.get("from"), p.get("lines"), p.get("max_bytes"))
        elif method == "status":
            call = backend.status
        elif method == "curated":
            call = functools.partial(backend.curated, p.get("kind"), p.get("limit", 512), p.get("projects"))
        elif method == "sync":
            call = functools.partial(backend.sync, p.get("wait", False))
        else:
            call = functools.partial(backend.reindex, p.get("wait", False))
        return call()


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
        return rid.isascii() or not SURROGATE.search(rid)
    return rid is None or (isinstance(rid, int | float) and not isinstance(rid, bool))


def _valid_id(entry: object) -> object:
    """The entry's id if an answer may echo it, else None."""
    rid = entry.get("id") if isinstance(entry, dict) else None
    return rid if _id_ok(rid) else None


def error_data(exc: ClawmemError) -> dict[str, object]:
    """`data` of an error answer: the class's name, and `missing` when `get` named a file that is not
    there (clients answer "not found" rather than "refused" without parsing the message)."""
    data: dict[str, object] = {"type": type(exc).__name__}
    refusal = refusal_of(exc)
    if refusal is not None and refusal.missing:
        data["missing"] = True
    return data


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
