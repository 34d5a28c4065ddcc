"""Gemini embeddings through `google-genai` (the Gemini Developer API, never Vertex AI).

Documents and queries are embedded with different task types (RETRIEVAL_DOCUMENT and
RETRIEVAL_QUERY), which is what makes Gemini's vectors good for search. The SDK is imported in
the constructor; its retries are off (one attempt per call) so ours are the only ones.

Everything the SDK would otherwise read from the environment that changes the endpoint is passed
explicitly (base URL, API version, `vertexai=False`), so `info.endpoint` is exactly where requests go.

Large backfills can go through batch embeddings instead (`BatchEmbedder`): the requests travel
inline in one `asyncBatchEmbedContent` call and the answers come back inline in the job.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.parse
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.jobs import JobState, Submitted, assemble, job_capacity, pack_job
from clawmem_index.embeddings.query_http import HTTPCall
from clawmem_index.embeddings.remote import (
    InputKind,
    Limits,
    RemoteProvider,
    describe_endpoint,
    first_set,
    secret_values,
)
from clawmem_index.embeddings.retry import Failure
from clawmem_index.errors import ProviderError

__all__ = ["DEFAULT_API_VERSION", "DEFAULT_BASE_URL", "DEFAULT_MODEL", "GeminiProvider", "split_base_url"]

DEFAULT_MODEL = "gemini-embedding-001"
DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
DEFAULT_API_VERSION = "v1beta"

# gemini-embedding-001 takes 2,048 tokens of its own tokenizer per input and 100 inputs per batch
# request; we count with cl100k_base, so keep a 10% margin.
_LIMITS = Limits(max_input_tokens=1843, max_batch_inputs=100, max_batch_tokens=184_300)
_TASK_TYPES: dict[str, str] = {"document": "RETRIEVAL_DOCUMENT", "query": "RETRIEVAL_QUERY"}
# Batch embeddings: inline requests must stay under 20 MB, and a completed job's vectors come back
# inline as JSON, parsed by the SDK into Python floats (about 32 bytes each) before we see them.
_JOB_REQUESTS = 5_000
_JOB_BYTES = 18_000_000
_JOB_FLOATS = 6_000_000
_JOB_COMPLETED = frozenset({"JOB_STATE_SUCCEEDED", "JOB_STATE_PARTIALLY_SUCCEEDED"})
_JOB_FAILED = frozenset({"JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"})
_VERSION_SUFFIX = re.compile(r"^(?P<base>.*?)/(?P<version>v\d+(?:(?:alpha|beta)\d*)?)/*$")


def split_base_url(url: str) -> tuple[str, str]:
    """(base, api version): a base URL may end in its version (`.../v1beta`); the SDK wants them apart."""
    match = _VERSION_SUFFIX.match(url.strip())
    if match:
        return match["base"], match["version"]
    return url.strip().rstrip("/"), DEFAULT_API_VERSION


class GeminiProvider(RemoteProvider):
    name = "gemini"
    known_dims: ClassVar[Mapping[str, int]] = {"gemini-embedding-001": 3072, "text-embedding-004": 768,
                                               "embedding-001": 768}

    def __init__(self, settings: EmbeddingSettings, *, environ: Mapping[str, str] = os.environ,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """Raises ProviderError when no API key is set (GEMINI_API_KEY, GOOGLE_API_KEY or embedding.api_key)."""
        api_key = settings.api_key or first_set(environ, "GEMINI_API_KEY", "GOOGLE_API_KEY")
        if not api_key:
            raise ProviderError("gemini: no API key (set GEMINI_API_KEY, GOOGLE_API_KEY or embedding.api_key)")
        base_url, api_version = split_base_url(settings.base_url or DEFAULT_BASE_URL)
        self.official_endpoint = base_url == DEFAULT_BASE_URL  # batch jobs only where Google serves them
        headers = dict(settings.headers)
        model = settings.model or DEFAULT_MODEL
        super().__init__(settings, model=model, endpoint=describe_endpoint(f"{base_url}/{api_version}", headers),
                         limits=_LIMITS, secrets=[api_key, *secret_values(headers)], sleep=sleep)
        self._connection = (api_key, base_url, api_version, headers)
        self._submitted: dict[str, Submitted] = {}

    def _make_client(self) -> Any:
        from google import genai

        api_key, base_url, api_version, headers = self._connection
        types = self._types
        options = types.HttpOptions(base_url=base_url, api_version=api_version, headers=headers or None,
                                    timeout=max(1, round(self._settings.timeout * 1000)),
                                    retry_options=types.HttpRetryOptions(attempts=1))
        return genai.Client(api_key=api_key, vertexai=False, http_options=options)

    @property
    def _types(self) -> Any:
        """The SDK's request types (`google.genai.types`), imported when a request is first built."""
        from google.genai import types

        return types

    def _request(self, inputs: list[str], kind: InputKind) -> list[list[float]]:
        config = self._types.EmbedContentConfig(task_type=_TASK_TYPES[kind],
                                                output_dimensionality=self._settings.dimensions or None)
        contents: list[Any] = list(inputs)
        response = self._client.models.embed_content(model=self._model, contents=contents, config=config)
        embeddings = response.embeddings or []
        return [list(item.values or []) for item in embeddings]

    def _query_call(self, text: str) -> HTTPCall:
        """`batchEmbedContents` with one request, as the SDK sends `embed_content` (its model named `models/...`)."""
        api_key, base_url, api_version, headers = self._connection
        model = self._model if self._model.startswith(("models/", "tunedModels/")) else f"models/{self._model}"
        request: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "user"},
                                   "taskType": _TASK_TYPES["query"], "model": model}
        if self._settings.dimensions:
            request["outputDimensionality"] = self._settings.dimensions
        url = f"{base_url}/{api_version}/{urllib.parse.quote(model, safe='/')}:batchEmbedContents"
        return HTTPCall(url, {"x-goog-api-key": api_key, **headers}, {"requests": [request]})

    def _query_vector(self, payload: Any) -> Any:
        return list(payload["embeddings"][0].get("values") or [])

    @property
    def max_batch_items(self) -> int:
        return job_capacity(self._dims, most=_JOB_REQUESTS, floats=_JOB_FLOATS)

    def submit_batch(self, items: Sequence[tuple[str, str]]) -> str:
        """Start a batch embeddings job over the texts (task type RETRIEVAL_DOCUMENT); its name (`batches/...`).

        Each inline request carries its key in `metadata`, which the API echoes in its answer: the
        answers can then be read by a process that did not submit the job. The SDK's inline
        requests have no field for it, so the request list it builds from the same texts is sent
        with `metadata` added, through `http_options.extra_body` (a documented SDK option).
        """
        requests, _ = pack_job(items, max_input_tokens=self._split_tokens, max_requests=_JOB_REQUESTS,
                               max_bytes=_JOB_BYTES, encode=self._job_request)
        types = self._types
        config = types.EmbedContentConfig(task_type=_TASK_TYPES["document"],
                                          output_dimensionality=self._settings.dimensions or None)
        contents: list[Any] = [request["request"]["content"]["parts"][0]["text"] for request in requests]
        src = types.EmbeddingsBatchJobSource(inlined_requests=types.EmbedContentBatch(contents=contents, config=config))
        job_config = types.CreateEmbeddingsBatchJobConfig(
            display_name=f"clawmem: {len(requests)} texts",
            http_options=types.HttpOptions(extra_body={"batch": {"inputConfig": {"requests": {"requests": requests}}}}))

        def create() -> Any:
            from google.genai.errors import ExperimentalWarning

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                return self._client.batches.create_embeddings(model=self._model, src=src, config=job_config)

        job = self._call(create, "batch creation")
        if not job.name:
            raise ProviderError(f"gemini returned a batch job without a name for model {self._model!r}")
        self._submitted[job.name] = Submitted(tuple(custom_id for custom_id, _ in items),
                                              tuple(request["metadata"]["key"] for request in requests))
        return str(job.name)

    def poll_batch(self, job_id: str) -> JobState:
        """The job's state; once it succeeded, its vectors, which come inline with it.

        A running job costs one small GET; a completed one's GET carries every vector as JSON
        (about 20 bytes x dims per text). An answer without its key in `metadata` is matched by
        its position, which only the submitting process knows.
        """
        job = self._call(lambda: self._client.batches.get(name=job_id), "batch poll")
        state = str(getattr(job.state, "value", job.state) or "JOB_STATE_UNSPECIFIED")
        error = job.error.message if job.error is not None and job.error.message else ""
        detail = self._redact(state + (f": {error}" if error else ""))
        if state in _JOB_FAILED:
            self._submitted.pop(job_id, None)
            return JobState("failed", {}, detail=detail)
        if state not in _JOB_COMPLETED:
            return JobState("running", {}, detail=detail)
        submitted = self._submitted.get(job_id)
        dest = job.dest
        responses: list[Any] = []
        if dest is not None:  # all answers failed: the SDK files them under `inlined_responses`
            responses = list(dest.inlined_embed_content_responses or dest.inlined_responses or [])
            if not responses and dest.file_name:
                self._submitted.pop(job_id, None)
                return JobState("failed", {}, detail=f"{detail}: answers in file {dest.file_name}, not read by clawmem")
        order = submitted.keys if submitted else ()
        answers: dict[str, Any] = {}
        failed: list[str] = []
        unkeyed = 0
        for position, item in enumerate(responses):
            key = (item.metadata or {}).get("key") or (order[position] if position < len(order) else None)
            if not isinstance(key, str):
                unkeyed += 1
                continue
            embedding = getattr(item.response, "embedding", None)
            values = embedding.values if embedding is not None else None
            if item.error is not None or not values:
                failed.append(key)
            else:
                answers[key] = values
        vectors, missing = assemble(answers, failed, accept=self._accepts, expected=submitted.ids if submitted else ())
        self._submitted.pop(job_id, None)
        if unkeyed:
            detail += f": {unkeyed} answers without a key, not matched"
        return JobState("completed", vectors, missing, detail)

    def cancel_batch(self, job_id: str) -> None:
        """Ask Gemini to cancel the job; one it refuses to cancel (already over) is left alone."""
        try:
            self._call(lambda: self._client.batches.cancel(name=job_id), "batch cancel")
        except ProviderError as exc:
            if type(exc) is not ProviderError:  # unreachable, refused credentials or rate limited: say so
                raise

    def _job_request(self, key: str, text: str) -> tuple[dict[str, Any], int]:
        """One inline request as the SDK would build it, plus the key; its size as JSON."""
        request: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "user"},
                                   "taskType": _TASK_TYPES["document"]}
        if self._settings.dimensions:
            request["outputDimensionality"] = self._settings.dimensions
        inline = {"request": request, "metadata": {"key": key}}
        return inline, len(json.dumps(inline))

    def _classify(self, exc: Exception) -> Failure | None:
        from google.genai import errors

        if isinstance(exc, errors.APIError):
            response = getattr(exc, "response", None)
            headers = getattr(response, "headers", None)
            return self._status_failure(int(exc.code or 0), headers, str(exc.message or exc.status or ""))
        return None
