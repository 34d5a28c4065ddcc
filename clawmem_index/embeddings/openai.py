"""OpenAI embeddings, and any OpenAI-compatible server (`base_url`, `api_key`, extra `headers`).

The `openai` SDK is imported when the first request needs its client, not at module import or in
the constructor (it costs over a second; the provider's identity needs none of it).
Its own retries are off (`max_retries=0`): `clawmem_index.embeddings.retry` is the one retry loop.

Large backfills can go through the Batch API instead (`BatchEmbedder`): one JSONL line per text
(`custom_id` = its id) is uploaded as a file, a batch runs over it within 24 hours, and its
output and error files are read back when it completes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings.jobs import JobState, Submitted, assemble, job_capacity, pack_job
from clawmem_index.embeddings.query_http import HTTPCall, decode_vector
from clawmem_index.embeddings.remote import (
    InputKind,
    Limits,
    RemoteProvider,
    describe_endpoint,
    first_set,
    secret_values,
)
from clawmem_index.embeddings.retry import Failure, Kind
from clawmem_index.errors import ProviderError

__all__ = ["DEFAULT_BASE_URL", "DEFAULT_MODEL", "OpenAIProvider"]

DEFAULT_MODEL = "text-embedding-3-small"
DEFAULT_BASE_URL = "https://api.openai.com/v1"

# OpenAI counts with cl100k_base, as we do: its limits apply unchanged.
_LIMITS = Limits(max_input_tokens=8191, max_batch_inputs=2048, max_batch_tokens=300_000)

# Batch API: 50,000 requests (and embedding inputs) and 200 MB per input file; a completed job's
# vectors (float32) are held at once, so wide models get fewer texts per job.
_JOB_REQUESTS = 50_000
_JOB_BYTES = 190_000_000
_JOB_FLOATS = 30_000_000
_JOB_RUNNING = frozenset({"validating", "in_progress", "finalizing", "cancelling"})


class OpenAIProvider(RemoteProvider):
    name = "openai"
    known_dims: ClassVar[Mapping[str, int]] = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072,
                                               "text-embedding-ada-002": 1536}

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
        self.official_endpoint = base_url == DEFAULT_BASE_URL  # batch jobs: OpenAI has them, compatible servers rarely
        super().__init__(settings, model=model, endpoint=describe_endpoint(base_url, headers), limits=_LIMITS,
                         secrets=[api_key, *secret_values(headers)], sleep=sleep)
        # The SDK would read the organization and project from the environment: both paths take them from here.
        self._account = (first_set(environ, "OPENAI_ORG_ID") or None, first_set(environ, "OPENAI_PROJECT_ID") or None)
        self._connection = (api_key or "no-key", base_url, headers)
        self._submitted: dict[str, Submitted] = {}

    def _make_client(self) -> Any:
        import openai

        api_key, base_url, headers = self._connection
        organization, project = self._account
        return openai.OpenAI(api_key=api_key, organization=organization, project=project, base_url=base_url,
                             max_retries=0, timeout=self._settings.timeout, default_headers=headers)

    def _body(self, inputs: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self._model, "input": inputs, "encoding_format": "base64"}
        if self._settings.dimensions:
            body["dimensions"] = self._settings.dimensions
        return body

    def _query_call(self, text: str) -> HTTPCall:
        api_key, base_url, headers = self._connection
        organization, project = self._account
        account = {name: value for name, value in (("OpenAI-Organization", organization), ("OpenAI-Project", project))
                   if value}
        return HTTPCall(f"{base_url}/embeddings", {"Authorization": f"Bearer {api_key}", **account, **headers},
                        self._body([text]))

    def _query_vector(self, payload: Any) -> Any:
        return decode_vector(min(payload["data"], key=lambda item: item["index"])["embedding"])

    def _request(self, inputs: list[str], kind: InputKind) -> list[Any]:
        """One request through the SDK's client (auth, headers, errors), its answer read as plain JSON.

        Vectors come as base64 float32. As JSON floats, or through the SDK's response models, every
        number of every vector is validated in Python: measured, that cost more than the whole
        keyword index of the same notes.
        """
        import httpx

        payload = self._client.post("/embeddings", body=self._body(inputs), cast_to=httpx.Response).json()
        data = sorted(payload["data"], key=lambda item: item["index"])
        return [decode_vector(item["embedding"]) for item in data]

    @property
    def max_batch_items(self) -> int:
        return job_capacity(self._dims, most=_JOB_REQUESTS, floats=_JOB_FLOATS)

    def submit_batch(self, items: Sequence[tuple[str, str]]) -> str:
        """Upload the texts as a JSONL file and start an embeddings batch over it; the batch's id.

        Texts over the input limit are sent in pieces (see `jobs.pack_job`); texts that would take
        the file over its limits are left out, and reported missing if this process polls the job.
        """
        lines, _ = pack_job(items, max_input_tokens=self._split_tokens, max_requests=_JOB_REQUESTS,
                            max_bytes=_JOB_BYTES, encode=self._job_line)
        data = b"".join(lines)
        upload = self._call(lambda: self._client.files.create(
            file=("clawmem-embeddings.jsonl", data, "application/jsonl"), purpose="batch"), "batch file upload")
        batch = self._call(lambda: self._client.batches.create(
            input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h",
            metadata={"client": "clawmem"}), "batch creation")
        self._submitted[batch.id] = Submitted(tuple(custom_id for custom_id, _ in items))
        return str(batch.id)

    def poll_batch(self, job_id: str) -> JobState:
        """The batch's state; once completed, its vectors, read from its output and error files.

        A running batch costs one small GET; a completed one also downloads both files (about
        4/3 x 4 bytes x dims per text), which is worth doing once.
        """
        batch = self._call(lambda: self._client.batches.retrieve(job_id), "batch poll")
        detail = self._redact(_batch_detail(batch))
        if batch.status in _JOB_RUNNING:
            return JobState("running", {}, detail=detail)
        if batch.status != "completed":
            self._submitted.pop(job_id, None)
            return JobState("failed", {}, detail=detail)
        answers: dict[str, Any] = {}
        failed: list[str] = []
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                read = self._call(functools.partial(self._read_results, file_id), "batch results download")
                answers.update(read[0])
                failed.extend(read[1])
        submitted = self._submitted.pop(job_id, None)
        vectors, missing = assemble(answers, failed, accept=self._accepts,
                                    expected=submitted.ids if submitted else ())
        return JobState("completed", vectors, missing, detail)

    def cancel_batch(self, job_id: str) -> None:
        """Ask OpenAI to cancel the batch; one it refuses to cancel (already over) is left alone."""
        try:
            self._call(lambda: self._client.batches.cancel(job_id), "batch cancel")
        except ProviderError as exc:
            if type(exc) is not ProviderError:  # unreachable, refused credentials or rate limited: say so
                raise

    def _job_line(self, key: str, text: str) -> tuple[bytes, int]:
        body = self._body(text)
        line = json.dumps({"custom_id": key, "method": "POST", "url": "/v1/embeddings", "body": body}).encode() + b"\n"
        return line, len(line)

    def _read_results(self, file_id: str) -> tuple[dict[str, Any], list[str]]:
        """A batch output or error file, streamed: vectors by custom_id, and the custom_ids that failed.

        A line that failed has an `error`, or a response whose status is not 200 (the error file
        holds both kinds); a line whose answer cannot be read counts as failed too.
        """
        answers: dict[str, Any] = {}
        failed: list[str] = []
        with self._client.files.with_streaming_response.content(file_id) as response:
            for line in response.iter_lines():
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:  # no key to blame: the text is reported missing if this process submitted it
                    continue
                key = record.get("custom_id") if isinstance(record, dict) else None
                if not isinstance(key, str):
                    continue
                answer = record.get("response") or {}
                vector = None
                if not record.get("error") and answer.get("status_code") == 200:
                    with contextlib.suppress(KeyError, IndexError, TypeError, ValueError):
                        vector = decode_vector(answer["body"]["data"][0]["embedding"])
                if vector is None:
                    failed.append(key)
                else:
                    answers[key] = vector
        return answers, failed

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


def _batch_detail(batch: Any) -> str:
    """`in_progress (120/5000 done, 2 failed)`, with the batch's own errors after a colon when it failed."""
    detail = str(batch.status)
    counts = batch.request_counts
    if counts is not None and counts.total:
        detail += f" ({counts.completed}/{counts.total} done" + (f", {counts.failed} failed)" if counts.failed else ")")
    errors = batch.errors.data if batch.errors is not None and batch.errors.data else []
    messages = [f"{e.message or e.code}" + (f" (line {e.line})" if e.line else "") for e in errors]
    return detail + (": " + "; ".join(messages) if messages else "")


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
    return str(getattr(exc, "message", "") or exc)
