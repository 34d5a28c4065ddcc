"""A seeded, bounded protocol fuzzer: no line a client sends may stop the socket API answering.

Lines are generated from a fixed seed (set CLAWMEM_FUZZ_SEED to explore others): random bytes,
truncated and mutated JSON, integers past Python's 4,300-digit limit, numbers past a double's
range, NaN and Infinity, deep nesting, lone surrogates (in ids, values and keys), wrong types,
batches (empty, mixed, over the limit) and valid requests in between. Each run checks, line by
line, that a line that is not a notification gets exactly one answer, that every answer is strict
JSON-RPC 2.0 (no NaN, an id, a result or an error), that nothing a client sends yields -32603,
and that no exception escaped a thread. Both the `Dispatcher` alone and a real daemon over one
socket connection are fuzzed.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import RawClient, RecordingLog, daemon_settings, running_daemon, short_dir

from clawmem_index.search.ranking import SearchRequest
from clawmem_index.service.protocol import MAX_BATCH, Dispatcher
from clawmem_index.service.replies import INTERNAL_ERROR, MemoryBudget
from clawmem_index.service.server import MAX_LINE

SEED = int(os.environ.get("CLAWMEM_FUZZ_SEED", "20261122"))
DISPATCHER_LINES = 3000
DAEMON_LINES = 1500
STATUS_EVERY = 100
METHODS = ("search", "get", "status", "sync", "reindex")

pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")


# -- generating lines ---------------------------------------------------------------------------


def json_string(rng: random.Random) -> str:
    """A JSON string literal, sometimes with escapes JSON allows but Unicode does not (lone surrogates)."""
    pick = rng.random()
    if pick < 0.15:
        return '"' + rng.choice(["\\ud800", "\\udfff", "x\\udc00y", "\\ud83d", "\\ude00\\ud83d"]) + '"'
    if pick < 0.2:
        return '"\\ud83d\\ude00"'  # a valid pair
    alphabet = "abc xyz/.-_\"\\\t\n\u00e9\u4e2d\U0001f600\x00\x7f"
    return json.dumps("".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))))


def json_number(rng: random.Random) -> str:
    return rng.choice([
        str(rng.randrange(-5, 2000)), str(1 << 63), str((1 << 63) - 1), str(-(1 << 63) - 1),
        "9" * rng.choice([20, 400, 4300, 4301, 6000]), "-" + "1" * 5000, "1e999", "-1e400", "1e-400",
        "0.5", "-0.0", "3.14159", "1E2", "NaN", "Infinity", "-Infinity", "01", "1.", ".5", "+1", "0x10",
    ])


def json_value(rng: random.Random, depth: int = 0) -> str:
    """Random JSON-ish text: mostly valid JSON, some of it not (NaN, bad numbers), nested a little."""
    pick = rng.random()
    if depth > 3 or pick < 0.3:
        return rng.choice(["null", "true", "false", json_number(rng), json_string(rng)])
    if pick < 0.65:
        return "[" + ",".join(json_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))) + "]"
    items = (f"{json_string(rng)}:{json_value(rng, depth + 1)}" for _ in range(rng.randrange(0, 4)))
    return "{" + ",".join(items) + "}"


def deep(rng: random.Random) -> str:
    depth = rng.choice([10, 500, 990, 1100, 5000, 100_000])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    return opener * depth + "1" + closer * depth


def valid_params(rng: random.Random, method: str) -> dict[str, Any]:
    if method == "search":
        params: dict[str, Any] = {"query": rng.choice(["sqlite", "zebra project", "why", "x" * 300])}
        if rng.random() < 0.5:
            params["mode"] = rng.choice(["bm25", "hybrid", "vector"])
        if rng.random() < 0.3:
            params["max_results"] = rng.randrange(1, 20)
        return params
    if method == "get":
        params = {"path": rng.choice(["MEMORY.md", "memory/2026-01-02.md", "memory/missing.md", "../x"])}
        for name, top in (("from", 5), ("lines", 5), ("max_bytes", 5000)):
            if rng.random() < 0.4:
                params[name] = rng.randrange(1, top)
        return params
    if method in ("sync", "reindex"):
        return {"wait": False} if rng.random() < 0.7 else {}
    return {}


def request_text(rng: random.Random) -> str:
    """One request object as text: valid, or with one or more members gone wrong."""
    method = rng.choice(METHODS)
    members: dict[str, str] = {"jsonrpc": '"2.0"', "method": json.dumps(method)}
    if rng.random() < 0.85:
        members["id"] = rng.choice([str(rng.randrange(1_000_000)), json.dumps(f"r{rng.randrange(1000)}"), "null"])
    members["params"] = json.dumps(valid_params(rng, method))
    for _ in range(rng.choice([0, 0, 1, 2])):
        name = rng.choice(["jsonrpc", "method", "id", "params", "params", "extra"])
        if name == "params" and rng.random() < 0.6:
            params = valid_params(rng, method)
            key = rng.choice([*params, "query", "max_bytes", "from", "\\ud800", "unknown"]) if params else "x"
            members["params"] = ("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in params.items()
                                                if k != key)
                                 + ("," if len(params) > (key in params) else "")
                                 + f'"{key}":{json_value(rng)}' + "}")
        else:
            members[name] = json_value(rng)
    if rng.random() < 0.05:
        members.pop(rng.choice(list(members)))
    return "{" + ",".join(f'"{k}":{v}' for k, v in members.items()) + "}"


def batch_text(rng: random.Random) -> str:
    size = rng.choice([0, 1, 2, 5, 20, MAX_BATCH, MAX_BATCH + 1, 100])
    entries = [request_text(rng) if rng.random() < 0.8 else json_value(rng) for _ in range(size)]
    return "[" + ",".join(entries) + "]"


def mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        if not out:
            break
        at = rng.randrange(len(out))
        kind = rng.random()
        if kind < 0.4:
            out[at] = rng.randrange(256)
        elif kind < 0.7:
            del out[at]
        else:
            out[at:at] = rng.choice([b"\xff", b"\xed\xa0\x80", b"\xc3", b"{", b"]", b'"', b"\\", b"NaN"])
    return bytes(out)


def generate(rng: random.Random, count: int) -> Iterator[bytes]:
    """`count` lines, none with a newline inside and each under the line limit."""
    for _ in range(count):
        pick = rng.random()
        if pick < 0.25:
            text = request_text(rng).encode()
        elif pick < 0.35:
            text = batch_text(rng).encode()
        elif pick < 0.45:
            full = request_text(rng).encode()
            text = full[:rng.randrange(len(full))]
        elif pick < 0.6:
            text = mutate(rng, (request_text(rng) if rng.random() < 0.8 else batch_text(rng)).encode())
        elif pick < 0.7:
            text = rng.randbytes(rng.randrange(0, 300))
        elif pick < 0.75:
            text = deep(rng).encode()
        elif pick < 0.8:
            member = rng.choice(["id", "params"])
            text = (f'{{"jsonrpc":"2.0","method":"status","{member}":' + deep(rng) + "}").encode()
        else:
            text = json_value(rng).encode()
        line = text.replace(b"\n", b" ").replace(b"\r", b" ")
        assert len(line) < MAX_LINE
        yield line


# -- the oracle ---------------------------------------------------------------------------------


def _strict_loads(data: bytes | str) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError("out of range")
        return value

    return json.loads(data, parse_constant=refuse, parse_float=finite)


def _is_notification(entry: object) -> bool:
    return (isinstance(entry, dict) and "id" not in entry and entry.get("jsonrpc") == "2.0"
            and isinstance(entry.get("method"), str))


def expects_answer(line: bytes, *, over_socket: bool) -> bool:
    """Whether JSON-RPC 2.0 calls for an answer to `line` (a socket skips blank lines)."""
    if over_socket and not line.strip():
        return False
    try:
        message = _strict_loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return True
    if isinstance(message, list):
        return not message or len(message) > MAX_BATCH or not all(_is_notification(e) for e in message)
    return not _is_notification(message)


def check_answer(line: bytes, raw: bytes) -> None:
    """One strict JSON-RPC 2.0 response line, with the request's id when the request had a usable one."""
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1, (line[:200], raw[:200])
    answer = _strict_loads(raw)
    answers = answer if isinstance(answer, list) else [answer]
    assert answers, (line[:200], raw[:200])
    for one in answers:
        assert isinstance(one, dict) and one.get("jsonrpc") == "2.0" and "id" in one, (line[:200], one)
        assert ("result" in one) != ("error" in one), (line[:200], one)
        if "error" in one:
            error = one["error"]
            assert isinstance(error.get("code"), int) and isinstance(error.get("message"), str), (line[:200], one)
            assert error["code"] != INTERNAL_ERROR, (line[:200], one)
    try:
        request = _strict_loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        assert answer["id"] is None and answer["error"]["code"] == -32700, (line[:200], answer)
        return
    if isinstance(request, dict) and request.get("jsonrpc") == "2.0" and isinstance(answer, dict):
        rid = request.get("id")
        if isinstance(rid, int | float) and not isinstance(rid, bool) and answer["id"] is not None:
            assert answer["id"] == rid, (line[:200], answer)


# -- the runs ---------------------------------------------------------------------------------


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    seen: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(f"{args.thread}: {args.exc_value!r}"))
    yield seen


class QuietBackend:
    """Answers at once, like a healthy index, so the run measures the protocol layer."""

    def search(self, request: SearchRequest) -> dict[str, object]:
        return {"results": [], "query": request.query}

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, object]:
        text = "line\n" * min(lines or 3, 1000)
        return {"path": path, "text": text[:max_bytes], "from": start or 1, "lines": lines or 3, "truncated": False}

    def status(self) -> dict[str, object]:
        return {"ok": True}

    def sync(self, wait: bool) -> dict[str, object]:
        return {"queued": True}

    def reindex(self, wait: bool) -> dict[str, object]:
        return {"queued": True}


def test_fuzz_the_dispatcher(thread_errors: list[str]) -> None:
    log = RecordingLog()
    dispatcher = Dispatcher(QuietBackend(), log=log)
    answered = 0
    for line in generate(random.Random(SEED), DISPATCHER_LINES):
        raw = dispatcher.handle(line)
        if not expects_answer(line, over_socket=False):
            assert raw is None, (line[:200], raw[:200] if raw else raw)
            continue
        assert raw is not None, line[:200]
        check_answer(line, raw)
        answered += 1
    assert answered > DISPATCHER_LINES // 2
    assert [r for r in log.records if r[0] == "exception"] == []
    assert thread_errors == []


class BulkyBackend(QuietBackend):
    """Answers of tens of kilobytes, so small reply caps and budgets are reached."""

    def search(self, request: SearchRequest) -> dict[str, object]:
        return {"results": [{"snippet": "s" * 30_000}], "query": request.query}

    def get(self, path: str, start: int | None = None, lines: int | None = None,
            max_bytes: int | None = None) -> dict[str, object]:
        return {"path": path, "text": "x" * (max_bytes or 30_000), "from": start or 1, "lines": 1, "truncated": False}


@pytest.mark.parametrize("max_reply, budget, code", [(150_000, 1 << 30, -32002), (1 << 30, 150_000, -32001)])
def test_fuzz_the_dispatcher_at_its_limits(thread_errors: list[str], max_reply: int, budget: int, code: int) -> None:
    """A small reply cap, or a small budget: every reply stays within both and gives its budget back."""
    held = MemoryBudget(budget, free=2_000)
    dispatcher = Dispatcher(BulkyBackend(), log=RecordingLog(), max_reply=max_reply)
    codes: set[int] = set()
    full = json.dumps([{"jsonrpc": "2.0", "id": n, "method": "get", "params": {"path": "MEMORY.md"}}
                       for n in range(20)]).encode()  # 600 KB of answers: over both limits, whatever the seed
    for line in [*generate(random.Random(SEED + 2), DISPATCHER_LINES), full]:
        reply = dispatcher.answer(line, held)
        if not expects_answer(line, over_socket=False):
            assert reply is None, line[:200]
            continue
        assert reply is not None, line[:200]
        raw = reply.data()
        assert len(raw) == reply.size <= max_reply and held.held <= held.limit
        check_answer(line, raw)
        answer = json.loads(raw)
        codes.update(a["error"]["code"] for a in (answer if isinstance(answer, list) else [answer]) if "error" in a)
        reply.release()
        assert held.held == 0, line[:200]
    assert code in codes
    assert thread_errors == []


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    yield from short_dir()


def test_fuzz_a_daemon_over_one_connection(workspace: Path, tmp_path: Path, sock_dir: Path, write: Any,
                                            thread_errors: list[str]) -> None:
    write("MEMORY.md", "# Long-term\nWe chose SQLite for the index.\n")
    write("memory/2026-01-02.md", "# Jan 2\nThe zebra project started.\nLine three.\n")
    settings = daemon_settings(workspace, tmp_path, sock_dir)
    with running_daemon(settings) as daemon, RawClient(settings.socket_path, timeout=20.0) as client:
        answered = 0
        for n, line in enumerate(generate(random.Random(SEED + 1), DAEMON_LINES)):
            marker = f"marker-{n}"
            # The marker (an unknown method: answered at once, by id) shows where this line's answers end.
            client.send(line + b"\n" + json.dumps({"jsonrpc": "2.0", "id": marker, "method": "fuzz"}).encode()
                        + b"\n")
            lines = []
            while True:
                raw = client.file.readline()
                assert raw, f"the daemon closed the connection after {line[:200]!r}"
                if raw.startswith(b"{") and _strict_loads(raw).get("id") == marker:
                    break
                lines.append(raw)
            expected = 1 if expects_answer(line, over_socket=True) else 0
            assert len(lines) == expected, (line[:200], [x[:200] for x in lines])
            for raw in lines:
                check_answer(line, raw)
            answered += expected
            if n % STATUS_EVERY == 0:
                status = client.call("status")
                assert "result" in status, status
                assert status["result"]["files_indexed"] >= 0
        assert answered > DAEMON_LINES // 2
        assert "result" in client.call("status")
        assert daemon.server is not None and daemon.server.alive()
        failures = [r for r in daemon.log.records if r[0] == "exception"]
        assert failures == []
    assert thread_errors == []
