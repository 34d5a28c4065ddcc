"""A fake OpenAI-compatible chat-completions server on 127.0.0.1 for agent turns through a real OpenClaw Gateway:
it records every request it is sent and answers from a script (a queue of replies, and rules tried first), with
streaming (SSE) and plain JSON answers as OpenClaw asks. A reply is {"content": text} or {"tool_calls": [{"name",
"arguments"}]}, optionally with "usage"; a rule's reply may be a function of the request."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Reply = dict[str, Any]


def text(content: str, **extra: Any) -> Reply:
    return {"content": content, **extra}


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None, **extra: Any) -> Reply:
    return {"tool_calls": [{"name": name, "arguments": arguments, "id": call_id}], **extra}


def system_text(body: dict[str, Any]) -> str:
    """All system/developer message text of a request, joined."""
    parts: list[str] = []
    for message in body.get("messages") or []:
        if message.get("role") in ("system", "developer"):
            parts.append(content_text(message.get("content")))
    return "\n\n".join(parts)


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content)


def last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


class FakeModel:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, record_path: Path | None = None,
                 default_reply: Reply | None = None, model_ids: tuple[str, ...] = ("fake-model",)) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies_sent: list[Reply] = []
        self._queue: deque[Reply] = deque()
        self._rules: list[tuple[Callable[[dict[str, Any]], bool], Any, bool]] = []
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self.record_path = record_path
        self.default_reply = default_reply or {"content": "ok"}
        self.model_ids = model_ids
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                return json.loads(raw) if raw else {}

            def do_GET(self) -> None:
                path = self.path.split("?")[0].rstrip("/")
                if path.endswith("/models"):
                    self._json(200, {"object": "list", "data": [
                        {"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in fake.model_ids]})
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                path = self.path.split("?")[0].rstrip("/")
                body = self._body()
                if path.endswith("/chat/completions"):
                    fake._chat(self, body)
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- scripting -----------------------------------------------------------------------------------------------
    def script(self, *replies: Reply) -> FakeModel:
        with self._lock:
            self._queue.extend(replies)
        return self

    def rule(self, predicate: Callable[[dict[str, Any]], bool], reply: Reply | Callable[[dict[str, Any]], Reply],
             once: bool = False) -> FakeModel:
        with self._lock:
            self._rules.append((predicate, reply, once))
        return self

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self._rules.clear()
            self.requests.clear()
            self.replies_sent.clear()

    def wait_for_requests(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._arrived.wait(left)
        return True

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> FakeModel:
        self._thread = threading.Thread(target=self.server.serve_forever, name="fake-model", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the chat endpoint ---------------------------------------------------------------------------------------
    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            for index, (predicate, reply, once) in enumerate(self._rules):
                try:
                    matched = predicate(body)
                except Exception:  # a broken predicate is a non-match
                    matched = False
                if matched:
                    if once:
                        del self._rules[index]
                    return reply(body) if callable(reply) else reply
            if self._queue:
                return self._queue.popleft()
            return self.default_reply

    def _record(self, body: dict[str, Any], reply: Reply) -> None:
        with self._arrived:
            self.requests.append(body)
            self.replies_sent.append(reply)
            if self.record_path is not None:
                with open(self.record_path, "a") as out:
                    out.write(json.dumps({"t": time.time(), "request": body, "reply": reply}) + "\n")
            self._arrived.notify_all()

    def _chat(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        reply = self._next_reply(body)
        self._record(body, reply)
        if reply.get("status"):
            handler._json(int(reply["status"]), {"error": {"message": reply.get("error", "scripted error"),
                                                            "type": "server_error"}})
            return
        model = body.get("model", self.model_ids[0])
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        created = int(time.time())
        content = reply.get("content")
        calls = [{"id": c.get("id") or f"call_{uuid.uuid4().hex[:10]}", "type": "function",
                  "function": {"name": c["name"], "arguments": c["arguments"] if isinstance(c["arguments"], str)
                               else json.dumps(c["arguments"])}} for c in reply.get("tool_calls") or []]
        finish = "tool_calls" if calls else "stop"
        prompt_chars = len(json.dumps(body.get("messages", [])))
        usage = {"prompt_tokens": max(1, prompt_chars // 4), "completion_tokens": 5}
        usage.update(reply.get("usage") or {})
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]

        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": content if content is not None else
                                       (None if calls else "")}
            if calls:
                message["tool_calls"] = calls
            handler._json(200, {"id": completion_id, "object": "chat.completion", "created": created, "model": model,
                                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                                "usage": usage})
            return

        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True

        def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> None:
            payload = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}
            handler.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            handler.wfile.flush()

        chunk({"role": "assistant", "content": ""})
        if content:
            for start in range(0, len(content), 40):
                chunk({"content": content[start:start + 40]})
        for index, call in enumerate(calls):
            chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                   "function": {"name": call["function"]["name"], "arguments": ""}}]})
            chunk({"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]})
        chunk({}, finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            handler.wfile.write(("data: " + json.dumps({"id": completion_id, "object": "chat.completion.chunk",
                                                        "created": created, "model": model, "choices": [],
                                                        "usage": usage}) + "\n\n").encode())
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()
