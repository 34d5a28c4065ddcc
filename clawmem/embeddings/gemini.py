"""Gemini embeddings through `google-genai` (the Gemini Developer API, never Vertex AI).

Documents and queries are embedded with different task types (RETRIEVAL_DOCUMENT and
RETRIEVAL_QUERY), which is what makes Gemini's vectors good for search. The SDK is imported in
the constructor; its retries are off (one attempt per call) so ours are the only ones.

Everything the SDK would otherwise read from the environment that changes the endpoint is passed
explicitly (base URL, API version, `vertexai=False`), so `info.endpoint` is exactly where requests go.
"""

from __future__ import annotations

import os
import re
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
from clawmem.embeddings.retry import Failure
from clawmem.errors import ProviderError

__all__ = ["DEFAULT_API_VERSION", "DEFAULT_BASE_URL", "DEFAULT_MODEL", "GeminiProvider", "split_base_url"]

DEFAULT_MODEL = "gemini-embedding-001"
DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
DEFAULT_API_VERSION = "v1beta"

# gemini-embedding-001 takes 2,048 tokens of its own tokenizer per input and 100 inputs per batch
# request; we count with cl100k_base, so keep a 10% margin.
_LIMITS = Limits(max_input_tokens=1843, max_batch_inputs=100, max_batch_tokens=184_300)
_TASK_TYPES: dict[str, str] = {"document": "RETRIEVAL_DOCUMENT", "query": "RETRIEVAL_QUERY"}
_VERSION_SUFFIX = re.compile(r"^(?P<base>.*?)/(?P<version>v\d+(?:(?:alpha|beta)\d*)?)/*$")


def split_base_url(url: str) -> tuple[str, str]:
    """(base, api version): a base URL may end in its version (`.../v1beta`); the SDK wants them apart."""
    match = _VERSION_SUFFIX.match(url.strip())
    if match:
        return match["base"], match["version"]
    return url.strip().rstrip("/"), DEFAULT_API_VERSION


class GeminiProvider(RemoteProvider):
    name = "gemini"
    known_dims: ClassVar[Mapping[str, int]] = {"gemini-embedding-001": 3072, "text-embedding-004": 768, "embedding-001": 768}

    def __init__(self, settings: EmbeddingSettings, *, environ: Mapping[str, str] = os.environ,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """Raises ProviderError when no API key is set (GEMINI_API_KEY, GOOGLE_API_KEY or embedding.api_key)."""
        api_key = settings.api_key or first_set(environ, "GEMINI_API_KEY", "GOOGLE_API_KEY")
        if not api_key:
            raise ProviderError("gemini: no API key (set GEMINI_API_KEY, GOOGLE_API_KEY or embedding.api_key)")
        base_url, api_version = split_base_url(settings.base_url or DEFAULT_BASE_URL)
        headers = dict(settings.headers)
        model = settings.model or DEFAULT_MODEL
        super().__init__(settings, model=model, endpoint=describe_endpoint(f"{base_url}/{api_version}", headers),
                         limits=_LIMITS, secrets=[api_key, *secret_values(headers)], sleep=sleep)
        from google import genai
        from google.genai import types

        options = types.HttpOptions(base_url=base_url, api_version=api_version, headers=headers or None,
                                    timeout=max(1, round(settings.timeout * 1000)),
                                    retry_options=types.HttpRetryOptions(attempts=1))
        self._types = types
        self._client = genai.Client(api_key=api_key, vertexai=False, http_options=options)

    def close(self) -> None:
        self._client.close()

    def _request(self, inputs: list[str], kind: InputKind) -> list[list[float]]:
        config = self._types.EmbedContentConfig(task_type=_TASK_TYPES[kind],
                                                output_dimensionality=self._settings.dimensions or None)
        contents: list[Any] = list(inputs)
        response = self._client.models.embed_content(model=self._model, contents=contents, config=config)
        embeddings = response.embeddings or []
        return [list(item.values or []) for item in embeddings]

    def _classify(self, exc: Exception) -> Failure | None:
        from google.genai import errors

        if isinstance(exc, errors.APIError):
            response = getattr(exc, "response", None)
            headers = getattr(response, "headers", None)
            return self._status_failure(int(exc.code or 0), headers, str(exc.message or exc.status or ""))
        return None
