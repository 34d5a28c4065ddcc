"""What the OpenAI, Gemini and Voyage providers share: planning, retries, checks, identity.

A subclass implements five methods: `_make_client` builds its SDK client (called on first use
only: importing an SDK costs up to a second, which a command that embeds nothing must not pay),
`_request` makes exactly one HTTP call for a list of inputs, `_classify` maps the SDK's
exceptions to a `retry.Failure`, and `_query_call` / `_query_vector` describe the one request a
query is, as the SDK would send it, and read its answer: a query is sent without the SDK
(`clawmem_index.embeddings.query_http`; connections are not kept, as the SDKs keep theirs 5 s at most).
Everything else, from splitting over-limit inputs to refusing zero vectors, lives here once.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.base import ProviderBase, ProviderInfo
from clawmem_index.embeddings.batching import Piece, Plan, combine, embed_planned, plan_batches
from clawmem_index.embeddings.query_http import HTTPCall, failure_of, post_json
from clawmem_index.embeddings.retry import (
    Failure,
    Kind,
    Pause,
    RetryPolicy,
    call_with_retries,
    failure_from_status,
    redact,
)
from clawmem_index.errors import ProviderError
from clawmem_index.text.tokens import get_encoding

__all__ = ["InputKind", "Limits", "RemoteProvider", "describe_endpoint", "first_set", "is_secret_header",
           "secret_values"]

InputKind = Literal["document", "query"]
T = TypeVar("T")

_SECRET_WORDS = ("auth", "key", "token", "secret", "password", "passwd", "cookie", "session", "signature",
                 "credential")


@dataclass(frozen=True)
class Limits:
    """A model's request limits, in cl100k tokens (already discounted where the model counts differently)."""

    max_input_tokens: int
    max_batch_inputs: int
    max_batch_tokens: int


def is_secret_header(name: str) -> bool:
    """Headers that carry credentials: never part of the endpoint identity, never in a message."""
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def describe_endpoint(base_url: str, headers: Mapping[str, str]) -> str:
    """Base URL plus sorted non-secret headers: what decides which server answers, without any key."""
    public = sorted((k.lower(), v) for k, v in headers.items() if not is_secret_header(k))
    return "; ".join([base_url.rstrip("/"), *(f"{k}={v}" for k, v in public)])


def secret_values(headers: Mapping[str, str]) -> list[str]:
    """Values of the credential headers, to scrub from error messages."""
    return [value for name, value in headers.items() if is_secret_header(name)]


def first_set(environ: Mapping[str, str], *names: str) -> str:
    """The first non-empty environment variable among `names`, stripped, or ''."""
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return value
    return ""


class RemoteProvider(ProviderBase, abc.ABC):
    """Base for SDK-backed providers; see the module docstring for the subclass contract."""

    name: ClassVar[str]
    known_dims: ClassVar[Mapping[str, int]] = {}

    def __init__(
        self,
        settings: EmbeddingSettings,
        *,
        model: str,
        endpoint: str,
        limits: Limits,
        secrets: Sequence[str],
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._settings = settings
        self._model = model
        self._endpoint = endpoint
        self._secrets = tuple(s for s in secrets if s)
        self._policy = RetryPolicy(max_retries=settings.max_retries, sleep=sleep)
        self._batch_size = min(settings.batch_size, limits.max_batch_inputs)
        self._batch_tokens = min(settings.batch_tokens, limits.max_batch_tokens)
        self._max_input_tokens = limits.max_input_tokens
        self._declared_dims = settings.dimensions or self.known_dims.get(model, 0)
        self._dims = self._declared_dims
        self._lock = threading.Lock()
        self._concurrency = settings.concurrency
        self._pause = Pause(sleep)
        self._client_lock = threading.Lock()
        self._sdk_client: Any = None

    @property
    def _client(self) -> Any:
        """The SDK client, made on first use; an SDK that fails to import then is a ProviderError naming it."""
        if self._sdk_client is None:
            with self._client_lock:
                if self._sdk_client is None:
                    try:
                        self._sdk_client = self._make_client()
                    except ImportError as exc:
                        raise ProviderError(f"{self.name}: its SDK cannot be imported ({exc.name or exc}); "
                                            "reinstall the provider's extra") from exc
        return self._sdk_client

    def close(self) -> None:
        """Close the SDK client's connections, if one was ever made."""
        close = getattr(self._sdk_client, "close", None)
        if close is not None:
            close()

    @property
    def info(self) -> ProviderInfo:
        """The provider's identity, known without a request (the index must build while the provider is down).

        `dims` is the size the settings or the model table declare, 0 when only the first answer will
        tell; it stays so, since it is part of the fingerprint (`vector_dims` says what was learned).
        """
        return ProviderInfo(provider=self.name, model=self._model, dims=self._declared_dims, endpoint=self._endpoint)

    @property
    def preferred_batch(self) -> int:
        """Texts worth handing over per call: enough to keep every concurrent request busy."""
        return self._batch_size * self._concurrency

    @property
    def vector_dims(self) -> int:
        """The size of this model's vectors: declared, or learned from its first answer (0 before that)."""
        return self._dims

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return self._embed(texts, "document")

    def embed_query(self, text: str) -> list[float]:
        """One request without the SDK, unless the text needs splitting (see `embed_documents`).

        A text of at most `_split_tokens` bytes is within every limit (a token is at least a byte).
        """
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self._split_tokens:
            return self._embed([text], "query")[0]
        sent = text or " "  # as `plan_batches` sends an empty text: the APIs refuse empty inputs
        call = self._query_call(sent)
        vectors = call_with_retries(lambda: [self._query_vector(post_json(call, timeout=self._settings.timeout))],
                                    self._classify_any, self._policy,
                                    what=f"{self.name} embeddings request ({self._model})", secrets=self._secrets,
                                    pause=self._pause)
        self._check_dims(vectors)
        vector: list[float] = combine(Plan((Piece(sent, max(size, 1), 0),), ((0,),), 1), vectors)[0]
        return vector  # checked and made unit

    def _embed(self, texts: Sequence[str], kind: InputKind) -> list[list[float]]:
        if not texts:
            return []
        plan = plan_batches(texts, batch_size=self._batch_size, batch_tokens=self._batch_tokens,
                            max_input_tokens=self._max_input_tokens, encoding=get_encoding("cl100k_base"))
        return embed_planned(plan, lambda inputs: self._send(inputs, kind), width=self._concurrency)

    def _send(self, inputs: list[str], kind: InputKind) -> list[list[float]]:
        vectors = call_with_retries(lambda: self._request(inputs, kind), self._classify_any, self._policy,
                                    what=f"{self.name} embeddings request ({self._model})", secrets=self._secrets,
                                    pause=self._pause)
        self._check_dims(vectors)
        return vectors

    def _check_dims(self, vectors: Sequence[Sequence[float]]) -> None:
        """Every vector must have the model's size; the first answer fixes it when it was unknown."""
        with self._lock:
            for vector in vectors:
                if len(vector) == 0:
                    raise ProviderError(f"{self.name} returned an empty vector for model {self._model!r}")
                if not self._dims:
                    self._dims = len(vector)
                if len(vector) != self._dims:
                    raise ProviderError(f"{self.name} returned a {len(vector)}-d vector for model {self._model!r}, "
                                        f"expected {self._dims}-d")

    def _call(self, attempt: Callable[[], T], what: str) -> T:
        """One SDK call other than an embeddings request (batch jobs), retried and redacted as `_send` is."""
        return call_with_retries(attempt, self._classify_any, self._policy, what=f"{self.name} {what} ({self._model})",
                                 secrets=self._secrets, pause=self._pause)

    def _redact(self, text: str) -> str:
        return redact(text, self._secrets)

    def _accepts(self, vector: Any) -> bool:
        """`_check_dims` for one vector of a batch job, without raising: one odd answer must not sink the job."""
        with self._lock:
            if len(vector) == 0:
                return False
            if not self._dims:
                self._dims = len(vector)
            return len(vector) == self._dims

    @property
    def _split_tokens(self) -> int:
        """The largest piece the synchronous path sends (see `plan_batches`): batch jobs cut texts the same way."""
        return min(self._max_input_tokens, self._batch_tokens)

    def _classify_any(self, exc: Exception) -> Failure | None:
        failure = failure_of(exc) or self._classify(exc)
        if failure is None:
            failure = _transport_failure(exc)
        if failure is None and isinstance(exc, (ValueError, LookupError, TypeError, AttributeError)):
            failure = Failure(Kind.BAD_RESPONSE, f"{type(exc).__name__}: {exc}")
        if failure is not None:
            failure = Failure(failure.kind, redact(failure.detail, self._secrets), failure.status,
                              failure.retry_after)
        return failure

    def _status_failure(self, status: int, headers: Mapping[str, str] | None, detail: str) -> Failure:
        return failure_from_status(status, headers, detail, clock=self._policy.clock)

    @abc.abstractmethod
    def _make_client(self) -> Any:
        """The SDK's client for this provider's settings (the SDK is imported here, not at module import)."""

    @abc.abstractmethod
    def _request(self, inputs: list[str], kind: InputKind) -> list[list[float]]:
        """One HTTP request for `inputs`; raw vectors in input order."""

    @abc.abstractmethod
    def _classify(self, exc: Exception) -> Failure | None:
        """Map an SDK exception to a Failure, or None to let the shared rules decide."""

    @abc.abstractmethod
    def _query_call(self, text: str) -> HTTPCall:
        """The request the SDK would send to embed `text` as a query (the same URL, credentials and body)."""

    @abc.abstractmethod
    def _query_vector(self, payload: Any) -> Any:
        """The vector in the answer to `_query_call` (raises KeyError, IndexError, TypeError or ValueError)."""


def _transport_failure(exc: Exception) -> Failure | None:
    """Timeouts and connection errors of httpx/httpx2 (used raw by google-genai), without importing either."""
    names = {(cls.__module__.split(".")[0], cls.__name__) for cls in type(exc).__mro__}
    http_libs = {module for module, _ in names if module in ("httpx", "httpx2", "requests", "urllib3")}
    if not http_libs:
        return None
    if any(name in ("TimeoutException", "Timeout", "TimeoutError") for _, name in names):
        return Failure(Kind.TIMEOUT, str(exc))
    if any(name in ("TransportError", "ConnectionError", "RequestException") for _, name in names):
        return Failure(Kind.CONNECTION, str(exc))
    return None
