"""A scripted HTTP server on 127.0.0.1 that speaks the embedding providers' wire formats.

The real SDK clients talk to it over a socket, so the tests exercise the SDKs' own request building,
parsing and error mapping, not a mock of them. Every request is recorded (path, headers, JSON body);
replies come from a queue of scripted `Reply`s, then from a default responder.
"""

from __future__ import annotations

import base64
import email.policy
import json
import math
import re
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import pytest
import xxhash

__all__ = [
    "FakeBatches",
    "FakeJob",
    "FakeServer",
    "GeminiBatches",
    "OpenAIBatches",
    "Recorded",
    "Reply",
    "fake_server",
    "gemini_reply",
    "no_proxy",
    "openai_reply",
    "query_route",
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
                self._serve("POST")

            def do_GET(self) -> None:
                self._serve("GET")

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                request = Recorded(method=method, path=self.path,
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


@pytest.fixture(params=["one request", "sdk"])
def query_route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: queries sent as one plain request (the route a query fits), then through the SDK (the
    route of a query too long for one input, and of every document), so both keep the same behaviour."""
    if request.param == "sdk":
        from clawmem_index.embeddings.remote import RemoteProvider

        monkeypatch.setattr(RemoteProvider, "embed_query", lambda self, text: self._embed([text], "query")[0])
    return str(request.param)


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


@dataclass
class FakeJob:
    """One job of a fake batch service: its requests as parsed from the wire, and where it stands.

    `requests` holds (key, text, dimensions) per request in order; `key` is the OpenAI custom_id
    or the Gemini request's metadata key. `state` is running, cancelling, completed, failed,
    expired or cancelled; `failed` maps the keys answered with an error to how ("status": an
    HTTP error answer, "error": no answer at all).
    """

    id: str
    requests: list[tuple[str, str, int]]
    raw: Any = None
    state: str = "running"
    polls: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    message: str = ""


class FakeBatches:
    """An in-memory batch service behind a FakeServer: jobs change state only when the test says so.

    Used as the server's `default` responder; requests it does not serve go to `fallback` (the
    synchronous embeddings endpoint, so one server answers both paths). With `complete_after`, a
    running job completes on that many polls instead.
    """

    def __init__(self, fallback: Responder | None = None, dims: int = 8) -> None:
        self.fallback = fallback
        self.dims = dims
        self.jobs: dict[str, FakeJob] = {}
        self.complete_after: int | None = None
        self._lock = threading.Lock()
        self._counter = 0

    def job(self, job_id: str | None = None) -> FakeJob:
        """The job `job_id`, or the one created last."""
        with self._lock:
            return self.jobs[job_id] if job_id is not None else list(self.jobs.values())[-1]

    def complete(self, job_id: str | None = None, *, failed: Iterable[str] = (), errored: Iterable[str] = ()) -> None:
        """Finish a job: `failed` keys get an error answer, `errored` keys none at all, the rest a vector."""
        job = self.job(job_id)
        with self._lock:
            job.state = "completed"
            job.failed = {**dict.fromkeys(failed, "status"), **dict.fromkeys(errored, "error")}
            self._completed(job)

    def fail(self, job_id: str | None = None, message: str = "the input file is invalid") -> None:
        job = self.job(job_id)
        with self._lock:
            job.state, job.message = "failed", message

    def expire(self, job_id: str | None = None) -> None:
        job = self.job(job_id)
        with self._lock:
            job.state = "expired"

    def __call__(self, request: Recorded) -> Reply:
        reply = self._route(request)
        if reply is not None:
            return reply
        if self.fallback is None:
            return Reply(status=404, json={"error": {"message": f"no route for {request.method} {request.path}"}})
        return self.fallback(request)

    def _new_id(self) -> int:
        self._counter += 1
        return self._counter

    def _polled(self, job: FakeJob) -> None:
        """Count a poll; a cancelling job is cancelled by then, and `complete_after` may finish a running one."""
        job.polls += 1
        if job.state == "cancelling":
            job.state = "cancelled"
        if job.state == "running" and self.complete_after is not None and job.polls >= self.complete_after:
            job.state = "completed"
            self._completed(job)

    def _route(self, request: Recorded) -> Reply | None:
        raise NotImplementedError

    def _completed(self, job: FakeJob) -> None:
        """Hook: a job has just completed (called with the lock held)."""


class OpenAIBatches(FakeBatches):
    """OpenAI's Files and Batches endpoints: a JSONL upload, a batch over it, output and error files."""

    def __init__(self, fallback: Responder | None = openai_reply, dims: int = 8) -> None:
        super().__init__(fallback, dims)
        self.files: dict[str, tuple[str, str, bytes]] = {}  # id -> (filename, purpose, content)

    def lines(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """The JSONL lines a job was created from, parsed."""
        return [json.loads(line) for line in self.files[self.job(job_id).raw][2].splitlines()]

    def _route(self, request: Recorded) -> Reply | None:
        path = path_of(request)
        with self._lock:
            if request.method == "POST" and path == "/v1/files":
                return self._upload(request)
            if request.method == "POST" and path == "/v1/batches":
                return self._create(request.body or {})
            match = re.fullmatch(r"/v1/batches/([^/]+)(/cancel)?", path)
            if match and match[1] in self.jobs:
                job = self.jobs[match[1]]
                if match[2] and request.method == "POST":
                    if job.state not in ("running", "cancelling"):
                        message = f"cannot cancel a batch that is {self._status(job)}"
                        return Reply(status=400, json={"error": {"message": message}})
                    job.state = "cancelling"
                elif request.method == "GET":
                    self._polled(job)
                return Reply(json=self._batch(job))
            match = re.fullmatch(r"/v1/files/([^/]+)/content", path)
            if match and request.method == "GET" and match[1] in self.files:
                return Reply(body=self.files[match[1]][2], headers={"Content-Type": "application/octet-stream"})
        if path.startswith(("/v1/files", "/v1/batches")):
            return Reply(status=404, json={"error": {"message": "No such object", "type": "invalid_request_error"}})
        return None

    def _upload(self, request: Recorded) -> Reply:
        parts = _multipart(request)
        filename, content = parts["file"]
        purpose = parts["purpose"][1].decode()
        file_id = f"file-{self._new_id()}"
        self.files[file_id] = (filename or "", purpose, content)
        return Reply(json={"id": file_id, "object": "file", "bytes": len(content), "created_at": 1700000000,
                           "filename": filename, "purpose": purpose, "status": "processed"})

    def _create(self, body: dict[str, Any]) -> Reply:
        file = self.files.get(body.get("input_file_id", ""))
        if file is None or file[1] != "batch":
            problem = "no input file with purpose batch"
        elif body.get("endpoint") != "/v1/embeddings" or body.get("completion_window") != "24h":
            problem = "this fake serves /v1/embeddings batches with a 24h window only"
        else:
            problem = ""
        if file is None or problem:
            return Reply(status=400, json={"error": {"message": problem, "type": "invalid_request_error"}})
        job = FakeJob(id=f"batch_{self._new_id()}", requests=[], raw=body["input_file_id"])
        self.jobs[job.id] = job
        seen: set[str] = set()
        for number, text in enumerate(file[2].decode().splitlines(), 1):
            line = json.loads(text)
            request = line.get("body") or {}
            if (line.get("method") != "POST" or line.get("url") != "/v1/embeddings" or line.get("custom_id") in seen
                    or not isinstance(request.get("input"), str) or not request.get("model")):
                job.state, job.message = "failed", f"line {number} is not a valid /v1/embeddings request"
                break
            seen.add(line["custom_id"])
            job.requests.append((line["custom_id"], request["input"], request.get("dimensions") or self.dims))
        return Reply(json=self._batch(job))

    def _completed(self, job: FakeJob) -> None:
        lines = [json.loads(line) for line in self.files[job.raw][2].splitlines()]
        output, errors = [], []
        for number, line in enumerate(lines):
            key, how = line["custom_id"], job.failed.get(line["custom_id"])
            record: dict[str, Any] = {"id": f"batch_req_{number}", "custom_id": key, "response": None, "error": None}
            if how == "error":
                record["error"] = {"code": "batch_expired", "message": "not executed within the completion window"}
                errors.append(record)
            elif how == "status":
                record["response"] = {"status_code": 400, "request_id": f"req_{number}",
                                      "body": {"error": {"message": "bad input", "type": "invalid_request_error"}}}
                errors.append(record)
            else:
                body = {**line["body"], "input": [line["body"]["input"]]}
                request = Recorded("POST", "/v1/embeddings", {}, body, b"")
                record["response"] = {"status_code": 200, "request_id": f"req_{number}",
                                      "body": openai_reply(request, self.dims).json}
                output.append(record)
        for kind, records in (("out", output), ("err", errors)):
            if records:
                self.files[f"file-{kind}-{job.id}"] = (f"{kind}.jsonl", "batch_output",
                                                       "".join(json.dumps(r) + "\n" for r in records).encode())

    def _status(self, job: FakeJob) -> str:
        if job.state == "running":
            return "validating" if job.polls == 0 else "in_progress"
        return job.state

    def _batch(self, job: FakeJob) -> dict[str, Any]:
        done = job.state == "completed"
        failed = len(job.failed) if done else 0
        batch: dict[str, Any] = {
            "id": job.id, "object": "batch", "endpoint": "/v1/embeddings", "input_file_id": job.raw,
            "completion_window": "24h", "status": self._status(job), "created_at": 1700000000,
            "output_file_id": f"file-out-{job.id}" if f"file-out-{job.id}" in self.files else None,
            "error_file_id": f"file-err-{job.id}" if f"file-err-{job.id}" in self.files else None,
            "request_counts": {"total": len(job.requests), "completed": len(job.requests) - failed if done else 0,
                               "failed": failed},
            "errors": None,
        }
        if job.state == "failed":
            batch["errors"] = {"object": "list", "data": [{"code": "invalid_input", "message": job.message,
                                                           "line": None, "param": None}]}
        return batch


class GeminiBatches(FakeBatches):
    """The Gemini API's batch embeddings: `asyncBatchEmbedContent`, then the batch operation polled by name.

    Responses are inline, in request order, each with its request's `metadata` (unless
    `echo_metadata` is off), under `output.inlinedResponses` as the API sends them.
    """

    def __init__(self, fallback: Responder | None = gemini_reply, dims: int = 8) -> None:
        super().__init__(fallback, dims)
        self.echo_metadata = True

    def _route(self, request: Recorded) -> Reply | None:
        path = path_of(request)
        with self._lock:
            match = re.fullmatch(r"/(v\w+)/models/([^/:]+):asyncBatchEmbedContent", path)
            if match and request.method == "POST":
                return self._create(match[2], request.body or {})
            match = re.fullmatch(r"/v\w+/batches/([^/:]+)(:cancel)?", path)
            if match:
                job = self.jobs.get(f"batches/{match[1]}")
                if job is None:
                    return _google_error(404, "NOT_FOUND", f"batch {match[1]} not found")
                if match[2] and request.method == "POST":
                    if job.state != "running":
                        return _google_error(400, "FAILED_PRECONDITION", "the batch is not running")
                    job.state = "cancelling"
                    return Reply(json={})
                if request.method == "GET":
                    self._polled(job)
                    return Reply(json=self._operation(job))
        return None

    def _create(self, model: str, body: dict[str, Any]) -> Reply:
        batch = body.get("batch") or {}
        items = ((batch.get("inputConfig") or {}).get("requests") or {}).get("requests")
        if not batch.get("displayName") or not items:
            return _google_error(400, "INVALID_ARGUMENT", "batch.displayName and inline requests are required")
        requests = []
        for number, item in enumerate(items):
            inner = item.get("request") or {}
            parts = (inner.get("content") or {}).get("parts") or []
            if not parts or not all(isinstance(part.get("text"), str) for part in parts):
                return _google_error(400, "INVALID_ARGUMENT", f"request {number} has no text")
            key = str((item.get("metadata") or {}).get("key", number))
            requests.append((key, "".join(part["text"] for part in parts),
                             inner.get("outputDimensionality") or self.dims))
        job = FakeJob(id=f"batches/emb-{self._new_id()}", requests=requests, raw={"model": model, "batch": batch})
        self.jobs[job.id] = job
        return Reply(json=self._operation(job))

    def inlined(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """The inline requests a job was created with, as sent."""
        return _inlined(self.job(job_id))

    def _operation(self, job: FakeJob) -> dict[str, Any]:
        state = {"running": "BATCH_STATE_PENDING" if job.polls == 0 else "BATCH_STATE_RUNNING",
                 "cancelling": "BATCH_STATE_RUNNING", "completed": "BATCH_STATE_SUCCEEDED"}.get(
                     job.state, f"BATCH_STATE_{job.state.upper()}")
        metadata: dict[str, Any] = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.EmbedContentBatch",
            "model": f"models/{job.raw['model']}", "displayName": job.raw["batch"]["displayName"], "name": job.id,
            "state": state, "createTime": "2026-01-01T00:00:00Z", "updateTime": "2026-01-01T00:00:00Z",
        }
        operation: dict[str, Any] = {"name": job.id, "metadata": metadata}
        if job.state == "completed":
            metadata["output"] = {"inlinedResponses": {"inlinedResponses": [
                self._response(job, key, text, dims, item.get("metadata"))
                for (key, text, dims), item in zip(job.requests, _inlined(job), strict=True)]}}
            operation["done"] = True
        elif job.state in ("failed", "expired", "cancelled"):
            operation["done"] = True
            operation["error"] = {"code": 13 if job.state == "failed" else 4, "message": job.message or job.state}
        return operation

    def _response(self, job: FakeJob, key: str, text: str, dims: int, metadata: Any) -> dict[str, Any]:
        answer: dict[str, Any] = {"metadata": metadata} if self.echo_metadata and metadata is not None else {}
        if key in job.failed:
            answer["error"] = {"code": 3, "message": f"request {key} was invalid"}
        else:
            answer["response"] = {"embedding": {"values": vector_for(text, dims)}}
        return answer


def _inlined(job: FakeJob) -> list[dict[str, Any]]:
    return list(job.raw["batch"]["inputConfig"]["requests"]["requests"])


def _google_error(code: int, status: str, message: str) -> Reply:
    return Reply(status=code, json={"error": {"code": code, "message": message, "status": status}})


def _multipart(request: Recorded) -> dict[str, tuple[str | None, bytes]]:
    """A multipart/form-data body's fields: name -> (filename, content)."""
    head = f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode()
    message = BytesParser(policy=email.policy.HTTP).parsebytes(head + request.raw)
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        fields[str(name)] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields
