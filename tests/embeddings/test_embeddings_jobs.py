"""Batch jobs (OpenAI's Batch API, Gemini's batch embeddings) through the real SDKs, against fake batch services."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_http import FakeBatches, FakeServer, GeminiBatches, OpenAIBatches, Reply, no_proxy, path_of, vector_for

from clawmem_index.config import EmbeddingSettings
from clawmem_index.embeddings import gemini as gemini_module
from clawmem_index.embeddings import openai as openai_module
from clawmem_index.embeddings.base import normalize
from clawmem_index.embeddings.gemini import GeminiProvider
from clawmem_index.embeddings.jobs import BatchEmbedder, JobState, assemble, job_capacity, pack_job, piece_key
from clawmem_index.embeddings.openai import OpenAIProvider
from clawmem_index.errors import AuthError, ProviderError
from clawmem_index.text.tokens import count_tokens

__all__ = ["no_proxy"]

KEYS = {"openai": "sk-test-0123456789-SECRET", "gemini": "AIza-test-0123456789-SECRET"}
TEXTS = [("a1", "alpha"), ("b2", "beta"), ("c3", "gamma delta")]
LONG = " ".join(f"w{i}" for i in range(150))
PIECE = re.compile(r"long#(\d+)/(\d+):(\d+)")
pytestmark = pytest.mark.usefixtures("no_proxy")


@dataclass
class Setup:
    """One provider kind against its fake batch service, on one server."""

    kind: str
    server: FakeServer
    service: Any
    sleeps: list[float] = field(default_factory=list)
    providers: list[Any] = field(default_factory=list)

    @property
    def key(self) -> str:
        return KEYS[self.kind]

    def make(self, **overrides: Any) -> Any:
        values: dict[str, Any] = {"provider": self.kind, "api_key": self.key, "dimensions": 8, "max_retries": 2,
                                  "timeout": 5.0, "concurrency": 1,
                                  "base_url": f"{self.server.url}/v1" if self.kind == "openai" else self.server.url}
        values.update(overrides)
        cls = OpenAIProvider if self.kind == "openai" else GeminiProvider
        provider = cls(EmbeddingSettings(**values), environ={}, sleep=self.sleeps.append)
        self.providers.append(provider)
        return provider

    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
        if self.kind == "openai":
            return Reply(status=status, json={"error": {"message": message}}, headers=headers or {})
        words = {401: "UNAUTHENTICATED", 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE"}.get(status, "INVALID_ARGUMENT")
        return Reply(status=status, json={"error": {"code": status, "message": message, "status": words}},
                     headers=headers or {})

    def polls(self) -> int:
        return sum(1 for r in self.server.requests if r.method == "GET" and "/batches/" in path_of(r))


@pytest.fixture(params=["openai", "gemini"])
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    service: FakeBatches = OpenAIBatches() if request.param == "openai" else GeminiBatches()
    with FakeServer(service) as server:
        state = Setup(request.param, server, service)
        yield state
        for provider in state.providers:
            provider.close()


@pytest.fixture
def openai_setup() -> Iterator[Setup]:
    with FakeServer(OpenAIBatches()) as server:
        state = Setup("openai", server, server.default)
        yield state
        for provider in state.providers:
            provider.close()


@pytest.fixture
def gemini_setup() -> Iterator[Setup]:
    with FakeServer(GeminiBatches()) as server:
        state = Setup("gemini", server, server.default)
        yield state
        for provider in state.providers:
            provider.close()


def unit_of(vector: Any) -> list[float]:
    result = normalize(vector)
    assert result is not None
    return result


def test_submit_poll_until_completed_gives_the_synchronous_vectors(setup: Setup) -> None:
    provider = setup.make()
    assert isinstance(provider, BatchEmbedder)
    job = provider.submit_batch(TEXTS)
    first = provider.poll_batch(job)
    assert first.state == "running" and first.vectors == {} and first.missing == ()
    assert first.detail in ("in_progress (0/3 done)", "JOB_STATE_RUNNING")
    assert provider.poll_batch(job).state == "running"
    setup.service.complete()
    done = provider.poll_batch(job)
    assert done.state == "completed" and done.missing == ()
    assert sorted(done.vectors) == ["a1", "b2", "c3"]
    synchronous = provider.embed_documents([text for _, text in TEXTS])
    for (custom_id, text), expected in zip(TEXTS, synchronous, strict=True):
        assert list(done.vectors[custom_id]) == pytest.approx(vector_for(text, 8))  # raw, not normalised
        assert unit_of(done.vectors[custom_id]) == pytest.approx(list(expected))


def test_a_job_completes_after_the_polls_the_service_was_told(setup: Setup) -> None:
    setup.service.complete_after = 2
    provider = setup.make()
    job = provider.submit_batch(TEXTS)
    assert provider.poll_batch(job).state == "running"
    assert provider.poll_batch(job).state == "completed"


def test_another_process_can_collect_the_job(setup: Setup) -> None:
    """The daemon polls what `clawmem index` submitted: nothing may depend on the submitter's memory."""
    job = setup.make(batch_tokens=64).submit_batch([*TEXTS, ("long", LONG)])  # "long" goes in pieces
    setup.service.complete()
    elsewhere = setup.make(batch_tokens=64)
    done = elsewhere.poll_batch(job)
    assert done.state == "completed" and done.missing == ()
    assert sorted(done.vectors) == ["a1", "b2", "c3", "long"]
    assert list(done.vectors["long"]) == pytest.approx(list(elsewhere.embed_documents([LONG])[0]))


def test_openai_request_contents(openai_setup: Setup) -> None:
    provider = openai_setup.make()
    job = provider.submit_batch(TEXTS)
    upload, create = openai_setup.server.requests[:2]
    assert upload.path == "/v1/files" and upload.headers["content-type"].startswith("multipart/form-data")
    assert upload.headers["authorization"] == f"Bearer {openai_setup.key}"
    [file_id] = openai_setup.service.files
    filename, purpose, _ = openai_setup.service.files[file_id]
    assert purpose == "batch" and filename.endswith(".jsonl")
    assert create.path == "/v1/batches"
    assert create.body["input_file_id"] == file_id
    assert create.body["endpoint"] == "/v1/embeddings" and create.body["completion_window"] == "24h"
    lines = openai_setup.service.lines(job)
    assert [line["custom_id"] for line in lines] == ["a1", "b2", "c3"]
    for line, (_, text) in zip(lines, TEXTS, strict=True):
        assert line["method"] == "POST" and line["url"] == "/v1/embeddings"
        assert line["body"] == {"model": "text-embedding-3-small", "input": text, "encoding_format": "base64",
                                "dimensions": 8}


def test_openai_default_dimensions_are_not_sent(openai_setup: Setup) -> None:
    openai_setup.service.dims = 1536
    provider = openai_setup.make(dimensions=0)
    job = provider.submit_batch(TEXTS[:1])
    assert "dimensions" not in openai_setup.service.lines(job)[0]["body"]
    openai_setup.service.complete()
    assert len(provider.poll_batch(job).vectors["a1"]) == 1536


def test_openai_json_float_answers_are_read_too(openai_setup: Setup) -> None:
    """Some compatible servers ignore encoding_format."""
    provider = openai_setup.make()
    job = provider.submit_batch(TEXTS[:1])
    openai_setup.service.complete()
    path = f"file-out-{job}"
    name, purpose, content = openai_setup.service.files[path]
    records = [json.loads(line) for line in content.splitlines()]
    for record in records:
        record["response"]["body"]["data"][0]["embedding"] = vector_for("alpha", 8)
    openai_setup.service.files[path] = (name, purpose, "".join(json.dumps(r) + "\n" for r in records).encode())
    assert list(provider.poll_batch(job).vectors["a1"]) == pytest.approx(vector_for("alpha", 8))


def test_gemini_request_contents(gemini_setup: Setup) -> None:
    provider = gemini_setup.make()
    job = provider.submit_batch(TEXTS)
    [create] = gemini_setup.server.requests
    assert create.method == "POST"
    assert create.path == "/v1beta/models/gemini-embedding-001:asyncBatchEmbedContent"
    assert create.headers["x-goog-api-key"] == gemini_setup.key
    assert create.body["batch"]["displayName"] == "clawmem: 3 texts"
    inlined = gemini_setup.service.inlined(job)
    assert [item["metadata"] for item in inlined] == [{"key": "a1"}, {"key": "b2"}, {"key": "c3"}]
    for item, (_, text) in zip(inlined, TEXTS, strict=True):
        assert item["request"] == {"content": {"parts": [{"text": text}], "role": "user"},
                                   "taskType": "RETRIEVAL_DOCUMENT", "outputDimensionality": 8}
    assert job.startswith("batches/")
    provider.poll_batch(job)
    assert path_of(gemini_setup.server.requests[-1]) == f"/v1beta/{job}"


def test_gemini_default_dimensions_are_not_sent(gemini_setup: Setup) -> None:
    provider = gemini_setup.make(dimensions=0)
    job = provider.submit_batch(TEXTS[:1])
    assert "outputDimensionality" not in gemini_setup.service.inlined(job)[0]["request"]


def test_failed_lines_are_missing(setup: Setup) -> None:
    provider = setup.make()
    job = provider.submit_batch(TEXTS)
    if setup.kind == "openai":  # one answered 400, one never run: both land in the error file
        setup.service.complete(failed=["b2"], errored=["c3"])
    else:
        setup.service.complete(failed=["b2", "c3"])
    done = provider.poll_batch(job)
    assert done.state == "completed"
    assert sorted(done.vectors) == ["a1"] and done.missing == ("b2", "c3")


def test_gemini_job_whose_answers_all_failed(gemini_setup: Setup) -> None:
    """With no embedding among them, the SDK files the answers as generic inline responses."""
    provider = gemini_setup.make()
    job = provider.submit_batch(TEXTS)
    gemini_setup.service.complete(failed=["a1", "b2", "c3"])
    done = provider.poll_batch(job)
    assert done.state == "completed" and done.vectors == {} and done.missing == ("a1", "b2", "c3")


def test_gemini_answers_without_metadata_are_matched_by_position(gemini_setup: Setup) -> None:
    gemini_setup.service.echo_metadata = False
    submitter = gemini_setup.make()
    job = submitter.submit_batch(TEXTS)
    gemini_setup.service.complete(failed=["b2"])
    elsewhere = gemini_setup.make().poll_batch(job)  # another process cannot know the order
    assert elsewhere.state == "completed" and elsewhere.vectors == {}
    assert "3 answers without a key" in elsewhere.detail
    done = submitter.poll_batch(job)
    assert sorted(done.vectors) == ["a1", "c3"] and done.missing == ("b2",)
    assert list(done.vectors["c3"]) == pytest.approx(vector_for("gamma delta", 8))


def test_a_failed_job_says_why(setup: Setup) -> None:
    provider = setup.make()
    job = provider.submit_batch(TEXTS)
    provider.poll_batch(job)
    setup.service.fail(message="the input file is malformed")
    state = provider.poll_batch(job)
    assert state == JobState("failed", {}, (), state.detail)
    if setup.kind == "openai":
        assert state.detail == "failed (0/3 done): the input file is malformed"
    else:  # the SDK drops a Gemini batch's error: its state is all there is
        assert state.detail == "JOB_STATE_FAILED"


def test_an_expired_job_is_failed(setup: Setup) -> None:
    provider = setup.make()
    job = provider.submit_batch(TEXTS)
    setup.service.expire()
    state = provider.poll_batch(job)
    assert state.state == "failed" and state.vectors == {}
    assert state.detail == ("expired (0/3 done)" if setup.kind == "openai" else "JOB_STATE_EXPIRED")


def test_cancel(setup: Setup) -> None:
    provider = setup.make()
    job = provider.submit_batch(TEXTS)
    provider.cancel_batch(job)
    cancel = setup.server.requests[-1]
    assert cancel.method == "POST" and path_of(cancel).endswith(f"{job}/cancel" if setup.kind == "openai"
                                                                 else f"{job}:cancel")
    state = provider.poll_batch(job)
    assert state.state == "failed" and "cancel" in state.detail.lower()
    provider.cancel_batch(job)  # already over: left alone, no error


def test_a_429_on_poll_is_retried_after_retry_after(setup: Setup) -> None:
    provider = setup.make()
    job = provider.submit_batch(TEXTS)
    setup.server.script(setup.error(429, "slow down", {"Retry-After": "2"}))
    assert provider.poll_batch(job).state == "running"
    assert setup.polls() == 2 and setup.sleeps == [2.0]


def test_server_errors_on_submit_are_retried(setup: Setup) -> None:
    provider = setup.make()
    setup.server.script(setup.error(503, "overloaded"))
    job = provider.submit_batch(TEXTS)
    assert len(setup.sleeps) == 1 and len(setup.service.jobs) == 1 and job in setup.service.jobs


def test_keys_never_appear_in_errors(setup: Setup) -> None:
    provider = setup.make()
    setup.server.script(setup.error(401, f"API key not valid: {setup.key}"))
    with pytest.raises(AuthError) as submitting:
        provider.submit_batch(TEXTS)
    job = provider.submit_batch(TEXTS)
    setup.server.script(setup.error(401, f"API key not valid: {setup.key}"))
    with pytest.raises(AuthError) as polling:
        provider.poll_batch(job)
    for info in (submitting, polling):
        assert setup.key not in str(info.value) and "HTTP 401" in str(info.value)
        assert info.value.__cause__ is None
    setup.server.script(setup.error(401, f"API key not valid: {setup.key}"))
    with pytest.raises(AuthError) as cancelling:
        provider.cancel_batch(job)
    assert setup.key not in str(cancelling.value)


def test_a_key_echoed_in_a_job_failure_is_redacted(openai_setup: Setup) -> None:
    provider = openai_setup.make()
    job = provider.submit_batch(TEXTS)
    openai_setup.service.fail(message=f"the key {openai_setup.key} may not run batches")
    detail = provider.poll_batch(job).detail
    assert openai_setup.key not in detail and "***" in detail


def test_over_limit_texts_are_split_and_combined_as_the_synchronous_path_does(setup: Setup) -> None:
    provider = setup.make(batch_tokens=64)
    job = provider.submit_batch([("short", "alpha"), ("long", LONG)])
    if setup.kind == "openai":
        sent = [(line["custom_id"], line["body"]["input"]) for line in setup.service.lines(job)]
    else:
        sent = [(item["metadata"]["key"], item["request"]["content"]["parts"][0]["text"])
                for item in setup.service.inlined(job)]
    assert sent[0] == ("short", "alpha")
    pieces = [(PIECE.fullmatch(key), text) for key, text in sent[1:]]
    assert len(pieces) > 1 and all(match is not None for match, _ in pieces)
    assert "".join(text for _, text in pieces) == LONG
    for index, (match, text) in enumerate(pieces):
        assert match is not None
        assert (int(match[1]), int(match[2]), int(match[3])) == (index, len(pieces), count_tokens(text))
        assert count_tokens(text) <= 64
    setup.service.complete()
    done = provider.poll_batch(job)
    assert done.missing == () and sorted(done.vectors) == ["long", "short"]
    [synchronous] = provider.embed_documents([LONG])
    assert list(done.vectors["long"]) == pytest.approx(list(synchronous))


def test_a_failed_piece_makes_its_text_missing(openai_setup: Setup) -> None:
    provider = openai_setup.make(batch_tokens=64)
    job = provider.submit_batch([("short", "alpha"), ("long", LONG)])
    second_piece = openai_setup.service.lines(job)[2]["custom_id"]
    openai_setup.service.complete(failed=[second_piece])
    done = provider.poll_batch(job)
    assert sorted(done.vectors) == ["short"] and done.missing == ("long",)


def test_texts_beyond_the_job_limits_are_left_out_and_missing(openai_setup: Setup,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_module, "_JOB_REQUESTS", 2)
    provider = openai_setup.make()
    job = provider.submit_batch(TEXTS)
    assert [line["custom_id"] for line in openai_setup.service.lines(job)] == ["a1", "b2"]
    openai_setup.service.complete()
    done = provider.poll_batch(job)
    assert sorted(done.vectors) == ["a1", "b2"] and done.missing == ("c3",)


def test_gemini_jobs_stay_under_the_inline_size_limit(gemini_setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemini_module, "_JOB_BYTES", 400)
    provider = gemini_setup.make()
    job = provider.submit_batch([("a1", "alpha"), ("big", "x " * 200), ("c3", "gamma")])
    assert [item["metadata"]["key"] for item in gemini_setup.service.inlined(job)] == ["a1", "c3"]
    gemini_setup.service.complete()
    assert provider.poll_batch(job).missing == ("big",)


def test_max_batch_items_follows_the_limits_and_the_vector_width(setup: Setup) -> None:
    narrow, default = setup.make(), setup.make(dimensions=0)
    if setup.kind == "openai":
        assert (narrow.max_batch_items, default.max_batch_items) == (50_000, 30_000_000 // 1536)
    else:
        assert (narrow.max_batch_items, default.max_batch_items) == (5_000, 6_000_000 // 3072)


@pytest.mark.parametrize("items", [[], [("a", "x"), ("a", "y")], [("", "x")], [("x" * 49, "x")],
                                   [("id#0/2:5", "x")]])
def test_unusable_ids_are_refused(setup: Setup, items: list[tuple[str, str]]) -> None:
    with pytest.raises(ValueError):
        setup.make().submit_batch(items)
    assert setup.server.requests == []


def test_a_poll_that_times_out_is_retried(setup: Setup) -> None:
    provider = setup.make(timeout=0.2)
    job = provider.submit_batch(TEXTS)
    setup.server.script(Reply(delay=3.0))
    assert provider.poll_batch(job).state == "running"
    assert setup.polls() == 2 and len(setup.sleeps) == 1


def test_a_malformed_poll_answer_is_a_provider_error(setup: Setup) -> None:
    provider = setup.make()
    job = provider.submit_batch(TEXTS)
    setup.server.script(Reply(body=b"{not json"))
    with pytest.raises(ProviderError, match="malformed response"):
        provider.poll_batch(job)
    assert setup.polls() == 1


def test_importing_jobs_does_not_import_an_sdk() -> None:
    code = ("import sys, clawmem_index.embeddings.jobs, clawmem_index.embeddings.openai, "
            "clawmem_index.embeddings.gemini; "
            "assert 'openai' not in sys.modules and 'google.genai' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


# pack_job and assemble: the pure halves, at their edges.

def encode(key: str, text: str) -> tuple[tuple[str, str], int]:
    return (key, text), len(key) + len(text)


def test_pack_job_splits_at_the_given_limit_and_leaves_out_what_does_not_fit() -> None:
    requests, left_out = pack_job([("a", "alpha"), ("long", LONG), ("b", "beta")], max_input_tokens=64,
                                  max_requests=100, max_bytes=10_000, encode=encode)
    assert requests[0] == ("a", "alpha") and requests[-1] == ("b", "beta") and left_out == []
    assert all(PIECE.fullmatch(key) for key, _ in requests[1:-1])
    requests, left_out = pack_job([("a", "alpha"), ("long", LONG), ("b", "beta")], max_input_tokens=64,
                                  max_requests=3, max_bytes=10_000, encode=encode)
    assert requests == [("a", "alpha"), ("b", "beta")] and left_out == ["long"]
    requests, left_out = pack_job([("a", "alpha"), ("b", "beta")], max_input_tokens=64, max_requests=10,
                                  max_bytes=7, encode=encode)
    assert requests == [("a", "alpha")] and left_out == ["b"]


def test_pack_job_sends_an_empty_text_as_a_space() -> None:
    assert pack_job([("e", "")], max_input_tokens=64, max_requests=1, max_bytes=100, encode=encode)[0] == [("e", " ")]


def test_pack_job_refuses_a_job_where_nothing_fits() -> None:
    with pytest.raises(ProviderError, match="none of 1 texts fits"):
        pack_job([("a", "alpha")], max_input_tokens=64, max_requests=1, max_bytes=3, encode=encode)


def test_assemble_combines_pieces_by_token_weight() -> None:
    first, second = [1.0, 0.0, 0.0], [0.0, 3.0, 0.0]
    answers = {piece_key("t", 0, 2, 30): first, piece_key("t", 1, 2, 10): second, "w": [0.0, 0.0, 2.0]}
    vectors, missing = assemble(answers, [], accept=lambda v: len(v) == 3)
    assert missing == ()
    assert list(vectors["w"]) == [0.0, 0.0, 2.0]
    assert list(vectors["t"]) == pytest.approx(unit_of([30.0, 10.0, 0.0]))


def test_assemble_reports_what_has_no_usable_vector() -> None:
    answers = {"zero": [0.0, 0.0], "nan": [float("nan"), 1.0], "wide": [1.0, 1.0, 1.0], "ok": [1.0, 2.0],
               piece_key("half", 0, 2, 5): [1.0, 1.0]}
    vectors, missing = assemble(answers, [piece_key("bad", 1, 2, 5)], accept=lambda v: len(v) == 2,
                                expected=["ok", "never"])
    assert list(vectors) == ["ok"]
    assert missing == ("bad", "half", "nan", "never", "wide", "zero")


def test_job_capacity() -> None:
    assert job_capacity(8, most=50_000, floats=30_000_000) == 50_000
    assert job_capacity(0, most=50_000, floats=30_000_000) == 30_000_000 // 3072
    assert job_capacity(10**9, most=5, floats=10) == 1


def test_combined_vectors_are_numpy_unit_vectors() -> None:
    vectors, _ = assemble({piece_key("t", 0, 2, 1): [1.0, 0.0], piece_key("t", 1, 2, 1): [0.0, 1.0]}, [],
                          accept=lambda v: True)
    assert isinstance(vectors["t"], np.ndarray) and float(vectors["t"] @ vectors["t"]) == pytest.approx(1.0)
