"""Voyage AI embeddings through the `voyageai` SDK, with input_type "document" / "query".

`voyageai.Client(base_url=...)` takes a base URL (it defaults to api.voyageai.com, or MongoDB's
host for `al-` keys, exactly as the SDK decides). The SDK drops every request header except
Authorization and Content-Type, so extra `headers` cannot be honoured and are refused rather than
silently ignored. The SDK is imported when the first request needs it (importing it costs a third
of a second); `max_retries=0` turns its tenacity loop off.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.query_http import HTTPCall, decode_vector
from clawmem_index.embeddings.remote import InputKind, Limits, RemoteProvider, describe_endpoint, first_set
from clawmem_index.embeddings.retry import Failure, Kind
from clawmem_index.errors import ConfigError, ProviderError

__all__ = ["DEFAULT_MODEL", "VoyageProvider"]

DEFAULT_MODEL = "voyage-4-large"

# voyage-4-large: 32,000 tokens per input, 1,000 inputs and 120,000 tokens per request, counted
# with Voyage's tokenizer; we count with cl100k_base, so keep a 10% margin. `truncation=True` stays
# on as a safety net should the estimate still fall short.
_LIMITS = Limits(max_input_tokens=28_800, max_batch_inputs=1000, max_batch_tokens=108_000)


class VoyageProvider(RemoteProvider):
    name = "voyage"
    known_dims: ClassVar[Mapping[str, int]] = {
        "voyage-4-large": 1024, "voyage-4": 1024, "voyage-4-lite": 1024,
        "voyage-3-large": 1024, "voyage-3.5": 1024, "voyage-3.5-lite": 1024, "voyage-3": 1024,
        "voyage-3-lite": 512, "voyage-code-3": 1024, "voyage-finance-2": 1024, "voyage-law-2": 1024,
        "voyage-code-2": 1536,
    }

    def __init__(self, settings: EmbeddingSettings, *, environ: Mapping[str, str] = os.environ,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """Raises ProviderError without an API key, ConfigError when extra headers are configured."""
        api_key = settings.api_key or first_set(environ, "VOYAGE_API_KEY")
        if not api_key:
            raise ProviderError("voyage: no API key (set VOYAGE_API_KEY or embedding.api_key)")
        if settings.headers:
            raise ConfigError("invalid setting 'embedding.headers': the voyageai SDK sends no extra headers; "
                              "remove them to use voyage")
        model = settings.model or DEFAULT_MODEL
        if model not in self.known_dims and _runs_in_process(model):
            raise ConfigError(f"invalid setting 'embedding.model': {model!r} runs in-process in the voyageai SDK "
                              "(downloading weights at run time); clawmem's voyage provider only calls the API")
        base_url = (settings.base_url or _default_base_url(api_key)).rstrip("/")
        super().__init__(settings, model=model, endpoint=describe_endpoint(base_url, {}), limits=_LIMITS,
                         secrets=[api_key], sleep=sleep)
        self._connection = (api_key, base_url)

    def _make_client(self) -> Any:
        from voyageai.client import Client

        api_key, base_url = self._connection
        return Client(api_key=api_key, max_retries=0, timeout=self._settings.timeout, base_url=base_url)

    def _request(self, inputs: list[str], kind: InputKind) -> list[list[float]]:
        result = self._client.embed(list(inputs), model=self._model, input_type=kind, truncation=True,
                                    output_dimension=self._settings.dimensions or None)
        return [list(map(float, vector)) for vector in result.embeddings]

    def _query_call(self, text: str) -> HTTPCall:
        """The body the SDK sends for `embed([text], input_type="query")`: base64 float32 vectors."""
        api_key, base_url = self._connection
        body = {"input": [text], "model": self._model, "input_type": "query", "truncation": True, "output_dtype": None,
                "output_dimension": self._settings.dimensions or None, "encoding_format": "base64"}
        return HTTPCall(f"{base_url}/embeddings", {"Authorization": f"Bearer {api_key}"}, body)

    def _query_vector(self, payload: Any) -> Any:
        return decode_vector(min(payload["data"], key=lambda item: item["index"])["embedding"])

    def _classify(self, exc: Exception) -> Failure | None:
        from voyageai import error

        if isinstance(exc, error.Timeout):
            return Failure(Kind.TIMEOUT, str(exc))
        if isinstance(exc, error.APIConnectionError):
            return Failure(Kind.CONNECTION, str(exc))
        if isinstance(exc, error.VoyageError):
            status = exc.http_status
            detail = str(exc.user_message or "")
            if isinstance(exc, error.AuthenticationError) and status is None:
                return Failure(Kind.AUTH, detail)
            if not isinstance(status, int) or 200 <= status < 300:
                return Failure(Kind.BAD_RESPONSE, detail)
            return self._status_failure(status, exc.headers, detail)
        return None


def _default_base_url(api_key: str) -> str:
    """The SDK's default endpoint for `api_key` (`voyageai.util.get_default_base_url`, without importing the SDK)."""
    return "https://ai.mongodb.com/v1" if api_key.startswith("al-") else "https://api.voyageai.com/v1"


def _runs_in_process(model: str) -> bool:
    """Whether the SDK would run `model` in-process; asked only of names outside the known API models."""
    from voyageai.local.helpers import is_local_model

    return bool(is_local_model(model))
