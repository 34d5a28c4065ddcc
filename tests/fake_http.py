"""A scripted HTTP server on 127.0.0.1 that speaks the embedding providers' wire formats.

The real SDK clients talk to it over a socket, so the tests exercise the SDKs' own request building,
parsing and error mapping, not a mock of them. Every request is recorded (path, headers, JSON body);
replies come from a queue of scripted `Reply`s, then from a default responder.
"""

from __future__ import annotations

import base64
import json
import math
import re
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import pytest
import xxhash

__all__ = [
    "FakeServer",
    "Recorded",
    "Reply",
    "fake_server",
    "gemini_reply",
    "no_proxy",
    "openai_reply",
    "vector_for",
    "voyage_reply",
]


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes


@dataclass(frozen=True)
class Reply:
    status: int = 200
    json: Any = None
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


Responder = Callable[[Recorded], Reply]


def vector_for(text: str, dims: int) -> list[float]:
    """A deterministic, non-zero, not normalised vector for `text` (tests recompute the expectation)."""
    seed = xxhash.xxh3_64_intdigest(text.encode())
    return [float(((seed >> (i % 60)) & 7) - 3.5) for i in range(dims)]


def openai_reply(request: Recorded, dims: int = 8) -> Reply:
    """POST /embeddings: `data[i].embedding` as floats, or base64 float32 when asked."""
    body = request.body
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    dims = body.get("dimensions") or dims
    as_base64 = body.get("encoding_format") == "base64"
    data = [{"object": "embedding", "index": i, "embedding": _encode(vector_for(t, dims), as_base64)}
            for i, t in enumerate(inputs)]
    return Reply(json={"object": "list", "data": data, "model": body["model"],
                       "usage": {"prompt_tokens": 1, "total_tokens": 1}})


def gemini_reply(request: Recorded, dims: int = 8) -> Reply:
    """POST /{version}/models/{model}:batchEmbedContents: `embeddings[i].values`."""
    embeddings = []
    for item in request.body["requests"]:
        text = "".join(part["text"] for part in item["content"]["parts"])
        embeddings.append({"values": vector_for(text, item.get("outputDimensionality") or dims)})
    return Reply(json={"embeddings": embeddings})


def voyage_reply(request: Recorded, dims: int = 8) -> Reply:
    """POST /embeddings: like OpenAI's, the SDK asks for base64 float32."""
    body = request.body
    dims = body.get("output_dimension") or dims
    as_base64 = body.get("encoding_format") == "base64"
    data = [{"object": "embedding", "index": i, "embedding": _encode(vector_for(t, dims), as_base64)}
            for i, t in enumerate(body["input"])]
    return Reply(json={"object": "list", "data": data, "model": body["model"], "usage": {"total_tokens": 1}})


def _encode(vector: Sequence[float], as_base64: bool) -> list[float] | str:
    if not as_base64:
        return list(vector)
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


class FakeServer:
    """Serves scripted replies on 127.0.0.1:<free port>; use as a context manager."""

    def __init__(self, default: Responder | None = None) -> None:
        self.default = default
        self.requests: list[Recorded] = []
        self._queue: list[Reply | Responder] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}"

    def script(self, *replies: Reply | Responder) -> None:
        """Serve these replies to the next requests, in order, before falling back to `default`."""
        with self._lock:
            self._queue.extend(replies)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _respond(self, request: Recorded) -> Reply:
        with self._lock:
            self.requests.append(request)
            scripted = self._queue.pop(0) if self._queue else None
        chosen = scripted if scripted is not None else self.default
        if chosen is None:
            return Reply(status=500, json={"error": {"message": "no reply scripted"}})
        return chosen(request) if callable(chosen) else chosen

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                request = Recorded(method="POST", path=self.path,
                                   headers={k.lower(): v for k, v in self.headers.items()}, body=body, raw=raw)
                reply = server._respond(request)
                if reply.delay and server._closing.wait(reply.delay):
                    return
                payload = reply.body if reply.body is not None else json.dumps(reply.json).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.headers.get("Content-Type", "application/json"))
                    for name, value in reply.headers.items():
                        if name.lower() != "content-type":
                            self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    with FakeServer() as server:
        yield server


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep a machine's proxy settings from routing 127.0.0.1 traffic elsewhere."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def assert_unit(vector: Sequence[float]) -> None:
    assert math.isclose(math.fsum(x * x for x in vector), 1.0, rel_tol=1e-6)


def path_of(request: Recorded) -> str:
    return re.sub(r"\?.*$", "", request.path)
