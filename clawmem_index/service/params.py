"""The socket's methods and their parameters: each request's params checked before anything runs.

Parameters are named (a JSON object) and checked against the method's signature: kinds, ranges,
no unknown name; a string holding a lone surrogate and an integer beyond 64 bits are refused
(-32602) before anything runs, so nothing a client sends can make an answer that is not JSON.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from clawmem_index.config import MAX_CONTEXT_BUDGET
from clawmem_index.service.replies import INVALID_PARAMS, RpcError

if TYPE_CHECKING:
    from clawmem_index.search.ranking import SearchRequest

__all__ = [
    "ECHO_CHARS",
    "MAX_GET_BYTES",
    "MAX_WORKSPACES",
    "PARAMS",
    "POOLED",
    "SURROGATE",
    "has_lone_surrogate",
    "quote_name",
    "search_request",
    "validate_params",
]

# The largest `get` text: JSON escapes a control character to 6 bytes (\u00XX), so even a text of
# nothing else, with its envelope, fits one reply line.
MAX_GET_BYTES = 512 << 10
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
ECHO_CHARS = 80  # how much of a client's name (method, parameter) an error message repeats
SEARCH_MODES = ("hybrid", "bm25", "vector")
SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(value: object) -> bool:
    """Whether a string anywhere in `value` (keys too) holds a lone surrogate, which UTF-8 cannot encode.

    Iterative, so a deeply nested value cannot exhaust the stack.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def quote_name(name: str) -> str:
    """A client's name for an error message: escaped (repr) and cut short."""
    return repr(name[:ECHO_CHARS]) + ("..." if len(name) > ECHO_CHARS else "")


# name -> (kind, required); kinds: "str", "int", "number", "bool", "names" (a list of 1-64 short strings)
PARAMS: dict[str, dict[str, tuple[str, bool]]] = {
    "search": {"query": ("str", True), "max_results": ("int", False), "min_score": ("number", False),
               "mode": ("str", False), "path_prefix": ("str", False), "source": ("str", False),
               "since": ("str", False), "before": ("str", False), "explain": ("bool", False),
               "workspaces": ("names", False), "now": ("str", False), "projects": ("keys", False)},
    "get": {"path": ("str", True), "from": ("int", False), "lines": ("int", False), "max_bytes": ("int", False)},
    "status": {},
    "context": {"query": ("str", True), "budget": ("int", False), "max_results": ("int", False),
                "min_score": ("number", False), "mode": ("str", False), "path_prefix": ("str", False),
                "source": ("str", False), "since": ("str", False), "before": ("str", False),
                "workspaces": ("names", False), "now": ("str", False)},
    "curated": {"kind": ("str", False), "limit": ("int", False), "projects": ("keys", False)},
    "sync": {"wait": ("bool", False)},
    "reindex": {"wait": ("bool", False)},
}
# Methods answered on the query pool (bounded read connections); sync/reindex only wait on the writer.
POOLED = frozenset({"search", "get", "status", "context", "curated"})

_KIND_NAMES = {"str": "a string", "int": "an integer", "number": "a number", "bool": "true or false",
               "names": "a list of 1 to 64 workspace names", "keys": "a list of at most 64 repository keys"}
MAX_WORKSPACES = 64
MAX_KEY_CHARS = 1000


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
        raise RpcError(INVALID_PARAMS, f"invalid params: unknown parameter {quote_name(unknown[0])} for {method}"
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
    if kind == "keys":
        return (isinstance(value, list) and len(value) <= MAX_WORKSPACES
                and all(isinstance(v, str) and 0 < len(v) <= MAX_KEY_CHARS for v in value))
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int)
    # An int is a number whatever its size (math.isfinite would overflow on a huge one).
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _check_ranges(method: str, p: dict[str, Any]) -> None:  # noqa: C901
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
    elif method == "curated":
        if "kind" in p and p["kind"] not in ("triggers", "projects"):
            raise bad("'kind' must be triggers or projects (or left out: every annotated entry)")
        if "limit" in p and not 1 <= p["limit"] <= 512:
            raise bad("'limit' must be between 1 and 512")
    elif method == "get":
        for name in ("from", "lines"):
            if name in p and p[name] < 1:
                raise bad(f"{name!r} must be >= 1")
        if "max_bytes" in p and not 1 <= p["max_bytes"] <= MAX_GET_BYTES:
            raise bad(f"'max_bytes' must be between 1 and {MAX_GET_BYTES}")


def search_request(params: dict[str, Any]) -> SearchRequest:
    """The SearchRequest of validated `search` (or `context`) params."""
    from clawmem_index.search.ranking import SearchRequest

    return SearchRequest(params["query"], params.get("max_results"), params.get("min_score"), params.get("mode"),
                         params.get("path_prefix"), params.get("source"), params.get("since"), params.get("before"),
                         bool(params.get("explain", False)),
                         tuple(params["workspaces"]) if params.get("workspaces") else None, params.get("now"),
                         tuple(params.get("projects") or ()))
