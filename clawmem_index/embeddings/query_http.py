"""One embeddings request through the standard library's HTTP client: a query's vector without an SDK.

A search without a daemon embeds one short text. Importing the openai SDK (pydantic, httpx and its
types) cost ~0.5 s of CPU, more than the whole keyword search; the other SDKs cost less, but still
more than one request. Indexing keeps the SDKs (batching, Batch API jobs); a query that fits in one
request is sent here, with what the SDKs would do for it: the proxy settings of the environment,
certifi's CA bundle unless `SSL_CERT_FILE` / `SSL_CERT_DIR` name others, no redirects followed, a
timeout, and a bounded answer. Failures are exceptions `failure_of` maps to a `retry.Failure`, so
the one retry loop (`clawmem_index.embeddings.retry`) handles them as it does the SDKs'.
"""

from __future__ import annotations

import base64
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clawmem_index.embeddings.retry import Failure, Kind, failure_from_status

if TYPE_CHECKING:
    import ssl
    import urllib.request

__all__ = ["MAX_REPLY_BYTES", "HTTPCall", "ReplyTooLarge", "StatusError", "decode_vector", "failure_of", "post_json"]

MAX_REPLY_BYTES = 16 << 20  # a query's vector is at most ~100 KB as JSON; a bigger answer is not one


@dataclass(frozen=True)
class HTTPCall:
    """A JSON POST: where, with which headers (credentials included), and its body."""

    url: str
    headers: Mapping[str, str]
    body: Any


class StatusError(Exception):
    """The server answered with a status other than 2xx."""

    def __init__(self, status: int, headers: Mapping[str, str], message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.headers = headers
        self.message = message


class ReplyTooLarge(ValueError):
    """The answer was larger than MAX_REPLY_BYTES."""


def _opener(https: bool) -> urllib.request.OpenerDirector:
    """Made per request (it reads the proxy settings of the environment then); for https, around one TLS context
    (loading the CA bundle costs ~20 ms: a server on plain http, a local one, does not need it).

    A redirect is answered as the error it is for a POST (the SDKs do not follow them either).
    urllib (~15 ms with http.client and ssl) is imported here: a command that sends no query does not need it.
    """
    import urllib.request

    class NoRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    handlers: list[Any] = [NoRedirects()]
    if https:
        handlers.append(urllib.request.HTTPSHandler(context=_tls_context()))
    return urllib.request.build_opener(*handlers)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's choice (the SDKs' client): `SSL_CERT_FILE` or `SSL_CERT_DIR` when set, else certifi's bundle."""
    import ssl

    cafile, capath = os.environ.get("SSL_CERT_FILE") or None, os.environ.get("SSL_CERT_DIR") or None
    if cafile is None and capath is None:
        try:
            import certifi

            cafile = certifi.where()
        except ImportError:  # the system's store, then
            pass
    return ssl.create_default_context(cafile=cafile, capath=capath)


def post_json(call: HTTPCall, *, timeout: float, max_bytes: int = MAX_REPLY_BYTES) -> Any:
    """POST `call.body` as JSON; the answer's JSON. Raises StatusError, ReplyTooLarge, ValueError or an OSError."""
    import http.client
    import urllib.error
    import urllib.request

    data = json.dumps(call.body).encode()
    request = urllib.request.Request(call.url, data=data, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json", **call.headers})
    try:
        with _opener(call.url.lower().startswith("https:")).open(request, timeout=timeout) as response:
            return json.loads(_read(response, max_bytes))
    except urllib.error.HTTPError as exc:
        try:
            with exc:
                body = _read(exc, 64 << 10, truncate=True)
        except (OSError, AttributeError, http.client.HTTPException):  # no body to read, or it broke off
            body = b""
        raise StatusError(exc.code, dict(exc.headers.items()), _message(body)) from None


def _read(response: Any, max_bytes: int, *, truncate: bool = False) -> bytes:
    body = response.read(max_bytes + 1)
    if len(body) > max_bytes and not truncate:
        raise ReplyTooLarge(f"an answer over {max_bytes} bytes")
    return bytes(body[:max_bytes])


def _message(body: bytes) -> str:
    """The error's own words: `error.message` (OpenAI, Gemini), `detail` (Voyage), else the body's start."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body[:300].decode("utf-8", "replace")
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(payload.get("detail"), str):
            return str(payload["detail"])
    return body[:300].decode("utf-8", "replace")


def failure_of(exc: Exception) -> Failure | None:
    """What went wrong with a `post_json`, as a Failure; None for an exception it does not raise."""
    import http.client
    import urllib.error

    if isinstance(exc, StatusError):
        return failure_from_status(exc.status, exc.headers, exc.message)
    if isinstance(exc, ReplyTooLarge):
        return Failure(Kind.BAD_RESPONSE, str(exc))
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            return Failure(Kind.TIMEOUT, str(reason) or "timed out")
        return Failure(Kind.CONNECTION, str(reason))
    if isinstance(exc, TimeoutError):
        return Failure(Kind.TIMEOUT, str(exc) or "timed out")
    if isinstance(exc, (http.client.HTTPException, ConnectionError)):
        return Failure(Kind.CONNECTION, f"{type(exc).__name__}: {exc}")
    if isinstance(exc, OSError):
        return Failure(Kind.CONNECTION, str(exc))
    return None


def decode_vector(embedding: object) -> Any:
    """A vector as the server sent it: base64 little-endian float32 (asked for), or a JSON list (some servers)."""
    import numpy as np

    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding, validate=True), dtype="<f4")
    if isinstance(embedding, list):
        return np.asarray(embedding, dtype=np.float64)
    raise ValueError(f"an embedding of type {type(embedding).__name__}")
