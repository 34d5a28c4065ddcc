"""OpenAI embeddings, and any OpenAI-compatible server (`base_url`, `api_key`, extra `headers`).

The `openai` SDK is imported in the constructor, not at module import (it costs over a second).
Its own retries are off (`max_retries=0`): `clawmem.embeddings.retry` is the one retry loop.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from clawmem.config import EmbeddingSettings
from clawmem.embeddings.remote import (
    InputKind,
    Limits,
    RemoteProvider,
    describe_endpoint,
    first_set,
    secret_values,
)
from clawmem.embeddings.retry import Failure, Kind
from clawmem.errors import ProviderError

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_MODEL", "OpenAIProvider"]

DEFAULT_MODEL = "text-embedding-3-small"
DEFAULT_BASE_URL = "https://api.openai.com/v1"

# OpenAI counts with cl100k_base, as we do: its limits apply unchanged.
_LIMITS = Limits(max_input_tokens=8191, max_batch_inputs=2048, max_batch_tokens=300_000)


class OpenAIProvider(RemoteProvider):
    name = "openai"
    known_dims: ClassVar[Mapping[str, int]] = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}

    def __init__(self, settings: EmbeddingSettings, *, environ: Mapping[str, str] = os.environ,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """Raises ProviderError when there is no API key for OpenAI's own endpoint.

        A custom `base_url` (a local OpenAI-compatible server) may have no key: the SDK insists
        on one, so a placeholder is sent.
        """
        api_key = settings.api_key or first_set(environ, "OPENAI_API_KEY")
        base_url = (settings.base_url or first_set(environ, "OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        if not api_key and base_url == DEFAULT_BASE_URL:
            raise ProviderError("openai: no API key (set OPENAI_API_KEY or embedding.api_key)")
        headers = dict(settings.headers)
        model = settings.model or DEFAULT_MODEL
        super().__init__(settings, model=model, endpoint=describe_endpoint(base_url, headers), limits=_LIMITS,
                         secrets=[api_key, *secret_values(headers)], sleep=sleep)
        import openai

        self._client = openai.OpenAI(api_key=api_key or "no-key", base_url=base_url, max_retries=0,
                                     timeout=settings.timeout, default_headers=headers)

    def close(self) -> None:
        self._client.close()

    def _request(self, inputs: list[str], kind: InputKind) -> list[Any]:
        """One request through the SDK's client (auth, headers, errors), its answer read as plain JSON.

        Vectors come as base64 float32. As JSON floats, or through the SDK's response models, every
        number of every vector is validated in Python: measured, that cost more than the whole
        keyword index of the same notes.
        """
        import httpx

        body: dict[str, Any] = {"model": self._model, "input": inputs, "encoding_format": "base64"}
        if self._settings.dimensions:
            body["dimensions"] = self._settings.dimensions
        payload = self._client.post("/embeddings", body=body, cast_to=httpx.Response).json()
        data = sorted(payload["data"], key=lambda item: item["index"])
        return [_floats(item["embedding"]) for item in data]

    def _classify(self, exc: Exception) -> Failure | None:
        import openai

        if isinstance(exc, openai.APIStatusError):
            return self._status_failure(exc.status_code, exc.response.headers, _message(exc))
        if isinstance(exc, openai.APITimeoutError):
            return Failure(Kind.TIMEOUT, str(exc))
        if isinstance(exc, openai.APIConnectionError):
            return Failure(Kind.CONNECTION, str(exc))
        if isinstance(exc, openai.APIResponseValidationError):
            return Failure(Kind.BAD_RESPONSE, str(exc))
        if isinstance(exc, openai.OpenAIError):
            return Failure(Kind.REJECTED, str(exc))
        return None


def _floats(embedding: object) -> Any:
    """A vector as the server sent it: base64 little-endian float32 (asked for), or a JSON list (some servers)."""
    import numpy as np

    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding, validate=True), dtype="<f4")
    if isinstance(embedding, list):
        return np.asarray(embedding, dtype=np.float64)
    raise ValueError(f"an embedding of type {type(embedding).__name__}")


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    return str(getattr(exc, "message", "") or exc)
